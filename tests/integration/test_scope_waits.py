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

from tests.integration.test_local_link import up
from tests.integration.test_worker_trust import Rogue
from tests.support.cluster import Cluster, free_port, write_config
from worker import app
from worker.config import PROMPT_TIMEOUT_MAX_S, Paths, UiSection, load
from worker.core.approvals import ApprovalBroker, Choice, Decision
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


def test_a_scope_request_whose_stream_ended_is_withdrawn_from_the_person(tmp_path: Path) -> None:
    """review26: the hub answers a RequestScope "cancelled" as its worker's stream ends,
    but the worker kept the prompt open, and the person's answer after the reconnect
    went down the new stream as a decision on no request there (an unsolicited message,
    a warning in the hub's log). The worker now withdraws the prompt as the stream ends:
    it closes saying why, and nothing of it goes down the next stream. A real hub and
    worker in this process, over loopback gRPC; the person is the broker's `decide`."""

    async def scenario() -> None:
        async with up(tmp_path, local=False) as (hub, _link, worker):
            broker = ApprovalBroker(
                worker.dispatcher.state, worker.dispatcher.telemetry, always_attached=True
            )
            worker.answer_scopes = broker.scope_request
            told: list[tuple[str, dict[str, Any]]] = []
            news = asyncio.Event()

            def listen(kind: str, body: dict[str, Any]) -> None:
                told.append((kind, body))
                news.set()

            broker.listeners.append(listen)
            (worker_id,) = hub.sessions
            asked = pb.RequestScopeRequest(
                worker_id=worker_id, agent_id="agent-1", plan_id="p", scopes=["workerHost.fs_write"]
            )
            ask = asyncio.ensure_future(hub.request_scope(asked))
            try:
                while not broker.pending():  # the prompt is on the person's screen
                    news.clear()
                    await asyncio.wait_for(news.wait(), 20)
                (prompt,) = broker.pending()
                started = worker.sessions_started
                hub.sessions[worker_id].close()  # the stream ends
                answer = await asyncio.wait_for(ask, 20)
                assert not answer.granted and "withdrew the question" in answer.reason, answer
                while worker.sessions_started == started or not worker.connected.is_set():
                    await asyncio.sleep(0.01)  # the worker is back, on a new stream
                assert broker.pending() == [], "the prompt stays after its stream ended"
                closed = [body for kind, body in told if kind == "prompt_closed"]
                assert closed and closed[0]["reason"].startswith(
                    "withdrawn: the server's stream ended"
                ), closed
                # The person answers what they saw: it no longer waits, nothing is sent.
                late = broker.decide(prompt.id, Decision(Choice.DENY))
                # A call through the new stream: anything sent before its answer has come.
                done = pb.DispatchResponse.FromString(
                    await hub.dispatch_serialized(_stat(), None)
                ).result
                assert done.status == pb.ActionResult.OK, done.error.message
                assert late is None, "the person answered a request nobody waits for"
                assert hub.sessions[worker_id].unsolicited == 0
            finally:
                broker.close_all("the test ends")

    asyncio.run(scenario())


def _stat() -> pb.DispatchRequest:
    return pb.DispatchRequest(
        agent_id="tester", surface="workerHost", action="fs_stat", args_json='{"path": "."}'
    )
