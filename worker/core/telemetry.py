"""Invocation telemetry: one `v1:worker:invocation` row per call, refusals included.

Rows live in a local SQLite database (WAL) and also ride back to the server inside
each ActionResult. Policy-relevant events (denials, kills, path refusals) add an
audit row linked by correlation id. Rows older than the retention period are pruned.

Each invocation row keeps, locally, the key of the server that sent the call (its
`server` column; not sent: the server knows who it is), and each audit row the
server served when it was written: plan ids are unique per server only, and
`agentworker record PLAN` draws a plan's script from these rows (review12 finding
04), `telemetry`/`audit --server-key` selects by it. Rows of a state.db from before
get the server the ledger still knows for their call when the worker converts it
(`convert`), else UNRECORDED_SERVER.
"""

from __future__ import annotations

import json
import operator
import sqlite3
import uuid
from collections.abc import Callable, Generator
from typing import Any, Final

from worker.clock import now_ms
from worker.core.ledger import UNRECORDED_SERVER
from worker.core.recording import Recordings
from worker.core.redaction import masked_detail
from worker.db import (
    Steps,
    at_once,
    delete_oldest,
    immediate,
    in_steps,
    newest_within,
    transaction,
    write_many,
)
from worker.errors import ErrorCode
from worker.wire.proto import agentworker_pb2 as pb

ROW_KIND: Final = "v1:worker:invocation"
DAY_MS: Final = 86_400_000

# The Invocation message's fields are the row's columns, in order.
COLUMNS: Final = tuple(f.name for f in pb.Invocation.DESCRIPTOR.fields)
# A row's values in COLUMNS' order, read in one C call (a generator of getattr took
# about 3 us of each row's write, a row per call).
_VALUES: Final = operator.attrgetter(*COLUMNS)
_TYPES: Final = {
    f.name: "INTEGER" if f.type in (f.TYPE_INT64, f.TYPE_BOOL) else "TEXT"
    for f in pb.Invocation.DESCRIPTOR.fields
}

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS invocations (
    kind TEXT NOT NULL DEFAULT '{ROW_KIND}',
    {", ".join(f"{name} {_TYPES[name]}" for name in COLUMNS)},
    server TEXT NOT NULL DEFAULT '{UNRECORDED_SERVER}' -- the key of the server that sent it
);
CREATE INDEX IF NOT EXISTS invocations_started ON invocations (started_unix_ms);
CREATE INDEX IF NOT EXISTS invocations_correlation ON invocations (correlation_id);
CREATE TABLE IF NOT EXISTS audit_events (
    event_id TEXT PRIMARY KEY,
    correlation_id TEXT,
    kind TEXT NOT NULL,
    plan_id TEXT,
    agent_id TEXT,
    detail_json TEXT,
    unix_ms INTEGER NOT NULL,
    server TEXT NOT NULL DEFAULT '{UNRECORDED_SERVER}' -- the server served when it happened
);
CREATE INDEX IF NOT EXISTS audit_time ON audit_events (unix_ms);
CREATE INDEX IF NOT EXISTS audit_kind ON audit_events (kind);
"""

# A state.db from before invocation rows and audit events kept their server: the
# column, and the server the ledger still knows for each row's call (its `calls` row,
# kept 24 h after the ack).
_ADD_SERVER: Final = "ALTER TABLE {table} ADD COLUMN server TEXT NOT NULL DEFAULT '{unrecorded}'"
_SORT_OLD_ROWS: Final = {
    "invocations": "UPDATE invocations SET server = c.server FROM calls AS c"
    " WHERE invocations.correlation_id = c.correlation_id AND invocations.plan_id = c.plan_id"
    " AND c.server NOT IN ('', ?)",
    "audit_events": "UPDATE audit_events SET server = c.server FROM calls AS c"
    " WHERE audit_events.correlation_id = c.correlation_id AND c.correlation_id != ''"
    " AND c.server NOT IN ('', ?)",
}


def has_server_column(conn: sqlite3.Connection, table: str = "invocations") -> bool:
    """Whether the table's rows keep their server (no: a state.db from before, not yet
    converted by the worker; its rows are all UNRECORDED_SERVER's)."""
    return any(row[1] == "server" for row in conn.execute(f"PRAGMA table_info({table})"))


# The most invocation rows, and audit events, kept (the oldest go first): about 0.5 GB
# of ordinary rows.
MAX_ROWS: Final = 1_000_000
# And the most bytes each of the two tables keeps, about: rows are as large as the
# server makes them (five 256-character ids, an error message, a preview), and a
# million of its largest took 3.1 GB (review25 G1). A table keeps its newest rows whose
# texts' bytes (UTF-8) fit, counted row by row from the newest (`_cut`), WALK_ROWS at a
# time: sized by its newest thousand rows' average, a flood of large rows under a tail
# of small ones kept 9.2 times the bound (review25 G1b). Rows go DELETE_ROWS at a time,
# the event loop's other work running between (`cap_rows_in_steps`): removed at once,
# 254,000 rows held the loop 2 s (review25 G1c).
MAX_TABLE_BYTES: Final = 256 * 1024 * 1024
WALK_ROWS: Final = 10_000
DELETE_ROWS: Final = 1_000
# What a row takes besides its texts' characters: its numbers, SQLite's own record.
ROW_OVERHEAD_BYTES: Final = 64
# Rows written (of both tables) after which the caps are applied again, besides the
# worker's hourly housekeeping: 800 refused calls a second wrote 9 GB of rows an hour.
CAP_EVERY_ROWS: Final = 50_000
_SIZES: Final = {
    "invocations": " + ".join(
        f"COALESCE(length(CAST({name} AS BLOB)), 0)"
        for name in (*COLUMNS, "server")
        if _TYPES.get(name, "TEXT") == "TEXT"
    ),
    "audit_events": " + ".join(
        f"COALESCE(length(CAST({name} AS BLOB)), 0)"
        for name in (
            "event_id",
            "correlation_id",
            "kind",
            "plan_id",
            "agent_id",
            "detail_json",
            "server",
        )
    ),
}

# Audit events of the person's own acts: `max_rows` never removes them (retention does),
# so no flood of the agent's rows can. A kill the server sent is not the person's.
PERSON_KINDS: Final = ("kill", "lift", "revoke", "approval_granted", "approval_denied")
# What the cap leaves where it removed a kind's rows: the kind, how many, and when the
# first and last of them were (kept like the person's rows: at most one per kind a run).
CAPPED_KIND: Final = "audit_capped"
_KEPT: Final = (
    f"(kind IN ({', '.join(repr(k) for k in PERSON_KINDS)})"
    " AND COALESCE(json_extract(detail_json, '$.by'), '') != 'server')"
    f" OR kind = '{CAPPED_KIND}'"
)


def fair_share(counts: list[int], total: int) -> int:
    """The most rows each kind may keep so that all kinds together keep at most `total`,
    the kinds with fewer keeping all of theirs (at least 2: a kind's first and last)."""
    left = total
    ordered = sorted(counts)
    for i, count in enumerate(ordered):
        share = left // (len(ordered) - i)
        if count > share:
            return max(2, share)
        left -= count
    return max(2, ordered[-1] if ordered else 2)


# Errors worth an audit row: the person will want to know someone tried (ErrorCode.audited).
AUDITED_CODES: Final = frozenset(code for code in ErrorCode if code.audited)


class Telemetry:
    """The invocation and audit tables, kept in the call ledger's database so a call's
    row and its result commit together; whoever opened the connection closes it."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        retention_days: int = 90,
        max_rows: int = MAX_ROWS,
        *,
        convert: bool = False,
    ) -> None:
        """`convert`: the worker, at its start, converts tables from before (see the
        module's docstring and worker.db.connect); only the worker writes rows."""
        conn.executescript(_SCHEMA)
        if convert and not all(has_server_column(conn, t) for t in _SORT_OLD_ROWS):
            with immediate(conn):
                ledger = conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'calls'"
                ).fetchone()
                for table, sort in _SORT_OLD_ROWS.items():
                    if has_server_column(conn, table):  # another process may have done it
                        continue
                    conn.execute(_ADD_SERVER.format(table=table, unrecorded=UNRECORDED_SERVER))
                    if ledger:
                        conn.execute(sort, (UNRECORDED_SERVER,))
        self._db = conn
        self.max_rows = max_rows
        self.max_table_bytes = MAX_TABLE_BYTES
        self.written_since_cap = 0  # rows of both tables (see CAP_EVERY_ROWS)
        # Plans recorded for replay keep their calls' args and results beside the rows.
        self.recordings = Recordings(conn, convert=convert)
        self.retention_days = retention_days
        # The key of the server whose calls this process serves (the Dispatcher points
        # it at its ledger's, which the connection names): stamped on each row.
        self.server: Callable[[], str] = lambda: ""
        self._queued: list[tuple[str, pb.Invocation]] = []  # see record_later
        self._insert = (
            f"INSERT INTO invocations ({', '.join(COLUMNS)}, server)"
            f" VALUES ({', '.join('?' for _ in COLUMNS)}, ?)"
        )

    def record(self, row: pb.Invocation, server: str | None = None) -> None:
        self.record_many([row], server)

    def record_many(self, rows: list[pb.Invocation], server: str | None = None) -> None:
        """One invocation row each, all in one commit, each of `server` (default: the
        one this process serves)."""
        who = self.server() if server is None else server
        self._write([(who, row) for row in rows])

    def _write(self, rows: list[tuple[str, pb.Invocation]]) -> None:
        self.written_since_cap += len(rows)
        write_many(
            self._db,
            self._insert,
            [(*_VALUES(row), who) for who, row in rows],
        )

    def record_later(self, rows: list[pb.Invocation]) -> None:
        """Keep rows for the next `flush` (the pipeline writes a call's row just after
        its result: see Dispatcher.flush_results), each of the server served now."""
        who = self.server()
        self._queued.extend((who, row) for row in rows)

    def flush(self) -> None:
        """Write the rows kept by `record_later` (and recorded plans' calls), in one
        commit; should that fail, they stay queued for the next try."""
        if self.recordings.pending():
            with transaction(self._db):
                self._write(self._queued)
                self.recordings.write_pending()
            self.recordings.written()
        elif self._queued:
            self._write(self._queued)
        self._queued = []

    def has(self, correlation_id: str) -> bool:
        """Whether a call's invocation row is written."""
        cur = self._db.execute(
            "SELECT 1 FROM invocations WHERE correlation_id = ? LIMIT 1", (correlation_id,)
        )
        return cur.fetchone() is not None

    def audit(
        self,
        kind: str,
        *,
        correlation_id: str = "",
        plan_id: str = "",
        agent_id: str = "",
        detail: dict[str, Any] | None = None,
    ) -> pb.AuditEvent:
        event = pb.AuditEvent(
            event_id=uuid.uuid4().hex,
            correlation_id=correlation_id,
            kind=kind,
            plan_id=plan_id,
            agent_id=agent_id,
            # Its messages quote the call (a refused URL, an argv): masked as previews are,
            # since audit rows are kept 90 days and the hub logs them (review10 01).
            detail_json=json.dumps(masked_detail(detail or {}), sort_keys=True),
            unix_ms=now_ms(),
        )
        self.written_since_cap += 1
        self._db.execute(
            "INSERT INTO audit_events (event_id, correlation_id, kind, plan_id, agent_id,"
            " detail_json, unix_ms, server) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                event.event_id,
                event.correlation_id,
                event.kind,
                event.plan_id,
                event.agent_id,
                event.detail_json,
                event.unix_ms,
                self.server(),
            ),
        )
        return event

    def prune(self, now: int | None = None) -> int:
        """Forget what is past retention; the number of invocation rows removed."""
        return self.prune_all(now)[0]

    def cap_rows(self) -> int:
        """Forget the oldest invocation rows past `max_rows` or `max_table_bytes`, and
        audit events past them by kind (`_cap_audit`);
        how many went. Retention bounds telemetry by age, this by size: a server that
        sends a million calls a day (or a million refused ones, each an audit event)
        cannot fill the person's disk within the 90 days. All at once (a tool, a test):
        the worker uses `cap_rows_in_steps`."""
        return at_once(self._capping())

    async def cap_rows_in_steps(self) -> int:
        """`cap_rows`, a turn of the event loop for other work after each step (a
        walk of WALK_ROWS rows, a delete of DELETE_ROWS)."""
        return await in_steps(self._capping())

    def _capping(self) -> Steps:
        self.flush()
        self.written_since_cap = 0
        _kept, cut = yield from self._newest_within("invocations")
        gone = yield from delete_oldest(  # rowid 0 (every row fits): none
            self._db, "invocations", "rowid <= ?", (cut,), batch=DELETE_ROWS
        )
        most, _cut_at = yield from self._newest_within("audit_events")
        gone += yield from self._cap_audit(most)
        return gone

    def _newest_within(self, table: str) -> Generator[None, None, tuple[int, int]]:
        """How many of `table`'s newest rows fit `max_rows` and `max_table_bytes`, and
        the rowid of the newest that does not (0: every row fits)."""
        return newest_within(
            self._db,
            table,
            f"{_SIZES[table]} + {ROW_OVERHEAD_BYTES}",
            most_bytes=self.max_table_bytes,
            most_rows=self.max_rows,
            walk_rows=WALK_ROWS,
        )

    def _cap_audit(self, most: int) -> Generator[None, None, int]:
        """Audit events past `most`, removed so a flood erases only its own kind:
        the person's own acts (PERSON_KINDS) are never removed; every other kind keeps
        a fair share of `most` (a kind with fewer keeps all), and a kind over its
        share keeps its first event and its newest, the ones between replaced by one
        CAPPED_KIND event saying how many went and when they were (written before
        they go, so no removal is ever silent)."""
        counts = dict(
            self._db.execute(
                f"SELECT kind, COUNT(*) FROM audit_events WHERE NOT ({_KEPT}) GROUP BY kind"
            ).fetchall()
        )
        if sum(counts.values()) <= most:
            return 0
        share = fair_share(list(counts.values()), most)
        gone = 0
        for kind, count in sorted(counts.items()):
            if count <= share:
                continue
            of_kind = f"FROM audit_events WHERE kind = ? AND NOT ({_KEPT})"
            (first,) = self._db.execute(f"SELECT MIN(rowid) {of_kind}", (kind,)).fetchone()
            (cut,) = self._db.execute(
                f"SELECT rowid {of_kind} ORDER BY rowid DESC LIMIT 1 OFFSET ?", (kind, share - 2)
            ).fetchone()
            between = f"{of_kind} AND rowid > ? AND rowid < ?"
            n, earliest, latest = self._db.execute(
                f"SELECT COUNT(*), MIN(unix_ms), MAX(unix_ms) {between}", (kind, first, cut)
            ).fetchone()
            if not n:
                continue
            self.audit(
                CAPPED_KIND,
                detail={
                    "kind": kind,
                    "removed": n,
                    "first_removed_unix_ms": earliest,
                    "last_removed_unix_ms": latest,
                    "max_rows": most,
                },
            )
            gone += yield from delete_oldest(
                self._db,
                "audit_events",
                f"kind = ? AND NOT ({_KEPT}) AND rowid > ? AND rowid < ?",
                (kind, first, cut),
                batch=DELETE_ROWS,
            )
        return gone

    def prune_all(self, now: int | None = None) -> tuple[int, int, int]:
        """Forget invocation rows, audit events and recorded calls past retention;
        how many of each went."""
        self.flush()
        cutoff = (now if now is not None else now_ms()) - self.retention_days * DAY_MS
        removed = self._db.execute(
            "DELETE FROM invocations WHERE started_unix_ms < ?", (cutoff,)
        ).rowcount
        audit = self._db.execute("DELETE FROM audit_events WHERE unix_ms < ?", (cutoff,)).rowcount
        return removed, audit, self.recordings.prune(cutoff)

    def rows(self, correlation_id: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        self.flush()
        query = f"SELECT {', '.join(COLUMNS)} FROM invocations"
        params: tuple[Any, ...] = ()
        if correlation_id is not None:
            query += " WHERE correlation_id = ?"
            params = (correlation_id,)
        query += " ORDER BY started_unix_ms DESC LIMIT ?"
        cur = self._db.execute(query, (*params, limit))
        return [dict(zip(COLUMNS, row, strict=True)) for row in cur]

    def audit_rows(self, correlation_id: str) -> list[dict[str, Any]]:
        cur = self._db.execute(
            "SELECT kind, plan_id, agent_id, detail_json FROM audit_events"
            " WHERE correlation_id = ? ORDER BY unix_ms",
            (correlation_id,),
        )
        return [
            {"kind": k, "plan_id": p, "agent_id": a, "detail": json.loads(d)} for k, p, a, d in cur
        ]
