"""A call whose correlation id the caller chose is committed to hub.db before its worker
gets it (a retry after a hub restart must find it), in the store's writer thread.

That commit was made on the hub's event loop: while another process held hub.db's
write lock, every other call, Status and Hello waited SQLite's busy timeout (10 s), and
then the call was refused `internal_error` "could not record the call" (review29 h1).
Now the call alone waits; past the busy timeout it is answered `busy`, saying that
another process holds hub.db, and a retry of its id runs once it is let go.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

from tests.integration.test_large_result_commits import (
    HEARTBEAT_S,
    hub_db_locked,
    stored_state,
)
from tests.support.cluster import call_in_background, cluster, wait_for

STAT = ("workerHost.fs_stat", json.dumps({"path": "."}))
# Orders events, waits for no outcome: the chosen id's call reaches the hub's commit
# before the other call is made. Too short, the test passes on the code before too.
REACHES_THE_HUB_S = 1.0


def test_a_call_with_a_chosen_id_waits_for_a_held_hub_db_alone(tmp_path: Path) -> None:
    with cluster(tmp_path / "home", heartbeat_s=HEARTBEAT_S) as live:
        assert live.call(*STAT)["status"] == "ok"
        cid = uuid.uuid4().hex
        with hub_db_locked(live):
            chosen = call_in_background(live, *STAT, correlation_id=cid)
            time.sleep(REACHES_THE_HUB_S)
            # Before: this call waited for the loop, held by the chosen id's commit
            # until SQLite gave up (10 s), and that call was refused.
            other = live.call(*STAT)
            assert other["status"] == "ok", other
            assert live.status().connected_workers == 1
            assert "out" not in chosen, chosen  # still waiting to be recorded
            assert stored_state(live, cid) is None  # nor sent: it is not recorded
        chosen["thread"].join(30)
        assert chosen.get("out", {}).get("status") == "ok", chosen
        wait_for(lambda: stored_state(live, cid) == "DONE", 30)


def test_a_call_with_a_chosen_id_is_answered_busy_while_hub_db_stays_held(
    tmp_path: Path,
) -> None:
    with cluster(tmp_path / "home", heartbeat_s=HEARTBEAT_S) as live:
        assert live.call(*STAT)["status"] == "ok"
        cid = uuid.uuid4().hex
        with hub_db_locked(live):
            chosen = call_in_background(live, *STAT, correlation_id=cid)
            chosen["thread"].join(60)
            refused = chosen.get("out", {})
            assert refused.get("status") == "error", chosen
            assert refused["error"]["code"] == "busy", refused  # before: internal_error
            assert "another process held hub.db" in refused["error"]["message"], refused
            assert "retry it with the same correlation id" in refused["error"]["message"]
            assert live.status().connected_workers == 1
        assert stored_state(live, cid) is None  # refused: neither recorded nor sent
        again = live.call(*STAT, correlation_id=cid)
        assert again["status"] == "ok", again
