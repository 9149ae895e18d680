"""The reference hub's store stays bounded: it never holds a request blob, holds a
result blob only until a caller takes it, and forgets calls after their keeping time."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from worker.core.ledger import ALL_PLANS, now_ms
from worker.core.registry import MIB
from worker.hub import store as store_module
from worker.hub.store import (
    CALLS_KEPT_MS,
    KILL_REASON_BYTES,
    KILLS_KEPT,
    HubStore,
    Kept,
)
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.protocol import plan_digest


def _request(cid: str) -> pb.ActionRequest:
    return pb.ActionRequest(
        correlation_id=cid, surface="workerHost", action="fs_write", args_json="{}"
    )


# The calls table as a hub.db from before result blobs and plans were kept had it.
_CALLS_BEFORE = (
    "CREATE TABLE calls (correlation_id TEXT PRIMARY KEY, worker_id TEXT NOT NULL,"
    " args_digest TEXT NOT NULL, request BLOB NOT NULL, state TEXT NOT NULL,"
    " result BLOB, created_ms INTEGER NOT NULL, deadline_ms INTEGER NOT NULL)"
)


def _written_before(path: Path, *statements: tuple[str, tuple[object, ...]]) -> None:
    """hub.db as an older hub left it: each (SQL, parameters) run, then committed."""
    with contextlib.closing(sqlite3.connect(path)) as old:
        for sql, parameters in statements:
            old.execute(sql, parameters)
        old.commit()


def _ok(cid: str) -> pb.ActionResult:
    return pb.ActionResult(correlation_id=cid, status=pb.ActionResult.OK, result_json="{}")


def _ok_with_blob(cid: str, blob: bytes) -> pb.ActionResult:
    result = _ok(cid)
    result.blob = blob
    return result


def test_request_blobs_are_never_stored_only_their_size(tmp_path: Path) -> None:
    store = HubStore(tmp_path / "hub.db")
    store.add("w", "digest-big", _request("big"), 2 * 1024 * 1024, now_ms() + 60_000)
    pending = store.get("big")
    assert pending is not None and pending.request.blob == b"" and pending.blob_bytes == 2 * MIB
    store.complete(_ok("big"))
    done = store.get("big")
    assert done is not None and done.args_digest == "digest-big" and done.result == _ok("big")
    store.close()
    assert os.path.getsize(tmp_path / "hub.db") < MIB


def test_a_result_blob_is_kept_only_until_a_caller_takes_it(tmp_path: Path) -> None:
    store = HubStore(tmp_path / "hub.db")
    blob = os.urandom(MIB)
    for cid in ("taken", "waiting"):
        store.add("w", "d", _request(cid), 0, now_ms() + 60_000)
    # A caller was waiting for "taken": only its outcome and the blob's size are kept.
    # Nobody was waiting for "waiting" (a hub restarted): its blob is kept for the caller.
    # (The hub reads a large result's blob apart from it: "taken" comes so.)
    store.complete_many(
        [
            (_ok("taken"), memoryview(blob), False, None),
            (_ok_with_blob("waiting", blob), None, True, None),
        ]
    )
    taken = store.get("taken")
    assert taken is not None and taken.result is not None and taken.result.blob == b""
    assert taken.result_blob_bytes == MIB and taken.result_blob_gone
    waiting = store.get("waiting")
    assert waiting is not None and waiting.result is not None and waiting.result.blob == blob
    assert not waiting.result_blob_gone
    store.delivered(waiting)
    gone = store.get("waiting")
    assert gone is not None and gone.result_blob_gone and gone.result_blob_bytes == MIB
    store.close()


def test_prune_forgets_old_calls_and_keeps_live_ones(tmp_path: Path) -> None:
    store = HubStore(tmp_path / "hub.db")
    now = now_ms()
    store.add("w", "d1", _request("old-done"), 0, now + 1000)
    store.complete(_ok("old-done"))
    store.add("w", "d2", _request("pending"), 0, now + 60_000)
    store.add("w", "d3", _request("old-pending"), 0, now - 1000)
    assert store.prune(now) == 0, "nothing is old yet"
    # A day and ten seconds on: the finished call and the long-dead pending one go;
    # the pending call whose deadline is still within the keeping time stays.
    assert store.prune(now + CALLS_KEPT_MS + 10_000) == 2
    assert store.get("old-done") is None and store.get("old-pending") is None
    assert store.get("pending") is not None
    store.close()


def test_prune_off_the_loop_forgets_old_calls_in_batches_while_the_loop_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "PRUNE_BATCH_ROWS", 4)
    monkeypatch.setattr(store_module, "PRUNE_BATCH_BYTES", 300_000)
    store = HubStore(tmp_path / "hub.db")
    now = now_ms()
    large = {f"large-{i}" for i in range(6)}  # ~200 KB each: two to a batch
    small = {f"small-{i}" for i in range(9)}
    for cid in sorted(large | small):
        store.add("w", "d", _request(cid), 0, now + 1000)
        store.complete(_large_ok(cid) if cid in large else _ok(cid))
    store.add("w", "d", _request("pending"), 0, now + 60_000)
    store.add("w", "d", _request("old-pending"), 0, now - 1000)

    async def prune_beside_the_loop() -> tuple[int, int]:
        turns = 0

        async def other_work() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        beside = asyncio.create_task(other_work())
        gone = await store.prune_off_loop(now + CALLS_KEPT_MS + 10_000)
        beside.cancel()
        return gone, turns

    gone, turns = asyncio.run(prune_beside_the_loop())
    assert gone == len(large) + len(small) + 1
    assert turns >= 2, "the loop ran other work while the batches were written"
    assert _committed_ids(tmp_path / "hub.db") == {"pending"}
    store.close()


def test_a_hub_db_from_before_the_blob_column_still_opens(tmp_path: Path) -> None:
    path = tmp_path / "hub.db"
    legacy = _request("legacy")
    legacy.blob = b"inline"
    _written_before(
        path,
        (_CALLS_BEFORE, ()),
        (
            "INSERT INTO calls VALUES ('legacy', 'w', 'd', ?, 'PENDING', NULL, 0, ?)",
            (legacy.SerializeToString(), now_ms() + 60_000),
        ),
    )
    store = HubStore(path)
    found = store.get("legacy")
    assert found is not None and found.request.blob == b"inline"
    store.close()


def _committed_ids(path: Path) -> set[str]:
    """What another connection (a restarted hub) would find."""
    conn = sqlite3.connect(path)
    try:
        return {cid for (cid,) in conn.execute("SELECT correlation_id FROM calls")}
    finally:
        conn.close()


def test_an_added_call_is_written_at_the_next_flush_and_read_back_before(tmp_path: Path) -> None:
    path = tmp_path / "hub.db"
    store = HubStore(path)
    deadline = now_ms() + 60_000
    assert store.add("w", "d", _request("c1"), 0, deadline) is True
    assert store.add("w", "d", _request("c1"), 0, deadline) is False  # known while queued
    assert _committed_ids(path) == set()  # no commit on the caller's path
    store.flush()
    assert _committed_ids(path) == {"c1"}
    assert store.add("w", "d", _request("c1"), 0, deadline) is False  # known once written
    store.add("w", "d", _request("c2"), 0, deadline)
    found = store.get("c2")  # a read flushes first
    assert found is not None and found.state == "PENDING"
    store.close()


def test_a_result_arriving_before_the_flush_stores_its_call_first(tmp_path: Path) -> None:
    path = tmp_path / "hub.db"
    store = HubStore(path)
    store.add("w", "d", _request("quick"), 0, now_ms() + 60_000)
    assert store.complete_many([(_ok("quick"), None, False, None)]) == [True]
    assert _committed_ids(path) == {"quick"}
    done = store.get("quick")
    assert done is not None and done.state == "DONE" and done.result == _ok("quick")
    store.close()


def test_calls_added_and_answered_between_commits_are_written_once_answered(
    tmp_path: Path,
) -> None:
    path = tmp_path / "hub.db"
    store = HubStore(path)
    deadline = now_ms() + 60_000
    store.add("w", "d-old", _request("written"), 0, deadline)
    store.flush()  # a call written pending before its answer came
    store.add("w", "d-new", _request("quick"), 7, deadline)  # answered before the commit
    store.add("w", "d-slow", _request("slow"), 0, deadline)  # not answered yet
    blob = os.urandom(100)
    answers = [
        (_ok("quick"), memoryview(blob), False, None),
        (_ok("written"), None, False, None),
        (_ok("stranger"), None, False, None),  # a result for a call this hub never sent
    ]
    assert store.complete_many(answers) == [True, True, False]
    assert _committed_ids(path) == {"written", "quick"}  # "slow": the next commit's
    assert store.complete_many([]) == []
    assert _committed_ids(path) == {"written", "quick", "slow"}
    quick = store.get("quick")
    assert quick is not None and quick.state == "DONE" and quick.result == _ok("quick")
    answered = _request("quick")
    answered.args_json = ""  # the answer's preview of them (it has none): answered_request
    assert quick.args_digest == "d-new" and quick.request == answered
    assert quick.blob_bytes == 7 and quick.deadline_ms == deadline
    assert quick.result_blob_bytes == 100 and quick.result_blob_gone
    written = store.get("written")
    assert written is not None and written.state == "DONE" and written.result == _ok("written")
    slow = store.get("slow")
    assert slow is not None and slow.state == "PENDING" and slow.result is None
    store.close()


def test_a_call_unanswered_at_a_commit_waits_for_the_next_and_is_written_once(
    tmp_path: Path,
) -> None:
    """Left for the next commit, a call answered meanwhile is written once, whole: no
    PENDING row, no UPDATE, no query for its state (a quarter of the calls at 64
    Dispatches in flight were written PENDING and updated). One still unanswered at
    that next commit is written PENDING by it."""
    path = tmp_path / "hub.db"
    store = HubStore(path)
    deadline = now_ms() + 60_000
    store.add("w", "d", _request("first"), 0, deadline)
    store.add("w", "d", _request("late"), 0, deadline)  # answered after the next commit
    store.add("w", "d", _request("later"), 0, deadline)  # answered after two commits
    made: list[str] = []
    store._db.set_trace_callback(made.append)
    assert store.complete_many([(_ok("first"), None, False, None)]) == [True]
    assert _committed_ids(path) == {"first"}
    assert store.call_state("late") == ("w", "PENDING")  # from memory
    assert store.complete_many([(_ok("late"), None, False, None)]) == [True]
    assert _committed_ids(path) == {"first", "late", "later"}  # "later": PENDING, now
    assert not [sql for sql in made if sql.startswith(("UPDATE", "SELECT"))]
    assert store.complete_many([(_ok("later"), None, False, None)]) == [True]
    store._db.set_trace_callback(None)
    for cid in ("first", "late", "later"):
        call = store.get(cid)
        assert call is not None and call.state == "DONE" and call.result == _ok(cid)
    assert store.pending_for("w") == (0, 0)
    store.close()


def test_close_writes_what_was_added(tmp_path: Path) -> None:
    path = tmp_path / "hub.db"
    store = HubStore(path)
    store.add("w", "d", _request("last"), 0, now_ms() + 60_000)
    store.close()
    assert _committed_ids(path) == {"last"}


def test_calls_whose_write_failed_stay_queued_for_the_next_flush(tmp_path: Path) -> None:
    path = tmp_path / "hub.db"
    store = HubStore(path)
    store.add("w", "d", _request("kept"), 0, now_ms() + 60_000)
    locker = sqlite3.connect(path, timeout=0)
    locker.execute("BEGIN IMMEDIATE")  # another writer holds the database: the far side
    store._db.execute("PRAGMA busy_timeout = 0")  # fail at once instead of after 10 s
    with pytest.raises(sqlite3.OperationalError):
        store.flush()
    locker.rollback()
    locker.close()
    store.flush()
    assert _committed_ids(path) == {"kept"}
    store.close()


def _large_ok(cid: str) -> pb.ActionResult:
    """A result past worker.db.OFF_LOOP_BYTES (a listing's JSON)."""
    entries = [{"name": f"entry-{i:05d}.txt", "size": i} for i in range(4000)]
    return pb.ActionResult(
        correlation_id=cid, status=pb.ActionResult.OK, result_json=json.dumps(entries)
    )


def test_a_commit_in_the_writer_thread_leaves_its_calls_found_and_takes_no_later_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "hub.db"
    store = HubStore(path)
    deadline = now_ms() + 60_000
    store.add("w", "d", _request("listed"), 0, deadline, fresh=True)
    store.add("w", "d", _request("running"), 0, deadline, fresh=True)
    locker = sqlite3.connect(path, timeout=0)
    locker.execute("BEGIN IMMEDIATE")  # another writer holds the database: the commit waits
    commit = store.complete_off_loop([(_large_ok("listed"), None, False, None)])
    # Meanwhile the loop goes on, never waiting for the commit: the calls it took are
    # found in memory, a call added now is not taken by it, nor lost.
    assert not commit.done() and store.committing
    assert store.call_state("running") == ("w", "PENDING")
    assert store.worker_of("listed") == "w"
    store.add("w", "d", _request("later"), 0, deadline, fresh=True)
    assert store.call_state("later") == ("w", "PENDING")
    locker.rollback()
    locker.close()
    assert commit.result(timeout=60) == [True]
    store.reap()
    assert not store.committing
    assert _committed_ids(path) == {"listed", "running"}  # "later": with the next commit
    listed = store.get("listed")  # a read of a call written: no commit (review29 h1)
    assert listed is not None and listed.state == "DONE" and listed.result == _large_ok("listed")
    assert _committed_ids(path) == {"listed", "running"}
    later = store.get("later")  # a read of a call not written yet: committed first
    assert later is not None and later.state == "PENDING"
    assert _committed_ids(path) == {"listed", "running", "later"}
    store.close()


def test_a_read_of_a_call_written_commits_nothing_and_goes_on_while_hub_db_is_held(
    tmp_path: Path,
) -> None:
    """`get` committed every call added first: while another process held hub.db, a read
    of a call written long ago waited for it (SQLite's busy timeout, 10 s) and failed."""
    path = tmp_path / "hub.db"
    store = HubStore(path)
    deadline = now_ms() + 60_000
    store.add("w", "d", _request("written"), 0, deadline)
    store.flush()
    store.add("w", "d", _request("unwritten"), 0, deadline)
    locker = sqlite3.connect(path, timeout=0)
    locker.execute("BEGIN IMMEDIATE")  # another writer holds the database: the far side
    store._db.execute("PRAGMA busy_timeout = 0")  # fail at once instead of after 10 s
    written = store.get("written")
    assert written is not None and written.state == "PENDING"
    with pytest.raises(sqlite3.OperationalError):
        store.get("unwritten")  # this one needs its commit
    locker.rollback()
    locker.close()
    unwritten = store.get("unwritten")
    assert unwritten is not None and unwritten.state == "PENDING"
    store.close()


def test_a_failed_commit_in_the_writer_thread_leaves_its_calls_for_the_next(
    tmp_path: Path,
) -> None:
    path = tmp_path / "hub.db"
    store = HubStore(path)
    store.add("w", "d", _request("kept"), 0, now_ms() + 60_000, fresh=True)
    locker = sqlite3.connect(path, timeout=0)
    locker.execute("BEGIN IMMEDIATE")  # another writer holds the database: the far side
    store._db.execute("PRAGMA busy_timeout = 0")  # fail at once instead of after 10 s
    commit = store.complete_off_loop([(_large_ok("kept"), None, False, None)])
    with pytest.raises(sqlite3.OperationalError):
        commit.result(timeout=60)
    assert store.call_state("kept") == ("w", "PENDING")  # still known: taken back
    locker.rollback()
    locker.close()
    store.flush()
    assert _committed_ids(path) == {"kept"}  # written pending: its result was not acked
    kept = store.get("kept")
    assert kept is not None and kept.state == "PENDING"
    store.close()


def test_a_read_after_a_failed_commit_in_the_writer_thread_finds_its_calls(
    tmp_path: Path,
) -> None:
    """Read before anything took the failed commit in: the call is back among those
    added, and committed for the read."""
    path = tmp_path / "hub.db"
    store = HubStore(path)
    store.add("w", "d", _request("kept"), 0, now_ms() + 60_000, fresh=True)
    locker = sqlite3.connect(path, timeout=0)
    locker.execute("BEGIN IMMEDIATE")
    store._db.execute("PRAGMA busy_timeout = 0")
    commit = store.complete_off_loop([])
    with pytest.raises(sqlite3.OperationalError):
        commit.result(timeout=60)
    locker.rollback()
    locker.close()
    kept = store.get("kept")
    assert kept is not None and kept.state == "PENDING"
    assert _committed_ids(path) == {"kept"}
    store.close()


def test_a_call_recorded_in_the_writer_thread_is_taken_back_should_its_commit_fail(
    tmp_path: Path,
) -> None:
    """Its caller is told it was not sent (worker.hub.server): no later commit writes
    it, whichever reads first after the commit failed; the calls beside it are kept."""
    path = tmp_path / "hub.db"
    store = HubStore(path)
    deadline = now_ms() + 60_000
    store.add("w", "d", _request("beside"), 0, deadline, fresh=True)
    store.add("w", "d", _request("chosen"), 0, deadline)
    assert store.pending_for("w")[0] == 2
    locker = sqlite3.connect(path, timeout=0)
    locker.execute("BEGIN IMMEDIATE")
    store._db.execute("PRAGMA busy_timeout = 0")
    commit = store.record_off_loop("chosen")
    with pytest.raises(sqlite3.OperationalError):
        commit.result(timeout=60)
    assert store.call_state("chosen") is None and store.pending_for("w")[0] == 1
    assert store.call_state("beside") == ("w", "PENDING")
    locker.rollback()
    locker.close()
    store.flush()
    assert _committed_ids(path) == {"beside"}
    assert store.add("w", "d", _request("chosen"), 0, deadline) is True  # a retry: new
    store.close()


def test_a_resent_result_restores_a_blob_its_first_delivery_let_go(tmp_path: Path) -> None:
    """Handed to a caller (the blob not kept), then the hub stopped before acking: the
    worker re-sends it, nobody waits now, and the blob is kept for the caller's retry."""
    store = HubStore(tmp_path / "hub.db")
    store.add("w", "d", _request("again"), 0, now_ms() + 60_000)
    blob = os.urandom(1000)
    assert store.complete_many([(_ok("again"), memoryview(blob), False, None)]) == [True]
    gone = store.get("again")
    assert gone is not None and gone.result_blob_gone
    assert store.complete_many([(_ok_with_blob("again", blob), None, True, None)]) == [False]
    kept = store.get("again")
    assert kept is not None and kept.result is not None and kept.result.blob == blob
    store.close()


def test_the_workers_a_plan_ran_on_are_found_written_or_not(tmp_path: Path) -> None:
    store = HubStore(tmp_path / "hub.db")
    deadline = now_ms() + 60_000
    for cid, worker, plan in (("a", "w1", "p"), ("b", "w3", "q"), ("c", "w1", "p")):
        request = _request(cid)
        request.plan_id = plan
        store.add(worker, "d", request, 0, deadline)
    store.flush()
    waiting = _request("d")
    waiting.plan_id = "p"
    store.add("w2", "d", waiting, 0, deadline)  # not written yet
    assert store.workers_of_plan("p") == {"w1", "w2"}
    assert store.workers_of_plan("q") == {"w3"}
    assert store.workers_of_plan("nowhere") == set()
    store.complete(_ok("d"))
    assert store.workers_of_plan("p") == {"w1", "w2"}
    store.close()


def test_a_hub_db_from_before_plans_were_kept_reads_them_from_its_requests(
    tmp_path: Path,
) -> None:
    path = tmp_path / "hub.db"
    ran = _request("ran")
    ran.plan_id = "p-old"
    insert = "INSERT INTO calls VALUES (?, ?, 'd', ?, 'DONE', NULL, 0, 0)"
    _written_before(
        path,
        (_CALLS_BEFORE, ()),
        (insert, ("ran", "w-old", ran.SerializeToString())),
        (insert, ("bad", "w", b"\xff")),
    )
    store = HubStore(path)
    assert store.workers_of_plan("p-old") == {"w-old"}
    store.close()


def test_kills_are_kept_numbered_and_bounded_one_row_a_plan(tmp_path: Path) -> None:
    """A kill is one row (never one per worker), numbered for the workers to confirm;
    past KILLS_KEPT the oldest go; they outlive the hub, and so does their epoch."""
    path = tmp_path / "hub.db"
    store = HubStore(path)
    first = store.kill("p", "stop").kill
    named = store.kill("q", "stop there", "w1").kill
    assert (first.seq, named.seq) == (1, 2)
    assert store.killed("p", "w2", 0) and not store.killed("p", "w2", first.seq)
    assert store.killed("q", "w1", 0) and not store.killed("q", "w2", 0)
    assert [k.plan_id for k in store.kills_after("w1", 0)] == ["p", "q"]
    assert [k.plan_id for k in store.kills_after("w2", 0)] == ["p"]
    again = store.kill("p", "again").kill  # numbered anew: reaches those that confirmed the first
    assert again.seq == 3 and store.killed("p", "w2", first.seq)
    assert [(k.plan_id, k.reason) for k in store.kills_after("w2", 2)] == [("p", "again")]
    store.kill("r", "\N{GRINNING FACE}" * 1000)  # cut in UTF-8 bytes, on a character
    assert store.kills_after("w9", 3)[0].reason == "\N{GRINNING FACE}" * (KILL_REASON_BYTES // 4)
    # A page: at most so many kills, and as many as fit in so many bytes (one at least).
    assert [k.plan_id for k in store.kills_after("w1", 0, 2)] == ["q", "p"]
    assert [k.plan_id for k in store.kills_after("w1", 0, 10, 1)] == ["q"]
    assert [k.plan_id for k in store.kills_after("w1", 0, 10, 30)] == ["q", "p"]
    epoch = store.kills_epoch
    store.seen_worker(pb.Hello(worker_id="w2"))
    assert store.kills_confirmed("w2") == 0
    store.touch_worker("w2", 10, kills_through=3)  # its session ended, confirmed through 3
    assert store.kills_confirmed("w2") == 3 and store.kills_confirmed("w-unknown") == 0
    store.close()

    store = HubStore(path)  # a restart: the same kills, the same numbers
    assert store.kills_epoch == epoch
    assert store.killed("p", "w2", 0) and store.killed("q", "w1", 2 - 1)
    for n in range(KILLS_KEPT):  # every worker confirms each (w2's mark is in hub.db)
        store.kill(f"made-up-{n}", "flood", connected={"w2": KILLS_KEPT + 4})
    # p and q were asked for by calls (plans in use): a flood of kills of plans never
    # dispatched prunes its own oldest and r (never asked for), not them.
    assert store.killed("p", "w2", 0) and store.killed("q", "w1", 0)
    assert not store.killed("r", "w2", 0) and not store.killed("made-up-1", "w2", 0)
    assert store.killed("made-up-2", "w2", 0)
    assert len(store.kills_after("w1", 0)) == KILLS_KEPT
    store.close()
    db = sqlite3.connect(path)
    assert db.execute("SELECT count(*) FROM kills").fetchone() == (KILLS_KEPT,)
    db.close()


def test_a_flood_of_kills_of_plans_never_dispatched_keeps_the_kills_of_plans_in_use(
    tmp_path: Path,
) -> None:
    """review14 finding 02: 1,000 kills of made-up plans pushed out a kill still owed to
    a worker away. A kill of a plan this hub sent a call of, placed, or refused a call
    of for the kill, goes only once KILLS_KEPT kills of plans in use are newer; a hub.db
    from before the mark counts its kills as in use."""
    path = tmp_path / "hub.db"
    store = HubStore(path)
    store.add("w", "d", pb.ActionRequest(correlation_id="c1", plan_id="sent"), 0, now_ms() + 1)
    store.kill("sent", "the person's")
    store.place("placed", "w")
    store.kill("placed", "the person's")
    store.kill("asked", "before its first call")
    assert store.killed("asked", "w", 0)  # its first call, refused: a plan in use now
    store.kill("never", "never called")
    for n in range(KILLS_KEPT + 1):
        store.kill(f"made-up-{n}", "flood")
    assert all(store.killed(plan, "w", 0) for plan in ("sent", "placed", "asked"))
    assert not store.killed("never", "w", 0)
    assert [k.plan_id for k in store.kills_after("w", 0)][:3] == ["sent", "placed", "asked"]
    store.close()
    store = HubStore(path)  # the mark outlives the hub
    for n in range(KILLS_KEPT):
        store.kill(f"more-{n}", "flood")
    assert all(store.killed(plan, "w", 0) for plan in ("sent", "placed", "asked"))
    store.close()

    db = sqlite3.connect(path)  # a hub.db from before the mark: its kills count as in use
    db.execute("DROP INDEX kills_by_use")  # nor its index
    db.execute("ALTER TABLE kills DROP COLUMN used")
    db.commit()
    db.close()
    store = HubStore(path)
    for n in range(KILLS_KEPT):
        store.kill(f"after-upgrade-{n}", "flood")
    assert store.killed("sent", "w", 0) and store.killed("more-5", "w", 0)
    store.close()


@pytest.mark.parametrize("pruning", ["prune", "prune_off_loop"])
def test_a_kill_of_a_plan_whose_calls_were_pruned_is_of_a_plan_in_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pruning: str
) -> None:
    """review19 A6: a plan dispatched, idle past CALLS_KEPT_MS (its call pruned), was
    "never dispatched" at its kill, so past KILLS_HELD (a worker away) the kill went
    first, not kept apart, owing nothing, and the worker back ran the plan. A pruned
    call's plan is remembered, by digest, for good (and across a restart)."""
    monkeypatch.setattr(store_module, "KILLS_HELD", 10)
    path = tmp_path / "hub.db"
    store = HubStore(path)
    store.seen_worker(pb.Hello(worker_id="away"))
    store.touch_worker("away", 10, kills_through=0)
    store.add("away", "d", pb.ActionRequest(correlation_id="c1", plan_id="victim"), 0, now_ms() + 1)
    assert store.complete(_ok("c1"))
    later = now_ms() + store_module.CALLS_KEPT_MS + 3_600_000
    if pruning == "prune":
        assert store.prune(now=later) == 1
    else:
        assert asyncio.run(store.prune_off_loop(now=later)) == 1
    assert not store.workers_of_plan("victim")
    assert store.kill("victim", "the person's").kill.in_use
    for n in range(11):  # a caller's kills of made-up plans, none dispatched
        assert not store.kill(f"made-up-{n}", "flood").stops
    assert store.killed("victim", "away", 0)
    assert not store.kill("never", "x").kill.in_use
    store.close()
    store = HubStore(path)
    assert store.kill("victim", "again").kill.in_use and not store.kill("none", "x").kill.in_use
    store.close()


def test_past_plans_remembered_every_plan_counts_as_in_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plans of pruned calls remembered are bounded (PLANS_REMEMBERED): past it no
    more are, and a kill of any plan counts as of a plan in use (fail closed)."""
    monkeypatch.setattr(store_module, "PLANS_REMEMBERED", 2)
    path = tmp_path / "hub.db"
    store = HubStore(path)
    for n in range(3):
        req = pb.ActionRequest(correlation_id=f"c{n}", plan_id=f"p{n}")
        store.add("w", "d", req, 0, now_ms() + 1)
        assert store.complete(_ok(f"c{n}"))
    assert not store.kill("before", "x").kill.in_use
    assert store.prune(now=now_ms() + store_module.CALLS_KEPT_MS + 3_600_000) == 3
    assert store.kill("never-dispatched", "x").kill.in_use
    store.close()
    db = sqlite3.connect(path)
    assert db.execute("SELECT count(*) FROM plans_dispatched").fetchone() == (2,)
    db.close()


def test_kills_queued_by_a_hub_db_from_before_are_kept_for_their_workers(tmp_path: Path) -> None:
    path = tmp_path / "hub.db"
    queued_kills = (
        "CREATE TABLE queued_kills (worker_id TEXT NOT NULL, plan_id TEXT NOT NULL,"
        " reason TEXT NOT NULL, created_ms INTEGER NOT NULL, PRIMARY KEY (worker_id, plan_id))"
    )
    _written_before(
        path, (queued_kills, ()), ("INSERT INTO queued_kills VALUES ('w1', 'p', 'stop', 1)", ())
    )
    store = HubStore(path)
    assert [(k.plan_id, k.reason) for k in store.kills_after("w1", 0)] == [("p", "stop")]
    assert store.kills_after("w2", 0) == [] and store.killed("p", "w1", 0)
    store.close()
    db = sqlite3.connect(path)
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
    db.close()
    assert "queued_kills" not in tables


def test_a_kill_tells_the_worker_whether_its_plan_is_in_use(tmp_path: Path) -> None:
    """KillPlan.in_use: of a plan dispatched before the kill, or whose call the hub
    refused for it (review14 finding 02, variant B: the worker never saw that call)."""
    store = HubStore(tmp_path / "hub.db")
    store.add("w", "d", pb.ActionRequest(correlation_id="c1", plan_id="sent"), 0, now_ms() + 1)
    assert store.kill("sent", "stop").kill.in_use
    assert not store.kill("asked", "stop").kill.in_use
    assert not store.kill("never", "stop").kill.in_use
    assert store.killed("asked", "w", 0)  # a call of it, refused here
    assert {k.plan_id: k.in_use for k in store.kills_after("w", 0)} == {
        "sent": True,
        "asked": True,
        "never": False,
    }
    store.close()


def test_a_kill_a_worker_has_not_confirmed_is_never_pruned_and_past_kills_held_it_is_owed_a_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review15 finding 01: a Dispatch of each made-up plan before its kill made the
    flood's kills "in use", and they pushed out the kill owed to a worker away: only
    kills every remembered worker confirmed are pruned. review16 E1: past KILLS_HELD of
    those a new kill was refused, for as long as the worker stayed away. Now it is kept,
    and the oldest unconfirmed go: of plans never in use first, owing nothing; of plans
    in use then, kept apart by digest (review16 F4: each owed the worker a kill of every
    plan); past KILLS_APART of those, a worker that had not confirmed one that went is
    owed a kill of every plan, once, never dropped; a worker that had confirmed, none."""
    monkeypatch.setattr(store_module, "KILLS_HELD", KILLS_KEPT + 10)
    monkeypatch.setattr(store_module, "KILLS_APART", 5)
    path = tmp_path / "hub.db"
    store = HubStore(path)
    for worker_id in ("away", "here"):
        store.seen_worker(pb.Hello(worker_id=worker_id))
        store.touch_worker(worker_id, 10, kills_through=0)
    store.kill("victim", "stop")
    store.killed("victim", "away", 0)  # a call of it: in use
    flood = KILLS_KEPT + 9
    for n in range(flood):
        kept = store.kill(f"made-up-{n}", "flood", connected={"here": n + 2})
        assert not kept.stops
    assert store.killed("victim", "away", 0) and store.stop_owed("away", 0) is None
    # Past KILLS_HELD: kept, never refused; the oldest of the plans never in use went,
    # and, being of plans never in use, they owe no stop.
    kept = store.kill("one-more", "flood", connected={"here": flood + 1})
    assert not kept.stops
    owed = [k.plan_id for k in store.kills_after("away", 0)]
    assert "made-up-0" not in owed and "made-up-1" in owed and "victim" in owed
    assert owed[-1] == "one-more" and ALL_PLANS not in owed

    # A flood of kills of plans in use (a call of each refused for its kill) pushes out
    # the rest, then the victim's, which is kept apart: still in force for the worker
    # away, sent to it by digest (or, to a worker before protocol 4, a stop in its place).
    def in_use_kill(plan: str) -> Kept:
        kept = store.kill(plan, "flood", connected={"here": store.kills_issued()})
        store.killed(plan, "away", 0)
        return kept

    n = 0
    while "victim" in [k.plan_id for k in store.kills_after("away", 0)]:
        assert not in_use_kill(f"in-use-{n}").stops
        n += 1
    assert store.killed("victim", "away", 0)
    assert not store.killed("victim", "here", store.kills_issued())  # it confirmed it
    assert not store.killed("never-killed", "away", 0)
    apart = [k for k in store.kills_after("away", 0) if not k.plan_id]
    assert [k.plan_digest for k in apart] == [plan_digest("victim")]
    assert apart[0].in_use and apart[0].seq == 1 and "digest" in store.kill_reason("victim", "away")
    stand_in = [k for k in store.kills_after("away", 0, by_digest=False) if k.seq == 1]
    assert [(k.plan_id, k.plan_digest) for k in stand_in] == [(ALL_PLANS, 0)]
    assert store.kills_after("here", store.kills_issued()) == []

    # Past KILLS_APART kept apart, the oldest go: the worker away is owed a stop.
    while not (kept := in_use_kill(f"in-use-{n}")).stops:
        n += 1
    assert plan_digest("victim") not in [k.plan_digest for k in store.kills_after("away", 0)]
    stop = kept.stops["away"]
    assert list(kept.stops) == ["away"] and stop.plan_id == ALL_PLANS and stop.in_use
    assert stop.seq > kept.kill.seq and "agentworker lift '*'" in stop.reason
    assert store.stop_owed("away", 0) == stop and store.stop_owed("here", stop.seq) is None
    # Every plan is killed for it at the hub until it confirms the stop.
    assert store.killed("any-plan", "away", kept.kill.seq) and "dropped" in store.kill_reason(
        "any-plan", "away"
    )
    assert not store.killed("any-plan", "away", stop.seq) and not store.killed("any-plan", "x", 0)
    for n in range(KILLS_KEPT):  # a flood on: one stop still, the rows bounded
        kept = in_use_kill(f"more-{n}")
        assert not kept.stops
    assert store.stop_owed("away", 0) == stop
    db = sqlite3.connect(path)
    assert db.execute("SELECT count(*) FROM kills").fetchone()[0] <= store_module.KILLS_HELD + 2
    assert db.execute("SELECT count(*) FROM kills_apart").fetchone()[0] == 5
    store.close()
    store = HubStore(path)  # the stop and the kills kept apart outlive the hub
    assert store.stop_owed("away", 0) == stop
    assert len([k for k in store.kills_after("away", 0) if k.plan_digest]) == 5
    # The worker back, every kill confirmed: the oldest go, past KILLS_KEPT; none is
    # kept apart any more.
    store.kill(
        "last", "flood", connected={"away": store.kills_issued(), "here": store.kills_issued()}
    )
    assert len(store.kills_after("away", 0)) == KILLS_KEPT
    assert db.execute("SELECT count(*) FROM kills_apart").fetchone()[0] == 0
    db.close()
    store.close()


def _sqlite_steps(store: HubStore, work: Callable[[], object]) -> int:
    """SQLite's virtual machine steps `work` takes on `store`'s database, by the
    hundred: what a statement walks or sorts, counted whatever the machine's load."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0  # go on

    store._db.set_progress_handler(count, 100)
    try:
        work()
    finally:
        store._db.set_progress_handler(None, 100)
    return steps


def test_a_kill_costs_the_same_however_many_kills_a_worker_away_has_not_confirmed(
    tmp_path: Path,
) -> None:
    """review18 F7: each kill counted and sorted every kill a worker had not confirmed
    (one away, or a stream that never confirms): 8,000 of them made each KillPlan 24 ms,
    every caller's (500 -> 42 KillPlans/s). Below KILLS_HELD, at most KILLS_KEPT of them
    are counted (those kept first when pruning), nothing more walks them."""
    store = HubStore(tmp_path / "hub.db")
    store.seen_worker(pb.Hello(worker_id="away"))
    store.touch_worker("away", 10, kills_through=0)
    for n in range(KILLS_KEPT + 100):
        store.kill(f"made-up-{n}", "flood")
    few = _sqlite_steps(store, lambda: store.kill("one", "flood"))
    for n in range(KILLS_KEPT + 100, 3 * KILLS_KEPT):
        store.kill(f"made-up-{n}", "flood")
    many = _sqlite_steps(store, lambda: store.kill("two", "flood"))
    assert len(store.kills_after("away", 0)) == 3 * KILLS_KEPT + 2  # every one kept for it
    assert many <= 2 * few + 10, (few, many)
    store.close()


def test_a_kill_named_for_a_worker_outlives_the_hub_forgetting_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller's kill named for one worker, kept apart, binds that worker only, and
    stays when the hub forgets the worker (review18 F4: deleted, the worker back was
    sent nothing of it, and the plan's call went to it); only a stop owed to a worker
    forgotten goes with it (review17 E1)."""
    monkeypatch.setattr(store_module, "KILLS_HELD", 2)
    store = HubStore(tmp_path / "hub.db")
    store.workers_away_kept = 0
    for worker_id in ("gone", "other"):
        store.seen_worker(pb.Hello(worker_id=worker_id))
    store.kill("victim", "stop", "gone")
    assert store.killed("victim", "gone", 0)
    for n in range(3):
        store.kill(f"in-use-{n}", "flood")
        store.killed(f"in-use-{n}", "other", 0)
    victim = plan_digest("victim")
    assert victim in [k.plan_digest for k in store.kills_after("gone", 0) if not k.plan_id]
    assert victim not in [k.plan_digest for k in store.kills_after("other", 0)]
    assert store.killed("victim", "gone", 0) and not store.killed("victim", "other", 0)
    store.kill("named", "stop", "gone")  # a caller's kill named for it, kept whole
    assert store.forget_workers(set()) == 2
    assert store.killed("victim", "gone", 0) and store.killed("named", "gone", 0)
    sent = store.kills_after("gone", 0)  # as to the worker back
    assert victim in [k.plan_digest for k in sent] and "named" in [k.plan_id for k in sent]
    store.close()


@pytest.mark.parametrize("flushed_first", [False, True], ids=["answered at once", "answered late"])
def test_an_answered_calls_request_keeps_its_args_as_the_answers_preview(
    tmp_path: Path, flushed_first: bool
) -> None:
    """An exec's argv holds passwords (review15 finding 03): once its call is answered
    (never sent again) the request keeps the worker's masked preview of its args, and
    hub.db's bytes hold the argv nowhere, free space included (secure_delete)."""
    store = HubStore(tmp_path / "hub.db")
    argv = {"argv": ["sh", "-c", "mysql -pPW0hubSecret db"]}
    request = pb.ActionRequest(
        correlation_id="c", surface="workerHost", action="exec", args_json=json.dumps(argv)
    )
    store.add("w", "digest-c", request, 0, now_ms() + 60_000)
    if flushed_first:  # a call running past the next commit: its row written pending
        store.flush()
        pending = store.get("c")
        assert pending is not None and pending.request.args_json == request.args_json
    result = _ok("c")
    result.invocation.args_preview = '{"argv": ["sh", "-c", "mysql \'-p***\' db"]}'
    store.complete(result)
    done = store.get("c")
    assert done is not None and done.args_digest == "digest-c" and done.result == result
    assert done.request.args_json == result.invocation.args_preview
    assert (done.request.correlation_id, done.request.action) == ("c", "exec")
    store.close()  # its log checkpointed into the database
    assert b"PW0hubSecret" not in (tmp_path / "hub.db").read_bytes()


@pytest.mark.parametrize("flushed_first", [False, True], ids=["at once", "late"])
def test_an_abandoned_calls_request_keeps_neither_its_args_nor_its_blob(
    tmp_path: Path, flushed_first: bool
) -> None:
    """review17 E3: a call abandoned (its deadline passed with the worker away, or the
    worker busy) is never sent again, yet kept its args whole for 24 h: a password in
    its argv at rest. Now its request keeps no args (no answer came to preview them);
    its digest and its ids stay."""
    store = HubStore(tmp_path / "hub.db")
    argv = {"argv": ["mysql", "-pPW0abandonedSecret", "db"]}
    request = pb.ActionRequest(
        correlation_id="c",
        plan_id="p",
        surface="workerHost",
        action="exec",
        args_json=json.dumps(argv),
    )
    store.add("w", "digest-c", request, 0, now_ms() + 60_000)
    if flushed_first:
        store.flush()
    store.abandon("c")
    gone = store.get("c")
    assert gone is not None and gone.state == "ABANDONED" and gone.args_digest == "digest-c"
    assert gone.request.args_json == ""
    assert (gone.request.correlation_id, gone.request.plan_id) == ("c", "p")
    store.close()
    assert b"PW0abandonedSecret" not in (tmp_path / "hub.db").read_bytes()


def test_a_stored_request_that_does_not_decode_is_kept_as_it_was() -> None:
    assert store_module.answered_request(b"\xff\xff", "{}") == b"\xff\xff"


def test_a_hub_db_put_back_from_a_backup_starts_a_new_kills_epoch_at_the_hubs_start(
    tmp_path: Path,
) -> None:
    """review15 finding 08, learnt from the file beside hub.db (KILLS_ISSUED_FILE), not
    from a worker's Hello (review16 E3): a hub.db that numbered fewer kills than the file
    says, or another epoch's, or a file unreadable, starts a new epoch, and the workers'
    marks go; the same hub.db, restarted, keeps its epoch."""
    path = tmp_path / "hub.db"
    backup = tmp_path / "hub.db.backup"
    store = HubStore(path)
    store.seen_worker(pb.Hello(worker_id="w"))
    store.kill("p", "stop")
    store.touch_worker("w", 10, kills_through=1)
    store.close()
    with (
        contextlib.closing(sqlite3.connect(path)) as src,
        contextlib.closing(sqlite3.connect(backup)) as dst,
    ):
        src.backup(dst)
    store = HubStore(path)
    epoch = store.kills_epoch
    assert store.kill("q", "stop").kill.seq == 2
    store.close()
    assert _epoch_at_start(path) == epoch  # the same hub.db: the same numbers

    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    backup.rename(path)  # numbered through 1; the file says 2
    store = HubStore(path)
    assert store.kills_epoch != epoch and store.kills_confirmed("w") == 0
    again = store.kills_epoch
    store.close()
    assert _epoch_at_start(path) == again  # the file follows the new epoch

    mark = tmp_path / store_module.KILLS_ISSUED_FILE
    mark.write_text("not a mark")
    assert _epoch_at_start(path) != again
    mark.unlink()  # none (a hub.db from before it): written, nothing else
    store = HubStore(path)
    assert mark.read_text().split() == [store.kills_epoch, "1"]
    store.close()


def _epoch_at_start(path: Path) -> str:
    store = HubStore(path)
    store.close()
    return store.kills_epoch


def test_the_stops_owed_to_workers_forgotten_go_with_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review17 E1: past KILLS_HELD, each kill dropped owes every worker remembered that
    had not confirmed it a kill of every plan, a row named for it. Made-up ids (a Hello
    each, then away) were forgotten past WORKERS_AWAY_KEPT, their rows kept: one more
    row a made-up id, for ever, each KillPlan walking them per worker (0.9 s a kill at
    10,000). Now a worker forgotten takes the kills named for it along."""
    monkeypatch.setattr(store_module, "KILLS_HELD", 5)
    monkeypatch.setattr(store_module, "KILLS_APART", 0)  # each dropped owes the stop
    store = HubStore(tmp_path / "hub.db")
    store.workers_away_kept = 4
    store.seen_worker(pb.Hello(worker_id="good"))
    for n in range(6):
        store.kill(f"junk-{n}", "flood")  # past the 5 held: kills dropped from now on
        store.killed(f"junk-{n}", "good", 0)  # in use: a drop of it owes a stop
    for cycle in range(5):
        made_up = [f"made-up-{cycle}-{n}" for n in range(4)]
        for worker_id in made_up:
            store.seen_worker(pb.Hello(worker_id=worker_id))
        store.forget_workers({"good"})
        kept = store.kill(f"junk-more-{cycle}", "flood", connected={"good": 0})
        store.killed(f"junk-more-{cycle}", "good", 0)
        assert set(kept.stops) <= {"good", *made_up}
    with sqlite3.connect(tmp_path / "hub.db") as db:
        named = {w for (w,) in db.execute("SELECT worker_id FROM kills WHERE plan_id = '*'")}
    remembered = {str(w) for w in store.kill_marks()}
    assert named <= remembered, named - remembered
    # What is remembered still works: the good worker is owed its stop, a forgotten id nothing.
    assert store.stop_owed("good", 0) is not None
    assert store.stop_owed("made-up-0-0", 0) is None
    assert store.killed("any-plan", "good", 0)


def _pending_in_db(path: Path) -> dict[str, tuple[int, int]]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        rows = db.execute(
            "SELECT worker_id, count(*), sum(length(request)) FROM calls"
            " WHERE state = 'PENDING' GROUP BY worker_id"
        ).fetchall()
    return {worker_id: (count, size) for worker_id, count, size in rows}


def test_the_calls_pending_are_counted_in_memory_as_hub_db_holds_them(tmp_path: Path) -> None:
    """review19 A4: the count a Dispatch is weighed against (worker.hub.pending) follows
    every way a call stops waiting, in the writer thread too, and is read back at start."""
    path = tmp_path / "hub.db"
    store = HubStore(path)
    deadline = now_ms() + 60_000

    def agrees() -> None:
        store.flush()
        held = _pending_in_db(path)
        for worker_id in ("w", "v"):
            assert store.pending_for(worker_id) == held.get(worker_id, (0, 0)), worker_id
        assert store.pending.total_bytes == sum(size for _, size in held.values())

    for cid in ("early", "late", "large", "dropped", "old"):
        store.add("w", "d", _request(cid), 0, deadline, fresh=True)
    store.add("v", "d", _request("other"), 0, deadline, fresh=True)
    store.add("w", "d", _request("unsent"), 0, deadline)  # its caller's id
    assert store.pending_for("w")[0] == 6
    locker = sqlite3.connect(path, timeout=0)
    locker.execute("BEGIN IMMEDIATE")
    store._db.execute("PRAGMA busy_timeout = 0")
    with pytest.raises(sqlite3.OperationalError):  # never sent: taken back
        store.record_off_loop("unsent").result(60)
    locker.rollback()
    locker.close()
    store.complete(_ok("early"))  # answered before its commit: written once, answered
    agrees()
    store.complete(_ok("late"))  # answered after its commit
    store.abandon("dropped")
    agrees()
    assert store.complete_off_loop([(_large_ok("large"), None, False, None)]).result(60) == [True]
    agrees()
    store.complete(_ok("late"))  # answered twice: once counted
    store.add("v", "d", _request("older"), 0, deadline - 10, fresh=True)
    store.prune(now=deadline + CALLS_KEPT_MS - 5)  # past its deadline a day: forgotten
    agrees()
    assert store.pending_for("v")[0] == 1
    asyncio.run(store.prune_off_loop(now=deadline + CALLS_KEPT_MS + 1))  # the writer thread's
    agrees()
    assert store.pending_for("w") == store.pending_for("v") == (0, 0)
    store.add("w", "d", _request("after"), 0, deadline, fresh=True)
    store.close()
    store = HubStore(path)  # counted once, at its start
    agrees()
    assert store.pending_for("w")[0] == 1 and store.pending_for("v") == (0, 0)
    store.close()
