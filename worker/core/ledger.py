"""Durable worker state: the at-most-once call ledger, killed plans and CLI grants.

The ledger records RUNNING before a call executes, so a re-sent correlation id is
answered from here and never run twice — not after a reconnect, not after a crash.
Results stay until the server acks them; acked rows are kept for `ttl_s` more so a
late duplicate still finds its answer — but not their blobs, which go with the ack
(a late duplicate is then answered `blob_gone`, with the outcome). A blob of
`FILE_BLOB_BYTES` or more waits for its ack in a file of its own beside the database
(`state.db-blobs/`), written before its row commits: SQLite writes a blob as one log
frame per page, so recording exec's 1 MiB of output took 2.7 ms and dropping it
1.8 ms, on the event loop (with 4 KiB pages; worker.db has larger ones now); a file
takes one write and one unlink. Like the log, it survives a crash of the process;
the file ends with the blob's BLAKE3, so after a power cut a blob found short, or
unwritten, is answered `blob_gone`, never sent cut.

A call with no effect (its action's `effect` is `Effect.NONE`: a read, a listing, a
screenshot) is not claimed before it runs: running it twice does no harm, so it does
not pay for a commit first. Its result is held in memory (`hold`) until the server
acks it, and only then written, without its blob, so duplicates are still answered
from here. A worker that dies meanwhile has nothing of it on disk: the server sends
it again, and it runs again.

Each call is stamped with the server that sent it (`server`: a key the connection
derives from the address it dials and a digest of its token, see
`worker.core.connection.Target.server_key`; never the token). Only that server is told
of it (its Hello lists the call's id as running or unacked), is sent its result again,
may ack it, and is answered from it when it sends the id again: a worker started again
against another server (another address or token, the same data folder) holds the
first server's results for it, unsent, until it connects to that server again or they
are `ttl_s` old (`prune`); they count toward the unacked budget meanwhile. Rows of a
state.db from before servers were recorded are stamped `UNRECORDED_SERVER`, which no
server's key equals: held, never sent, since whose they were is not known.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import re
import shlex
import sqlite3
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Final

from worker import db
from worker.clock import now_ms
from worker.config import LEDGER_BLOBS_SUFFIX
from worker.core.blob_files import BlobFiles, file_name
from worker.core.scopes import ASK_PREFIX, ask_name
from worker.db import connect, write_many
from worker.wire.framing import Buffer
from worker.wire.protocol import plan_digest, same_call

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    correlation_id TEXT PRIMARY KEY,
    args_digest    TEXT NOT NULL,
    plan_id        TEXT NOT NULL,
    state          TEXT NOT NULL CHECK (state IN ('RUNNING', 'DONE')),
    result         BLOB,           -- the ActionResult without its blob
    acked          INTEGER NOT NULL DEFAULT 0,
    created_ms     INTEGER NOT NULL,
    finished_ms    INTEGER,
    result_blob    BLOB,           -- its blob, until the server acks it
    blob_bytes     INTEGER NOT NULL DEFAULT 0, -- the blob's size, kept or not
    blob_file      INTEGER NOT NULL DEFAULT 0, -- 1: the blob is in a file (see blob_path)
    server         TEXT NOT NULL DEFAULT 'unrecorded', -- the key of the server that sent it
    at_rest        BLOB            -- the result as kept once acked (secrets masked), if not whole
);
CREATE INDEX IF NOT EXISTS calls_unacked ON calls (state, acked);
CREATE INDEX IF NOT EXISTS calls_plan ON calls (plan_id);  -- a kill asks whether its plan is in use
CREATE TABLE IF NOT EXISTS killed_plans (
    plan_id   TEXT PRIMARY KEY,
    reason    TEXT NOT NULL,
    killed_by TEXT NOT NULL,
    killed_ms INTEGER NOT NULL,
    server    TEXT NOT NULL DEFAULT '*', -- whose plan of the id it binds: a key, or * (all)
    used      INTEGER NOT NULL DEFAULT 1 -- a call of the plan came here (see MAX_SERVER_KILLS)
);
CREATE INDEX IF NOT EXISTS killed_plans_by ON killed_plans (killed_by);
CREATE TABLE IF NOT EXISTS kills_apart (  -- server kills of plans in use past MAX_SERVER_KILLS
    digest INTEGER PRIMARY KEY, -- of the plan id (worker.wire.protocol.plan_digest)
    server TEXT NOT NULL        -- whose plan of the id it binds: a key, or * (all)
);
CREATE TABLE IF NOT EXISTS grants (
    id         INTEGER PRIMARY KEY,
    agent      TEXT NOT NULL,
    scope      TEXT NOT NULL,
    plan       TEXT NOT NULL,
    expires_ms INTEGER,
    granted_by TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    server     TEXT NOT NULL DEFAULT 'unsorted' -- the key of the server it was granted for
);
CREATE TABLE IF NOT EXISTS kill_marks (  -- a server's numbered kills recorded here
    server  TEXT PRIMARY KEY,  -- its key
    epoch   TEXT NOT NULL,     -- the sequence they are numbered in (Welcome.kills_epoch)
    through INTEGER NOT NULL   -- recorded through this one (KillPlan.seq)
);
CREATE TABLE IF NOT EXISTS served (  -- the server the worker here serves, or served last
    one        INTEGER PRIMARY KEY CHECK (one = 1),
    server     TEXT NOT NULL,
    since_ms   INTEGER NOT NULL
);
"""

DEFAULT_TTL_S = 24 * 3600
# Acked calls, kept `ttl_s` to answer a late duplicate, take about this many bytes at
# most (ids, digest, result): past it the oldest go early (`cap_acked`), so a server
# that sends a flood of calls, refused ones too (a result and a row each: 800 a second
# kept ~1.6 MB/s, 137 GB a day, review25 G1), cannot fill the disk within the 24 h.
# A duplicate of a call forgotten so runs again; the hub answers one from its own store.
MAX_ACKED_BYTES: Final = 256 * 1024 * 1024
# Acks after which the bound is applied again (besides the hourly housekeeping), and the
# steps it is applied in: rows looked at, rows removed, the loop's other work between.
ACKED_CAP_EVERY: Final = 50_000
_ACKED_WALK_ROWS: Final = 10_000
_ACKED_DELETE_ROWS: Final = 1_000
_ACKED: Final = "state = 'DONE' AND acked = 1 AND blob_file = 0"
_CALL_BYTES: Final = (
    "length(CAST(correlation_id AS BLOB)) + length(CAST(args_digest AS BLOB))"
    " + length(CAST(plan_id AS BLOB)) + COALESCE(length(result), 0)"
    " + length(CAST(server AS BLOB)) + 64"
)
# Kills a server may make this worker keep; past it its oldest kills go (a kill made
# here, by the person, is never dropped). A kill outlives restarts, and the console
# lists every kill: unbounded, a server's flood of KillPlans for made-up plans grew
# state.db without end and made each UI event megabytes long. Counted per server
# (`killed_plans.server`): one server's flood prunes its own kills only, never
# another's (review12 finding 04: B's 1,001 made-up kills pruned A's kill, and A's
# killed plan ran again at A). Within a server's share, kills of plans no call ever
# came for go first: a kill of a plan in use (a call of it was recorded here, before
# or after the kill) goes only once this many kills of plans in use are newer, so a
# flood of kills of made-up plans never lifts it (review14 finding 02: 1,001 of them
# did, and the killed plan ran again). The kill that comes is never the one pruned, and
# a kill of a plan in use is never pruned without a trace: past MAX_SERVER_KILLS kills
# of plans in use, this worker can no longer say which of the server's plans are
# killed, so it stops them all (an ALL_PLANS kill, OVERFLOW's, binding that server; the
# person lifts it with `agentworker lift '*'`). A flood of kills of plans the server
# made run (a Dispatch, then a KillPlan, each time) then stops its plans; before, it
# pushed out the person's kill, and the killed plan ran (review15 finding 01).
# Past MAX_SERVER_KILLS a pruned kill of a plan in use is first kept apart (kills_apart:
# a digest of its plan id and the server it binds, its reason not kept; not listed, not
# cached: the check of a call asks the table by its primary key), and only past
# MAX_KILLS_APART of one server's kills kept apart is ALL_PLANS stopped. Before, 1,001
# pairs (Dispatch of a made-up plan, its KillPlan), 6 s of one agent's calls through a
# hub every agent shares, stopped every plan of every agent there (review16 F4).
MAX_SERVER_KILLS: Final = 1000
MAX_KILLS_APART: Final = 1_000_000
SERVER: Final = "server"  # `killed_by` of a server's KillPlan
ALL_PLANS: Final = "*"  # the plan id of a kill that binds every plan of its server
OVERFLOW: Final = "worker"  # `killed_by` of that kill, when the worker made it
# `killed_plans.server` of a kill that binds the plan id whichever server names it: the
# person's (and a server kill from before kills were kept per server, or of an id two
# servers killed).
ANY_SERVER: Final = "*"


# Effect-free results held in memory past this many bytes (a server that does not ack)
# are written to the ledger, oldest first, as any unacked result is.
HELD_BYTES: Final = 64 * 1024 * 1024
# An effect-free result past this many bytes is not written at its ack (its row keeps
# the args digest, result NULL): a late duplicate is told the call ran and its result,
# delivered, is gone (as a blob let go is: protocol.result_gone), and the args-mismatch
# check still holds. Written whole, an fs_list of 10,000 entries (a 1.4 MB answer) took
# 1.5 ms of the event loop at each ack, for an answer nothing reads but a duplicate
# (issue 12: no large database write on the loop).
KEPT_RESULT_BYTES: Final = 64 * 1024
# A recorded result blob this large waits for its ack in a file, not in the database.
FILE_BLOB_BYTES: Final = 64 * 1024
BLOBS_SUFFIX: Final = LEDGER_BLOBS_SUFFIX  # their folder: the database's path + this
# How stale the cached kills and grants may be: a grant or lift made from the CLI
# (another process) takes effect within this.
RECHECK_S = 0.1
RECOUNT_S: Final = 1.0  # see State.over_unacked_budget


# The server of a call recorded before calls were stamped with theirs (and of a row
# written without one): no server's key equals it, so such a result is held, never sent.
UNRECORDED_SERVER: Final = "unrecorded"
# The server of a State no connection names (a command-line tool, an in-process replay).
NO_SERVER: Final = ""


class Seen(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    DONE = "done"
    MISMATCH = "mismatch"
    OTHER_SERVER = "other_server"  # the id is another server's call: nothing of it is told


# The server of a grant made before grants were kept per server, until the worker's
# next start sorts it (`sort_old_grants`): to the server it was made for, if the ledger
# can tell, else UNRECORDED_SERVER. Neither is any server's key: such a grant admits
# no call.
UNSORTED_SERVER: Final = "unsorted"
# The server of a grant the person made before the worker here served any: the first
# one it serves gets it (`record_served`).
NEXT_SERVER: Final = "next"

# Columns added since the first state.db, with their definitions (added on open), by
# table. A call from before `server` was added is stamped UNRECORDED_SERVER: held, not
# sent; a grant, UNSORTED_SERVER.
_ADDED_COLUMNS: Final = {
    "calls": {
        "result_blob": "BLOB",
        "blob_bytes": "INTEGER NOT NULL DEFAULT 0",
        "blob_file": "INTEGER NOT NULL DEFAULT 0",
        "server": f"TEXT NOT NULL DEFAULT '{UNRECORDED_SERVER}'",
        "at_rest": "BLOB",
    },
    "grants": {"server": f"TEXT NOT NULL DEFAULT '{UNSORTED_SERVER}'"},
    "killed_plans": {
        "server": f"TEXT NOT NULL DEFAULT '{ANY_SERVER}'",
        "used": "INTEGER NOT NULL DEFAULT 1",
    },
}


# The name an allowlist ask's grant was kept under before review14 (finding 01): its
# argv, masked as previews mask them, which left every password the masking did not
# know in state.db. Renamed on open to the name asks have now (scopes.ask_name).
_ASK_EARLIER: Final = re.compile(
    r"ask:([A-Za-z]+)\.exec `(.*)` in (.*) \(sha256 ([0-9a-f]{64})\)", re.S
)


def _renamed_ask(pattern: str) -> str | None:
    """A grant's pattern kept under an ask's earlier name, under its name now (as a
    pattern: fnmatch's specials escaped, as approvals._literal does); None for any
    other. The surface and digest stay, and they are what a grant for an ask matches
    on (scopes.ask_binding): it answers the same command in the same folder as
    before. The program is the label's first word; the count of its arguments when
    the label held them all (it was cut at 60 characters), else "args not kept"."""
    found = _ASK_EARLIER.fullmatch(pattern)
    if found is None:
        return None
    surface, label, place, digest = (
        re.sub(r"\[([*?\[])\]", r"\1", part) for part in found.groups()
    )
    try:
        words: list[str] | None = shlex.split(label) if not label.endswith("…") else None
    except ValueError:  # a cut label, or one no shell would read back
        words = None
    program = words[0] if words else label.split(" ", 1)[0].strip("'\"")
    name = ask_name(surface, program, None if not words else len(words) - 1, "", digest)
    name = name.replace(" in  (sha256", f" in {place} (sha256", 1)  # the folder as it was shown
    return re.sub(r"([*?\[])", r"[\1]", ASK_PREFIX + name)


@dataclass(frozen=True)
class Begin:
    seen: Seen
    result: bytes | None = None  # DONE: the stored result, without its blob
    blob: Buffer | None = None  # DONE: its blob, while kept (None once let go)
    blob_bytes: int = 0  # DONE: the blob's size, kept or not

    @property
    def blob_gone(self) -> bool:
        return self.blob_bytes > 0 and self.blob is None

    @property
    def result_gone(self) -> bool:
        """DONE, and its result was not kept past its ack (see KEPT_RESULT_BYTES)."""
        return self.seen is Seen.DONE and self.result is None


@dataclass(frozen=True)
class Unacked:
    """A result the server has not acked: sent again after each reconnect."""

    correlation_id: str
    result: bytes  # without its blob
    stored: Buffer  # its blob, unless it is in a file
    blob_bytes: int = 0
    in_file: BlobFiles | None = None  # where its blob waits, if in a file

    @property
    def blob(self) -> Buffer | None:
        """The blob (read from its file, if it has one); None if that file lost it."""
        if self.in_file is None:
            return self.stored
        return self.in_file.read(self.correlation_id, self.blob_bytes)


@dataclass(frozen=True)
class _Held:
    """An effect-free call's result, in memory until the server acks it."""

    digest: str
    plan_id: str
    result: bytes
    blob: Buffer
    finished_ms: int
    server: str
    at_rest: bytes | None = None  # the result as kept once acked, if not whole

    @property
    def kept_after_ack(self) -> bytes | None:
        """What its row keeps of the result once acked: its form kept at rest, and
        nothing past KEPT_RESULT_BYTES."""
        kept = self.result if self.at_rest is None else self.at_rest
        return kept if len(kept) <= KEPT_RESULT_BYTES else None


@dataclass(frozen=True)
class HeldForOther:
    """Results of another server, not acked by it: held for it (see the module's
    docstring)."""

    server: str
    count: int
    bytes: int
    oldest_ms: int  # when the oldest of them finished


@dataclass(frozen=True)
class StoredGrant:
    id: int
    agent: str
    scope: str
    plan: str
    expires: datetime | None
    granted_by: str
    server: str = NO_SERVER  # the key of the server it was granted for


class State:
    def __init__(self, path: Path, ttl_s: float = DEFAULT_TTL_S, *, convert: bool = False) -> None:
        self._db = connect(path, _SCHEMA, convert=convert)  # convert: see worker.db.connect
        self._blob_dir = Path(f"{path}{BLOBS_SUFFIX}")
        self._blob_store = BlobFiles(self._blob_dir)
        self._blob_files: set[str] = set()  # calls whose blob this process wrote to a file
        for table, added in _ADDED_COLUMNS.items():
            columns = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
            for name, definition in added.items():
                if name not in columns:  # a state.db from before the column
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {definition}")
        if convert:  # the worker, at its start: the owner converts (worker.db.connect)
            self._rename_asks()
        self._ttl_ms = int(ttl_s * 1000)
        self.max_acked_bytes = MAX_ACKED_BYTES
        self.acked_since_cap = 0  # calls acked since `cap_acked` last ran
        # The greatest id any row holds or this process wrote or holds since: an
        # effect-free call's id past it is new without a lookup (`begin`), which a hub's
        # time-ordered ids nearly always are (22 us of a call's 200 on `up`'s loop). Only
        # this process writes calls rows (a second worker on one data folder is refused);
        # were one to, an effect-free call it knows would run here again, which it may.
        row = self._db.execute("SELECT MAX(correlation_id) FROM calls").fetchone()
        self._newest_known: str = row[0] or ""
        # The server whose calls this process serves (its WorkerConnection names it):
        # the only one told of, sent, acking and answered from the calls stamped with it.
        self.server = NO_SERVER
        self._held: dict[str, _Held] = {}  # effect-free results not yet acked, oldest first
        self._held_bytes = 0
        # Results recorded and not acked (each its result and blob): with the held ones,
        # what a server that does not ack makes the worker keep (see unacked_bytes).
        self._recorded_unacked_bytes = 0
        self._counted_at = 0.0
        self._count_unacked()
        # Recorded results not acked yet that are kept masked once acked (see `ack`).
        self._masked_at_ack: set[str] = {
            cid
            for (cid,) in self._db.execute(
                "SELECT correlation_id FROM calls"
                " WHERE state = 'DONE' AND acked = 0 AND at_rest IS NOT NULL"
            )
        }
        # Kills and grants are read on every call but change rarely (often from the CLI,
        # another process): cache them until SQLite's data_version says someone wrote.
        self._seen_version = -1
        self._checked_at = 0.0
        # plan -> (reason, killed by, whose plan of the id it binds: a key, or ANY_SERVER)
        self._kills: dict[str, tuple[str, str, str]] = {}
        self._unused_kills: set[str] = set()  # killed plans no call came for (yet)
        self._kills_moved: set[str] = set()  # plans whose kill another process changed
        self._kills_read = False
        self._apart_counts: dict[str, int] = {}  # server -> its kills kept apart
        self._any_apart = True  # whether kills_apart may hold a row (read in _refresh)
        self._prune_server_kills()  # a state.db from before the bound
        self._grants: list[StoredGrant] = []

    def _refresh(self) -> None:
        now = time.monotonic()
        if self._seen_version != -1 and now - self._checked_at < RECHECK_S:
            return
        self._checked_at = now
        version = self._db.execute("PRAGMA data_version").fetchone()[0]
        if version == self._seen_version:
            return
        self._seen_version = version
        kills = {
            plan: (reason, by, server)
            for plan, reason, by, server in self._db.execute(
                "SELECT plan_id, reason, killed_by, server FROM killed_plans"
            )
        }
        self._unused_kills = {
            plan for (plan,) in self._db.execute("SELECT plan_id FROM killed_plans WHERE NOT used")
        }
        if self._kills_read and kills != self._kills:
            self._kills_moved.update(
                plan
                for plan in kills.keys() | self._kills.keys()
                if kills.get(plan) != self._kills.get(plan)
            )
        self._kills = kills
        self._kills_read = True
        # Most ledgers keep no kill apart: a call's check then asks no table.
        (self._any_apart,) = self._db.execute(
            "SELECT EXISTS (SELECT 1 FROM kills_apart)"
        ).fetchone()
        self._grants = self._read_grants()

    def _changed(self) -> None:
        """Our own writes do not move data_version; forget the cache by hand."""
        self._seen_version = -1

    @property
    def connection(self) -> sqlite3.Connection:
        """For tables that should commit with the ledger (see Telemetry)."""
        return self._db

    def close(self) -> None:
        """Close the ledger; held results not yet acked are written first (only a
        crash loses them, and then the server's re-send runs them again)."""
        if self._held:
            self._spill(0)
        db.close(self._db)
        self._blob_store.close()

    # ------------------------------------------------------------- call ledger

    def begin(
        self, correlation_id: str, args_digest: str, plan_id: str, *, claim: bool = True
    ) -> Begin:
        """Claim a call; only a NEW answer lets the caller execute it. With `claim`
        False (an effect-free call) nothing is written: NEW says only that the ledger
        knows nothing of the id. An id another server's call holds is OTHER_SERVER,
        whatever its args: nothing of that call is told to this one."""
        held = self._held.get(correlation_id)
        if held is not None:
            if held.server != self.server:
                return Begin(Seen.OTHER_SERVER)
            if held.digest != args_digest:
                return Begin(Seen.MISMATCH)
            return Begin(Seen.DONE, held.result, held.blob, len(held.blob))
        if claim:
            try:
                self._db.execute(
                    "INSERT INTO calls (correlation_id, args_digest, plan_id, state, created_ms,"
                    " server) VALUES (?, ?, ?, 'RUNNING', ?, ?)",
                    (correlation_id, args_digest, plan_id, now_ms(), self.server),
                )
                self._known(correlation_id)
                return Begin(Seen.NEW)
            except sqlite3.IntegrityError:
                pass
        elif correlation_id > self._newest_known:
            # Past every id this ledger holds (a hub's ids begin with the time): no row
            # can be this call's, so the lookup is not made (see `_newest_known`).
            return Begin(Seen.NEW)
        row = self._db.execute(
            "SELECT args_digest, state, result, result_blob, blob_bytes, blob_file, server"
            " FROM calls WHERE correlation_id = ?",
            (correlation_id,),
        ).fetchone()
        if row is None:  # not claimed, and not known
            return Begin(Seen.NEW)
        digest, state, result, blob, blob_bytes, in_file, server = row
        if server != self.server:
            return Begin(Seen.OTHER_SERVER)
        if not same_call(digest, args_digest):
            return Begin(Seen.MISMATCH)
        if state == "RUNNING":
            return Begin(Seen.RUNNING)
        if in_file:
            blob = self._blob_store.read(correlation_id, blob_bytes)
        return Begin(Seen.DONE, result, blob, blob_bytes)

    def claim(self, correlation_id: str, args_digest: str, plan_id: str) -> Seen:
        """Claim a call looked up before (`begin` with `claim` False), committed when
        this returns NEW; anything else says it is not this caller's to run. Never
        inside a batch, whose commit would come only after the claimed call started."""
        if self._db.in_transaction:
            raise sqlite3.ProgrammingError("a claim inside a batch would commit too late")
        return self.begin(correlation_id, args_digest, plan_id).seen

    def _known(self, correlation_id: str) -> None:
        if correlation_id > self._newest_known:
            self._newest_known = correlation_id

    def hold(
        self,
        correlation_id: str,
        args_digest: str,
        plan_id: str,
        result: bytes,
        blob: Buffer,
        at_rest: bytes | None = None,
    ) -> None:
        """Keep an effect-free call's result (without its blob, and the blob) in memory
        until the server acks it; nothing is written. Once acked it is written as
        `at_rest` says it is kept, if given (protocol.at_rest)."""
        self._known(correlation_id)
        held = _Held(args_digest, plan_id, result, blob, now_ms(), self.server, at_rest)
        self._held[correlation_id] = held
        self._held_bytes += len(result) + len(blob)
        if self._held_bytes > HELD_BYTES:
            self._spill(HELD_BYTES // 2)

    def _spill(self, keep_bytes: int) -> None:
        """Write the oldest held results to the ledger, blobs and all, until what is
        held is at most `keep_bytes`: memory stays bounded when the server does not
        ack, and a worker that stops cleanly keeps them all (see close)."""
        rows = []
        while self._held and self._held_bytes > keep_bytes:
            cid = next(iter(self._held))
            h = self._held.pop(cid)
            self._held_bytes -= len(h.result) + len(h.blob)
            self._recorded_unacked_bytes += len(h.result) + len(h.blob)
            rows.append(
                (
                    cid,
                    h.digest,
                    h.plan_id,
                    h.result,
                    h.blob or None,
                    len(h.blob),
                    h.finished_ms,
                    h.server,
                    h.at_rest,
                )
            )
            if h.at_rest is not None:
                self._masked_at_ack.add(cid)
        with db.transaction(self._db):
            self._db.executemany(
                "INSERT OR IGNORE INTO calls (correlation_id, args_digest, plan_id, state,"
                " result, result_blob, blob_bytes, acked, created_ms, finished_ms, server,"
                " at_rest) VALUES (?1, ?2, ?3, 'DONE', ?4, ?5, ?6, 0, ?7, ?7, ?8, ?9)",
                rows,
            )

    def forget(self, correlation_id: str) -> None:
        """Drop a claim that was never executed (refused before it started)."""
        self._db.execute(
            "DELETE FROM calls WHERE correlation_id = ? AND state = 'RUNNING' AND server = ?",
            (correlation_id, self.server),
        )

    def finish(
        self, correlation_id: str, result: bytes, blob: bytes = b"", at_rest: bytes | None = None
    ) -> None:
        self.finish_many([(correlation_id, result, blob, at_rest)])

    def finish_many(
        self,
        results: list[tuple[str, bytes, Buffer, bytes | None]],
        checks: Mapping[str, bytes] | None = None,
    ) -> None:
        """Record finished calls' results (each without its blob, the blob, and the
        result as kept once acked when not whole: protocol.at_rest), all in one commit.
        `checks` has the blobs' checks its caller computed already (by id; see
        blob_files.check_hasher): a blob kept in a file is not hashed again."""
        finished = now_ms()
        rows = []
        for cid, result, blob, at_rest in results:
            in_file = len(blob) >= FILE_BLOB_BYTES and self._write_blob(
                cid, blob, checks.get(cid) if checks else None
            )
            kept = None if in_file else blob or None
            rows.append((result, kept, len(blob), int(in_file), finished, at_rest, cid))
            self._recorded_unacked_bytes += len(result) + len(blob)
            if at_rest is not None:
                self._masked_at_ack.add(cid)
        write_many(
            self._db,
            "UPDATE calls SET state = 'DONE', result = ?, result_blob = ?, blob_bytes = ?,"
            " blob_file = ?, finished_ms = ?, at_rest = ? WHERE correlation_id = ?",
            rows,
        )

    def blob_path(self, correlation_id: str) -> Path:
        """Where a call's result blob waits for its ack when it is kept in a file."""
        return self._blob_dir / file_name(correlation_id)

    def _write_blob(self, correlation_id: str, blob: Buffer, check: bytes | None) -> bool:
        """Write the blob to its file (before its row commits); False if it could not
        be (it is then kept in the row, as a small one is)."""
        if not self._blob_store.write(correlation_id, blob, check):
            return False
        self._blob_files.add(correlation_id)
        return True

    def _drop_blob_files(self, correlation_ids: list[str]) -> None:
        for cid in correlation_ids:
            if cid in self._blob_files:
                self._blob_files.discard(cid)
                self._blob_store.remove(cid)

    def sweep_blob_files(self) -> int:
        """At the worker's start: remove blob files no unacked result names (written just
        before a crash, or left by an ack the worker died before acting on); how many.
        Only the worker itself may call it: a file is written before its row commits."""
        rows = self._db.execute(
            "SELECT correlation_id FROM calls WHERE blob_file = 1 AND acked = 0"
        ).fetchall()
        wanted = {cid for (cid,) in rows}
        self._blob_files |= wanted
        return self._blob_store.sweep(wanted)

    def ack(self, correlation_ids: list[str]) -> None:
        """The server has these results: their blobs go (the pages they took are reused
        by the next ones); a held effect-free result is written now, without its blob
        (and past KEPT_RESULT_BYTES without the result either). A result with a form
        kept at rest (protocol.at_rest) is kept in that form from now on: a late
        duplicate is answered with it (review25 G10). Until the ack it stays whole: the
        server may not have it, and a re-send must carry all of it.
        Only the results of this server: another's ack of them lets nothing go."""
        correlation_ids = list(dict.fromkeys(correlation_ids))  # each id counts once
        self.acked_since_cap += len(correlation_ids)
        held = [
            (cid, self._held.pop(cid))
            for cid in correlation_ids
            if cid in self._held and self._held[cid].server == self.server
        ]
        self._held_bytes -= sum(len(h.result) + len(h.blob) for _cid, h in held)
        held_ids = {cid for cid, _h in held}
        recorded = [cid for cid in correlation_ids if cid not in held_ids]
        freed = 0
        let_go = []  # the recorded results this ack let go (their blob files go too)
        masked = [cid for cid in recorded if cid in self._masked_at_ack]
        with db.transaction(self._db) if held or masked else contextlib.nullcontext():
            if held:
                self._db.executemany(
                    "INSERT OR IGNORE INTO calls (correlation_id, args_digest, plan_id, state,"
                    " result, acked, created_ms, finished_ms, blob_bytes, server)"
                    " VALUES (?, ?, ?, 'DONE', ?, 1, ?, ?, ?, ?)",
                    [
                        (
                            cid,
                            h.digest,
                            h.plan_id,
                            h.kept_after_ack,
                            h.finished_ms,
                            h.finished_ms,
                            len(h.blob),
                            h.server,
                        )
                        for cid, h in held
                    ],
                )
            if recorded:
                # One statement, rows found by key (the `+` keeps SQLite off the index of
                # unacked rows, which would scan them all); each row that was unacked
                # says what it held. All fetched: the statement ends, and commits.
                rows = self._db.execute(
                    "UPDATE calls SET acked = 1, result_blob = NULL, blob_file = 0"
                    " WHERE correlation_id IN (SELECT value FROM json_each(?))"
                    " AND +state = 'DONE' AND +acked = 0 AND +server = ?"
                    " RETURNING correlation_id, length(result) + blob_bytes",
                    (json.dumps(recorded), self.server),
                ).fetchall()
                freed = sum(size or 0 for _cid, size in rows)
                let_go = [cid for cid, _size in rows]
            if masked:
                self._mask_acked(masked)
        self._recorded_unacked_bytes = max(0, self._recorded_unacked_bytes - freed)
        self._drop_blob_files(let_go)  # once the ack committed

    def _mask_acked(self, correlation_ids: list[str]) -> None:
        """Acked results (inside the ack's transaction) in the form kept at rest. The
        whole one's bytes are zeroed where it lay (secure_delete, for this statement
        only: every ack's freed blob pages zeroed too would cost each ack a write), and
        the log that held it is emptied at the checkpointer's next round (`scrub`)."""
        self._db.execute("PRAGMA secure_delete = ON")
        try:
            done = self._db.execute(
                "UPDATE calls SET result = at_rest, at_rest = NULL"
                " WHERE correlation_id IN (SELECT value FROM json_each(?))"
                " AND at_rest IS NOT NULL AND acked = 1 AND server = ?"
                " RETURNING correlation_id",
                (json.dumps(correlation_ids), self.server),
            ).fetchall()
        finally:
            self._db.execute("PRAGMA secure_delete = OFF")
        self._masked_at_ack.difference_update(cid for (cid,) in done)
        checkpointer = getattr(self._db, "checkpointer", None)
        if done and checkpointer is not None:
            checkpointer.scrub()  # the whole result's frames in the log too (review26 H3)

    @property
    def unacked_bytes(self) -> int:
        """The results, blobs and all, the server has not acked: kept in memory, the
        database and blob files until it does."""
        return self._recorded_unacked_bytes + self._held_bytes

    def over_unacked_budget(self, budget: int) -> bool:
        """Whether the results not acked (every server's: those held for another server
        take room too, until `prune` drops them) take `budget` bytes or more:
        the worker then runs no new call (Dispatcher), so a server that never acks
        cannot fill the disk. The running count is checked against the database before
        it says yes (at most once a second), so a miscount never refuses for long."""
        if self.unacked_bytes < budget:
            return False
        if time.monotonic() - self._counted_at >= RECOUNT_S:
            self._count_unacked()
        return self.unacked_bytes >= budget

    def _count_unacked(self) -> None:
        self._recorded_unacked_bytes = self._db.execute(
            "SELECT COALESCE(SUM(length(result) + blob_bytes), 0) FROM calls"
            " WHERE state = 'DONE' AND acked = 0"
        ).fetchone()[0]
        self._counted_at = time.monotonic()

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Everything written inside commits at once, when the block ends, even if it
        raised: what it wrote was valid (a claim stays a claim). A failed commit raises."""
        if self._db.in_transaction:
            yield
            return
        # Begun with its first statement: most intakes (effect-free calls of new ids)
        # make none, and their BEGIN and COMMIT were two statements a call on the loop.
        self._db.begin_deferred()
        try:
            yield
        finally:
            self._db.end_deferred()

    def unacked_results(self, *, every_server: bool = False) -> list[Unacked]:
        """Every result this server has not acked (with `every_server`, every server's),
        recorded or held, oldest first."""
        rows = self._db.execute(
            "SELECT correlation_id, result, result_blob, blob_bytes, blob_file, finished_ms"
            " FROM calls WHERE state = 'DONE' AND acked = 0 AND (? OR server = ?)",
            (every_server, self.server),
        ).fetchall()
        found = [
            (
                finished,
                Unacked(cid, result, blob or b"", size, self._blob_store if in_file else None),
            )
            for cid, result, blob, size, in_file, finished in rows
        ]
        found += [
            (h.finished_ms, Unacked(cid, h.result, h.blob, len(h.blob)))
            for cid, h in self._held.items()
            if every_server or h.server == self.server
        ]
        found.sort(key=lambda pair: pair[0] or 0)
        return [unacked for _finished, unacked in found]

    def is_acked(self, correlation_id: str) -> bool:
        """Whether the server has acked this call's result (False if never recorded)."""
        row = self._db.execute(
            "SELECT acked FROM calls WHERE correlation_id = ?", (correlation_id,)
        ).fetchone()
        return row is not None and bool(row[0])

    def unacked_ids(self) -> list[str]:
        """The ids of the results this server has not acked (as its Hello lists them)."""
        rows = self._db.execute(
            "SELECT correlation_id FROM calls WHERE state = 'DONE' AND acked = 0 AND server = ?"
            " ORDER BY finished_ms",
            (self.server,),
        ).fetchall()
        held = [cid for cid, h in self._held.items() if h.server == self.server]
        return [cid for (cid,) in rows] + held

    def has_unacked(self) -> bool:
        """Whether this server has results it has not acked (what a shutdown waits for;
        another server's cannot be acked here)."""
        if any(h.server == self.server for h in self._held.values()):
            return True
        row = self._db.execute(
            "SELECT 1 FROM calls WHERE state = 'DONE' AND acked = 0 AND server = ? LIMIT 1",
            (self.server,),
        )
        return row.fetchone() is not None

    def running_ids(self, *, every_server: bool = False) -> list[str]:
        """The calls of this server (with `every_server`, of every one) recorded as
        running: after a crash, what may or may not have happened."""
        rows = self._db.execute(
            "SELECT correlation_id FROM calls WHERE state = 'RUNNING' AND (? OR server = ?)",
            (every_server, self.server),
        )
        return [cid for (cid,) in rows]

    def servers_of_calls(self, correlation_ids: list[str]) -> dict[str, str]:
        """The server each of these calls (recorded or held) came from, if known: whose
        its telemetry row is when the worker writes it after a crash (`recover`)."""
        found = {cid: h.server for cid, h in self._held.items() if cid in correlation_ids}
        for start in range(0, len(correlation_ids), 500):
            chunk = correlation_ids[start : start + 500]
            found.update(
                self._db.execute(
                    "SELECT correlation_id, server FROM calls WHERE correlation_id IN"
                    f" ({', '.join('?' for _ in chunk)})",
                    chunk,
                ).fetchall()
            )
        return found

    def servers_of_plans(self, plan_ids: list[str]) -> dict[str, str]:
        """For each of `plan_ids` whose calls in the ledger all came from one known
        server, that server (a plan with calls from before servers were recorded, or
        from two servers, or none, is not named): whose a workspace from before they
        were kept per server is (sandbox.workspaces.Workspaces.sort_old)."""
        wanted = set(plan_ids)
        seen: dict[str, set[str]] = {}
        for plan, server in self._db.execute("SELECT DISTINCT plan_id, server FROM calls"):
            if plan in wanted:
                seen.setdefault(plan, set()).add(server)
        for h in self._held.values():
            if h.plan_id in wanted:
                seen.setdefault(h.plan_id, set()).add(h.server)
        return {
            plan: next(iter(servers))
            for plan, servers in seen.items()
            if len(servers) == 1 and not servers & {UNRECORDED_SERVER, NO_SERVER}
        }

    def held_for_others(self) -> list[HeldForOther]:
        """The results of other servers not acked by them, per server (see the module's
        docstring): what the connection says it holds, and keeps from this server."""
        totals: dict[str, list[int]] = {}
        for server, count, size, oldest in self._db.execute(
            "SELECT server, count(*), COALESCE(SUM(length(result) + blob_bytes), 0),"
            " MIN(finished_ms) FROM calls WHERE state = 'DONE' AND acked = 0 AND server != ?"
            " GROUP BY server",
            (self.server,),
        ):
            totals[server] = [count, size, oldest or 0]
        for h in self._held.values():
            if h.server != self.server:
                total = totals.setdefault(h.server, [0, 0, h.finished_ms])
                total[0] += 1
                total[1] += len(h.result) + len(h.blob)
                total[2] = min(total[2], h.finished_ms)
        return [HeldForOther(server, *total) for server, total in sorted(totals.items())]

    @property
    def ttl_s(self) -> float:
        """How long an acked call, or a result held for another server, is kept."""
        return self._ttl_ms / 1000

    def cap_acked(self) -> db.Steps:
        """Forget the oldest acked calls past `max_acked_bytes` (see MAX_ACKED_BYTES), in
        steps (worker.db.in_steps): rows looked at from the newest, _ACKED_WALK_ROWS at
        a time, then removed _ACKED_DELETE_ROWS at a time; how many went."""
        self.acked_since_cap = 0
        _kept, cut = yield from db.newest_within(
            self._db,
            "calls",
            _CALL_BYTES,
            _ACKED,
            most_bytes=self.max_acked_bytes,
            walk_rows=_ACKED_WALK_ROWS,
        )
        if not cut:
            return 0  # every acked call fits
        return (
            yield from db.delete_oldest(
                self._db, "calls", f"{_ACKED} AND rowid <= ?", (cut,), batch=_ACKED_DELETE_ROWS
            )
        )

    def prune(self) -> int:
        """Forget acked calls `ttl_s` after they finished, and results held for another
        server as long after (it did not come back for them): their blob files go too.
        The pages they took are reused; a surplus goes back with db.give_back_off_loop."""
        cutoff = now_ms() - self._ttl_ms
        cur = self._db.execute(
            "DELETE FROM calls WHERE state = 'DONE' AND acked = 1 AND finished_ms < ?", (cutoff,)
        )
        pruned = cur.rowcount
        # Only a State that knows its server can tell another's (not a tool's, nor a
        # worker's before its connection names it: that would drop its own results).
        dropped = self._db.execute(
            "DELETE FROM calls WHERE state = 'DONE' AND acked = 0 AND server != ?1"
            " AND ?1 != '' AND finished_ms < ?2 RETURNING correlation_id, server, blob_file",
            (self.server, cutoff),
        ).fetchall()
        if dropped:
            for cid, _server, in_file in dropped:
                if in_file:
                    self._blob_files.discard(cid)
                    self._blob_store.remove(cid)
            servers = sorted({server for _cid, server, _in_file in dropped})
            log.warning(
                "dropped %d result(s) held for another server (%s) and never acked by it: "
                "kept %g h after they finished",
                len(dropped),
                ", ".join(servers),
                self._ttl_ms / 3_600_000,
            )
            self._count_unacked()
        return pruned + len(dropped)

    # ------------------------------------------------------------- kill switch

    def kill_plan(
        self, plan_id: str, reason: str, killed_by: str, in_use: bool = False
    ) -> list[str]:
        """Record the kill. A kill made here (the person's) binds the plan id whichever
        server names it, and replaces a server's kill of the plan (so it is never
        pruned). A server's kill (`killed_by` SERVER) binds that server's plan only: a
        server stops its own plans, never another's of the same id; a plan id two
        servers killed is bound for every server. Returns the plans whose server kill
        was pruned to make room (see MAX_SERVER_KILLS): they are no longer killed."""
        self._refresh()
        server = self.server if killed_by == SERVER else ANY_SERVER
        with self.batch():
            row = self._db.execute(
                "SELECT killed_by, server FROM killed_plans WHERE plan_id = ?", (plan_id,)
            ).fetchone()
            if in_use and plan_id in self._unused_kills:  # the server saw a call of it
                self._unused_kills.discard(plan_id)
                self._db.execute("UPDATE killed_plans SET used = 1 WHERE plan_id = ?", (plan_id,))
            if row is None or (row[0] == SERVER and killed_by != SERVER):
                used = in_use or (
                    self._db.execute(
                        "SELECT 1 FROM calls WHERE plan_id = ? LIMIT 1", (plan_id,)
                    ).fetchone()
                    is not None
                )
                self._db.execute(
                    "INSERT OR REPLACE INTO killed_plans (plan_id, reason, killed_by,"
                    " killed_ms, server, used) VALUES (?, ?, ?, ?, ?, ?)",
                    (plan_id, reason, killed_by, now_ms(), server, used),
                )
                self._kills[plan_id] = (reason, killed_by, server)
                if not used:
                    self._unused_kills.add(plan_id)
                else:
                    self._unused_kills.discard(plan_id)
            elif row[0] == SERVER and killed_by == SERVER and row[1] != server:
                self._db.execute(
                    "UPDATE killed_plans SET server = ? WHERE plan_id = ?", (ANY_SERVER, plan_id)
                )
                known = self._kills.get(plan_id)
                if known is not None:
                    self._kills[plan_id] = (known[0], known[1], ANY_SERVER)
        return self._prune_server_kills(server, plan_id) if killed_by == SERVER else []

    def _prune_server_kills(self, server: str | None = None, arriving: str = "") -> list[str]:
        """Past MAX_SERVER_KILLS of one server's kills (`server`; None: of each), its
        oldest go. Kills that bind every server (ANY_SERVER) are a share of their own."""
        shares = (
            [server]
            if server is not None
            else [
                key
                for (key,) in self._db.execute(
                    "SELECT server FROM killed_plans WHERE killed_by = ? GROUP BY server"
                    " HAVING count(*) > ?",
                    (SERVER, MAX_SERVER_KILLS),
                )
            ]
        )
        oldest: list[str] = []
        for key in shares:
            pruned = self._oldest_server_kills(key, arriving)
            if self._keep_apart(key, [plan_digest(plan) for plan, used in pruned if used]):
                self._stop_all_plans(key)
            oldest += [plan for plan, _ in pruned]
        if not oldest:
            return []
        self._db.executemany("DELETE FROM killed_plans WHERE plan_id = ?", ((p,) for p in oldest))
        for plan in oldest:
            self._kills.pop(plan, None)
            self._unused_kills.discard(plan)
        return oldest

    def kill_apart(self, digest: int) -> None:
        """Record the served server's kill of the plan whose id has `digest` (a hub's
        KillPlan.plan_digest: it could not keep the kill whole for this worker), kept
        apart as a pruned kill is (past MAX_KILLS_APART: every plan of it stopped)."""
        self._refresh()
        with self.batch():
            if self._keep_apart(self.server, [digest]):
                self._stop_all_plans(self.server)

    def kept_apart(self, digest: int) -> bool:
        """Whether a kill of the plan whose id has `digest` is kept apart (any server's)."""
        row = self._db.execute("SELECT 1 FROM kills_apart WHERE digest = ?", (digest,))
        return row.fetchone() is not None

    def _keep_apart(self, server: str, digests: list[int]) -> bool:
        """Keep the kills of the plans of `digests` (of `server`, in use; pruned, or sent
        by digest) apart (see MAX_KILLS_APART). Whether the server's share there is
        full: then the rest are not kept, and every plan of the server must be stopped
        instead."""
        for digest in digests:
            row = self._db.execute(
                "SELECT server FROM kills_apart WHERE digest = ?", (digest,)
            ).fetchone()
            if row is not None:
                if row[0] not in (server, ANY_SERVER):  # two servers killed the id
                    self._db.execute(
                        "UPDATE kills_apart SET server = ? WHERE digest = ?", (ANY_SERVER, digest)
                    )
                continue
            if self._apart_counted(server) >= MAX_KILLS_APART:
                return True
            self._db.execute(
                "INSERT INTO kills_apart (digest, server) VALUES (?, ?)", (digest, server)
            )
            self._any_apart = True
            self._apart_counts[server] += 1
        return False

    def _apart_counted(self, server: str) -> int:
        """How many kills of `server` are kept apart. Counted once a process (a scan),
        then kept: a lift by another process only makes it high, never low."""
        if server not in self._apart_counts:
            (self._apart_counts[server],) = self._db.execute(
                "SELECT count(*) FROM kills_apart WHERE server = ?", (server,)
            ).fetchone()
        return self._apart_counts[server]

    def _kept_apart(self, plan_id: str) -> str | None:
        """Why the plan is killed if its kill is kept apart for the server served."""
        if not self._any_apart:
            return None
        row = self._db.execute(
            "SELECT server FROM kills_apart WHERE digest = ?", (plan_digest(plan_id),)
        ).fetchone()
        if row is None or row[0] not in (ANY_SERVER, self.server):
            return None
        return (
            f"killed by the server: one of more than {MAX_SERVER_KILLS:,} kills of plans in "
            f"use from it, kept apart without its reason (by {SERVER})"
        )

    def _stop_all_plans(self, server: str) -> None:
        """Record OVERFLOW's kill of ALL_PLANS for `server` (see MAX_SERVER_KILLS): a
        kill of one of its plans in use is about to be pruned."""
        row = self._db.execute(
            "SELECT killed_by, server FROM killed_plans WHERE plan_id = ?", (ALL_PLANS,)
        ).fetchone()
        if row is not None and row[0] != SERVER and row[1] in (server, ANY_SERVER):
            return  # stopped already
        binds = server if row is None or (row[0] == SERVER and row[1] == server) else ANY_SERVER
        reason = (
            f"more than {MAX_SERVER_KILLS + MAX_KILLS_APART:,} kills of plans in use came from "
            f"server {server}: "
            "past that the worker could not keep them all, so every plan of that server is "
            "stopped here until the person lifts it (agentworker lift '*')"
        )
        log.warning("%s", reason)
        self._db.execute(
            "INSERT OR REPLACE INTO killed_plans (plan_id, reason, killed_by, killed_ms,"
            " server, used) VALUES (?, ?, ?, ?, ?, 1)",
            (ALL_PLANS, reason, OVERFLOW, now_ms(), binds),
        )
        self._kills[ALL_PLANS] = (reason, OVERFLOW, binds)
        self._unused_kills.discard(ALL_PLANS)

    def _oldest_server_kills(self, server: str, arriving: str = "") -> list[tuple[str, bool]]:
        """The kills of `server` past its MAX_SERVER_KILLS, oldest first (those of plans
        no call came for first), never `arriving`'s, nor the server's kill of ALL_PLANS
        (one at most: a hub sends it in place of kills it dropped, and pruned it would
        take with it the stop recorded in its place): plan, and whether in use."""
        (count,) = self._db.execute(
            "SELECT count(*) FROM killed_plans WHERE killed_by = ? AND server = ?",
            (SERVER, server),
        ).fetchone()
        if count <= MAX_SERVER_KILLS:
            return []
        return [
            (plan, bool(used))
            for plan, used in self._db.execute(
                "SELECT plan_id, used FROM killed_plans WHERE killed_by = ? AND server = ?"
                " AND plan_id NOT IN (?, ?) ORDER BY used, killed_ms, rowid LIMIT ?",
                (SERVER, server, arriving, ALL_PLANS, count - MAX_SERVER_KILLS),
            )
        ]

    def kill_mark(self) -> tuple[str, int]:
        """The numbered kills of the server served that are recorded here: the epoch
        they are numbered in and through which one (Hello.kills_epoch, kills_through)."""
        row = self._db.execute(
            "SELECT epoch, through FROM kill_marks WHERE server = ?", (self.server,)
        ).fetchone()
        return ("", 0) if row is None else (str(row[0]), int(row[1]))

    def hub_kills_recorded(self, epoch: str) -> int:
        """Through which of the kills numbered in `epoch` (a hub's hub.db: its
        Welcome.kills_epoch) this worker recorded them, under the key of the server
        served or any key of the same address (another token: the person rotated
        hub-workers.token). A kill at or below it was recorded here before: if it is
        no longer here, the person lifted it (or it was pruned), and a replay of it
        must not impose it again (review14 finding 07)."""
        if not epoch:
            return 0
        address, hashed, _ = self.server.rpartition("#")
        row = self._db.execute(
            "SELECT max(through) FROM kill_marks WHERE epoch = ?"
            " AND (server = ? OR (? AND substr(server, 1, ?) = ?))",
            (epoch, self.server, bool(hashed), len(address) + 1, f"{address}#"),
        ).fetchone()
        return int(row[0] or 0)

    def server_kill_of(self, plan_id: str) -> bool:
        """Whether a server's kill of the plan is recorded here (for any server), whole
        or kept apart: a kill kept apart is not one the person lifted (see
        connection._replayed_kill_lifted)."""
        row = self._db.execute(
            "SELECT 1 FROM killed_plans WHERE plan_id = ? AND killed_by = ?", (plan_id, SERVER)
        ).fetchone()
        return row is not None or self.kept_apart(plan_digest(plan_id))

    def carry_kills_over(self, epoch: str) -> int:
        """At the first session of a new key of an address whose kills numbered in
        `epoch` (its Welcome: the same hub.db) were recorded here under another key (the
        person rotated hub-workers.token), that key's kills, whole and kept apart, bind
        the new key instead: they are the same hub's. Before, they bound the old key
        only, and the hub, which sends every kill again, sends none it pruned, and one
        it keeps by digest the worker took for lifted since: the plan ran (review19 A5).
        How many were carried over."""
        address, hashed, _ = self.server.rpartition("#")
        if not epoch or not hashed or self.kill_mark()[0] == epoch:
            return 0
        earlier = [
            (key,)
            for (key,) in self._db.execute(
                "SELECT server FROM kill_marks WHERE epoch = ? AND server != ?"
                " AND substr(server, 1, ?) = ?",
                (epoch, self.server, len(address) + 1, f"{address}#"),
            )
        ]
        if not earlier:
            return 0
        with self.batch():
            carried = 0
            for (key,) in earlier:
                carried += self._db.execute(
                    "UPDATE killed_plans SET server = ? WHERE server = ? AND killed_by IN (?, ?)",
                    (self.server, key, SERVER, OVERFLOW),
                ).rowcount
                carried += self._db.execute(
                    "UPDATE kills_apart SET server = ? WHERE server = ?", (self.server, key)
                ).rowcount
            self._apart_counts.clear()
            self._changed()
            self._refresh()
            self._prune_server_kills(self.server)
        if carried:
            log.info(
                "%d kill(s) of this hub recorded under its earlier workers' token now bind "
                "its new one",
                carried,
            )
        return carried

    def mark_kills(self, epoch: str, through: int) -> None:
        """The server served numbers its kills in `epoch` (its Welcome), and this one's
        kills through `through` are recorded (its KillPlans, once `kill_plan` recorded
        each). Another epoch than the one kept starts the count over."""
        if not epoch:
            return
        kept_epoch, kept = self.kill_mark()
        if kept_epoch == epoch and kept >= through:
            return
        self._db.execute(
            "INSERT OR REPLACE INTO kill_marks VALUES (?, ?, ?)",
            (self.server, epoch, through),
        )

    def lift_kill(self, plan_id: str) -> bool:
        self._refresh()
        cur = self._db.execute("DELETE FROM killed_plans WHERE plan_id = ?", (plan_id,))
        apart = self._db.execute(
            "DELETE FROM kills_apart WHERE digest = ?", (plan_digest(plan_id),)
        )
        self._kills.pop(plan_id, None)
        return cur.rowcount > 0 or apart.rowcount > 0

    def _binding(self, plan_id: str) -> tuple[str, str, str] | None:
        for killed in (plan_id, ALL_PLANS):
            kill = self._kills.get(killed)
            if kill is not None and kill[2] in (ANY_SERVER, self.server):
                return kill
        return None  # none, or another server's kill of its own plan of this id

    def kill_reason(self, plan_id: str) -> str | None:
        """Why the plan is killed for the server this State serves, or None. Asked for a
        call of the plan: a kill of a plan no call had come for is now of a plan in use
        (see MAX_SERVER_KILLS)."""
        self._refresh()
        kill = self._binding(plan_id)
        if kill is None:
            return self._kept_apart(plan_id)
        if plan_id in self._unused_kills:
            self._unused_kills.discard(plan_id)
            with self.batch():
                self._db.execute("UPDATE killed_plans SET used = 1 WHERE plan_id = ?", (plan_id,))
        return f"{kill[0]} (by {kill[1]})"

    def killed(self, plan_id: str) -> str | None:
        """The reason of the plan's kill that binds the server served, or None: from the
        cache, but for a kill kept apart (a lookup by key, while any is kept apart: a UI
        showed such a plan as not killed, and would not lift it)."""
        self._refresh()
        kill = self._binding(plan_id)
        return self._kept_apart(plan_id) if kill is None else kill[0]

    def kills_moved(self) -> set[str]:
        """Plans killed or lifted by another process (`agentworker kill`) since the last
        ask: what a UI's list of plans must show anew."""
        self._refresh()
        moved, self._kills_moved = self._kills_moved, set()
        return moved

    def killed_plans(self) -> list[tuple[str, str]]:
        """The plans killed for the server served: id and reason, oldest first."""
        return list(
            self._db.execute(
                "SELECT plan_id, reason FROM killed_plans WHERE server IN (?, ?)"
                " ORDER BY killed_ms",
                (ANY_SERVER, self.server),
            )
        )

    def kills(self) -> list[tuple[str, str, str, int, str]]:
        """Every killed plan: id, reason, who killed it, when (unix ms), and whose plan
        of the id it binds (a server's key, or ANY_SERVER), oldest first."""
        return list(
            self._db.execute(
                "SELECT plan_id, reason, killed_by, killed_ms, server FROM killed_plans"
                " ORDER BY killed_ms"
            )
        )

    def kills_kept_apart(self) -> int:
        """How many server kills are kept apart (by digest; see MAX_KILLS_APART)."""
        (count,) = self._db.execute("SELECT count(*) FROM kills_apart").fetchone()
        return int(count)

    # ------------------------------------------------------------- local grants

    def _rename_asks(self) -> None:
        """Grants kept under an ask's earlier name (its masked argv) renamed in place
        (_renamed_ask): the rows stay, and answer the same asks; their argv leaves
        state.db, the freed space zeroed (secure_delete) and the log of pages that
        held it emptied (a checkpoint that truncates it)."""
        rows = self._db.execute(
            "SELECT id, scope FROM grants WHERE scope LIKE ? ESCAPE '!'",
            (ASK_PREFIX + "%.exec `%",),
        ).fetchall()
        renamed = [(new, gid) for gid, scope in rows if (new := _renamed_ask(scope)) is not None]
        if not renamed:
            return
        self._db.execute("PRAGMA secure_delete = ON")
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("UPDATE grants SET scope = ? WHERE id = ?", renamed)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            self._db.execute("PRAGMA secure_delete = OFF")
        log.info("renamed %d grants of allowlist asks: no argv in their names", len(renamed))

    def add_grant(
        self,
        agent: str,
        scope: str,
        plan: str,
        expires: datetime | None,
        granted_by: str,
        server: str | None = None,
    ) -> int:
        """A grant for `server` (default: the one this State serves): it admits that
        server's calls only."""
        expires_ms = None if expires is None else int(expires.timestamp() * 1000)
        cur = self._db.execute(
            "INSERT INTO grants (agent, scope, plan, expires_ms, granted_by, created_ms, server)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                agent,
                scope,
                plan,
                expires_ms,
                granted_by,
                now_ms(),
                self.server if server is None else server,
            ),
        )
        self._changed()
        return int(cur.lastrowid or 0)

    def revoke_grant(self, grant_id: int) -> bool:
        self._changed()
        return self._db.execute("DELETE FROM grants WHERE id = ?", (grant_id,)).rowcount > 0

    def grants(self, *, every_server: bool = False) -> list[StoredGrant]:
        """The grants for the server this State serves (with `every_server`, every
        grant: for the person's listings). A grant for another server admits none of
        this one's calls, whatever its agent and plan patterns say."""
        self._refresh()
        if every_server:
            return self._grants
        return [g for g in self._grants if g.server == self.server]

    def _read_grants(self) -> list[StoredGrant]:
        rows = self._db.execute(
            "SELECT id, agent, scope, plan, expires_ms, granted_by, server FROM grants ORDER BY id"
        ).fetchall()
        return [
            StoredGrant(
                id=gid,
                agent=agent,
                scope=scope,
                plan=plan,
                expires=None if exp is None else datetime.fromtimestamp(exp / 1000).astimezone(),
                granted_by=by,
                server=server,
            )
            for gid, agent, scope, plan, exp, by, server in rows
        ]

    def sort_old_grants(self) -> list[StoredGrant]:
        """Give each grant from before grants were kept per server (UNSORTED_SERVER) its
        server once: a grant for one plan (no pattern) whose calls in the ledger all
        came from one recorded server is that server's (`servers_of_plans`); any other
        is UNRECORDED_SERVER, for no server, until the person grants it again. Run at
        the worker's start. Returns the grants sorted now."""
        old = [
            g.plan
            for g in self.grants(every_server=True)
            if g.server == UNSORTED_SERVER and not any(c in g.plan for c in "*?[")
        ]
        owners = self.servers_of_plans(old)
        sorted_now = []
        for g in self.grants(every_server=True):
            if g.server != UNSORTED_SERVER:
                continue
            server = owners.get(g.plan, UNRECORDED_SERVER)
            self._db.execute("UPDATE grants SET server = ? WHERE id = ?", (server, g.id))
            sorted_now.append(replace(g, server=server))
        if sorted_now:
            self._changed()
        return sorted_now

    # ------------------------------------------------------------- the server served

    def record_served(self) -> None:
        """Remember the server this State serves (`server`), for the person's CLI: a
        grant made there is for it unless another server is named. Grants made before
        any server was served here (NEXT_SERVER) are this one's."""
        with self.batch():
            first = self._db.execute("SELECT 1 FROM served").fetchone() is None
            self._db.execute(
                "INSERT INTO served VALUES (1, ?, ?) ON CONFLICT (one) DO UPDATE"
                " SET server = excluded.server, since_ms = excluded.since_ms",
                (self.server, now_ms()),
            )
            if first:
                self._db.execute(
                    "UPDATE grants SET server = ? WHERE server = ?", (self.server, NEXT_SERVER)
                )
        self._changed()

    def served(self) -> str | None:
        """The server the worker here serves, or served last (None: none yet)."""
        row = self._db.execute("SELECT server FROM served").fetchone()
        return None if row is None else str(row[0])
