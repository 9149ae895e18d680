"""The hub's writer holds a request back while the worker has other calls of its in
hand (Nagle's rule, for calls): one caller's calls, one at a time, never wait."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from worker.hub import server
from worker.hub import session as session_module
from worker.hub.server import Hub
from worker.hub.session import HOLD_S, Session
from worker.hub.store import HubStore
from worker.wire.framing import PART_BYTES
from worker.wire.proto import agentworker_pb2 as pb


def hub_and_session(tmp_path: Path) -> tuple[Hub, Session]:
    hub = Hub(HubStore(tmp_path / "hub.db"))
    return hub, Session(hello=pb.Hello(worker_id="w"), session_id="s")


def test_a_lone_call_is_not_held(tmp_path: Path) -> None:
    async def go() -> None:
        hub, session = hub_and_session(tmp_path)
        hub._open_calls["w"] = 1  # this one, being sent
        assert hub._hold(session) is None
        hub._open_calls["w"] = 3  # and two more, all three queued to go together
        session.outbox.put_nowait(b"a")
        session.outbox.put_nowait(b"b")
        assert hub._hold(session) is None
        hub.store.close()

    asyncio.run(go())


def test_a_call_is_held_until_results_come_and_the_loop_runs_out_of_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the worker's results come, the batch still waits while other work is ready
    (in `up`, the worker's; anywhere, the next Dispatches gRPC hands over)."""
    # Only the results and the loop count (the Hub's timer, and the Session's idle wait).
    for module in (server, session_module):
        monkeypatch.setattr(module, "HOLD_S", 3600)

    async def go() -> None:
        hub, session = hub_and_session(tmp_path)
        hub._open_calls["w"] = 2  # another call is at the worker
        held = hub._hold(session)
        assert held is not None and not held.done()
        seen: list[bool] = []

        def other_work(turns: int) -> None:
            seen.append(held.done())
            if turns > 1:
                asyncio.get_running_loop().call_soon(other_work, turns - 1)

        other_work(10)
        session.settle()  # what the reader does when the worker's results come
        session.settle()  # results twice before the loop idles: one wait
        await held
        assert seen == [False] * 10, "the batch went while other work was ready"
        hub.store.close()

    asyncio.run(go())


def test_a_call_is_held_until_results_come_or_the_hold_ends(tmp_path: Path) -> None:
    async def go() -> None:
        hub, session = hub_and_session(tmp_path)
        hub._open_calls["w"] = 2  # another call is at the worker
        held = hub._hold(session)
        assert held is not None and not held.done()
        session.settle()  # what the reader does when the worker's results come
        async with asyncio.timeout(60):
            await held
        timed = hub._hold(session)  # no results this time: the hold ends by itself
        assert timed is not None
        async with asyncio.timeout(HOLD_S + 5):
            await timed
        hub.store.close()

    asyncio.run(go())


def test_calls_the_worker_said_are_running_hold_nothing(tmp_path: Path) -> None:
    """A long call (an exec of minutes) is acked STARTED: its result is not on its way,
    so one caller's quick calls beside it go at once."""

    async def go() -> None:
        hub, session = hub_and_session(tmp_path)
        hub._open_calls["w"] = 2  # a long call at the worker, and this one
        hub._waiters["long"] = [asyncio.get_running_loop().create_future()]  # its caller
        started = pb.ActionAck(correlation_ids=["long"], kind=pb.ActionAck.STARTED)
        hub._handle(session, pb.WorkerMessage(ack=started), None)
        assert hub._hold(session) is None
        done = pb.ActionResult(correlation_id="long", status=pb.ActionResult.OK)
        hub._handle(session, pb.WorkerMessage(result=done), None)
        assert session.running == set()
        hub.store.close()

    asyncio.run(go())


def test_a_call_carrying_a_large_blob_holds_nothing(tmp_path: Path) -> None:
    """A 16 MiB fs_write takes longer than HOLD_S from the moment it enters, not only once
    the worker acks it STARTED: a quick call beside it goes at once. Beside a quick call,
    the same call is held."""

    async def go() -> None:
        hub, session = hub_and_session(tmp_path)
        hub.sessions["w"] = session  # connected; nothing reads its stream

        async def beside(blob: bytes) -> asyncio.Future[None] | None:
            request = pb.DispatchRequest(
                agent_id="a", surface="workerHost", action="fs_write", args_json="{}"
            )
            call = asyncio.create_task(hub._dispatch(request, blob))
            while session.outbox.empty():  # sent: its request waits on the stream
                await asyncio.sleep(0)
            session.outbox.get_nowait()  # taken by the writer, as it goes
            hub._open_calls["w"] += 1  # and a quick call, being sent now
            held = hub._hold(session)
            hub._open_calls["w"] -= 1
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await call
            return held

        assert await beside(bytes(PART_BYTES + 1)) is None
        quick = await beside(b"small")
        assert quick is not None
        session.release()
        hub.store.close()

    asyncio.run(go())
