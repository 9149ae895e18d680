"""Calls to a worker that is away wait in hub.db, their requests whole, bounded
(review17 E4): one caller's Dispatches of 1 MiB args to a worker away, each caller
hanging up at once, grew hub.db 17 MB/s with no bound, kept up to 48 h. Past
PENDING_AWAY_CALLS calls (or PENDING_AWAY_BYTES, or PENDING_BYTES for every worker)
the next is answered `busy` at once, stored nowhere.

A real hub (worker.app.start_hub) in the test's loop; the worker away is a hand-driven
stream that said Hello once (the far side)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.support.hub_inproc import Caller, DrivenHub, HandWorker, driven_hub
from worker.hub import server as server_module
from worker.wire.proto import agentworker_pb2 as pb

BOUND = 3


def _call(worker_id: str, scope: str, args_json: str, **fields: Any) -> pb.DispatchRequest:
    """A Dispatch of `scope` (surface.action) to `worker_id`, in plan p of agent a."""
    surface, action = scope.split(".")
    return pb.DispatchRequest(
        worker_id=worker_id,
        plan_id="p",
        agent_id="a",
        surface=surface,
        action=action,
        args_json=args_json,
        **fields,
    )


def test_calls_past_the_bound_for_a_worker_away_are_answered_busy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_module, "PENDING_AWAY_CALLS", BOUND)
    home = tmp_path / "home"

    async def go() -> None:
        async with driven_hub(home) as hub:
            away = await hub.away()
            big = json.dumps({"argv": ["true"], "pad": "x" * 100_000})

            async def dispatch() -> pb.DispatchResponse | grpc.StatusCode:
                request = _call(away.worker_id, "workerHost.exec", big, timeout_ms=3_600_000)
                try:
                    reply: pb.DispatchResponse = await hub.caller.dispatch(request, timeout=0.5)
                    return reply
                except grpc.aio.AioRpcError as exc:  # the caller hangs up; the call waits
                    return exc.code()

            waited = [await dispatch() for _ in range(BOUND)]
            assert waited == [grpc.StatusCode.DEADLINE_EXCEEDED] * BOUND
            assert hub.store.pending_for(away.worker_id)[0] == BOUND
            refused = await dispatch()
            assert isinstance(refused, pb.DispatchResponse), refused
            assert refused.result.error.code == "busy"
            assert "away" in refused.result.error.message
            assert hub.store.pending_for(away.worker_id)[0] == BOUND  # not stored

    asyncio.run(go())


def test_a_retry_of_an_abandoned_call_goes_with_the_callers_args(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An abandoned call keeps no args in hub.db (review17 E3); a caller's retry of its
    id (the same args, by the digest) is sent with the caller's own, not the none kept."""
    monkeypatch.setattr(server_module, "RESULT_SLACK_S", 0.2)  # no answer comes anyway
    home = tmp_path / "home"

    async def go() -> None:
        async with driven_hub(home) as hub:
            worker = await hub.welcomed()  # takes calls, answers none
            request = _call(
                worker.worker_id,
                "workerDiag.probe",
                '{"sleep_ms": 1}',
                correlation_id="abandoned-then-retried",
                timeout_ms=100,
            )
            first = await hub.caller.dispatch(request, timeout=60)
            assert first.result.error.code == "timeout", first
            stored = hub.store.get("abandoned-then-retried")
            assert stored is not None and stored.state == "ABANDONED"
            assert stored.request.args_json == ""
            await hub.caller.dispatch(request, timeout=60)
            sent = await worker.until("request", 2)
            assert [r.args_json for r in sent] == ['{"sleep_ms": 1}'] * 2
            assert sent[1].attempt == 2

    asyncio.run(go())


def test_a_blob_for_a_worker_away_goes_when_its_caller_does(tmp_path: Path) -> None:
    """review17 E7: a call's blob is held until the call is answered, in case it must
    be sent again; for a worker away whose caller left, it stayed in the hub's memory,
    no longer counted in held_blobs_mib, until the worker came back (24 x 16 MiB: +400
    MB). Now it goes with the caller; the call stays, for a retry that brings it."""
    home = tmp_path / "home"

    async def go() -> None:
        async with driven_hub(home) as hub:
            away = await hub.away()
            request = _blob_call(away.worker_id, "workerHost.fs_write", '{"path": "f"}')
            with pytest.raises(grpc.aio.AioRpcError) as left:
                await hub.caller.dispatch(request, timeout=0.5)
            assert left.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await _blob_gone_call_kept(hub, request.correlation_id)

    asyncio.run(go())


def test_a_blob_for_a_connected_worker_that_answers_nothing_goes_when_its_caller_does(
    tmp_path: Path,
) -> None:
    """review18 F3: with the worker connected, a blob whose callers had left stayed in
    the hub's memory until the call was answered, uncounted in held_blobs_mib: a worker
    that reads every request and answers none held 24 x 16 MiB (+402 MB). Now it goes
    with its last caller, as for a worker away."""
    home = tmp_path / "home"

    async def go() -> None:
        async with driven_hub(home) as hub:
            silent = await hub.welcomed()  # reads all, answers nothing
            request = _blob_call(silent.worker_id, "workerDiag.probe", "{}")
            call = hub.caller.dispatch(request, timeout=None)
            (sent,) = await silent.until("request")
            assert sent.correlation_id == request.correlation_id
            call.cancel()  # the caller leaves
            await _blob_gone_call_kept(hub, request.correlation_id)

    asyncio.run(go())


def _blob_call(worker_id: str, scope: str, args_json: str) -> pb.DispatchRequest:
    """A call with a blob of 2 MiB, waiting an hour for its worker."""
    return _call(
        worker_id,
        scope,
        args_json,
        correlation_id=f"blob-for-{worker_id}",
        blob=b"b" * (2 * 1024 * 1024),
        timeout_ms=3_600_000,
    )


async def _blob_gone_call_kept(hub: DrivenHub, cid: str) -> None:
    """Once the hub saw the call's caller gone: its blob gone, the call kept for a retry."""
    while hub.hub._waiters.get(cid):
        await asyncio.sleep(0.02)  # the hub sees the caller gone
    assert cid not in hub.hub._blobs
    stored = hub.store.get(cid)
    assert stored is not None and stored.state == "PENDING"  # kept, for a retry


async def _sent_and_left(
    caller: Caller, worker: HandWorker, args_json: str
) -> pb.DispatchResponse | None:
    """Dispatch a call to `worker` (reading every request, answering none) and hang up
    once the worker got it: the call waits in hub.db. The hub's answer instead when it
    refused the call before sending it."""
    before = len(worker.received.get("request", []))
    request = _call(worker.worker_id, "workerDiag.probe", args_json, timeout_ms=3_600_000)
    call = caller.dispatch(request, timeout=None)
    answered = asyncio.ensure_future(call)
    got = asyncio.ensure_future(worker.until("request", before + 1))
    done, _ = await asyncio.wait({answered, got}, return_when=asyncio.FIRST_COMPLETED)
    if answered in done:  # refused before it went
        got.cancel()
        reply: pb.DispatchResponse = answered.result()
        return reply
    call.cancel()  # the caller hangs up; the call waits
    return None


def _waiting_in_hub_db(hub: DrivenHub) -> dict[str, tuple[int, int]]:
    """What hub.db holds pending, by worker: calls, their requests' bytes (a reader of
    its own, once the hub committed what it recorded)."""
    hub.store.flush()
    with contextlib.closing(sqlite3.connect(hub.home / "hub.db")) as db:
        rows = db.execute(
            "SELECT worker_id, count(*), sum(length(request)) FROM calls"
            " WHERE state = 'PENDING' GROUP BY worker_id"
        ).fetchall()
    return {worker_id: (count, size) for worker_id, count, size in rows}


def test_calls_past_the_bound_for_a_connected_worker_that_answers_none_are_answered_busy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review18's r7: with the worker connected, reading every request and answering
    none, calls whose callers left waited in hub.db with their args whole and no bound
    (100 of 1 MiB: 105 MB). Past the bound, `busy`, counted at every Dispatch."""
    monkeypatch.setattr(server_module, "PENDING_AWAY_CALLS", BOUND * 2)
    home = tmp_path / "home"

    async def go() -> None:
        async with driven_hub(home) as hub:
            silent = await hub.welcomed()  # reads all, answers nothing
            big = json.dumps({"pad": "x" * 100_000})
            answers = [await _sent_and_left(hub.caller, silent, big) for _ in range(BOUND * 2 + 3)]
            assert answers[: BOUND * 2] == [None] * (BOUND * 2)
            refused = answers[BOUND * 2 :]
            assert all(a is not None and a.result.error.code == "busy" for a in refused)
            assert refused[0] is not None
            assert "has answered none" in refused[0].result.error.message
            while hub.hub._waiters:
                await asyncio.sleep(0.02)  # the hub sees every caller gone
            waiting = _waiting_in_hub_db(hub)[silent.worker_id]
            assert waiting[0] == BOUND * 2
            assert hub.store.pending_for(silent.worker_id) == waiting

    asyncio.run(go())


def test_the_bound_for_a_connected_worker_holds_across_its_streams(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review19 A4 (1): the count lived on the worker's session, so each new stream of
    an id took 32 Dispatches unchecked: one made-up id dialling again between them held
    191 MiB after 6 streams (bound 64). Counted by worker id, the bound holds whatever
    the streams."""
    monkeypatch.setattr(server_module, "PENDING_AWAY_CALLS", BOUND)
    home = tmp_path / "home"

    async def go() -> None:
        async with driven_hub(home) as hub:
            first = hub.hand()  # reads all, answers nothing
            big = json.dumps({"pad": "x" * 100_000})
            answers: list[pb.DispatchResponse | None] = []
            silent = first
            for _stream in range(3):
                await silent.until("welcome")
                answers += [await _sent_and_left(hub.caller, silent, big) for _ in range(2)]
                await hub.gone(silent)
                silent = hub.back(first)
            await silent.close()
            waiting = _waiting_in_hub_db(hub).get(first.worker_id, (0, 0))
            assert waiting[0] == BOUND, answers
            assert answers[:BOUND] == [None] * BOUND
            assert all(a is not None and a.result.error.code == "busy" for a in answers[BOUND:])

    asyncio.run(go())


def test_the_bound_for_every_worker_holds_for_workers_connected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review19 A4 (2): the bound on the requests waiting for every worker together
    (PENDING_BYTES) was not counted for a worker connected: 5 silent workers, each
    held to its own 64 MiB, held 324 MiB (bound 256). It holds for them too."""
    big = json.dumps({"pad": "x" * 100_000})
    monkeypatch.setattr(server_module, "PENDING_BYTES", 250_000)  # two such calls, not three
    home = tmp_path / "home"

    async def go() -> None:
        async with driven_hub(home) as hub:
            silents = [hub.hand() for _ in range(2)]
            for silent in silents:
                await silent.until("welcome")
            answers = [await _sent_and_left(hub.caller, silent, big) for silent in silents * 2]
            assert answers[:2] == [None, None]
            for refused in answers[2:]:
                assert refused is not None and refused.result.error.code == "busy"
                assert "wait in hub.db for their workers" in refused.result.error.message
            waiting = _waiting_in_hub_db(hub)
            assert sum(size for _, size in waiting.values()) <= 250_000, waiting
            assert hub.store.pending.total_bytes == sum(size for _, size in waiting.values())

    asyncio.run(go())


def test_the_bound_for_a_connected_worker_holds_while_a_commit_is_in_the_writer_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review19 A4 (3): the count was skipped while a commit was in the store's writer
    thread (a query then waited for it): with large results committed there one after
    another, a silent worker held 248 MiB in one session (bound 64). Counted in memory,
    a Dispatch is weighed while the commit is under way, and waits for none of it."""
    monkeypatch.setattr(server_module, "PENDING_AWAY_CALLS", BOUND)
    # Before review19 A4, each Dispatch was counted (every PENDING_CHECK_EVERY) unless a
    # commit was in the writer thread: here each, so that only the commit skipped it.
    monkeypatch.setattr(server_module, "PENDING_CHECK_EVERY", 1, raising=False)
    # No group commit on the loop meanwhile: it would wait for the one held.
    monkeypatch.setattr(server_module, "STORE_DELAY_S", 3600.0)
    home = tmp_path / "home"

    async def go() -> None:
        async with driven_hub(home) as hub:
            silent = await hub.welcomed()  # reads all, answers nothing
            big = json.dumps({"pad": "x" * 100_000})
            store = hub.store
            locker = sqlite3.connect(home / "hub.db", timeout=0)
            try:
                assert await _sent_and_left(hub.caller, silent, big) is None
                # Another writer holds hub.db: the commit of that call, handed to the
                # writer thread, waits for it.
                locker.execute("BEGIN IMMEDIATE")
                commit = store.complete_off_loop([])
                answers = [await _sent_and_left(hub.caller, silent, big) for _ in range(BOUND + 1)]
                assert not commit.done() and store.committing  # all of them meanwhile
                locker.rollback()
                assert await asyncio.wrap_future(commit) == []
                assert answers[: BOUND - 1] == [None] * (BOUND - 1), answers
                for refused in answers[BOUND - 1 :]:
                    assert refused is not None and refused.result.error.code == "busy"
                waiting = _waiting_in_hub_db(hub)[silent.worker_id]
                assert waiting[0] == BOUND
                assert store.pending_for(silent.worker_id) == waiting
            finally:
                locker.close()

    asyncio.run(go())
