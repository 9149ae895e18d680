"""What pruning frees in state.db and hub.db goes back to the file system, beyond the
4 MiB of free pages kept for the next writes (worker.db.give_back_free_pages)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from pathlib import Path

from worker import db
from worker.clock import now_ms
from worker.core.ledger import State
from worker.hub.store import CALLS_KEPT_MS, HubStore
from worker.wire.proto import agentworker_pb2 as pb

DAY_MS = 24 * 3600 * 1000
GROWN_BYTES = 24 * 1024 * 1024
ROW_BYTES = 96 * 1024  # an fs_list's answer, or a call's args: rows, not blob files
# Pages in use after pruning (the schema, the rows kept) and the log's last frames.
SLACK_BYTES = 1024 * 1024


def _file_bytes(path: Path) -> int:
    """The database file and its log, once the log is copied in."""
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return sum(
        Path(f"{path}{suffix}").stat().st_size
        for suffix in ("", "-wal")
        if Path(f"{path}{suffix}").exists()
    )


def test_pruned_results_of_the_ledger_go_back_to_the_file_system(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    state = State(path)
    state.server = "server-key"
    calls = GROWN_BYTES // ROW_BYTES
    for i in range(calls):
        cid = f"call-{i}"
        state.begin(cid, "digest", "plan")
        state.finish(cid, os.urandom(ROW_BYTES))  # a large result, kept in its row
    state.ack([f"call-{i}" for i in range(calls)])
    state.connection.execute("UPDATE calls SET finished_ms = ?", (now_ms() - DAY_MS,))
    grown = _file_bytes(path)
    assert grown > GROWN_BYTES

    assert state.prune() == calls
    db.give_back_free_pages(state.connection)

    after = _file_bytes(path)
    assert after <= db.FREE_BYTES_KEPT + SLACK_BYTES, (grown, after)
    state.close()


def test_pruned_calls_of_the_hub_go_back_to_the_file_system(tmp_path: Path) -> None:
    path = tmp_path / "hub.db"
    store = HubStore(path)
    args = "x" * ROW_BYTES
    for i in range(GROWN_BYTES // ROW_BYTES):
        request = pb.ActionRequest(
            correlation_id=f"call-{i}",
            plan_id="plan",
            agent_id="agent",
            surface="workerHost",
            action="fs_stat",
            args_json=args,
        )
        store.add("worker", "digest", request, 0, deadline_ms=1, fresh=True)
    store.flush()
    grown = _file_bytes(path)
    assert grown > GROWN_BYTES

    assert store.prune(now=now_ms() + CALLS_KEPT_MS + 1) == GROWN_BYTES // ROW_BYTES
    db.give_back_free_pages(store.path)

    after = _file_bytes(path)
    assert after <= db.FREE_BYTES_KEPT + SLACK_BYTES, (grown, after)
    store.close()


def test_a_give_back_cancelled_stops_and_what_it_gave_stays_given(tmp_path: Path) -> None:
    """The worker stopping mid-way: the thread ends within a step, the rest waits for
    the next prune, and the database is whole."""
    path = tmp_path / "t.db"
    conn = db.connect(path, "CREATE TABLE IF NOT EXISTS t (v BLOB);")
    db.write_many(conn, "INSERT INTO t VALUES (?)", [(os.urandom(ROW_BYTES),) for _ in range(256)])
    conn.execute("DELETE FROM t")
    free = conn.execute("PRAGMA freelist_count").fetchone()[0]

    async def cancelled_at_once() -> None:
        task = asyncio.create_task(db.give_back_off_loop(conn))
        await asyncio.sleep(0)  # started: its thread is given the work
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(cancelled_at_once())
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert asyncio.run(db.give_back_off_loop(conn)) <= free
    assert conn.execute("PRAGMA freelist_count").fetchone()[0] == (
        db.FREE_BYTES_KEPT // db.PAGE_BYTES
    )
    db.close(conn)
