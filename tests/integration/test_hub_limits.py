"""What a hub holds for callers is bounded: request blobs of calls not yet answered
stay under `[hub] held_blobs_mib`, and a call past it is answered `busy` at once."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tests.support.cluster import Cluster, call_in_background, cluster, release, wait_for

MIB = 1024 * 1024


def test_blobs_held_for_unanswered_calls_are_bounded(tmp_path: Path) -> None:
    with cluster(tmp_path / "home", held_blobs_mib=16) as live:
        held = call_in_background(
            live, "workerDiag.probe", '{"hold": "h1"}', correlation_id="h1", blob=b"a" * 10 * MIB
        )
        wait_for(lambda: _in_ledger(live, "h1"), 30)  # claimed by the worker: it runs
        # 10 MiB held: another 10 MiB would pass 16, and is refused before it is sent.
        refused = live.call("workerDiag.probe", "{}", correlation_id="b1", blob=b"b" * 10 * MIB)
        assert refused["status"] == "error" and refused["error"]["code"] == "busy", refused
        assert refused["error"]["retryable"] is True
        assert refused["error"]["details"]["limit_bytes"] == 16 * MIB
        assert "held_blobs_mib" in refused["error"]["message"]
        assert not _in_ledger(live, "b1"), "a refused call never reached the worker"
        # A call with a smaller blob, or none, still goes.
        assert live.call("workerDiag.probe", "{}", blob=b"c" * MIB)["status"] == "ok"
        assert live.call("workerDiag.probe", "{}")["status"] == "ok"
        release(live.home, "h1")
        held["thread"].join(30)
        assert held["out"]["status"] == "ok", held
        # What the answered call held is given back.
        again = live.call("workerDiag.probe", "{}", correlation_id="b2", blob=b"b" * 10 * MIB)
        assert again["status"] == "ok", again


def _in_ledger(live: Cluster, cid: str) -> bool:
    db = sqlite3.connect(live.home / "state.db")
    try:
        found = db.execute("SELECT 1 FROM calls WHERE correlation_id = ?", (cid,)).fetchone()
    finally:
        db.close()
    return found is not None
