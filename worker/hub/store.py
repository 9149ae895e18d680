"""The reference hub's durable memory: dispatched calls and the workers it has seen.

A call is recorded PENDING as it is sent, so a hub that is killed and restarted
still knows what it asked for: a caller retrying with the same correlation id waits
for the same call instead of starting a second one, and results the worker re-sends
after the reconnect land where the caller will look.

The row is written a moment later than the call leaves (`add` queues it; a group
commit of the hub's, every `STORE_DELAY_S` while calls come, commits it together with
every call and result since), so no call waits on a commit of its own. A call still
unanswered at the first commit after it came waits for the next (`complete_many`):
most are answered by then and written once, whole, not PENDING and then updated (an
UPDATE, a look-up and a `call_state` query less for a quarter of the calls at 64
Dispatches in flight). A hub killed inside that moment (two commits at most)
forgets the call; the call still runs at most once, because the
worker's ledger decides that: a caller retrying the id sends it again and gets the
worker's recorded answer (an effect-free call, which the ledger does not claim, may
run again, which is harmless). Every read flushes first, so the store always
answers with what was added.

Blobs stay out of it (docs/architecture.md, "Blobs"): a request's blob is held in
the hub's memory while the call may need re-sending (`Hub`), never written here; a
result's blob is written only when no caller was waiting to take it (a result the
worker re-sent after this hub restarted), and let go as soon as a caller has it.
The store keeps each blob's size, so a late repeat says what went (`blob_gone`).

A call's request is kept whole while the call may be sent again; once it is answered
it never is (a retry of its id gets the stored answer, args_mismatch compares the
digest), so its args give way to the answer's preview of them, masked by the worker
(`answered_request`): an exec's argv holds passwords as often as not (review15 finding
03). hub.db is opened with secure_delete, so the args the row held are zeroed in the
database file, not left in its free space.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import uuid
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from google.protobuf.message import DecodeError

from worker import db
from worker.clock import now_ms
from worker.db import connect
from worker.hub.enrolment import Enrolments
from worker.hub.epochs import EndedPlans
from worker.hub.pending import PendingCalls
from worker.wire.framing import Buffer
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.protocol import at_rest, plan_digest

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    correlation_id TEXT PRIMARY KEY,
    worker_id      TEXT NOT NULL,
    args_digest    TEXT NOT NULL,
    request        BLOB NOT NULL,  -- the ActionRequest without its blob
    request_blob   BLOB,           -- only in a hub.db from before blobs left it
    state          TEXT NOT NULL CHECK (state IN ('PENDING', 'DONE', 'ABANDONED')),
    result         BLOB,           -- the ActionResult without its blob
    created_ms     INTEGER NOT NULL,
    deadline_ms    INTEGER NOT NULL,
    blob_bytes     INTEGER NOT NULL DEFAULT 0,  -- the request blob's size
    result_blob    BLOB,           -- a result blob no caller has taken yet
    result_blob_bytes INTEGER NOT NULL DEFAULT 0,
    plan_id        TEXT NOT NULL DEFAULT ''  -- the request's, for the kills naming no worker
);
CREATE INDEX IF NOT EXISTS calls_open ON calls (worker_id, state);
CREATE TABLE IF NOT EXISTS workers (
    worker_id    TEXT PRIMARY KEY,
    hello        BLOB NOT NULL,
    last_seen_ms INTEGER NOT NULL,
    key_digest   TEXT NOT NULL DEFAULT '',  -- sha256 of the key it was last served with
    connected_ms INTEGER NOT NULL DEFAULT 0,  -- how long it was connected, its sessions together
    kills_through INTEGER NOT NULL DEFAULT 0  -- kills.seq it confirmed, through (at its last end)
);
CREATE TABLE IF NOT EXISTS kills (  -- the plans this hub killed (see KILLS_KEPT)
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,  -- KillPlan.seq: never used again
    plan_id    TEXT NOT NULL,
    worker_id  TEXT NOT NULL,  -- '' every worker
    reason     TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    used       INTEGER NOT NULL DEFAULT 1,  -- of a plan this hub dispatched (see KILLS_KEPT)
    UNIQUE (plan_id, worker_id)
);
CREATE TABLE IF NOT EXISTS kills_apart (  -- kills of plans in use dropped past KILLS_HELD
    seq       INTEGER PRIMARY KEY,  -- the kill's own (kills.seq, never used again)
    digest    INTEGER NOT NULL,     -- of its plan id (worker.wire.protocol.plan_digest)
    worker_id TEXT NOT NULL         -- '' every worker
);
CREATE INDEX IF NOT EXISTS kills_apart_digest ON kills_apart (digest);
CREATE TABLE IF NOT EXISTS plans_dispatched (  -- plans of calls pruned (see PLANS_REMEMBERED)
    digest INTEGER PRIMARY KEY  -- of the plan id (worker.wire.protocol.plan_digest)
);
CREATE TABLE IF NOT EXISTS kills_epoch (  -- names the sequence of kills.seq
    one   INTEGER PRIMARY KEY CHECK (one = 1),
    epoch TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS queued_teardowns (  -- for a worker that was away
    worker_id  TEXT NOT NULL,
    plan_id    TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    PRIMARY KEY (worker_id, plan_id)
);
CREATE TABLE IF NOT EXISTS placements (  -- sandbox mode: which worker holds a plan's workspace
    plan_id   TEXT PRIMARY KEY,
    worker_id TEXT NOT NULL,
    placed_ms INTEGER NOT NULL,
    epoch     TEXT NOT NULL DEFAULT ''  -- the plan's creation its tokens prove (worker.hub.epochs)
);
"""


# The worker is told about an abandoned call on every reconnect for this long.
ABANDONED_KEPT_MS = 24 * 3600 * 1000
# Finished and abandoned calls are kept this long (a caller retrying an id gets the
# stored answer), then pruned; like the worker's ledger.
CALLS_KEPT_MS = 24 * 3600 * 1000
# The calls `prune_off_loop` forgets in one commit, at most: this many rows, and about
# this many bytes of them (a 10,000-entry listing's row is 1.5 MB).
PRUNE_BATCH_ROWS: Final = 512
PRUNE_BATCH_BYTES: Final = 16 * 1024 * 1024
# Workers away are remembered (ListWorkers, Status, the key their
# id is bound to) this long after they were last seen, and at most this many of them:
# anyone with hub-workers.token may say Hello under new ids, and each grew the table
# for good. Past the count, a new worker's row makes room by forgetting those away that
# were connected the least, their sessions together (a fleeting id goes before the
# person's worker that served for hours), then those seen longest ago. Connected
# workers are never forgotten. A worker forgotten is known again by its next Hello, its
# id bound again to the key it brings.
WORKERS_KEPT_MS = 30 * 24 * 3600 * 1000
WORKERS_AWAY_KEPT = 1024
# The plans this hub killed, one row a plan (and a worker, for a kill naming one), kept
# until this many newer kills came: each goes to every worker at its Hello until the
# worker confirms it (Heartbeat.kills_through), whenever it comes back, so a kill is
# kept by count, not by age. As many as a worker keeps whole of one server's kills
# (worker.core.ledger.MAX_SERVER_KILLS; past it, kills of plans in use are kept there
# by digest, MAX_KILLS_APART). A caller's flood of
# kills of made-up plans pushes out this hub's oldest kills, never grows the table.
# Kills of plans this hub never dispatched go first: a kill of a plan in use (a call
# of it sent, a workspace placed, or a call refused for the kill) goes only once this
# many kills of plans in use are newer (review14 finding 02: 1,000 kills of made-up
# plans pushed out a kill still owed to a worker away, and the plan ran again).
# A kill a worker remembered here has not confirmed is never pruned: whatever a caller
# marks "in use" (a Dispatch of each made-up plan before its kill), a flood pushed out
# the person's kill owed to a worker away (review15 finding 01). Those are bounded
# apart, and a kill is never refused: past KILLS_HELD kills some worker has not
# confirmed, the oldest of them go (of plans never dispatched first), and each worker
# that had not confirmed a kill of a plan in use that went (see _owe_stops) is owed a
# kill of every plan (ALL_PLANS, a row named for that worker, never dropped): it is sent
# to the worker ahead of its backlog, which stops every plan of this hub's there until
# the person lifts it (`agentworker lift '*'`), as the worker itself does past
# MAX_KILLS_APART. Before, past KILLS_HELD
# every KillPlan of a plan not killed already was refused, for as long as one worker
# stayed away (up to 30 days), while the plan ran (review16 E1). The rows stay at most
# KILLS_KEPT + KILLS_HELD + one a worker remembered.
KILLS_KEPT: Final = 1000
KILLS_HELD: Final = 10_000
# A kill of a plan in use dropped past KILLS_HELD is kept apart, by the digest of its
# plan id (kills_apart, ~40 bytes a row), and sent so (KillPlan.plan_digest, protocol 4)
# to the workers that had not confirmed it; the hub refuses the plan's calls to them
# meanwhile. Only past KILLS_APART of those are the oldest dropped, and a worker that
# had not confirmed one is owed the kill of every plan. Before, past KILLS_HELD that
# stop was owed at once: 10,001 pairs of a KillPlan and a call refused for it (made-up
# plans, in use so), a worker away, stopped every plan there (review16 F4).
KILLS_APART: Final = 1_000_000
APART_REASON: Final = (
    f"killed through this hub: one of more than {KILLS_HELD:,} kills a worker had not "
    "confirmed, kept since by the digest of its plan id, its reason not kept"
)
APART_STAND_IN: Final = (
    "this hub keeps a kill of one of its plans by the digest of the plan's id only, which "
    "this worker cannot read (its protocol is before 4): every plan of the hub is stopped "
    "here in its place until the person lifts it (agentworker lift '*')"
)
# A plan this hub dispatched is in use for good, not only while it keeps the plan's calls
# (CALLS_KEPT_MS): as it prunes a call it remembers its plan, by digest, in
# plans_dispatched (about 20 bytes a row), so a kill of a plan idle a day is still of a
# plan in use, kept apart past KILLS_HELD rather than dropped first. Before, it counted
# as never dispatched: a worker away, KILLS_HELD + 1 KillPlans of made-up plans erased
# the person's kill, and the worker back ran the plan (review19 A6). Past this many
# plans remembered no more are, and every plan counts as in use (fail closed: a kill
# is then kept apart, and past KILLS_APART a stop of every plan is owed).
PLANS_REMEMBERED: Final = 1_000_000
ALL_CONFIRMED: Final = 2**63 - 1  # a kill seq past any: with no worker, every kill is confirmed
ALL_PLANS: Final = "*"  # a kill of this plan id binds every plan (worker.core.ledger.ALL_PLANS)
# A kill's reason is kept this long, in UTF-8 bytes (it was 1,000 characters, up to
# 4,000 bytes: review14 finding 06). The worker keeps no more than it is sent.
KILL_REASON_BYTES: Final = 512


@dataclass(frozen=True)
class Dropped:
    """A kill dropped past KILLS_HELD: its plan, seq, the worker it named ("": every
    worker), and whether the plan was in use."""

    plan_id: str
    seq: int
    named: str
    used: bool


@dataclass(frozen=True)
class Kept:
    """A kill kept (`kill`), and the kills of every plan (ALL_PLANS) it made owed to
    workers whose unconfirmed kills went past KILLS_HELD (worker id -> that kill)."""

    kill: pb.KillPlan
    stops: dict[str, pb.KillPlan]


# Beside hub.db, the kills it numbered: "<kills_epoch> <highest seq>", written after each
# kill's commit (no fsync, as the commit has none: synchronous=NORMAL; a power cut that
# takes the last commits and leaves this starts a new epoch, which is right, since
# workers may have confirmed the seqs lost). A hub.db put back from a backup numbers
# below it, or in another epoch: at its start the hub makes a new kills epoch (see
# HubStore.__init__). The file is not hub.db's, so a backup of hub.db does not take it
# back. Before, the hub learnt it from a worker's Hello confirming kills past those
# numbered, and anyone with hub-workers.token could say so at will: each such Hello
# made a new epoch, and every worker took every kill kept anew, the person's lifts
# undone at each (review16 E3).
KILLS_ISSUED_FILE: Final = "hub-kills-issued"
# How far one worker's word moves the kills' numbering on (HubStore.number_kills_past):
# far past any count of kills a backup could miss, and 2**63 out of reach of anyone's
# Hellos (2**43 of them).
KILLS_SKIPPED_AT_MOST: Final = 2**20


class IssuedMark:
    """The file that keeps how far hub.db numbered its kills (KILLS_ISSUED_FILE)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> tuple[str, int] | None:
        """(epoch, seq) written last; None with no file; ("", -1) for one unreadable."""
        try:
            text = self.path.read_text(encoding="ascii")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError):
            return ("", -1)
        epoch, _, seq = text.strip().partition(" ")
        return (epoch, int(seq)) if seq.isdigit() else ("", -1)

    def write(self, epoch: str, seq: int) -> None:
        record = f"{epoch} {seq}\n".encode("ascii")
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, record, 0)  # one write: a process killed leaves it whole
            os.ftruncate(fd, len(record))
        finally:
            os.close(fd)


def utf8_prefix(text: str, limit: int) -> str:
    """`text` cut to at most `limit` UTF-8 bytes, on a character's boundary."""
    data = text.encode()
    return text if len(data) <= limit else data[:limit].decode(errors="ignore")


_INSERT_CALL = (
    "INSERT OR IGNORE INTO calls (correlation_id, worker_id, args_digest, request,"
    " blob_bytes, created_ms, deadline_ms, plan_id, state, result)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'PENDING', NULL)"
)
# A call added and answered since the last commit, written once (see complete_many).
_INSERT_ANSWERED = (
    "INSERT OR IGNORE INTO calls (correlation_id, worker_id, args_digest, request,"
    " blob_bytes, created_ms, deadline_ms, plan_id, state, result, result_blob,"
    " result_blob_bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'DONE', ?, ?, ?)"
)
_CALL_COLUMNS = (
    "correlation_id, worker_id, args_digest, request, request_blob, state, result, deadline_ms,"
    " blob_bytes, result_blob, result_blob_bytes"
)
# Columns added since the first hub.db, with their definitions (added on open).
_ADDED_COLUMNS: Final = {
    "request_blob": "BLOB",
    "blob_bytes": "INTEGER NOT NULL DEFAULT 0",
    "result_blob": "BLOB",
    "result_blob_bytes": "INTEGER NOT NULL DEFAULT 0",
    "plan_id": "TEXT NOT NULL DEFAULT ''",
}


@dataclass(frozen=True)
class StoredCall:
    correlation_id: str
    worker_id: str
    args_digest: str
    request: pb.ActionRequest  # without its blob (the hub holds that while it may re-send)
    state: str
    result: pb.ActionResult | None  # with its blob only while no caller has taken it
    deadline_ms: int
    blob_bytes: int = 0  # the request blob's size
    result_blob_bytes: int = 0  # the result blob's size, kept or not

    @property
    def result_blob_gone(self) -> bool:
        """The result had a blob, delivered and no longer kept."""
        return (
            self.result is not None
            and self.result_blob_bytes > 0
            and len(self.result.blob) != self.result_blob_bytes
        )


class HubStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._db = connect(path, _SCHEMA, convert=True)  # the hub owns hub.db
        # An answered call's args are masked in place (answered_request): the bytes
        # they took are zeroed, not left in the page's free space.
        self._db.execute("PRAGMA secure_delete=ON")
        self._db.create_function("answered_request", 2, answered_request, deterministic=True)
        self._unwritten: dict[str, tuple[object, ...]] = {}  # added, not yet flushed
        # Of _unwritten, the calls a group commit left for the next (complete_many),
        # which writes them, answered or not.
        self._held_over: set[str] = set()
        # Commits handed to the writer thread (complete_off_loop), oldest first, each
        # with the calls it took from _unwritten and those of them taken back should it
        # fail (record_off_loop); taken in by `reap` on the loop.
        self._committing: list[
            tuple[
                concurrent.futures.Future[list[bool]],
                dict[str, tuple[object, ...]],
                tuple[str, ...],
            ]
        ] = []
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(calls)")}
        for name, definition in _ADDED_COLUMNS.items():
            if name not in columns:  # a hub.db from before the column
                self._db.execute(f"ALTER TABLE calls ADD COLUMN {name} {definition}")
        if "plan_id" not in columns:  # its calls' plans are in their requests: read once
            self._db.create_function("plan_of", 1, _plan_of, deterministic=True)
            self._db.execute("UPDATE calls SET plan_id = plan_of(request)")
        self._db.execute("CREATE INDEX IF NOT EXISTS calls_plan ON calls (plan_id, worker_id)")
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(workers)")}
        if "key_digest" not in columns:
            self._db.execute("ALTER TABLE workers ADD COLUMN key_digest TEXT NOT NULL DEFAULT ''")
        if "connected_ms" not in columns:
            self._db.execute(
                "ALTER TABLE workers ADD COLUMN connected_ms INTEGER NOT NULL DEFAULT 0"
            )
        if "kills_through" not in columns:
            self._db.execute(
                "ALTER TABLE workers ADD COLUMN kills_through INTEGER NOT NULL DEFAULT 0"
            )
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(kills)")}
        if "used" not in columns:  # a hub.db from before: its kills count as in use
            self._db.execute("ALTER TABLE kills ADD COLUMN used INTEGER NOT NULL DEFAULT 1")
        # The kills in the order they go (past KILLS_HELD, past KILLS_KEPT): walked, not
        # sorted, at each kill.
        self._db.execute("CREATE INDEX IF NOT EXISTS kills_by_use ON kills (used, seq)")
        # A worker stream's key is looked up before its Hello is read (worker.hub.server).
        self._db.execute("CREATE INDEX IF NOT EXISTS workers_key ON workers (key_digest)")
        # The operator's decisions about workers (worker.hub.enrolment).
        self.enrolments = Enrolments(self._db)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(placements)")}
        if "epoch" not in columns:  # placed before epochs: its tokens carry none
            self._db.execute("ALTER TABLE placements ADD COLUMN epoch TEXT NOT NULL DEFAULT ''")
        # The sandbox plans torn down, whose placement tokens so far prove nothing.
        self.ended_plans = EndedPlans(self._db)
        # The calls waiting for each worker, kept as they come and go (see
        # worker.hub.pending); counted once here.
        self.pending = PendingCalls(
            self._db.execute(
                "SELECT worker_id, count(*), coalesce(sum(length(request)), 0) FROM calls"
                " WHERE state = 'PENDING' GROUP BY worker_id"
            )
        )
        self.workers_away_kept = WORKERS_AWAY_KEPT
        # The count `known_workers` read last (Status's while a commit is under way).
        (self._known_workers,) = self._db.execute("SELECT count(*) FROM workers").fetchone()
        self._issued_seq: int | None = None  # kills_issued, read once, then kept
        (self._apart_rows,) = self._db.execute("SELECT count(*) FROM kills_apart").fetchone()
        (self._plans_remembered,) = self._db.execute(
            "SELECT count(*) FROM plans_dispatched"
        ).fetchone()
        self._take_queued_kills()
        row = self._db.execute("SELECT epoch FROM kills_epoch").fetchone()
        if row is None:
            row = (uuid.uuid4().hex,)
            self._db.execute("INSERT INTO kills_epoch VALUES (1, ?)", row)
        self.kills_epoch: str = row[0]
        self._issued = IssuedMark(path.with_name(KILLS_ISSUED_FILE))
        self._start_epoch_if_went_back()
        # plan -> {worker named or '': seq}: what Dispatch asks, without a query, and in
        # one lookup whatever the count of workers named (a kill of ALL_PLANS is named
        # for each worker owed one: a list walked whole per Dispatch and per worker at
        # each KillPlan froze the hub's loop, 0.9 s a kill at 10,000 of them: review17 E1).
        self._kills: dict[str, dict[str, int]] = {}
        self._unused_kills: set[str] = set()  # killed plans never dispatched (yet)
        for seq, plan_id, worker_id, used in self._db.execute(
            "SELECT seq, plan_id, worker_id, used FROM kills"
        ):
            kills = self._kills.setdefault(plan_id, {})
            kills[worker_id] = max(seq, kills.get(worker_id, 0))
            if not used:
                self._unused_kills.add(plan_id)

    def _take_queued_kills(self) -> None:
        """A hub.db from before kills were kept: its kills queued for workers away are
        kept as kills of the plan for each of those workers."""
        if not self._db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'queued_kills'"
        ).fetchone():
            return
        with db.transaction(self._db):
            self._db.execute(
                "INSERT OR REPLACE INTO kills (plan_id, worker_id, reason, created_ms)"
                " SELECT plan_id, worker_id, reason, created_ms FROM queued_kills"
                " ORDER BY created_ms"
            )
            self._db.execute("DROP TABLE queued_kills")
            self._prune_kills()

    def _start_epoch_if_went_back(self) -> None:
        """A hub.db that numbered fewer kills than the file beside it says, or in another
        epoch (put back from a backup): a new kills epoch, since its next kills would
        reuse seqs the workers confirmed already, never to be sent, counted as gone ahead
        of the plan's calls, which ran (review15 finding 08). No file (a hub.db from
        before it): it is written now."""
        issued = self.kills_issued()
        mark = self._issued.read()
        if mark is not None and (mark[0] != self.kills_epoch or mark[1] > issued):
            log.warning(
                "hub: hub.db numbered kills through %d of epoch %s, and %s says it had "
                "numbered %d of epoch %s: hub.db went back (a backup?); numbering kills in "
                "a new epoch, which every worker is sent anew",
                issued,
                self.kills_epoch,
                self._issued.path.name,
                mark[1],
                mark[0] or "(unreadable)",
            )
            self.new_kills_epoch()
        else:
            self._issued.write(self.kills_epoch, issued)

    def close(self) -> None:
        self.flush()
        db.close(self._db)

    def flush(self) -> None:
        """Commit the calls added since the last flush."""
        self.settle()
        if self._unwritten:
            with db.transaction(self._db):
                self._write_added(self._unwritten)
            self._unwritten = {}  # only once written: a failed commit keeps them for the next
            self._held_over = set()

    @property
    def has_unwritten(self) -> bool:
        """Whether calls added wait for a commit (a group commit left some for the next)."""
        return bool(self._unwritten)

    def _write_added(
        self,
        added: dict[str, tuple[object, ...]],
        answered: Container[str] = (),
        later: Container[str] = (),
    ) -> None:
        """Write the calls `added` since the last commit, but those `answered` (written
        already, with their answers) and those left for a `later` commit."""
        rows = [row for cid, row in added.items() if cid not in answered and cid not in later]
        if rows:
            self._db.executemany(_INSERT_CALL, rows)

    def get(self, correlation_id: str) -> StoredCall | None:
        """The call as hub.db has it. One added and not yet written is committed first;
        no other commit is made (another process may hold hub.db, review29 h1)."""
        self.settle()  # a call the writer thread failed to write is back, unwritten
        if correlation_id in self._unwritten:
            self.flush()
        row = self._db.execute(
            f"SELECT {_CALL_COLUMNS} FROM calls WHERE correlation_id = ?",
            (correlation_id,),
        ).fetchone()
        return None if row is None else _call(row)

    def add(
        self,
        worker_id: str,
        digest: str,
        request: pb.ActionRequest,
        blob_bytes: int,
        deadline_ms: int,
        *,
        fresh: bool = False,
    ) -> bool:
        """Record a new call (`request` without its `blob_bytes`-byte blob, which is not
        stored), to be written by the next flush; False when its correlation id is
        already known. A `fresh` id, made by the hub just now, is not looked up."""
        cid = request.correlation_id
        if not fresh:
            self.settle()  # a call the writer thread failed to write is added again
        if cid in self._unwritten or (not fresh and self._known(cid)):
            return False
        asked = request.SerializeToString()
        self._unwritten[cid] = (
            cid,
            worker_id,
            digest,
            asked,
            blob_bytes,
            now_ms(),
            deadline_ms,
            request.plan_id,
        )
        self.pending.came(worker_id, len(asked))
        return True

    def pending_for(self, worker_id: str) -> tuple[int, int]:
        """The calls recorded for `worker_id` and not yet answered nor abandoned: how
        many, and the bytes of their requests (args included). Kept in memory: no query,
        no wait for the writer thread."""
        return self.pending.of(worker_id)

    def workers_of_plan(self, plan_id: str) -> set[str]:
        """The workers this hub sent a call of `plan_id`, as long as it keeps the calls
        (CALLS_KEPT_MS after they ended)."""
        self.settle()  # the calls the writer thread is writing: committed, or back
        sent = {str(row[1]) for row in self._unwritten.values() if row[7] == plan_id}
        rows = self._db.execute(
            "SELECT DISTINCT worker_id FROM calls WHERE plan_id = ?", (plan_id,)
        ).fetchall()
        return sent | {str(worker_id) for (worker_id,) in rows}

    def worker_of(self, correlation_id: str) -> str | None:
        """The worker the call was sent to, or None for a call this hub does not know.
        Asked for each result: a call added since the last commit is looked up in
        memory (the writer thread's too), any other by its key, without a commit."""
        added = self._added(correlation_id)
        if added is not None:
            return str(added[1])
        row = self._db.execute(
            "SELECT worker_id FROM calls WHERE correlation_id = ?", (correlation_id,)
        ).fetchone()
        return None if row is None else str(row[0])

    def call_state(self, correlation_id: str) -> tuple[str, str] | None:
        """The worker a call was sent to and its state (PENDING, DONE, ABANDONED), or
        None for a call this hub does not know: `worker_of`, with the state."""
        added = self._added(correlation_id)
        if added is not None:
            return str(added[1]), "PENDING"
        row = self._db.execute(
            "SELECT worker_id, state FROM calls WHERE correlation_id = ?", (correlation_id,)
        ).fetchone()
        return None if row is None else (str(row[0]), str(row[1]))

    def _added(self, correlation_id: str) -> tuple[object, ...] | None:
        """A call added and not yet committed: since the last commit, or taken by one
        still under way in the writer thread (no wait for it)."""
        self.reap()
        added = self._unwritten.get(correlation_id)
        if added is None:
            for _commit, taken, _unsent in self._committing:
                added = taken.get(correlation_id)
                if added is not None:
                    break
        return added

    @property
    def committing(self) -> bool:
        """Whether a commit handed to the writer thread is still under way."""
        return bool(self._committing)

    def reap(self) -> None:
        """Take in the writer thread's commits that ended, oldest first: the calls each
        took are written, or, should it have failed, back to be written by the next
        commit (as a failed commit on the loop keeps them). Only on the loop's thread:
        the writer thread never touches the calls not yet written."""
        while self._committing and self._committing[0][0].done():
            commit, taken, unsent = self._committing.pop(0)
            if commit.exception() is not None:
                for cid in unsent:  # its caller is told so: nor will a later commit write it
                    added = taken.pop(cid, None)
                    if added is not None:
                        self.pending.went(str(added[1]), _size(added[3]))
                self._unwritten = {**taken, **self._unwritten}

    def settle(self) -> None:
        """Wait for the writer thread's commits, and take them in."""
        self._db.settle()
        self.reap()

    async def settled(self) -> None:
        """`settle`, waiting on the event loop rather than holding it (a commit in the
        writer thread may wait for hub.db held by another process)."""
        await self._db.writer_idle()
        self.settle()

    def _known(self, correlation_id: str) -> bool:
        row = self._db.execute("SELECT 1 FROM calls WHERE correlation_id = ?", (correlation_id,))
        return row.fetchone() is not None

    def complete(self, result: pb.ActionResult, *, keep_blob: bool = False) -> bool:
        """Store a result; False when the call is unknown or already has one."""
        return self.complete_many([(result, None, keep_blob, None)])[0]

    def complete_many(
        self, results: list[tuple[pb.ActionResult, Buffer | None, bool, bytes | None]]
    ) -> list[bool]:
        """`complete` for each (result, its blob if read apart from it, keep the blob?,
        the result serialized without its blob if it came so), in one commit. A
        result's blob is stored only when asked (no caller took it yet); its size
        always is. A call added since the last commit and answered meanwhile (most
        calls: commits are STORE_DELAY_S apart) is written once, with its answer, not
        written pending and then updated."""
        self.settle()
        # A call added since the last commit and not answered by these results is left
        # for the next (most are answered by then); one a commit left already goes now.
        answering = {result.correlation_id for result, *_rest in results}
        later = {
            cid for cid in self._unwritten if cid not in self._held_over and cid not in answering
        }
        stored = self._complete(results, self._unwritten, later)
        # Only once written: a failed commit keeps them all for the next.
        self._unwritten = {cid: row for cid, row in self._unwritten.items() if cid in later}
        self._held_over = later
        return stored

    def complete_off_loop(
        self, results: list[tuple[pb.ActionResult, Buffer | None, bool, bytes | None]]
    ) -> concurrent.futures.Future[list[bool]]:
        """`complete_many` in the connection's writer thread (a large result: a 1.5 MB
        listing's commit took 3-6 ms of the loop), after those handed over before it;
        its future says when it committed. The calls added since the last commit go
        with it: until it ended they are still found in memory (`call_state`,
        `worker_of`), and whatever reads the database meanwhile waits for it
        (`Database.settle`); should it fail they are written by the next commit
        (`reap`), as on the loop."""
        return self._off_loop(results, ())

    def record_off_loop(self, correlation_id: str) -> concurrent.futures.Future[list[bool]]:
        """Commit the calls added, `correlation_id`'s among them, in the writer thread
        (`complete_off_loop`): a call whose id its caller chose goes to its worker only
        once committed. Should that commit fail, the call is taken back as the commit
        is taken in (`reap`, whoever calls it first), never written by a later commit:
        it was not sent, and its caller is told so."""
        assert correlation_id in self._unwritten
        return self._off_loop([], (correlation_id,))

    def _off_loop(
        self,
        results: list[tuple[pb.ActionResult, Buffer | None, bool, bytes | None]],
        unsent: tuple[str, ...],
    ) -> concurrent.futures.Future[list[bool]]:
        self.reap()
        taken, self._unwritten = self._unwritten, {}
        self._held_over = set()
        commit = self._db.off_loop(lambda: self._complete(results, taken))
        self._committing.append((commit, taken, unsent))
        return commit

    def _complete(
        self,
        results: list[tuple[pb.ActionResult, Buffer | None, bool, bytes | None]],
        added_calls: dict[str, tuple[object, ...]],
        later: Container[str] = (),
    ) -> list[bool]:
        stored: list[bool] = []
        whole: dict[str, tuple[object, ...]] = {}  # added and answered: one row each
        answered: list[tuple[str, int]] = []  # (worker, request bytes) no longer pending
        with db.transaction(self._db):
            for result, apart, keep_blob, serialized in results:
                cid = result.correlation_id
                blob: Buffer = result.blob if apart is None else apart  # each read copies
                # Copied field by field only to leave a blob out: a result with none (or
                # read apart from it) is serialized as it is (a 1.5 MB listing's JSON was
                # copied twice more).
                bare = without_blob(result) if apart is None and blob else result
                answer = bare.SerializeToString() if serialized is None else serialized
                if not keep_blob and (masked := at_rest(bare)) is not None:
                    # A caller has it: kept from the start in its form at rest (a
                    # handed result's stub carries that form, and all the rest).
                    answer = masked.SerializeToString()
                kept = bytes(blob) if keep_blob and blob else None
                added = added_calls.get(cid)
                if added is not None and cid not in whole:
                    asked = added[3]  # add() wrote it as bytes
                    request = (
                        answered_request(asked, _preview(result))
                        if isinstance(asked, bytes)
                        else asked
                    )
                    whole[cid] = (*added[:3], request, *added[4:], answer, kept, len(blob))
                    answered.append((str(added[1]), _size(asked)))
                    stored.append(True)
                elif added is not None:  # answered twice since the last commit
                    stored.append(False)
                else:
                    new = self._answered(answer, kept, len(blob), cid, _preview(result), answered)
                    stored.append(new)
            if whole:
                self._db.executemany(_INSERT_ANSWERED, list(whole.values()))
            # and the calls not answered yet (but those left for a later commit)
            self._write_added(added_calls, answered=whole, later=later)
        self.pending.went_elsewhere(answered)  # committed (maybe in the writer thread)
        return stored

    def _answered(
        self,
        answer: bytes,
        kept: bytes | None,
        blob_bytes: int,
        cid: str,
        preview: str,
        was_pending: list[tuple[str, int]],
    ) -> bool:
        """Store a result in its call's row; whether it was new (the call known, and
        not answered yet). A call that was pending goes to `was_pending` (its worker,
        its request's bytes)."""
        # Read before it is masked (a call answered after the commit that recorded
        # it: one lookup by its key, in the commit's transaction).
        pending = self._db.execute(
            "SELECT worker_id, length(request) FROM calls"
            " WHERE correlation_id = ? AND state = 'PENDING'",
            (cid,),
        ).fetchone()
        # A finished call is never sent again: the digest still answers
        # args_mismatch; a legacy row's request blob goes, and its args give way to
        # their preview.
        cur = self._db.execute(
            "UPDATE calls SET state = 'DONE', result = ?, result_blob = ?,"
            " result_blob_bytes = ?, request_blob = NULL,"
            " request = answered_request(request, ?)"
            " WHERE correlation_id = ? AND state != 'DONE'",
            (answer, kept, blob_bytes, preview, cid),
        )
        if cur.rowcount > 0:
            if pending is not None:
                was_pending.append((str(pending[0]), int(pending[1])))
            return True
        if kept is not None:
            # A re-send (this hub never acked it: it stopped first) of a result a
            # caller was handed, maybe without the reply reaching it: its blob is
            # kept again, for that caller's retry.
            self._db.execute(
                "UPDATE calls SET result_blob = ? WHERE correlation_id = ?"
                " AND state = 'DONE' AND result_blob IS NULL AND result_blob_bytes = ?",
                (kept, cid, blob_bytes),
            )
        return False

    def delivered(self, call: StoredCall) -> None:
        """A caller took the stored result: its blob is not kept any longer, and the
        result is kept in its form at rest (protocol.at_rest), its whole one zeroed
        where it lay (secure_delete)."""
        assert call.result is not None
        masked = at_rest(without_blob(call.result))
        self._db.execute(
            "UPDATE calls SET result_blob = NULL, result = COALESCE(?, result)"
            " WHERE correlation_id = ? AND state = 'DONE'",
            (None if masked is None else masked.SerializeToString(), call.correlation_id),
        )

    def prune(self, now: int | None = None) -> int:
        """Forget calls finished or abandoned longer than CALLS_KEPT_MS ago, and pending
        ones whose deadline passed that long ago (their worker never came back). The pages
        they took are reused; a surplus goes back with db.give_back_off_loop."""
        self.flush()
        cutoff = (now if now is not None else now_ms()) - CALLS_KEPT_MS
        with db.transaction(self._db):
            expired = self._db.execute(
                "SELECT worker_id, length(request) FROM calls"
                " WHERE state = 'PENDING' AND deadline_ms < ?",
                (cutoff,),
            ).fetchall()
            self._remember_plans(
                [
                    str(plan)
                    for (plan,) in self._db.execute(
                        "SELECT DISTINCT plan_id FROM calls WHERE"
                        " (state != 'PENDING' AND created_ms < ?)"
                        " OR (state = 'PENDING' AND deadline_ms < ?)",
                        (cutoff, cutoff),
                    )
                ]
            )
            cur = self._db.execute(
                "DELETE FROM calls WHERE (state != 'PENDING' AND created_ms < ?)"
                " OR (state = 'PENDING' AND deadline_ms < ?)",
                (cutoff, cutoff),
            )
        self.pending.went_elsewhere((str(w), int(size)) for w, size in expired)
        return cur.rowcount

    async def prune_off_loop(self, now: int | None = None) -> int:
        """`prune`, made in the writer thread (see complete_off_loop) in commits of at
        most PRUNE_BATCH_ROWS rows and about PRUNE_BATCH_BYTES: a day of large results
        (hub.db rewrites each freed page: secure_delete) took the loop for seconds. The
        loop waits for none of it; a read of hub.db meanwhile waits for one batch."""
        self.flush()
        cutoff = (now if now is not None else now_ms()) - CALLS_KEPT_MS
        gone = 0
        while True:
            pruned, more = await asyncio.wrap_future(
                self._db.off_loop(lambda: self._prune_batch(cutoff))
            )
            gone += pruned
            if not more:
                return gone

    def _prune_batch(self, cutoff: int) -> tuple[int, bool]:
        """One commit of `prune_off_loop`: how many calls it forgot, and whether more
        may be left."""
        found = self._db.execute(
            "SELECT rowid, length(request) + coalesce(length(result), 0)"
            " + coalesce(length(result_blob), 0), worker_id, state, length(request), plan_id"
            " FROM calls"
            " WHERE (state != 'PENDING' AND created_ms < ?)"
            " OR (state = 'PENDING' AND deadline_ms < ?) LIMIT ?",
            (cutoff, cutoff, PRUNE_BATCH_ROWS),
        ).fetchall()
        batch: list[tuple[int]] = []
        expired: list[tuple[str, int]] = []  # pending calls among them (worker, bytes)
        plans: set[str] = set()
        size = 0
        for rowid, row_bytes, worker_id, state, request_bytes, plan in found:
            batch.append((rowid,))
            plans.add(str(plan))
            if state == "PENDING":
                expired.append((str(worker_id), int(request_bytes)))
            size += row_bytes
            if size >= PRUNE_BATCH_BYTES:
                break
        if batch:
            with db.transaction(self._db):
                self._remember_plans(plans)
                self._db.executemany("DELETE FROM calls WHERE rowid = ?", batch)
            self.pending.went_elsewhere(expired)
        return len(batch), len(found) == PRUNE_BATCH_ROWS or len(batch) < len(found)

    def _remember_plans(self, plans: Iterable[str]) -> None:
        """Remember `plans` (of calls about to be pruned) as dispatched, up to
        PLANS_REMEMBERED (see there). In the caller's transaction."""
        for plan in plans:
            if not plan or self._plans_remembered >= PLANS_REMEMBERED:
                continue
            cur = self._db.execute(
                "INSERT OR IGNORE INTO plans_dispatched (digest) VALUES (?)", (plan_digest(plan),)
            )
            self._plans_remembered += cur.rowcount

    def _dispatched_before(self, plan_id: str) -> bool:
        """Whether a call of the plan was pruned (see PLANS_REMEMBERED): past as many as
        are remembered, any plan may have been."""
        if self._plans_remembered >= PLANS_REMEMBERED:
            return True
        row = self._db.execute(
            "SELECT 1 FROM plans_dispatched WHERE digest = ?", (plan_digest(plan_id),)
        ).fetchone()
        return row is not None

    def abandon(self, correlation_id: str) -> None:
        """The call will not be sent again, nor answered but `timeout`: its args and any
        blob are let go now (its digest still answers args_mismatch). Kept whole, an
        abandoned call's args (a password in its argv) stayed in hub.db for 24 h
        (review17 E3); an answered call keeps the worker's masked preview, this one
        none."""
        self.flush()
        with db.transaction(self._db):
            pending = self._db.execute(
                "SELECT worker_id, length(request) FROM calls"
                " WHERE correlation_id = ? AND state = 'PENDING'",
                (correlation_id,),
            ).fetchone()
            self._db.execute(
                "UPDATE calls SET state = 'ABANDONED', request_blob = NULL,"
                " request = answered_request(request, '')"
                " WHERE correlation_id = ? AND state = 'PENDING'",
                (correlation_id,),
            )
        if pending is not None:
            self.pending.went(str(pending[0]), int(pending[1]))

    def open_calls(self, worker_id: str) -> list[StoredCall]:
        self.flush()
        rows = self._db.execute(
            f"SELECT {_CALL_COLUMNS} FROM calls WHERE worker_id = ?"
            " AND (state = 'PENDING' OR (state = 'ABANDONED' AND deadline_ms > ?))"
            " ORDER BY created_ms",
            (worker_id, now_ms() - ABANDONED_KEPT_MS),
        ).fetchall()
        return [_call(row) for row in rows]

    def seen_worker(self, hello: pb.Hello, key_digest: str = "") -> None:
        """Record the worker's Hello, served with the key of `key_digest` (the one its
        operator accepted: its streams' Hellos are read in turns of that key's, see
        knows_key); kept for as long as the id is remembered (WORKERS_KEPT_MS)."""
        self._db.execute(
            "INSERT INTO workers (worker_id, hello, last_seen_ms, key_digest)"
            " VALUES (?, ?, ?, ?) ON CONFLICT (worker_id) DO UPDATE"
            " SET hello = excluded.hello, last_seen_ms = excluded.last_seen_ms,"
            " key_digest = CASE WHEN excluded.key_digest = '' THEN key_digest"
            " ELSE excluded.key_digest END",
            (hello.worker_id, hello.SerializeToString(), now_ms(), key_digest),
        )

    def worker_key(self, worker_id: str) -> str:
        """The digest of the key `worker_id` was last served with ('' while none)."""
        row = self._db.execute(
            "SELECT key_digest FROM workers WHERE worker_id = ?", (worker_id,)
        ).fetchone()
        return "" if row is None else str(row[0])

    def bind_key(self, worker_id: str, key_digest: str) -> None:
        """The operator decided about `worker_id`: its row is bound to the key accepted
        now ('' for none), never to one no longer served (review28 L3: the old key kept
        the known keys' turns, and the new one waited on the unknown keys')."""
        self._db.execute(
            "UPDATE workers SET key_digest = ? WHERE worker_id = ?", (key_digest, worker_id)
        )

    def knows_key(self, key_digest: str) -> bool:
        """Whether a worker remembered here is bound to the key of this digest."""
        if not key_digest:
            return False
        row = self._db.execute("SELECT 1 FROM workers WHERE key_digest = ? LIMIT 1", (key_digest,))
        return row.fetchone() is not None

    def knows_worker(self, worker_id: str) -> bool:
        row = self._db.execute("SELECT 1 FROM workers WHERE worker_id = ?", (worker_id,))
        return row.fetchone() is not None

    def touch_worker(self, worker_id: str, connected_ms: int = 0, kills_through: int = 0) -> None:
        """The worker was seen now, after a session of `connected_ms` in which it
        confirmed this hub's kills through `kills_through`."""
        self._db.execute(
            "UPDATE workers SET last_seen_ms = ?, connected_ms = connected_ms + ?,"
            " kills_through = ? WHERE worker_id = ?",
            (now_ms(), max(0, connected_ms), kills_through, worker_id),
        )

    def kills_confirmed(self, worker_id: str) -> int:
        """Through which of this hub's kills the worker, away, confirmed recording them
        in its last session (0: none, or a worker not remembered)."""
        row = self._db.execute(
            "SELECT kills_through FROM workers WHERE worker_id = ?", (worker_id,)
        ).fetchone()
        return int(row[0]) if row else 0

    def worker_ids(self) -> list[str]:
        """Every worker remembered (see WORKERS_AWAY_KEPT), connected or away."""
        return [str(w) for (w,) in self._db.execute("SELECT worker_id FROM workers")]

    def known_workers(self) -> int:
        """How many workers hub.db knows. While a commit is under way in the writer
        thread, the count read last (at the start, if none since): that commit may wait
        for hub.db held by another process, and Status waits for no commit (review29 h1)."""
        if not self._db.writing:
            row = self._db.execute("SELECT COUNT(*) FROM workers").fetchone()
            self._known_workers = int(row[0])
        return int(self._known_workers)

    def forget_workers(self, connected: Container[str], now: int | None = None) -> int:
        """Forget workers away since WORKERS_KEPT_MS, and past `workers_away_kept` of
        those away, the ones connected the least, then seen longest ago (see
        WORKERS_AWAY_KEPT); never one in `connected`. How many were forgotten. Their
        placements go with them: a hub's Placements reads them again (`Hub.forget_workers`)."""
        cutoff = (now if now is not None else now_ms()) - WORKERS_KEPT_MS
        rows = self._db.execute(
            "SELECT worker_id, last_seen_ms FROM workers"
            " ORDER BY connected_ms DESC, last_seen_ms DESC, worker_id"
        ).fetchall()
        away = [(worker_id, seen) for worker_id, seen in rows if worker_id not in connected]
        gone = [
            worker_id
            for kept, (worker_id, seen) in enumerate(away)
            if seen < cutoff or kept >= self.workers_away_kept
        ]
        if gone:
            with db.transaction(self._db):
                self._db.executemany(
                    "DELETE FROM workers WHERE worker_id = ?", [(worker_id,) for worker_id in gone]
                )
                # And the plans placed there: the key their id was bound to is forgotten,
                # so whoever says Hello under the id next binds theirs, and would be the
                # plans' worker by this record (review26 H8). The worker itself, back,
                # proves each plan with its placement token (Placements.learn).
                self._db.executemany(
                    "DELETE FROM placements WHERE worker_id = ?",
                    [(worker_id,) for worker_id in gone],
                )
                # And what the hub accepted them by unasked (worker.hub.enrolment): anyone
                # with the workers' token may say Hello under new ids, and with
                # accept_new_workers on each was a row for good. The operator's own
                # decisions stay.
                self._db.executemany(
                    "DELETE FROM enrolments WHERE worker_id = ? AND decided_by != 'operator'",
                    [(worker_id,) for worker_id in gone],
                )
                # And the kills of every plan owed to them: kept, one a made-up id, they
                # grew without bound, and were walked at each Dispatch and KillPlan
                # (review17 E1). Not a caller's kill named for one (bounded as every kill
                # is, KILLS_HELD and KILLS_APART): deleted too, the worker back was sent
                # none of it, and the killed plan's call went to it (review18 F4).
                forgotten = set(gone)
                named = [
                    (ALL_PLANS, str(worker))
                    for (worker,) in self._db.execute(
                        "SELECT worker_id FROM kills WHERE worker_id != '' AND plan_id = ?",
                        (ALL_PLANS,),
                    )
                    if worker in forgotten
                ]
                self._db.executemany("DELETE FROM kills WHERE plan_id = ? AND worker_id = ?", named)
            for plan, worker in named:
                self._forget_kill(plan, named=worker)
        return len(gone)

    def kills_issued(self) -> int:
        """The highest kill seq this hub.db ever numbered (0: none). Read once, then
        kept as kills are numbered: every worker's heartbeat asks it."""
        if self._issued_seq is None:
            row = self._db.execute(
                "SELECT seq FROM sqlite_sequence WHERE name = 'kills'"
            ).fetchone()
            self._issued_seq = int(row[0]) if row else 0
        return self._issued_seq

    def number_kills_past(self, claimed: int) -> int:
        """Number the next kills after `claimed` (a worker's word that it confirmed kills
        past those this hub.db numbered), at most KILLS_SKIPPED_AT_MOST further at a
        time; the highest seq numbered now. A hub whose whole folder was put back
        (hub-kills-issued with hub.db) sees no sign of it at its start, and its next
        kills took seqs the workers had confirmed already: each worker took the
        person's kill as one it had lifted since, and the plan ran (review17 E2). Only
        numbers skip: no epoch, nothing undone, whoever says it."""
        issued = self.kills_issued()
        target = min(claimed, issued + KILLS_SKIPPED_AT_MOST)
        if target <= issued:
            return issued
        with db.transaction(self._db):
            self._db.execute(
                "INSERT OR IGNORE INTO sqlite_sequence (name, seq) VALUES ('kills', 0)"
            )
            self._db.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'kills'", (target,))
        self._issued_seq = target
        self._issued.write(self.kills_epoch, target)
        return target

    def new_kills_epoch(self) -> str:
        """Number the kills in a new sequence: every worker's mark (Hello.kills_through)
        is of the old one, so each takes every kill kept anew (a lift at a worker is then
        undone: fail closed). For a hub.db that went back (a backup restored), whose
        next seqs are ones workers confirmed already (review15 finding 08), seen at the
        hub's start (KILLS_ISSUED_FILE), never from a worker's word (review16 E3)."""
        epoch = uuid.uuid4().hex
        with db.transaction(self._db):
            self._db.execute("UPDATE kills_epoch SET epoch = ?", (epoch,))
            self._db.execute("UPDATE workers SET kills_through = 0")
        self.kills_epoch = epoch
        self._issued.write(epoch, self.kills_issued())
        return epoch

    def kill_marks(self, connected: Mapping[str, int] | None = None) -> dict[str, int]:
        """Through which kill each worker remembered here confirmed recording them:
        `connected` (worker -> its session's mark) in place of the marks of their last
        sessions."""
        marks = {
            str(worker_id): int(through)
            for worker_id, through in self._db.execute(
                "SELECT worker_id, kills_through FROM workers"
            )
        }
        marks.update(connected or {})
        return marks

    def kills_confirmed_by_all(self, connected: Mapping[str, int] | None = None) -> int:
        """Through which kill every worker remembered here confirmed recording them (see
        kill_marks)."""
        return min(self.kill_marks(connected).values(), default=ALL_CONFIRMED)  # none: all

    def kill(
        self,
        plan_id: str,
        reason: str,
        worker_id: str = "",
        connected: Mapping[str, int] | None = None,
    ) -> Kept:
        """Keep a kill of the plan (for `worker_id` alone, or every worker), numbered
        after every kill before it (a kill of the plan again is numbered anew, and so
        reaches the workers that confirmed the last one); past KILLS_KEPT, the oldest
        of those every worker confirmed go (marks: see kill_marks). Past KILLS_HELD kills
        not confirmed, the oldest of those go too, those of plans in use kept apart (see
        KILLS_APART); past that each worker that had not confirmed one dropped from there
        is owed a kill of ALL_PLANS (`Kept.stops`). Never refused. Committed before it
        returns: what the hub answers a caller is on disk."""
        reason = utf8_prefix(reason, KILL_REASON_BYTES)
        marks = self.kill_marks(connected)
        confirmed = min(marks.values(), default=ALL_CONFIRMED)
        used = (
            (plan_id in self._kills and plan_id not in self._unused_kills)
            or bool(self.workers_of_plan(plan_id))
            or self._placed(plan_id)
            or self._dispatched_before(plan_id)
        )
        with db.transaction(self._db):
            kill = self._keep(plan_id, worker_id, reason, used)
            dropped = self._drop_past_held(confirmed, kill.seq)
            stops = self._owe_stops(self._keep_apart(dropped), marks)
            pruned = self._prune_kills(confirmed)
        self._issued.write(self.kills_epoch, self.kills_issued())
        for gone_plan, gone_seq in [*pruned, *((d.plan_id, d.seq) for d in dropped)]:
            self._forget_kill(gone_plan, seq=gone_seq)
        return Kept(kill, stops)

    def _forget_kill(self, plan_id: str, *, seq: int = 0, named: str | None = None) -> None:
        """Forget, in memory, the plan's kill numbered `seq`, or the one named for `named`."""
        kills = self._kills.get(plan_id, {})
        if named is not None:
            kills.pop(named, None)
        else:
            for who in [who for who, at in kills.items() if at == seq]:
                del kills[who]
        if not kills:
            self._kills.pop(plan_id, None)
            self._unused_kills.discard(plan_id)

    def _keep(self, plan_id: str, worker_id: str, reason: str, used: bool) -> pb.KillPlan:
        """Write the kill's row (replacing the plan's for the same worker) and learn it."""
        self._db.execute(
            "DELETE FROM kills WHERE plan_id = ? AND worker_id = ?", (plan_id, worker_id)
        )
        cur = self._db.execute(
            "INSERT INTO kills (plan_id, worker_id, reason, created_ms, used)"
            " VALUES (?, ?, ?, ?, ?)",
            (plan_id, worker_id, reason, now_ms(), used),
        )
        seq = int(cur.lastrowid or 0)
        self._issued_seq = seq  # AUTOINCREMENT: past every seq before
        self._kills.setdefault(plan_id, {})[worker_id] = seq
        if used:
            self._unused_kills.discard(plan_id)
        else:
            self._unused_kills.add(plan_id)
        return pb.KillPlan(plan_id=plan_id, reason=reason, seq=seq, in_use=used)

    def _drop_past_held(self, confirmed: int, arriving: int) -> list[Dropped]:
        """Past KILLS_HELD kills some worker has not confirmed (through `confirmed`), the
        oldest go, those of plans never dispatched first; never the one `arriving` (its
        seq), nor a kill of ALL_PLANS (one a worker at most, and what stands for the
        kills that went). Not counted while fewer kills were numbered since `confirmed`
        than that, and counted in the index kills_by_use (`used IN (0, 1)` walks it in
        order): at each kill, counting and sorting every row a worker away had not
        confirmed cost it 24 ms at 8,000 of them (review18 F7)."""
        if arriving - confirmed <= KILLS_HELD:
            return []
        (held,) = self._db.execute(
            "SELECT (SELECT count(*) FROM kills WHERE used IN (0, 1) AND seq > ?)"
            " - (SELECT count(*) FROM kills WHERE plan_id = ? AND seq > ?)",
            (confirmed, ALL_PLANS, confirmed),
        ).fetchone()
        if held <= KILLS_HELD:
            return []
        gone = [
            Dropped(str(plan), int(seq), str(named), bool(used))
            for plan, seq, named, used in self._db.execute(
                "SELECT plan_id, seq, worker_id, used FROM kills WHERE used IN (0, 1)"
                " AND seq > ? AND plan_id != ? AND seq != ? ORDER BY used, seq LIMIT ?",
                (confirmed, ALL_PLANS, arriving, held - KILLS_HELD),
            )
        ]
        self._db.executemany("DELETE FROM kills WHERE seq = ?", [(d.seq,) for d in gone])
        return gone

    def _keep_apart(self, dropped: list[Dropped]) -> list[Dropped]:
        """Keep the kills of plans in use `dropped` apart (see KILLS_APART); those that
        went past it instead, the oldest kept apart before. A kill of a plan never in
        use (no call of it sent, placed or refused) goes as the worker's own pruning
        lets one go (ledger.MAX_SERVER_KILLS): a call of the plan after it runs, and
        would have been refused, and marked it in use. Before, 10,001 KillPlans of
        made-up plans alone, a worker away, stopped every plan there (review16 F4)."""
        used = [d for d in dropped if d.used]
        self._db.executemany(
            "INSERT INTO kills_apart (seq, digest, worker_id) VALUES (?, ?, ?)",
            [(d.seq, plan_digest(d.plan_id), d.named) for d in used],
        )
        self._apart_rows += len(used)
        if self._apart_rows <= KILLS_APART:
            return []
        gone = [
            Dropped("", int(seq), str(named), True)
            for seq, named in self._db.execute(
                "SELECT seq, worker_id FROM kills_apart ORDER BY seq LIMIT ?",
                (self._apart_rows - KILLS_APART,),
            )
        ]
        self._db.executemany("DELETE FROM kills_apart WHERE seq = ?", [(d.seq,) for d in gone])
        self._apart_rows -= len(gone)
        return gone

    def _owe_stops(
        self, dropped: list[Dropped], marks: Mapping[str, int]
    ) -> dict[str, pb.KillPlan]:
        """A kill of ALL_PLANS for each worker (its mark in `marks`) that had not
        confirmed a kill of a plan in use `dropped` for it (past KILLS_APART), unless one
        it has not confirmed is kept."""
        stops: dict[str, pb.KillPlan] = {}
        if not dropped:
            return stops
        for worker_id, mark in marks.items():
            lost = any(d.seq > mark and d.named in ("", worker_id) for d in dropped)
            if not lost or self.stop_owed(worker_id, mark) is not None:
                continue
            reason = utf8_prefix(
                f"more than {KILLS_HELD:,} kills waited at the hub for worker {worker_id} to "
                "confirm them, and the oldest were dropped: every plan of the hub is stopped "
                "here until the person lifts it (agentworker lift '*')",
                KILL_REASON_BYTES,
            )
            stops[worker_id] = self._keep(ALL_PLANS, worker_id, reason, True)
        if stops:  # one line a kill, not one a worker (a line each for 10,241 made-up ids)
            log.warning(
                "hub: kills %d worker(s) had not confirmed were dropped, past the %d kept for "
                "workers to confirm: each is owed a kill of every plan ('%s'), %s",
                len(stops),
                KILLS_HELD,
                ALL_PLANS,
                ", ".join(sorted(stops)[:5]) + (" ..." if len(stops) > 5 else ""),
            )
        return stops

    def stop_owed(self, worker_id: str, through: int) -> pb.KillPlan | None:
        """The kill of ALL_PLANS kept for `worker_id` (named for it, or for every worker)
        that it has not confirmed (numbered after `through`), or None."""
        owed = self._after(ALL_PLANS, worker_id, through)
        if not owed:
            return None
        row = self._db.execute("SELECT reason FROM kills WHERE seq = ?", (owed,)).fetchone()
        reason = str(row[0]) if row else ""
        return pb.KillPlan(plan_id=ALL_PLANS, reason=reason, seq=owed, in_use=True)

    def _after(self, plan_id: str, worker_id: str, through: int) -> int:
        """The latest kill of the plan for `worker_id` (named for it, or for every
        worker) numbered after `through`, or 0."""
        kills = self._kills.get(plan_id)
        if not kills:
            return 0
        latest = max(kills.get("", 0), kills.get(worker_id, 0) if worker_id else 0)
        return latest if latest > through else 0

    def _placed(self, plan_id: str) -> bool:
        return bool(
            self._db.execute("SELECT 1 FROM placements WHERE plan_id = ?", (plan_id,)).fetchone()
        )

    def _prune_kills(self, confirmed: int | None = None) -> list[tuple[str, int]]:
        """Past KILLS_KEPT, the kills every worker confirmed (through `confirmed`), those
        of plans not in use first, then the oldest; never one not confirmed."""
        if confirmed is None:
            confirmed = self.kills_confirmed_by_all()
        # Those not confirmed come first among the KILLS_KEPT (counted up to that many),
        # then the confirmed ones in use, the newest first: those walked in the index
        # kills_by_use, no row sorted. Every row sorted at each kill made a KillPlan
        # cost a walk of those a worker away had not confirmed (8,000: 60 KillPlans/s).
        (unconfirmed,) = self._db.execute(
            "SELECT count(*) FROM (SELECT 1 FROM kills WHERE seq > ? LIMIT ?)",
            (confirmed, KILLS_KEPT),
        ).fetchone()
        gone = self._db.execute(
            "SELECT plan_id, seq FROM kills WHERE used IN (1, 0) AND seq <= ?"
            " ORDER BY used DESC, seq DESC LIMIT -1 OFFSET ?",
            (confirmed, KILLS_KEPT - unconfirmed),
        ).fetchall()
        self._db.executemany("DELETE FROM kills WHERE seq = ?", [(seq,) for _, seq in gone])
        if self._apart_rows:  # every worker has them: none is needed here any more
            cur = self._db.execute("DELETE FROM kills_apart WHERE seq <= ?", (confirmed,))
            self._apart_rows -= cur.rowcount
        return [(str(plan_id), int(seq)) for plan_id, seq in gone]

    def kills_after(
        self,
        worker_id: str,
        through: int,
        limit: int = -1,
        limit_bytes: int = 0,
        *,
        by_digest: bool = True,
    ) -> list[pb.KillPlan]:
        """The kills for `worker_id` numbered after `through`, in order: at most `limit`
        of them (-1: all) and, with `limit_bytes`, as many as fit in it (plan ids and
        reasons, UTF-8), one at least. A kill kept apart goes by its plan's digest; to a
        worker that cannot read one (`by_digest` False: protocol before 4), as a kill of
        every plan in its place."""
        rows = self._db.execute(
            "SELECT seq, plan_id, reason, used, 0 FROM kills WHERE seq > ? AND worker_id IN ('', ?)"
            " UNION ALL SELECT seq, '', '', 1, digest FROM kills_apart"
            " WHERE seq > ? AND worker_id IN ('', ?) ORDER BY seq LIMIT ?",
            (through, worker_id, through, worker_id, limit),
        ).fetchall()
        kills: list[pb.KillPlan] = []
        size = 0
        for seq, plan, reason, used, digest in rows:
            if digest and by_digest:
                kill = pb.KillPlan(reason=APART_REASON, seq=seq, in_use=True, plan_digest=digest)
            elif digest:
                kill = pb.KillPlan(plan_id=ALL_PLANS, reason=APART_STAND_IN, seq=seq, in_use=True)
            else:
                # In use as it goes: a call refused here before the kill reached the
                # worker marked it, and the worker, which never saw that call, learns it.
                kill = pb.KillPlan(plan_id=plan, reason=reason, seq=seq, in_use=bool(used))
            size += len(kill.plan_id.encode()) + len(kill.reason.encode()) + (8 if digest else 0)
            if limit_bytes and kills and size > limit_bytes:
                break
            kills.append(kill)
        return kills

    def killed(self, plan_id: str, worker_id: str, through: int) -> bool:
        """Whether this hub killed the plan for `worker_id` in a kill numbered after
        `through` (one the worker has not confirmed), or every plan (ALL_PLANS). No
        query: from memory, but for the first call of a plan killed before it was ever
        dispatched, which marks the kill as of a plan in use (see KILLS_KEPT)."""
        found = bool(self._after(plan_id, worker_id, through))
        if found and plan_id in self._unused_kills:
            self._unused_kills.discard(plan_id)
            with db.transaction(self._db):
                self._db.execute("UPDATE kills SET used = 1 WHERE plan_id = ?", (plan_id,))
        return (
            found
            or bool(self._after(ALL_PLANS, worker_id, through))
            or self._kept_apart_after(plan_id, worker_id, through)
        )

    def _kept_apart_after(self, plan_id: str, worker_id: str, through: int) -> bool:
        """Whether a kill of the plan for `worker_id` numbered after `through` is kept
        apart (see KILLS_APART); no query while none is."""
        if not self._apart_rows:
            return False
        row = self._db.execute(
            "SELECT 1 FROM kills_apart WHERE digest = ? AND seq > ? AND worker_id IN ('', ?)",
            (plan_digest(plan_id), through, worker_id),
        ).fetchone()
        return row is not None

    def kill_reason(self, plan_id: str, worker_id: str = "") -> str:
        """Why the plan is killed for `worker_id`: its own kill's reason, else that of
        the kill of every plan."""
        row = self._db.execute(
            "SELECT reason FROM kills WHERE plan_id IN (?, ?)"
            " AND (? = '' OR worker_id IN ('', ?)) ORDER BY plan_id = ?, seq DESC LIMIT 1",
            (plan_id, ALL_PLANS, worker_id, worker_id, ALL_PLANS),
        ).fetchone()
        if row is None and self._kept_apart_after(plan_id, worker_id, 0):
            return APART_REASON
        return str(row[0]) if row else ""

    def queue_teardown(self, worker_id: str, plan_id: str) -> None:
        """Keep a teardown for a worker that is away, to deliver when it connects."""
        self._db.execute(
            "INSERT OR REPLACE INTO queued_teardowns VALUES (?, ?, ?)",
            (worker_id, plan_id, now_ms()),
        )

    def queued_teardowns(self, worker_id: str) -> list[str]:
        """The plans whose teardown waits for `worker_id`, left on the queue."""
        rows = self._db.execute(
            "SELECT plan_id FROM queued_teardowns WHERE worker_id = ?", (worker_id,)
        ).fetchall()
        return [plan for (plan,) in rows]

    def take_teardowns(self, worker_id: str) -> list[str]:
        """The plans whose teardown waits for `worker_id`, oldest first, taken off the queue."""
        rows = self._db.execute(
            "SELECT plan_id FROM queued_teardowns WHERE worker_id = ? ORDER BY created_ms",
            (worker_id,),
        ).fetchall()
        self._db.execute("DELETE FROM queued_teardowns WHERE worker_id = ?", (worker_id,))
        return [plan for (plan,) in rows]

    def place(self, plan_id: str, worker_id: str, epoch: str = "") -> None:
        """Remember that `worker_id` holds the workspace of `plan_id` (sandbox mode), of
        the plan's creation `epoch` (worker.hub.epochs)."""
        self._db.execute(
            "INSERT OR REPLACE INTO placements (plan_id, worker_id, placed_ms, epoch)"
            " VALUES (?, ?, ?, ?)",
            (plan_id, worker_id, now_ms(), epoch),
        )

    def unplace(self, plan_id: str) -> None:
        self._db.execute("DELETE FROM placements WHERE plan_id = ?", (plan_id,))

    def placements(self) -> dict[str, str]:
        """plan id -> the worker holding its workspace."""
        rows = self._db.execute("SELECT plan_id, worker_id FROM placements")
        return {plan: worker for plan, worker in rows}

    def placement_epochs(self) -> dict[str, str]:
        """plan id -> the epoch of its placement ('' placed before epochs)."""
        rows = self._db.execute("SELECT plan_id, epoch FROM placements")
        return {plan: epoch for plan, epoch in rows}

    def workers(self) -> list[tuple[pb.Hello, int]]:
        rows = self._db.execute("SELECT hello, last_seen_ms FROM workers ORDER BY worker_id")
        return [(pb.Hello.FromString(hello), seen) for hello, seen in rows]


def answered_request(request: bytes, preview: str) -> bytes:
    """A stored ActionRequest, answered: its args in the form of the answer's preview
    of them (masked, short), the rest as it was. One that does not decode is kept as
    it was (the hub wrote it: it decodes); never raises (SQLite calls it in a commit)."""
    try:
        stored = pb.ActionRequest.FromString(request)
    except DecodeError:
        return request
    stored.args_json = preview
    return stored.SerializeToString()


def _preview(result: pb.ActionResult) -> str:
    """What an answer keeps of its call's args: the worker's masked preview."""
    return result.invocation.args_preview


def _plan_of(request: bytes) -> str:
    """The plan of a stored ActionRequest ('' if it does not decode)."""
    try:
        return pb.ActionRequest.FromString(request).plan_id
    except DecodeError:
        return ""


def _size(request: object) -> int:
    """The bytes of a request as `add` recorded it."""
    return len(request) if isinstance(request, bytes) else 0


def without_blob(result: pb.ActionResult) -> pb.ActionResult:
    """A copy of `result` without its blob (which is never read, so never copied)."""
    bare = pb.ActionResult()
    for field, value in result.ListFields():
        if field.name == "blob":
            continue
        if field.message_type is not None:
            getattr(bare, field.name).CopyFrom(value)
        else:
            setattr(bare, field.name, value)
    return bare


_Row = tuple[str, str, str, bytes, bytes | None, str, bytes | None, int, int, bytes | None, int]


def _call(row: _Row) -> StoredCall:
    cid, worker_id, digest, request, legacy_blob, state, result, deadline = row[:8]
    blob_bytes, result_blob, result_blob_bytes = row[8:]
    stored = pb.ActionRequest.FromString(request)
    if legacy_blob is not None:  # a pending call stored by a hub from before
        stored.blob = legacy_blob
        blob_bytes = len(legacy_blob)
    answer = None if result is None else pb.ActionResult.FromString(result)
    if answer is not None and result_blob is not None:
        answer.blob = result_blob
    return StoredCall(
        correlation_id=cid,
        worker_id=worker_id,
        args_digest=digest,
        request=stored,
        state=state,
        result=answer,
        deadline_ms=deadline,
        blob_bytes=blob_bytes,
        result_blob_bytes=result_blob_bytes,
    )
