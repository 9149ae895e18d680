"""Recording a plan's calls so they can be replayed (`agentworker record start PLAN`).

A telemetry row keeps only a short preview of a call's args. While recording is
switched on for a plan, each of its calls also keeps what a replay needs: the
args (secret-looking values masked, as in previews, never cut short), the request
blob, the result and the result blob's digest. They are written with the calls'
telemetry rows, in the same commit, and pruned with them.

A call refused before it ran (scope_required, plan_killed, a validation error, ...)
keeps no request blob: its refusal does not depend on the bytes, and an agent with
no grant at all could otherwise fill the disk through a recorded plan (review10 05:
12 refused 16 MiB fs_writes kept 192 MiB). Its row says how many bytes were left
out. And the request blobs kept, of every recorded plan together, stop at
MAX_BLOB_BYTES: past it a call's row keeps its args and result but not its blob,
the worker logs a warning and writes a `recording_full` audit row (once a run), and
`agentworker record PLAN` says which steps lost their blob. The args and results
kept stop at MAX_TEXT_BYTES the same way: past it a call's row keeps neither (nor its
blob), and its step is a comment saying so. Without it, each call of a recorded plan
kept its args whole for the 90 days, refused ones too: an agent with no grant at all
sent 150 calls of 1 MiB of argv and the worker kept 150 MB (review25 G12).

The person switches recording on and off from the CLI (another process): the
worker reads the recorded plans from the database, cached until SQLite's
data_version says someone wrote (at most every RECHECK_S).

A plan is a server's: plan ids are unique per server only, so recordings are kept
by (server, plan), the server named by its key (the address the worker dials and a
digest of its token, `worker.core.connection.Target.server_key`), as grants, kills
and workspaces are. `record start P` while serving A records A's plan P; server B's
calls in a plan it also calls P keep nothing, and `record P` for A writes A's calls
only (review12 finding 04: B's steps and blob went into the script of A's plan).
A state.db from before is converted when the worker opens it (`convert`): the plans
being recorded become the plans of the server served last (whose they were when the
person started them, unless the worker moved since), and each recorded call the
ledger still knows (24 h) gets the server it came from; the others are kept under
UNRECORDED_SERVER, which no server's key equals: `agentworker record P --server-key
unrecorded` writes them. Until then (a command-line tool opens the database without
converting it) recorded calls are read as UNRECORDED_SERVER's.
"""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
import time
from dataclasses import dataclass
from typing import Final, cast

from worker.clock import now_ms
from worker.core.ledger import UNRECORDED_SERVER  # no server's key: whose is not known
from worker.core.redaction import args_for_replay
from worker.db import immediate, write_many
from worker.wire.framing import Buffer
from worker.wire.proto import agentworker_pb2 as pb

RECHECK_S: Final = 0.1
# The most request-blob bytes all recordings keep together.
MAX_BLOB_BYTES: Final = 1024 * 1024 * 1024
# The most bytes of args and results all recordings keep together; a call past it
# is kept with `redacted` set to PAST_BOUND, its args NULL and its result empty.
MAX_TEXT_BYTES: Final = 256 * 1024 * 1024
PAST_BOUND: Final = 2
# The most calls all recordings keep together: past it a call keeps nothing (its step
# is a comment, "recording was off"). Recordings are pruned by their own bounds and
# retention only, never with telemetry's rows: an agent's flood of calls in another
# plan pushing those out erased the person's recording (review25 G12c).
MAX_RECORDED_CALLS: Final = 1_000_000
FULL_KIND: Final = "recording_full"

_PLANS_TABLE: Final = """
CREATE TABLE IF NOT EXISTS recording_plans (
    server     TEXT NOT NULL,  -- the key of the server whose plan it is
    plan_id    TEXT NOT NULL,
    started_ms INTEGER NOT NULL,
    started_by TEXT NOT NULL,
    PRIMARY KEY (server, plan_id)
)
"""
_CALLS_TABLE: Final = """
CREATE TABLE IF NOT EXISTS recorded_calls (
    server             TEXT NOT NULL,  -- the key of the server that sent it
    correlation_id     TEXT NOT NULL,
    plan_id            TEXT NOT NULL,
    args_json          TEXT,   -- redacted; NULL when the args were not a JSON object
    redacted           INTEGER NOT NULL,  -- 1: masked; PAST_BOUND: args and result not kept
    request_blob       BLOB NOT NULL,
    result_json        TEXT NOT NULL,
    result_blob_sha256 TEXT NOT NULL,
    unix_ms            INTEGER NOT NULL,
    blob_left_out      INTEGER NOT NULL DEFAULT 0,  -- bytes of the request blob not kept
    PRIMARY KEY (server, correlation_id)
)
"""
SCHEMA: Final = f"{_PLANS_TABLE};{_CALLS_TABLE};"
# Made once the tables are per server (the table from before had `recorded_calls_plan`,
# on (plan_id, unix_ms): dropped when it is converted).
_INDEX: Final = (
    "CREATE INDEX IF NOT EXISTS recorded_calls_server_plan"
    " ON recorded_calls (server, plan_id, unix_ms)"
)
_RECORDED_COLUMNS: Final = (
    "correlation_id, plan_id, args_json, redacted, request_blob, result_json,"
    " result_blob_sha256, unix_ms, blob_left_out"
)

_INSERT: Final = (
    f"INSERT OR REPLACE INTO recorded_calls (server, {_RECORDED_COLUMNS})"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def _table_exists(conn: sqlite3.Connection, name: str) -> bool:
    found = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
    ).fetchone()
    return found is not None


def _per_server_plans(conn: sqlite3.Connection) -> None:
    """recording_plans from before (keyed by plan id alone) made per server: each
    plan being recorded is the plan of the server served last (the ledger's `served`),
    UNRECORDED_SERVER's if none was. A few rows: done by whoever opens it first."""
    if "server" in _columns(conn, "recording_plans"):
        return
    served = None
    if _table_exists(conn, "served"):
        row = conn.execute("SELECT server FROM served").fetchone()
        served = None if row is None else str(row[0])
    conn.execute("ALTER TABLE recording_plans RENAME TO recording_plans_before")
    conn.execute(_PLANS_TABLE)
    conn.execute(
        "INSERT INTO recording_plans (server, plan_id, started_ms, started_by)"
        " SELECT ?, plan_id, started_ms, started_by FROM recording_plans_before",
        (served or UNRECORDED_SERVER,),
    )
    conn.execute("DROP TABLE recording_plans_before")


def _per_server_calls(conn: sqlite3.Connection) -> None:
    """recorded_calls from before (keyed by correlation id alone) made per server, by
    copying them all (up to MAX_BLOB_BYTES of blobs: only the worker does it, see
    `convert`): a call the ledger still knows is its server's, any other
    UNRECORDED_SERVER's."""
    columns = _columns(conn, "recorded_calls")
    if "server" in columns:
        return
    conn.execute("ALTER TABLE recorded_calls RENAME TO recorded_calls_before")
    conn.execute("DROP INDEX IF EXISTS recorded_calls_plan")
    conn.execute(_CALLS_TABLE)
    left_out = "r.blob_left_out" if "blob_left_out" in columns else "0"
    known = (
        "(SELECT c.server FROM calls c WHERE c.correlation_id = r.correlation_id"
        " AND c.plan_id = r.plan_id AND c.server NOT IN ('', ?))"
        if _table_exists(conn, "calls")
        else "NULL"
    )
    chosen = ", ".join(
        f"r.{c}" if c != "blob_left_out" else left_out for c in _RECORDED_COLUMNS.split(", ")
    )
    conn.execute(
        f"INSERT INTO recorded_calls (server, {_RECORDED_COLUMNS})"
        f" SELECT COALESCE({known}, ?), {chosen} FROM recorded_calls_before r",
        (UNRECORDED_SERVER, UNRECORDED_SERVER) if known != "NULL" else (UNRECORDED_SERVER,),
    )
    conn.execute("DROP TABLE recorded_calls_before")


def _utf8_bytes(text: str | None) -> int:
    """What a text takes in the database (UTF-8): a character may take four bytes."""
    return len(text.encode("utf-8", "surrogatepass")) if text else 0


@dataclass(frozen=True)
class RecordedCall:
    correlation_id: str
    args_json: str | None
    redacted: bool
    request_blob: bytes
    result_json: str
    result_blob_sha256: str
    blob_left_out: int = 0  # bytes of its request blob not kept (refused, or bound reached)
    past_bound: bool = False  # its args and result were not kept: MAX_TEXT_BYTES was reached


class Recordings:
    """The plans being recorded and their calls' replay data, on the telemetry's
    connection (the ledger's database)."""

    def __init__(
        self, conn: sqlite3.Connection, recheck_s: float = RECHECK_S, *, convert: bool = False
    ) -> None:
        """`convert`: the worker, at its start, makes tables from before per server
        (worker.db.connect's rule: a command-line tool converting them would hold
        the worker out while up to a GiB of recorded blobs is copied); the small
        recording_plans is made per server by whoever opens it first."""
        conn.executescript(SCHEMA)
        before = "server" not in _columns(conn, "recording_plans") or (
            convert and "server" not in _columns(conn, "recorded_calls")
        )
        with immediate(conn) if before else contextlib.nullcontext():
            _per_server_plans(conn)  # each looks again, under the lock
            if convert:
                _per_server_calls(conn)
        # Read as UNRECORDED_SERVER's until the worker converts them (see the module's
        # docstring); nothing is written to them meanwhile (only the worker records).
        self._per_server = "server" in _columns(conn, "recorded_calls")
        if self._per_server:
            conn.execute(_INDEX)
        self._db = conn
        self.max_blob_bytes = MAX_BLOB_BYTES
        self.max_text_bytes = MAX_TEXT_BYTES
        self.max_calls = MAX_RECORDED_CALLS
        self._calls: int | None = None  # kept now, counted when first needed
        self._blob_bytes: int | None = None  # kept now, counted when first needed
        self._text_bytes: int | None = None  # the same, of args and results
        self.full = False  # the bound was reached in this run (told once)
        self._recheck_s = recheck_s
        self._plans: frozenset[tuple[str, str]] = frozenset()  # (server, plan)
        self._version = -1
        self._checked_at = 0.0
        self._queued: list[tuple[object, ...]] = []

    # ------------------------------------------------------------- switching

    def start(self, server: str, plan_id: str, started_by: str) -> bool:
        """Record the server's plan's calls from now on; False if it already was."""
        cur = self._db.execute(
            "INSERT OR IGNORE INTO recording_plans (server, plan_id, started_ms, started_by)"
            " VALUES (?, ?, ?, ?)",
            (server, plan_id, now_ms(), started_by),
        )
        self._version = -1  # our own writes do not move data_version
        return cur.rowcount > 0

    def stop(self, server: str, plan_id: str) -> bool:
        """Stop recording the server's plan (what was recorded stays); False if it was not."""
        cur = self._db.execute(
            "DELETE FROM recording_plans WHERE server = ? AND plan_id = ?", (server, plan_id)
        )
        self._version = -1
        return cur.rowcount > 0

    def plans(self) -> list[tuple[str, str, int, str]]:
        """(server, plan, started unix ms, by whom) of every plan being recorded."""
        return list(
            self._db.execute(
                "SELECT server, plan_id, started_ms, started_by FROM recording_plans"
                " ORDER BY started_ms"
            )
        )

    def active(self, server: str, plan_id: str) -> bool:
        """Whether the server's plan's calls are being recorded (cheap: read on every call)."""
        now = time.monotonic()
        if self._version == -1 or now - self._checked_at >= self._recheck_s:
            self._checked_at = now
            version = self._db.execute("PRAGMA data_version").fetchone()[0]
            if version != self._version:
                self._version = version
                self._blob_bytes = None  # another process may have cleared recordings
                self._text_bytes = None
                self._calls = None
                rows = self._db.execute("SELECT server, plan_id FROM recording_plans")
                self._plans = frozenset((who, plan) for who, plan in rows)
        return (server, plan_id) in self._plans

    # ------------------------------------------------------------- keeping calls

    def keep_later(
        self,
        server: str,
        req: pb.ActionRequest,
        request_blob: bytes,
        result_json: str,
        result_blob: Buffer,
        *,
        ran: bool = True,
    ) -> bool:
        """Queue a call of `server`'s recorded plan; `flush` writes it with the telemetry rows. A
        call that did not run keeps no request blob, nor one past MAX_BLOB_BYTES, and
        past MAX_TEXT_BYTES no args and no result either, and past MAX_RECORDED_CALLS
        nothing at all; True when this call is the first one a bound left something out
        of in this run."""
        if self._calls is None:
            (kept,) = self._db.execute("SELECT COUNT(*) FROM recorded_calls").fetchone()
            self._calls = int(kept) + len(self._queued)
        if self._calls >= self.max_calls:
            first_full, self.full = not self.full, True
            return first_full  # nothing of it kept
        self._calls += 1
        args, masked = args_for_replay(req.args_json)
        redacted = int(masked)  # or PAST_BOUND
        left_out = 0
        first_full = False
        text = _utf8_bytes(args) + _utf8_bytes(result_json)  # bytes, not characters
        if self._text_bytes is None:
            row = self._db.execute(
                "SELECT COALESCE(SUM(COALESCE(length(CAST(args_json AS BLOB)), 0)"
                " + length(CAST(result_json AS BLOB))), 0) FROM recorded_calls"
            ).fetchone()
            queued = sum(
                _utf8_bytes(cast(str | None, item[3])) + _utf8_bytes(cast(str, item[6]))
                for item in self._queued
            )
            self._text_bytes = int(row[0]) + queued
        if self._text_bytes + text > self.max_text_bytes:
            args, result_json, redacted = None, "", PAST_BOUND
            left_out, request_blob = len(request_blob), b""
            first_full, self.full = not self.full, True
        else:
            self._text_bytes += text
        if request_blob and not ran:
            left_out, request_blob = len(request_blob), b""
        elif request_blob:
            if self._blob_bytes is None:
                row = self._db.execute(
                    "SELECT COALESCE(SUM(length(request_blob)), 0) FROM recorded_calls"
                ).fetchone()
                queued = sum(len(cast(bytes, item[5])) for item in self._queued)
                self._blob_bytes = int(row[0]) + queued
            if self._blob_bytes + len(request_blob) > self.max_blob_bytes:
                left_out, request_blob = len(request_blob), b""
                first_full, self.full = not self.full, True
            else:
                self._blob_bytes += len(request_blob)
        self._queued.append(
            (
                server,
                req.correlation_id,
                req.plan_id,
                args,
                redacted,
                request_blob,
                result_json,
                hashlib.sha256(result_blob).hexdigest(),
                now_ms(),
                left_out,
            )
        )
        return first_full

    def pending(self) -> bool:
        return bool(self._queued)

    def write_pending(self) -> None:
        """Write the queued calls (inside the caller's transaction, if one is open);
        they stay queued until `written` says the commit went through."""
        write_many(self._db, _INSERT, self._queued)

    def written(self) -> None:
        self._queued = []

    def flush(self) -> None:
        if self._queued:
            self.write_pending()
            self.written()

    def calls(self, server: str, plan_id: str) -> dict[str, RecordedCall]:
        """The server's plan's recorded calls, by correlation id."""
        self.flush()
        select = (
            "SELECT correlation_id, args_json, redacted, request_blob, result_json,"
            " result_blob_sha256, {left_out} FROM recorded_calls WHERE plan_id = ?"
        )
        if self._per_server:
            rows = self._db.execute(
                select.format(left_out="blob_left_out") + " AND server = ?", (plan_id, server)
            )
        elif server == UNRECORDED_SERVER:  # not converted yet: every call is from before
            had = "blob_left_out" in _columns(self._db, "recorded_calls")
            left_out = "blob_left_out" if had else "0"
            rows = self._db.execute(select.format(left_out=left_out), (plan_id,))
        else:
            return {}
        return {
            cid: RecordedCall(
                cid,
                args,
                redacted == 1,
                bytes(blob),
                result,
                digest,
                left_out,
                past_bound=redacted == PAST_BOUND,
            )
            for cid, args, redacted, blob, result, digest, left_out in rows
        }

    def servers(self, plan_id: str) -> list[str]:
        """The servers with recorded calls in a plan of this id."""
        if not self._per_server:
            found = self._db.execute(
                "SELECT 1 FROM recorded_calls WHERE plan_id = ? LIMIT 1", (plan_id,)
            ).fetchone()
            return [UNRECORDED_SERVER] if found else []
        rows = self._db.execute(
            "SELECT DISTINCT server FROM recorded_calls WHERE plan_id = ? ORDER BY server",
            (plan_id,),
        )
        return [str(server) for (server,) in rows]

    def prune(self, cutoff_ms: int) -> int:
        self._blob_bytes = None
        self._text_bytes = None
        self._calls = None
        return self._db.execute(
            "DELETE FROM recorded_calls WHERE unix_ms < ?", (cutoff_ms,)
        ).rowcount
