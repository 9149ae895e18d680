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
`agentworker record PLAN` says which steps lost their blob.

The person switches recording on and off from the CLI (another process): the
worker reads the recorded plans from the database, cached until SQLite's
data_version says someone wrote (at most every RECHECK_S).
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from dataclasses import dataclass
from typing import Final, cast

from worker.clock import now_ms
from worker.core.redaction import args_for_replay
from worker.db import write_many
from worker.wire.proto import agentworker_pb2 as pb

RECHECK_S: Final = 0.1
# The most request-blob bytes all recordings keep together.
MAX_BLOB_BYTES: Final = 1024 * 1024 * 1024
FULL_KIND: Final = "recording_full"

SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS recording_plans (
    plan_id    TEXT PRIMARY KEY,
    started_ms INTEGER NOT NULL,
    started_by TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS recorded_calls (
    correlation_id     TEXT PRIMARY KEY,
    plan_id            TEXT NOT NULL,
    args_json          TEXT,   -- redacted; NULL when the args were not a JSON object
    redacted           INTEGER NOT NULL,
    request_blob       BLOB NOT NULL,
    result_json        TEXT NOT NULL,
    result_blob_sha256 TEXT NOT NULL,
    unix_ms            INTEGER NOT NULL,
    blob_left_out      INTEGER NOT NULL DEFAULT 0  -- bytes of the request blob not kept
);
CREATE INDEX IF NOT EXISTS recorded_calls_plan ON recorded_calls (plan_id, unix_ms);
"""

_INSERT: Final = (
    "INSERT OR REPLACE INTO recorded_calls (correlation_id, plan_id, args_json, redacted,"
    " request_blob, result_json, result_blob_sha256, unix_ms, blob_left_out)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


@dataclass(frozen=True)
class RecordedCall:
    correlation_id: str
    args_json: str | None
    redacted: bool
    request_blob: bytes
    result_json: str
    result_blob_sha256: str
    blob_left_out: int = 0  # bytes of its request blob not kept (refused, or bound reached)


class Recordings:
    """The plans being recorded and their calls' replay data, on the telemetry's
    connection (the ledger's database)."""

    def __init__(self, conn: sqlite3.Connection, recheck_s: float = RECHECK_S) -> None:
        conn.executescript(SCHEMA)
        columns = {row[1] for row in conn.execute("PRAGMA table_info(recorded_calls)")}
        if "blob_left_out" not in columns:  # a state.db from before the column
            conn.execute(
                "ALTER TABLE recorded_calls ADD COLUMN blob_left_out INTEGER NOT NULL DEFAULT 0"
            )
        self._db = conn
        self.max_blob_bytes = MAX_BLOB_BYTES
        self._blob_bytes: int | None = None  # kept now, counted when first needed
        self.full = False  # the bound was reached in this run (told once)
        self._recheck_s = recheck_s
        self._plans: frozenset[str] = frozenset()
        self._version = -1
        self._checked_at = 0.0
        self._queued: list[tuple[object, ...]] = []

    # ------------------------------------------------------------- switching

    def start(self, plan_id: str, started_by: str) -> bool:
        """Record the plan's calls from now on; False if it already was."""
        cur = self._db.execute(
            "INSERT OR IGNORE INTO recording_plans VALUES (?, ?, ?)",
            (plan_id, now_ms(), started_by),
        )
        self._version = -1  # our own writes do not move data_version
        return cur.rowcount > 0

    def stop(self, plan_id: str) -> bool:
        """Stop recording the plan (what was recorded stays); False if it was not."""
        cur = self._db.execute("DELETE FROM recording_plans WHERE plan_id = ?", (plan_id,))
        self._version = -1
        return cur.rowcount > 0

    def plans(self) -> list[tuple[str, int, str]]:
        """(plan, started unix ms, by whom) of every plan being recorded."""
        return list(
            self._db.execute(
                "SELECT plan_id, started_ms, started_by FROM recording_plans ORDER BY started_ms"
            )
        )

    def active(self, plan_id: str) -> bool:
        """Whether the plan's calls are being recorded (cheap: read on every call)."""
        now = time.monotonic()
        if self._version == -1 or now - self._checked_at >= self._recheck_s:
            self._checked_at = now
            version = self._db.execute("PRAGMA data_version").fetchone()[0]
            if version != self._version:
                self._version = version
                self._blob_bytes = None  # another process may have cleared recordings
                rows = self._db.execute("SELECT plan_id FROM recording_plans")
                self._plans = frozenset(plan for (plan,) in rows)
        return plan_id in self._plans

    # ------------------------------------------------------------- keeping calls

    def keep_later(
        self,
        req: pb.ActionRequest,
        request_blob: bytes,
        result_json: str,
        result_blob: bytes,
        *,
        ran: bool = True,
    ) -> bool:
        """Queue a recorded plan's call; `flush` writes it with the telemetry rows. A
        call that did not run keeps no request blob, nor one past MAX_BLOB_BYTES; True
        when this call's blob is the first one the bound left out in this run."""
        args, redacted = args_for_replay(req.args_json)
        left_out = 0
        first_full = False
        if request_blob and not ran:
            left_out, request_blob = len(request_blob), b""
        elif request_blob:
            if self._blob_bytes is None:
                row = self._db.execute(
                    "SELECT COALESCE(SUM(length(request_blob)), 0) FROM recorded_calls"
                ).fetchone()
                queued = sum(len(cast(bytes, item[4])) for item in self._queued)
                self._blob_bytes = int(row[0]) + queued
            if self._blob_bytes + len(request_blob) > self.max_blob_bytes:
                left_out, request_blob = len(request_blob), b""
                first_full, self.full = not self.full, True
            else:
                self._blob_bytes += len(request_blob)
        self._queued.append(
            (
                req.correlation_id,
                req.plan_id,
                args,
                int(redacted),
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

    def calls(self, plan_id: str) -> dict[str, RecordedCall]:
        """The plan's recorded calls, by correlation id."""
        self.flush()
        rows = self._db.execute(
            "SELECT correlation_id, args_json, redacted, request_blob, result_json,"
            " result_blob_sha256, blob_left_out FROM recorded_calls WHERE plan_id = ?",
            (plan_id,),
        )
        return {
            cid: RecordedCall(cid, args, bool(redacted), bytes(blob), result, digest, left_out)
            for cid, args, redacted, blob, result, digest, left_out in rows
        }

    def prune(self, cutoff_ms: int) -> int:
        self._blob_bytes = None
        return self._db.execute(
            "DELETE FROM recorded_calls WHERE unix_ms < ?", (cutoff_ms,)
        ).rowcount
