"""A large result is stored off the hub's event loop, and acked only once stored.

The hub answers a caller as soon as a result comes and stores it a moment later, then
acks it; the worker keeps the result until that ack (an effect-free call's in memory).
A 10,000-entry listing's 1.5 MB made the hub's commit 3-6 ms of its event loop; it is
now made in a writer thread of the hub's store. Here another connection holds hub.db's
write lock, so the hub's commit of a listing waits in that thread: other calls are
answered meanwhile, and whichever side is killed before the commit, a repeat of the
listing's id is answered from what was kept, never run again.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.cluster import Cluster, cluster, wait_for
from worker.config import HUB_DB
from worker.hub.server import STORE_DELAY_S

ENTRIES = 800  # about 120 KB of JSON: past worker.db.OFF_LOOP_BYTES
# Calls are made for this long after the listing's answer, past the moment its commit
# begins (STORE_DELAY_S after the result came): each must be answered while the commit
# waits for the lock. Before, the hub's loop waited in that commit (SQLite's busy
# timeout, 10 s), and so did every call. Short: a worker that dials again meanwhile (a
# stream dropped on a loaded machine) waits too, its Hello being read from hub.db.
CALLING_FOR_S = 4 * STORE_DELAY_S
# The hub's heartbeat here: the worker gives a stream up after three missed (the
# suite's 0.5 s made that 1.5 s, which a loaded machine's stall passed, and the Hello
# of the stream dialled again then waited for the locked hub.db: the calls after it
# found no worker, 2 runs in 45 at a load of 6).
HEARTBEAT_S = 3.0


def a_large_folder(live: Cluster) -> str:
    folder = live.workspace / "many"
    folder.mkdir()
    for i in range(ENTRIES):
        (folder / f"entry-{i:04d}-{'x' * 60}.txt").touch()
    return "many"


@contextmanager
def hub_db_locked(live: Cluster) -> Iterator[sqlite3.Connection]:
    """Hold hub.db's write lock (as a long writer in another process would)."""
    locker = sqlite3.connect(live.home / HUB_DB, isolation_level=None, timeout=60)
    locker.execute("BEGIN IMMEDIATE")
    try:
        yield locker
    finally:
        if locker.in_transaction:
            locker.execute("ROLLBACK")
        locker.close()


def listing_while_locked(live: Cluster, folder: str, *, calling_for_s: float) -> dict[str, Any]:
    """List `folder` while hub.db is locked, then make other calls for `calling_for_s`:
    each answered while the listing's commit waits (the hub's loop is not the one
    waiting, and never gives up on the lock meanwhile)."""
    # The listing's worker is stopped (as a loaded machine's stall does) past the hub's
    # next commit, which then writes the call with no answer yet. The sleep orders
    # events and waits for no outcome; too short, the commit writes call and answer.
    worker = the_worker(live)
    worker.signal(signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(1) as pool:
            asked = pool.submit(live.call, "workerHost.fs_list", json.dumps({"path": folder}))
            time.sleep(10 * STORE_DELAY_S)
            worker.signal(signal.SIGCONT)
            listing = asked.result()
    finally:
        worker.signal(signal.SIGCONT)
    listed = time.monotonic()
    assert listing["status"] == "ok", listing
    assert len(listing["result"]["entries"]) == ENTRIES
    while time.monotonic() - listed < calling_for_s:
        stat = live.call("workerHost.fs_stat", json.dumps({"path": folder}))
        assert stat["status"] == "ok", stat
    hub = the_hub(live).log()
    assert "database is locked" not in hub, f"the hub's loop waited for hub.db:\n{hub}"
    return listing


def stored_state(live: Cluster, cid: str) -> str | None:
    with sqlite3.connect(live.home / HUB_DB, timeout=30) as conn:
        row = conn.execute("SELECT state FROM calls WHERE correlation_id = ?", (cid,)).fetchone()
    return None if row is None else str(row[0])


def the_hub(live: Cluster) -> Any:
    return next(p for p in live.procs if p.name == "hub" and p.running())


def the_worker(live: Cluster) -> Any:
    return next(p for p in live.procs if p.name == "worker" and p.running())


def test_a_worker_killed_while_the_hub_stores_its_large_result_loses_nothing(
    tmp_path: Path,
) -> None:
    with cluster(tmp_path / "home", heartbeat_s=HEARTBEAT_S) as live:
        folder = a_large_folder(live)
        with hub_db_locked(live):
            listing = listing_while_locked(live, folder, calling_for_s=CALLING_FOR_S)
            cid = listing["correlation_id"]
            assert stored_state(live, cid) is None, "stored while hub.db was locked?"
            the_worker(live).kill()  # between the result and its ack
        wait_for(lambda: stored_state(live, cid) == "DONE", 30, the_hub(live))

        (live.workspace / folder / "added-after.txt").touch()
        live.start_worker()
        again = live.call("workerHost.fs_list", json.dumps({"path": folder}), correlation_id=cid)
        assert again["status"] == "ok", again
        assert again["result"] == listing["result"], "answered from hub.db, not run again"


def test_a_hub_killed_before_it_stored_a_large_result_loses_nothing(tmp_path: Path) -> None:
    with cluster(tmp_path / "home", heartbeat_s=HEARTBEAT_S) as live:
        folder = a_large_folder(live)
        with hub_db_locked(live):
            listing = listing_while_locked(live, folder, calling_for_s=0)
            cid = listing["correlation_id"]
            the_hub(live).kill()  # its commit of the listing never happened
        assert stored_state(live, cid) is None

        # The worker kept the result (never acked) and sends it again to the new hub,
        # which acks it (a call it does not know); the worker then keeps its outcome.
        live.start_hub()
        wait_for(lambda: live.status().connected_workers == 1, 60)
        (live.workspace / folder / "added-after.txt").touch()
        again = live.call("workerHost.fs_list", json.dumps({"path": folder}), correlation_id=cid)
        # Not run again: the result the worker sent again, if the repeat reached the hub
        # first (it is then that call's answer), or the worker's ledger's answer, which
        # keeps the outcome of an effect-free call this large, not its bytes.
        if again["status"] == "ok":
            assert again["result"] == listing["result"], "run again"
        else:
            assert again["replayed"], again
            assert again["error"]["code"] == "blob_gone", again
            assert again["error"]["details"]["status"] == "ok", again
