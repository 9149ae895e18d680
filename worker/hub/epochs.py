"""Which creation of a plan id a placement token proves (docs/architecture.md, "A claim
of a plan the hub has no record of needs the hub's proof").

A placement token was a MAC of (worker id, plan id) alone: a worker once given plan P
proved P for ever, also after P was torn down and a new plan P made (review26, the
neighbour of H5): between the teardown and the new P's first call the hub has no record
of P, and the old worker's claim placed the new P's calls, args and blobs on it. So
each placement has an epoch, made when the hub places a new plan (the hub's time in
ms, then random digits: a creation of the plan, never made twice), and the token is
MAC'd over it too and carries it (`EPOCH.MAC`): a hub with no record of the plan (it
lost hub.db) still checks a token alone, and a hub that tore the plan down remembers
when (`plans_ended`), so a token of an epoch made before then proves nothing.
"""

from __future__ import annotations

import secrets
import sqlite3
from typing import Final

from worker import db
from worker.clock import now_ms

SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS plans_ended (  -- sandbox plans torn down: their tokens so far are void
    plan_id  TEXT PRIMARY KEY,
    ended_ms INTEGER NOT NULL  -- epochs made at or before this are ended
);
"""

# A teardown is remembered this long: as long as a worker away is (store.WORKERS_KEPT_MS),
# and a worker back from longer has its placements forgotten with it and is sent the
# teardown it missed (store.queue_teardown) before anything else.
ENDED_KEPT_MS: Final = 30 * 24 * 3600 * 1000
# Teardowns of plans the hub had no record of and no worker said it held, kept at most
# (past it, the one ended longest ago goes). Such a row voids the tokens of a plan placed
# before hub.db was lost, held by a worker away; anyone with hub.token makes one a call,
# under made-up plan ids (review28 L5: 2,000 rows in 47 s, for 30 days each). A
# teardown of a plan placed here, or one a worker removed, is kept whole
# (ENDED_KEPT_MS): a flood of made-up ids cannot push it out.
UNPLACED_ENDED_KEPT: Final = 4096


def new_epoch(after_ms: int = 0) -> str:
    """A new creation of a plan: made after `after_ms` (its last teardown, should the
    hub's clock have gone back since) and unique."""
    return f"{max(now_ms(), after_ms + 1):x}-{secrets.token_hex(4)}"


def epoch_ms(epoch: str) -> int:
    """When `epoch` was made (0 for a token from before epochs, or one not of this form:
    ended by any teardown)."""
    head, _, _ = epoch.partition("-")
    try:
        return int(head, 16) if head else 0
    except ValueError:
        return 0


class EndedPlans:
    """The `plans_ended` table of hub.db (HubStore's connection, on the hub's loop)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._db = conn
        conn.executescript(SCHEMA)
        columns = {row[1] for row in conn.execute("PRAGMA table_info(plans_ended)")}
        if "placed" not in columns:  # rows from before: kept whole, as placed plans'
            conn.execute("ALTER TABLE plans_ended ADD COLUMN placed INTEGER NOT NULL DEFAULT 1")
        conn.execute(
            "CREATE INDEX IF NOT EXISTS plans_ended_unplaced ON plans_ended (placed, ended_ms)"
        )
        self.unplaced_kept = UNPLACED_ENDED_KEPT

    def ended_ms(self, plan_id: str) -> int:
        row = self._db.execute(
            "SELECT ended_ms FROM plans_ended WHERE plan_id = ?", (plan_id,)
        ).fetchone()
        return int(row[0]) if row else 0

    def end(self, plan_id: str, *, placed: bool = True) -> int:
        """Every epoch of `plan_id` made so far is void (a teardown). `placed`: the hub
        had placed the plan, or a worker removed it; else the row is one of the
        `unplaced_kept` at most. How many such rows went to make room."""
        with db.transaction(self._db):
            self._db.execute(
                "INSERT INTO plans_ended (plan_id, ended_ms, placed) VALUES (?, ?, ?)"
                " ON CONFLICT (plan_id) DO UPDATE SET ended_ms = max(ended_ms, excluded.ended_ms),"
                " placed = max(placed, excluded.placed)",
                (plan_id, now_ms(), int(placed)),
            )
            if placed:
                return 0
            cursor = self._db.execute(
                "DELETE FROM plans_ended WHERE rowid IN (SELECT rowid FROM plans_ended"
                " WHERE placed = 0 ORDER BY ended_ms DESC, rowid DESC LIMIT -1 OFFSET ?)",
                (self.unplaced_kept,),
            )
            return max(0, cursor.rowcount)

    def void(self, plan_id: str, epoch: str) -> bool:
        """Whether a token of `epoch` for `plan_id` was voided by a teardown since."""
        ended = self.ended_ms(plan_id)
        return bool(ended) and epoch_ms(epoch) <= ended

    def forget(self, now: int | None = None) -> int:
        """Forget teardowns older than ENDED_KEPT_MS; how many."""
        cutoff = (now if now is not None else now_ms()) - ENDED_KEPT_MS
        cursor = self._db.execute("DELETE FROM plans_ended WHERE ended_ms < ?", (cutoff,))
        return max(0, cursor.rowcount)
