"""How long a RequestScope waits (review25, noticed): its `timeout_ms` was not bounded
(2**32 - 1 ms is 49.7 days), and a scope request whose worker's stream ended waited on
for it, its place among the worker's SCOPE_REQUESTS_PER_WORKER taken all that while,
though no answer could come on that stream. Now the wait is cut to SCOPE_WAIT_MAX_MS
(the longest a prompt waits, and a minute), and the requests sent on a stream are
answered when it ends.

A real hub in this process (so the test can shorten the cap) and a worker stream whose
person never answers (the suite's Rogue), over loopback gRPC."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from tests.integration.test_worker_trust import Rogue
from tests.support.cluster import Cluster, free_port, write_config
from worker import app
from worker.config import PROMPT_TIMEOUT_MAX_S, Paths, UiSection, load
from worker.hub import server
from worker.hub.client import ControlClient
from worker.hub.server import SCOPE_WAIT_MAX_MS, Hub
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.transport import read_token

FOREVER_MS = 2**32 - 1  # the largest timeout_ms: 49.7 days


@contextlib.asynccontextmanager
async def hub_here(home: Path) -> AsyncIterator[tuple[Hub, Cluster, ControlClient]]:
    """A hub in this event loop, what Rogue needs of a cluster, and a caller."""
    write_config(home, f"127.0.0.1:{free_port()}")
    paths = Paths(home, home)
    running = await app.start_hub(paths, load(paths))
    live = cast(Cluster, SimpleNamespace(home=home, listen=running.address))
    client = ControlClient.connect(running.address, read_token(paths.token_file))
    try:
        yield running.hub, live, client
    finally:
        await client.close()
        await running.stop()


def _ask(client: ControlClient, worker_id: str, agent: str) -> Any:
    request = pb.RequestScopeRequest(
        worker_id=worker_id,
        agent_id=agent,
        plan_id="p",
        scopes=["workerHost.fs_write"],
        reason="a test asks",
        timeout_ms=FOREVER_MS,
    )
    return asyncio.ensure_future(client.stub.RequestScope(request, metadata=client.metadata))


async def _asked(rogue: Rogue, count: int) -> None:
    """Until the worker's stream has been sent `count` scope requests."""
    while len(rogue.scope_requests) < count:
        rogue.asked.clear()
        await asyncio.wait_for(rogue.asked.wait(), 20)


def test_the_scope_requests_sent_on_a_stream_are_answered_when_it_ends(tmp_path: Path) -> None:
    async def scenario() -> list[pb.ScopeDecision]:
        async with hub_here(tmp_path) as (hub, live, client):
            rogue = Rogue(live)  # its person never answers
            await rogue.welcomed.wait()
            asks = [_ask(client, rogue.worker_id, f"agent-{n}") for n in range(3)]
            await _asked(rogue, len(asks))
            await rogue.close()
            answers = await asyncio.wait_for(asyncio.gather(*asks), 20)
            assert hub._scope_waiters == {}, "none is left waiting"
            return answers

    answers = asyncio.run(scenario())
    assert [a.granted for a in answers] == [False] * 3
    assert all(a.reason.startswith("cancelled: the worker's stream ended") for a in answers)


def test_a_scope_requests_wait_is_cut_to_the_longest_a_prompt_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The longest prompt, and a minute for its answer to come back.
    assert SCOPE_WAIT_MAX_MS == (PROMPT_TIMEOUT_MAX_S + 60) * 1000
    assert UiSection.model_fields["prompt_timeout_s"].metadata[-1].le == PROMPT_TIMEOUT_MAX_S
    monkeypatch.setattr(server, "SCOPE_WAIT_MAX_MS", 300)  # 0.3 s here, not an hour

    async def scenario() -> pb.ScopeDecision:
        async with hub_here(tmp_path) as (_hub, live, client):
            rogue = Rogue(live)
            await rogue.welcomed.wait()
            try:
                return await asyncio.wait_for(_ask(client, rogue.worker_id, "agent-1"), 20)
            finally:
                await rogue.close()

    answer = asyncio.run(scenario())
    assert not answer.granted and answer.reason == "no answer in time (waited 0.3 s)", answer
