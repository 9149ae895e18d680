"""A server's calls are told and sent to that server only (review10 finding 16).

The worker here is the real one (app.build_dispatcher, its ledger, WorkerConnection)
over real loopback gRPC, started again with the same data folder against server A,
then server B (another address), then A again; A and B are scripted hubs, the far
side. Before the fix B's Hello listed A's unacked ids and B was sent A's exec output.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.cluster import write_config
from tests.support.scripted_hub import TOKEN, ScriptedHub
from worker import app
from worker.config import Paths, load
from worker.core.connection import Backoff, FatalConnectionError, Target, WorkerConnection
from worker.core.ledger import Seen, State
from worker.wire.proto import agentworker_pb2 as pb

SECRET = b"SECRET-OF-SERVER-A-0123456789\n"
CAT = '{"argv": ["cat", "secret.txt"]}'
READ = '{"path": "secret.txt"}'


@contextlib.asynccontextmanager
async def worker_at(
    home: Path, hub: ScriptedHub, *, recover: bool = True
) -> AsyncIterator[WorkerConnection]:
    """A worker started on `home`'s data folder against `hub`, as `run` starts one
    (calls left running by an earlier start are answered outcome_unknown first, unless
    not `recover`: as a session that dropped and was dialled again finds them)."""
    paths = Paths(home, home)
    dispatcher = app.build_dispatcher(paths, load(paths))
    asyncio.get_running_loop().set_default_executor(dispatcher.threads)
    if recover:
        dispatcher.recover()
    address = hub.address or await hub.start()
    link = WorkerConnection(
        dispatcher, Target(address, TOKEN), heartbeat_s=0.2, backoff=Backoff(0.05, 0.2)
    )
    runner = asyncio.create_task(link.run())
    try:
        await asyncio.wait_for(link.connected.wait(), 30)
        yield link
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError, FatalConnectionError):
            await runner
        dispatcher.close()


async def left_running(home: Path, hub: ScriptedHub, cid: str) -> None:
    """`cid` claimed for `hub` in `home`'s ledger and never finished, as a crash leaves
    it (`hub` started; the worker's configured server is elsewhere)."""
    write_config(home, "127.0.0.1:1")
    await hub.start()
    paths = Paths(home, home)
    paths.ensure()
    ledger = State(paths.data_dir / "state.db")
    ledger.server = Target(hub.address, TOKEN).server_key
    assert ledger.claim(cid, "digest", "plan") is Seen.NEW
    ledger.close()


async def until_result(hub: ScriptedHub, *cids: str) -> list[pb.WorkerMessage]:
    """Every message from the worker up to and with the results of `cids`."""
    seen = []
    waiting = set(cids)
    async with asyncio.timeout(30):
        while waiting:
            msg = await hub.inbox.get()
            seen.append(msg)
            if msg.WhichOneof("kind") == "result":
                waiting.discard(msg.result.correlation_id)
    return seen


def results_of(messages: list[pb.WorkerMessage]) -> dict[str, pb.ActionResult]:
    return {m.result.correlation_id: m.result for m in messages if m.WhichOneof("kind") == "result"}


def shows_secret(messages: list[pb.WorkerMessage]) -> bool:
    return any(SECRET.strip() in m.SerializeToString() for m in messages)


def test_unacked_results_are_held_for_their_server_and_sent_when_it_is_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A's exec (recorded) and fs_read (held in memory, written at the stop) results
    are not acked; the worker comes back against B: B is told of neither, sent
    neither, and its ack of their ids lets nothing go; back against A, A has both."""

    async def go() -> None:
        write_config(tmp_path, "127.0.0.1:1")
        (tmp_path / "workspace" / "secret.txt").write_bytes(SECRET)
        a = ScriptedHub(ack_results=False)
        async with worker_at(tmp_path, a):
            a.request("a-1", CAT, surface="workerHost", action="exec")
            a.request("a-2", READ, surface="workerHost", action="fs_read")
            got = results_of(await until_result(a, "a-1", "a-2"))
            assert got["a-1"].status == pb.ActionResult.OK and SECRET in got["a-1"].blob
            assert got["a-2"].status == pb.ActionResult.OK
            assert shows_secret([pb.WorkerMessage(result=got["a-2"])])

        b = ScriptedHub()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="worker.core.connection"):
            async with worker_at(tmp_path, b):
                await b.dials(1)
                assert list(b.hellos[0].unacked_ids) == []
                assert list(b.hellos[0].running_ids) == []
                b.send(ack=pb.Ack(correlation_ids=["a-1", "a-2"]))  # lets nothing go
                b.request("b-1")
                seen = await until_result(b, "b-1")
                assert list(results_of(seen)) == ["b-1"]
                assert not shows_secret(seen)
        held = [r.getMessage() for r in caplog.records if "holding" in r.getMessage()]
        assert len(held) == 1, held  # once for the one session
        assert "holding 2 result(s)" in held[0] and f"plain://{a.address}#" in held[0]
        assert TOKEN not in held[0]
        await b.stop()

        async with worker_at(tmp_path, a):
            await a.dials(2)
            assert sorted(a.hellos[-1].unacked_ids) == ["a-1", "a-2"]
            again = results_of(await until_result(a, "a-1", "a-2"))
            assert again["a-1"].result_json == got["a-1"].result_json
            assert again["a-1"].blob == got["a-1"].blob
            assert again["a-2"].result_json == got["a-2"].result_json
            assert again["a-2"].blob == got["a-2"].blob
        await a.stop()

    asyncio.run(go())


def test_a_reused_id_from_another_server_is_refused_without_its_result(tmp_path: Path) -> None:
    """B sends the id of A's unacked call, with the same args and with others: both
    are refused as a mismatch (nothing of A's call told, nothing run), and A still
    gets its own result."""

    async def go() -> None:
        write_config(tmp_path, "127.0.0.1:1")
        (tmp_path / "workspace" / "secret.txt").write_bytes(SECRET)
        a = ScriptedHub(ack_results=False)
        async with worker_at(tmp_path, a):
            a.request("a-1", CAT, surface="workerHost", action="exec")
            first = results_of(await until_result(a, "a-1"))["a-1"]

        b = ScriptedHub()
        async with worker_at(tmp_path, b):
            b.request("a-1", CAT, surface="workerHost", action="exec")
            b.request("a-1", '{"argv": ["cat", "other.txt"]}', surface="workerHost", action="exec")
            b.request("a-1", READ, surface="workerHost", action="fs_read")  # no claim
            b.request("b-1")
            seen = await until_result(b, "b-1")
            refusals = [
                m.ack
                for m in seen
                if m.WhichOneof("kind") == "ack"
                and m.ack.kind == pb.ActionAck.REJECTED_ARGS_MISMATCH
            ]
            assert [list(ack.correlation_ids) for ack in refusals] == [["a-1"]] * 3
            assert all("another server" in ack.message for ack in refusals)
            assert list(results_of(seen)) == ["b-1"] and not shows_secret(seen)
        await b.stop()

        async with worker_at(tmp_path, a):  # A (still up) again
            back = results_of(await until_result(a, "a-1"))["a-1"]
            assert back.result_json == first.result_json and back.blob == first.blob
        await a.stop()

    asyncio.run(go())


def test_a_call_left_running_is_told_to_its_server_only(tmp_path: Path) -> None:
    """A call of A's that was running when the worker stopped (its claim, as a crash
    leaves it): B's Hello does not name it, and once the worker answers it
    outcome_unknown at its next start, B is not sent that either; A is told both."""

    async def go() -> None:
        a = ScriptedHub(ack_results=False)
        await left_running(tmp_path, a, "r-1")

        b = ScriptedHub(ack_results=False)
        async with worker_at(tmp_path, b) as link:
            link.dispatcher.state.begin("r-2", "d2", "p")  # B's own, left running too
            await b.dials(1)
            assert list(b.hellos[0].running_ids) == []
            assert list(b.hellos[0].unacked_ids) == []  # r-1: outcome_unknown, A's
            b.request("b-1")
            seen = await until_result(b, "b-1")
            assert list(results_of(seen)) == ["b-1"]
        async with worker_at(tmp_path, b):
            await b.dials(2)
            # Its own: b-1, and r-2 answered outcome_unknown at this start.
            assert sorted(b.hellos[1].unacked_ids) == ["b-1", "r-2"]
        await b.stop()

        async with worker_at(tmp_path, a):
            await a.dials(1)
            assert list(a.hellos[0].unacked_ids) == ["r-1"]
            lost = results_of(await until_result(a, "r-1"))["r-1"]
            assert lost.error.code == "outcome_unknown"
        await a.stop()

    asyncio.run(go())


def test_the_hello_names_only_the_running_calls_of_its_server(tmp_path: Path) -> None:
    """Without the restart's outcome_unknown (as a session that dropped while calls
    ran finds them): each server's Hello lists its own running ids only."""

    async def go() -> None:
        a, b = ScriptedHub(), ScriptedHub()
        await left_running(tmp_path, a, "r-a")
        async with worker_at(tmp_path, b, recover=False) as link:
            await b.dials(1)
            assert list(b.hellos[0].running_ids) == []
            assert link.dispatcher.state.running_ids(every_server=True) == ["r-a"]
        async with worker_at(tmp_path, a, recover=False):
            await a.dials(1)
            assert list(a.hellos[0].running_ids) == ["r-a"]
        await a.stop()
        await b.stop()

    asyncio.run(go())
