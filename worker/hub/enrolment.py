"""Which workers the hub's operator accepted (docs/architecture.md, "Workers are
enrolled").

The workers' token (hub-workers.token) is one secret shared by every worker; it cannot
tell the operator's own sandbox worker from anyone else who holds it, and a worker the
hub serves is given plans, calls, args and blobs (review26 H5: a rogue offering
workbenchHost.* took its share of every new plan by load placement). So each worker
also proves a key of its own (made for this hub from worker.key in its data folder,
transport.key_for_server, sent with every stream), and the hub serves a worker id only
with the key the operator accepted for it. Any other Hello is recorded here as
*pending*, with its key's fingerprint for the operator to compare with the one the
worker prints at its start, and refused until the operator runs `agentworker workers
accept ID`. A pending Hello binds nothing: with hub.db lost, a rogue saying Hello
first under a real worker's id only waits beside it, and the operator accepts the
fingerprint that is the worker's.

The rows live in hub.db (table `enrolments`), apart from `workers`: forgetting a worker
away (HubStore.forget_workers) never forgets the operator's decision about it.
"""

from __future__ import annotations

import hmac
import sqlite3
from dataclasses import dataclass
from typing import Final, Literal

from worker import db
from worker.clock import now_ms
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.transport import FINGERPRINT_HEX, fingerprint_of_digest

State = Literal["pending", "accepted", "refused"]

SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS enrolments (  -- the operator's decisions, and Hellos awaiting one
    worker_id  TEXT NOT NULL,
    key_digest TEXT NOT NULL,  -- sha256 of the worker's key (worker.hub.hellos)
    state      TEXT NOT NULL CHECK (state IN ('pending', 'accepted', 'refused')),
    seen_ms    INTEGER NOT NULL,  -- its last Hello (or the decision, for one never seen)
    -- its last Hello, described (what it offers: worker.hub.hellos.hello_description, as
    -- worker.hub.admission gives it, never the ids and plans it names, which may be 8 MiB:
    -- review28 r6)
    hello      BLOB NOT NULL DEFAULT x'',
    -- who accepted it: 'operator' (kept until the operator says otherwise), else the hub
    -- unasked ('own', 'first_contact', 'migrated': forgotten with the worker's row, as
    -- HubStore.forget_workers forgets workers away, and accepted again as it was)
    decided_by TEXT NOT NULL DEFAULT 'operator',
    -- 1: the key is one made for this hub (transport.key_for_server); 0: an older
    -- worker's worker.key itself (a row from before, or an older worker's)
    per_server INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (worker_id, key_digest)
);
CREATE INDEX IF NOT EXISTS enrolments_state ON enrolments (state, seen_ms);
"""

# Hellos awaiting a decision, kept at most: anyone with the workers' token can say Hello
# under new ids (paced by worker.hub.hellos); past this many the one seen longest ago
# goes (a real worker waiting is back at its next try).
PENDING_KEPT: Final = 256
# Past PENDING_KEPT the pending rows seen longest ago go, but for the newest key made for
# this hub waiting under an id accepted with an older worker's worker.key: that row is
# what keeps the older key unserved (Enrolments.verdict's `superseded`), and pushed out
# by a flood of new ids it let the older key be served again until the worker's next
# Hello (review29 k1's rest). One such row per id, at most: keys sent under the id by
# anyone with the workers' token are pushed out as any other.
_PUSH_OUT_PENDING: Final = """
DELETE FROM enrolments WHERE rowid IN (
    SELECT rowid FROM enrolments WHERE state = 'pending' AND rowid NOT IN (
        SELECT kept FROM (
            SELECT (
                SELECT newest.rowid FROM enrolments AS newest
                WHERE newest.worker_id = older.worker_id AND newest.state = 'pending'
                AND newest.per_server = 1 ORDER BY newest.seen_ms DESC LIMIT 1
            ) AS kept
            FROM enrolments AS older WHERE older.state = 'accepted' AND older.per_server = 0
        ) WHERE kept IS NOT NULL
    )
    ORDER BY seen_ms DESC LIMIT -1 OFFSET ?
)
"""


@dataclass(frozen=True)
class Enrolment:
    worker_id: str
    key_digest: str
    state: State
    seen_ms: int
    hello: pb.Hello

    @property
    def fingerprint(self) -> str:
        return fingerprint_of_digest(self.key_digest)


@dataclass(frozen=True)
class Verdict:
    """What a Hello of (worker id, key) is: `accepted`; `pending` (no decision for this
    key; `upgraded` when the id is accepted under the worker.key an older version of the
    worker sent and this one brings a key made for this hub; `superseded` when this is
    that older key and a key made for this hub has come under the id since); or
    `refused`. `taken`: the id is accepted under another key."""

    state: State
    taken: bool = False
    upgraded: bool = False
    ahead: bool = False  # accepted by the fingerprint alone, before this key said Hello
    superseded: bool = False


class DecisionError(Exception):
    """The operator's decision names no worker waiting, or is ambiguous: `why` says
    which and what to do."""

    def __init__(self, why: str, *, not_found: bool = False) -> None:
        super().__init__(why)
        self.why = why
        self.not_found = not_found


def _fingerprint_key(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch in "0123456789abcdef")


class Enrolments:
    """The `enrolments` table of hub.db (HubStore's connection, on the hub's loop)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._db = conn
        existed = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'enrolments'"
        ).fetchone()
        conn.executescript(SCHEMA)
        columns = {row[1] for row in conn.execute("PRAGMA table_info(enrolments)")}
        if "per_server" not in columns:  # rows from before: each an older worker's key
            conn.execute("ALTER TABLE enrolments ADD COLUMN per_server INTEGER NOT NULL DEFAULT 0")
        # A hub.db from before enrolment: each worker bound to its key then (the first
        # key its id came with) is accepted with that key, so an upgraded hub keeps
        # serving the workers it served; a worker never seen, or remembered with no key,
        # waits for the operator. `agentworker workers` lists them all; refuse one you
        # do not recognise.
        self.migrated = 0
        if not existed:
            with db.transaction(conn):
                cursor = conn.execute(
                    "INSERT OR IGNORE INTO enrolments"
                    " (worker_id, key_digest, state, seen_ms, decided_by)"
                    " SELECT worker_id, key_digest, 'accepted', last_seen_ms, 'migrated'"
                    " FROM workers WHERE key_digest != ''"
                )
                self.migrated = max(0, cursor.rowcount)

    def verdict(self, worker_id: str, key_digest: str, *, per_server: bool = False) -> Verdict:
        rows = self._db.execute(
            "SELECT key_digest, state, per_server FROM enrolments WHERE worker_id = ?",
            (worker_id,),
        ).fetchall()
        verdict: State = "pending"
        # Read through every row: a refused key's Hello is taken too.
        taken = upgraded = ahead = older = newer = False
        for digest, state, row_per_server in rows:
            if len(digest) == FINGERPRINT_HEX and key_digest:  # decided ahead (accept_ahead)
                if hmac.compare_digest(str(digest), key_digest[:FINGERPRINT_HEX]):
                    verdict, ahead = state, state == "accepted"
                elif state == "accepted":
                    taken = True
            elif key_digest and hmac.compare_digest(str(digest), key_digest):
                if state != "pending":
                    verdict = state
                older = state == "accepted" and not row_per_server
            elif state == "pending" and row_per_server:
                newer = True
            elif state == "accepted" and per_server and not row_per_server:
                upgraded = True
            elif state == "accepted":
                taken = True
        if older and newer and not per_server:
            # worker.key itself, accepted from an older version of the worker, is served
            # no more once a key made for this hub came under the id: every server that
            # worker dialled before was sent it (review29 k1). The id waits for the
            # operator, who accepts the new key, as for any key of an id that changed.
            return Verdict("pending", superseded=True)
        return Verdict(
            verdict,
            taken=taken and verdict != "accepted",
            upgraded=upgraded and not taken and verdict == "pending",
            ahead=ahead,
        )

    def waiting(
        self, worker_id: str, key_digest: str, hello: pb.Hello, *, per_server: bool = False
    ) -> None:
        """Record a Hello with no decision yet (or seen again), bounded by PENDING_KEPT."""
        now = now_ms()
        described = hello.SerializeToString()
        with db.transaction(self._db):
            self._db.execute(
                "INSERT INTO enrolments (worker_id, key_digest, state, seen_ms, hello, per_server)"
                " VALUES (?, ?, 'pending', ?, ?, ?) ON CONFLICT (worker_id, key_digest) DO UPDATE"
                " SET seen_ms = excluded.seen_ms, hello = excluded.hello",
                (worker_id, key_digest, now, described, int(per_server)),
            )
            self._db.execute(_PUSH_OUT_PENDING, (PENDING_KEPT,))

    def seen(self, worker_id: str, key_digest: str, hello: pb.Hello) -> None:
        """An accepted worker said Hello: its row shows what it offers now."""
        self._db.execute(
            "UPDATE enrolments SET seen_ms = ?, hello = ? WHERE worker_id = ? AND key_digest = ?",
            (now_ms(), hello.SerializeToString(), worker_id, key_digest),
        )

    def accept(
        self,
        worker_id: str,
        key_digest: str,
        hello: pb.Hello | None = None,
        *,
        by: str,
        per_server: bool = False,
    ) -> None:
        """Accept `worker_id` with this key (its only accepted one): a Hello under the
        id with another key is refused from now on; other keys waiting under the id
        are dropped (each shows again, as taken, if it comes back)."""
        with db.transaction(self._db):
            self._db.execute(
                "DELETE FROM enrolments WHERE worker_id = ? AND key_digest != ?"
                " AND state != 'refused'",
                (worker_id, key_digest),
            )
            self._db.execute(
                "INSERT INTO enrolments"
                " (worker_id, key_digest, state, seen_ms, hello, decided_by, per_server)"
                " VALUES (?, ?, 'accepted', ?, ?, ?, ?) ON CONFLICT (worker_id, key_digest)"
                " DO UPDATE SET state = 'accepted', decided_by = excluded.decided_by",
                (
                    worker_id,
                    key_digest,
                    now_ms(),
                    b"" if hello is None else hello.SerializeToString(),
                    by,
                    int(per_server),
                ),
            )

    def decide(self, worker_id: str, fingerprint: str, state: State) -> Enrolment:
        """The operator's `accept` or `refuse` of the one row of `worker_id` whose
        fingerprint starts with `fingerprint` (any, when there is one row)."""
        rows = [row for row in self.of(worker_id) if row.state != state or state == "accepted"]
        wanted = _fingerprint_key(fingerprint)
        if wanted:
            rows = [row for row in rows if row.key_digest.startswith(wanted)]
        # Ahead only for an id accepted with no key: a typo in a fingerprint must not
        # replace a worker's key and end its stream (its new key says Hello first).
        taken = self.verdict(worker_id, "").taken
        if not rows and state == "accepted" and len(wanted) == FINGERPRINT_HEX and not taken:
            return self.accept_ahead(worker_id, wanted)
        if not rows:
            said = f" with a key of fingerprint {fingerprint!r}" if wanted else ""
            ahead = ""
            if state == "accepted" and taken:
                ahead = (
                    "; it is accepted with another key: a new key of it is accepted once "
                    "it said Hello"
                )
            elif state == "accepted":
                ahead = (
                    "; or accept it ahead of its next Hello with --fingerprint and the "
                    f"whole fingerprint it printed at its start ({FINGERPRINT_HEX} hex "
                    "digits, as xxxx-xxxx-xxxx-xxxx)"
                )
            raise DecisionError(
                f"no worker {worker_id!r}{said} has said Hello to this hub (or it is "
                f"{state} already): start it pointed at this hub, then run this again; "
                f"`agentworker workers` lists those waiting{ahead}",
                not_found=True,
            )
        if len(rows) > 1:
            shown = ", ".join(f"{row.fingerprint} ({row.state})" for row in rows)
            raise DecisionError(
                f"worker id {worker_id!r} came with {len(rows)} keys ({shown}): name the "
                "one its worker printed at its start with --fingerprint"
            )
        row = rows[0]
        if state == "accepted":
            self.accept(worker_id, row.key_digest, by="operator")
        else:
            self._db.execute(
                "UPDATE enrolments SET state = 'refused', decided_by = 'operator'"
                " WHERE worker_id = ? AND key_digest = ?",
                (worker_id, row.key_digest),
            )
        return Enrolment(worker_id, row.key_digest, state, row.seen_ms, row.hello)

    def accepted_key(self, worker_id: str) -> str:
        """The digest of the key `worker_id` is accepted with ('' while none is)."""
        row = self._db.execute(
            "SELECT key_digest FROM enrolments WHERE worker_id = ? AND state = 'accepted'"
            " AND length(key_digest) > ?",
            (worker_id, FINGERPRINT_HEX),
        ).fetchone()
        return "" if row is None else str(row[0])

    def accept_ahead(self, worker_id: str, fingerprint: str) -> Enrolment:
        """Accept `worker_id` with the key of this whole fingerprint before that key's
        Hello is here (pushed out of the PENDING_KEPT by newer ones, or not sent yet):
        its first Hello is served and the row takes its key's whole digest (`seen`).
        A key matching 64 bits of another's sha256 is out of anyone's reach."""
        self.accept(worker_id, fingerprint, by="operator", per_server=True)
        return Enrolment(
            worker_id, fingerprint, "accepted", now_ms(), pb.Hello(worker_id=worker_id)
        )

    def forget(self, worker_id: str) -> int:
        """Every row of `worker_id`: its next Hello waits for the operator again."""
        return max(
            0, self._db.execute("DELETE FROM enrolments WHERE worker_id = ?", (worker_id,)).rowcount
        )

    def waiting_hint(self) -> str:
        """For a call that found no worker: the workers waiting for the operator, if any."""
        (count,) = self._db.execute(
            "SELECT count(*) FROM enrolments WHERE state = 'pending'"
        ).fetchone()
        if not count:
            return ""
        return (
            f"; {count} worker(s) said Hello and wait to be accepted: `agentworker workers` "
            "lists them, `agentworker workers accept ID` accepts one"
        )

    def of(self, worker_id: str) -> list[Enrolment]:
        return [
            _enrolment(row)
            for row in self._db.execute(
                "SELECT worker_id, key_digest, state, seen_ms, hello FROM enrolments"
                " WHERE worker_id = ? ORDER BY seen_ms DESC",
                (worker_id,),
            )
        ]

    def all(self) -> list[Enrolment]:
        return [
            _enrolment(row)
            for row in self._db.execute(
                "SELECT worker_id, key_digest, state, seen_ms, hello FROM enrolments"
                " ORDER BY worker_id, seen_ms DESC"
            )
        ]


def _enrolment(row: tuple[str, str, str, int, bytes]) -> Enrolment:
    worker_id, digest, state, seen, hello = row
    described = pb.Hello.FromString(bytes(hello)) if hello else pb.Hello(worker_id=worker_id)
    return Enrolment(str(worker_id), str(digest), state, int(seen), described)  # type: ignore[arg-type]
