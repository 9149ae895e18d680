"""A call whose correlation id the caller chose is in hub.db before the worker gets it.

A hub killed between sending such a call and its next group commit came back not
knowing it; the worker's re-sent result was acked as one for an unknown call, the
worker let its blob go, and the caller's retry of the id got `blob_gone`."""

from __future__ import annotations

import asyncio
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


def test_a_call_that_cannot_be_recorded_is_not_sent(tmp_path: Path) -> None:
    async def go() -> None:
        hub = Hub(HubStore(tmp_path / "hub.db"))
        session = Session(hello=pb.Hello(worker_id="w"), session_id="s")
        hub.sessions["w"] = session

        def broken() -> None:
            raise sqlite3.OperationalError("disk I/O error")

        working_flush = hub.store.flush
        hub.store.flush = broken  # type: ignore[method-assign]
        call = pb.DispatchRequest(
            correlation_id="unrecorded", worker_id="w", blob=b"x" * 10, **CALL
        )
        answer = await hub.dispatch(call)
        assert answer.result.error.code == "internal_error"
        assert "nothing was sent" in answer.result.error.message
        assert "same correlation id" in answer.result.error.message
        assert session.outbox.empty()
        # Nor is it later: the next commit does not write it, so no reconnect sends it.
        hub.store.flush = working_flush  # type: ignore[method-assign]
        hub.store.flush()
        assert hub.store.get("unrecorded") is None and "unrecorded" not in hub._blobs

    asyncio.run(go())
