"""A call whose correlation id the caller chose is in hub.db before the worker gets it.

A hub killed between sending such a call and its next group commit came back not
knowing it; the worker's re-sent result was acked as one for an unknown call, the
worker let its blob go, and the caller's retry of the id got `blob_gone`."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path

from worker.hub.server import Hub
from worker.hub.session import Session
from worker.hub.store import HubStore
from worker.wire.proto import agentworker_pb2 as pb

CALL = {"agent_id": "a", "surface": "workerHost", "action": "fs_stat", "args_json": "{}"}


def _committed_state(db: Path, correlation_id: str) -> str | None:
    """The call's state as another connection sees it: only what was committed."""
    with sqlite3.connect(db) as other:
        row = other.execute(
            "SELECT state FROM calls WHERE correlation_id = ?", (correlation_id,)
        ).fetchone()
    return None if row is None else str(row[0])


def test_a_call_with_the_callers_id_is_committed_before_the_worker_gets_it(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        db = tmp_path / "hub.db"
        hub = Hub(HubStore(db))
        session = Session(hello=pb.Hello(worker_id="w"), session_id="s")
        hub.sessions["w"] = session
        call = pb.DispatchRequest(correlation_id="mine", worker_id="w", **CALL)
        dispatched = asyncio.create_task(hub.dispatch(call))
        await session.outbox.get()  # the request, as the worker's stream would take it
        assert _committed_state(db, "mine") == "PENDING"
        dispatched.cancel()
        hub.store.close()

    asyncio.run(go())


def _hub_db_held(db: Path) -> sqlite3.Connection:
    """Another process's writer holding hub.db's write lock (a backup, an sqlite3 shell)."""
    locker = sqlite3.connect(db, isolation_level=None, timeout=0)
    locker.execute("BEGIN IMMEDIATE")
    return locker


def _hub(db: Path) -> tuple[Hub, Session]:
    """A hub with worker "w" connected, whose commits give up at once on a held hub.db
    (SQLite's busy timeout is 10 s)."""
    hub = Hub(HubStore(db))
    hub.store._db.execute("PRAGMA busy_timeout = 0")
    session = Session(hello=pb.Hello(worker_id="w"), session_id="s")
    hub.sessions["w"] = session
    return hub, session


def _neither_recorded_nor_sent(hub: Hub, session: Session, db: Path, cid: str) -> None:
    """Nothing of the call went, nor goes later: the next commit does not write it, so
    no reconnect sends it."""
    assert session.outbox.empty()
    hub.store.flush()
    assert _committed_state(db, cid) is None and hub.store.get(cid) is None
    assert cid not in hub._blobs and cid not in hub._waiters
    assert hub.store.pending_for("w") == (0, 0)


def test_a_call_that_cannot_be_recorded_while_hub_db_is_held_is_refused_busy_not_sent(
    tmp_path: Path,
) -> None:
    """Its commit is made in the store's writer thread (review29 h1): there it fails on
    the lock another process holds, and the call is answered `busy` (before: made on
    the loop, refused `internal_error`)."""

    async def go() -> None:
        db = tmp_path / "hub.db"
        hub, session = _hub(db)
        locker = _hub_db_held(db)
        call = pb.DispatchRequest(
            correlation_id="unrecorded", worker_id="w", blob=b"x" * 10, **CALL
        )
        answer = await hub.dispatch(call)
        assert answer.result.error.code == "busy", answer
        assert "another process held hub.db" in answer.result.error.message
        assert "nothing was sent" in answer.result.error.message
        assert "same correlation id" in answer.result.error.message
        locker.rollback()
        locker.close()
        _neither_recorded_nor_sent(hub, session, db, "unrecorded")
        hub.store.close()

    asyncio.run(go())


def test_a_call_whose_commit_fails_otherwise_is_refused_internal_error_not_sent(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        db = tmp_path / "hub.db"
        hub, session = _hub(db)
        hub.store._db.execute("PRAGMA query_only = ON")  # every write fails: readonly
        call = pb.DispatchRequest(
            correlation_id="unrecorded", worker_id="w", blob=b"x" * 10, **CALL
        )
        answer = await hub.dispatch(call)
        assert answer.result.error.code == "internal_error", answer
        assert "nothing was sent" in answer.result.error.message
        assert "same correlation id" in answer.result.error.message
        hub.store._db.execute("PRAGMA query_only = OFF")
        _neither_recorded_nor_sent(hub, session, db, "unrecorded")
        hub.store.close()

    asyncio.run(go())


def test_a_store_commit_between_a_calls_record_and_its_commit_never_lets_it_go_unrecorded(
    tmp_path: Path,
) -> None:
    """The store timer's commit, made on the loop's turn after the call was added, took
    the call and failed on the held hub.db, while the call's own commit (empty) went
    through: the call was sent, not recorded. Now the call's commit takes it at once."""

    async def go() -> None:
        db = tmp_path / "hub.db"
        hub, session = _hub(db)
        # The timer's commit waits for the lock a while: the call's own comes meanwhile.
        hub.store._db.execute("PRAGMA busy_timeout = 1000")
        locker = _hub_db_held(db)
        loop = asyncio.get_running_loop()
        call = pb.DispatchRequest(correlation_id="mine", worker_id="w", **CALL)
        dispatched = asyncio.create_task(hub.dispatch(call))

        def timer_fires_once_added() -> None:  # at each turn of the loop, as it may
            if hub.store.has_unwritten:
                hub.store_results()
            elif not dispatched.done():
                loop.call_soon(timer_fires_once_added)

        loop.call_soon(timer_fires_once_added)
        sending = asyncio.create_task(session.outbox.get())
        await asyncio.wait([dispatched, sending], return_when=asyncio.FIRST_COMPLETED)
        assert not sending.done(), "sent while not recorded"
        sending.cancel()
        answer = dispatched.result()
        assert answer.result.error.code == "busy", answer
        locker.rollback()
        locker.close()
        _neither_recorded_nor_sent(hub, session, db, "mine")
        hub.store.close()

    asyncio.run(go())


def test_two_callers_of_one_id_while_hub_db_is_held_are_both_refused_busy(
    tmp_path: Path,
) -> None:
    """The second caller came while the first's commit was on its way: it committed on
    the loop (a commit that waited for hub.db there) and failed with the database's
    error. Now it waits for the first's commit, then makes its own, and both are
    answered; a caller leaving early leaves the others' waits."""

    async def go() -> None:
        db = tmp_path / "hub.db"
        hub, session = _hub(db)
        locker = _hub_db_held(db)
        call = pb.DispatchRequest(correlation_id="twice", worker_id="w", **CALL)
        answers = await asyncio.gather(hub.dispatch(call), hub.dispatch(call))
        assert [a.result.error.code for a in answers] == ["busy", "busy"], answers
        locker.rollback()
        locker.close()
        _neither_recorded_nor_sent(hub, session, db, "twice")
        hub.store.close()

    asyncio.run(go())


def test_a_caller_leaving_while_its_call_is_recorded_leaves_it_recorded_then_sent(
    tmp_path: Path,
) -> None:
    """The commit goes on without the caller (shielded), and the call goes to its worker
    once written, as one sent before its caller left does; no caller's wait is kept."""

    async def go() -> None:
        db = tmp_path / "hub.db"
        hub, session = _hub(db)
        hub.store._db.execute("PRAGMA busy_timeout = 60000")  # waits for the lock
        locker = _hub_db_held(db)
        call = pb.DispatchRequest(correlation_id="left", worker_id="w", blob=b"x" * 10, **CALL)
        dispatched = asyncio.create_task(hub.dispatch(call))
        while not hub.store.committing and not dispatched.done():
            await asyncio.sleep(0)  # a turn of the loop: the call on its way to its commit
        assert not dispatched.done()  # before: its commit held the loop, and failed
        dispatched.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await dispatched
        assert session.outbox.empty() and _committed_state(db, "left") is None
        locker.rollback()  # the other process lets hub.db go
        locker.close()
        await session.outbox.get()  # sent, once recorded
        assert _committed_state(db, "left") == "PENDING"
        assert "left" not in hub._waiters and "left" not in hub._blobs
        hub.store.close()

    asyncio.run(go())
