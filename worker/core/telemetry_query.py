"""Reading the telemetry a person asks for: invocation rows and audit events by
plan, agent, action, status, error code and time, and new ones as they come.

`agentworker telemetry` and `agentworker audit` print what this selects. Following
(`tail -f`) waits on the database's folder with inotify on Linux — the process
sleeps until SQLite writes — and re-reads only rows past the last one seen.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import re
import select
import sqlite3
import struct
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from worker.core.ledger import UNRECORDED_SERVER
from worker.core.telemetry import COLUMNS, has_server_column
from worker.errors import WorkerError

AUDIT_COLUMNS: Final = (
    "event_id",
    "correlation_id",
    "kind",
    "plan_id",
    "agent_id",
    "detail_json",
    "unix_ms",
    "server",
)


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[str, ...]
    time_column: str


# The server's key is the worker's own column (worker.core.telemetry), not the row's.
INVOCATIONS: Final = Table("invocations", (*COLUMNS, "server"), "started_unix_ms")
AUDIT: Final = Table("audit_events", AUDIT_COLUMNS, "unix_ms")


@dataclass(frozen=True)
class Filters:
    """Each filter given narrows the rows; none given selects them all."""

    plan: str | None = None
    agent: str | None = None
    action: str | None = None  # "fs_stat" (any surface) or "surface.action"
    status: str | None = None  # ok / error (invocations)
    error_code: str | None = None  # (invocations)
    kind: str | None = None  # (audit events)
    correlation_id: str | None = None
    since_ms: int | None = None  # inclusive
    until_ms: int | None = None  # exclusive
    server: str | None = None  # its key: the server that sent the call (served, for audit)

    def where(self, table: Table, server: str = "server") -> tuple[str, list[Any]]:
        """The WHERE clause and its parameters; `server`: the column's expression (a
        constant for a state.db from before the column, see `_server_of`)."""
        clauses: list[str] = []
        params: list[Any] = []

        def add(clause: str, value: Any) -> None:
            clauses.append(clause)
            params.append(value)

        if self.server is not None:
            add(f"{server} = ?", self.server)
        if self.plan is not None:
            add("plan_id = ?", self.plan)
        if self.agent is not None:
            add("agent_id = ?", self.agent)
        if self.correlation_id is not None:
            add("correlation_id = ?", self.correlation_id)
        if self.since_ms is not None:
            add(f"{table.time_column} >= ?", self.since_ms)
        if self.until_ms is not None:
            add(f"{table.time_column} < ?", self.until_ms)
        if table is INVOCATIONS:
            if self.action is not None:
                surface, _, name = self.action.rpartition(".")
                add("action = ?", name)
                if surface:
                    add("surface = ?", surface)
            if self.status is not None:
                add("status = ?", self.status)
            if self.error_code is not None:
                add("error_code = ?", self.error_code)
        else:
            if self.kind is not None:
                add("kind = ?", self.kind)
            if self.action is not None:  # audit details name the action as surface.action
                add("json_extract(detail_json, '$.action') LIKE ?", f"%{self.action}")
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), params


def select_rows(
    conn: sqlite3.Connection,
    table: Table,
    filters: Filters,
    *,
    after_rowid: int = 0,
    last: int | None = None,
) -> list[tuple[int, dict[str, Any]]]:
    """(rowid, row) of the matching rows past `after_rowid`, oldest first; with
    `last`, only the newest `last` of them."""
    server = _server_of(conn, table)
    where, params = filters.where(table, server)
    where += (" AND " if where else " WHERE ") + "rowid > ?"
    params.append(after_rowid)
    columns = ", ".join(c if c != "server" else f"{server} AS server" for c in table.columns)
    if last is None:
        sql = f"SELECT rowid, {columns} FROM {table.name}{where} ORDER BY rowid"
    else:
        sql = (
            f"SELECT * FROM (SELECT rowid, {columns} FROM {table.name}{where}"
            f" ORDER BY rowid DESC LIMIT ?) ORDER BY rowid"
        )
        params.append(last)
    return [(row[0], _shaped(table, row[1:])) for row in conn.execute(sql, params)]


def _server_of(conn: sqlite3.Connection, table: Table) -> str:
    """The expression of a row's server: its column, or, in a state.db from before the
    column that no worker has converted yet (this reader converts nothing), the mark
    of rows whose server is not known."""
    return "server" if has_server_column(conn, table.name) else f"'{UNRECORDED_SERVER}'"


def _shaped(table: Table, values: tuple[Any, ...]) -> dict[str, Any]:
    row = dict(zip(table.columns, values, strict=True))
    if table is INVOCATIONS:
        for name in ("truncated", "sandboxed"):
            row[name] = bool(row[name])
    else:
        row["detail"] = json.loads(row.pop("detail_json") or "{}")
    return row


def newest_rowid(conn: sqlite3.Connection, table: Table) -> int:
    return int(conn.execute(f"SELECT coalesce(max(rowid), 0) FROM {table.name}").fetchone()[0])


def follow(
    conn: sqlite3.Connection,
    table: Table,
    filters: Filters,
    db_path: Path,
    after_rowid: int,
    *,
    idle_check_s: float = 30.0,
) -> Iterator[dict[str, Any]]:
    """The matching rows written after `after_rowid`, as they come, forever."""
    with ChangeWaiter(db_path) as changes:
        version = -1
        while True:
            now_version = conn.execute("PRAGMA data_version").fetchone()[0]
            if now_version != version:
                version = now_version
                if newest_rowid(conn, table) < after_rowid:
                    after_rowid = 0  # pruned empty meanwhile: rowids start again
                for rowid, row in select_rows(conn, table, filters, after_rowid=after_rowid):
                    after_rowid = rowid
                    yield row
            changes.wait(idle_check_s)


# ----------------------------------------------------------------- waiting for writes

_IN_MODIFY, _IN_CREATE, _IN_MOVED_TO = 0x2, 0x100, 0x80
_EVENT = struct.Struct("iIII")


class ChangeWaiter:
    """Sleeps until a file of the database (`state.db`, its -wal) changes. inotify on
    Linux, where a write wakes it at once; elsewhere it checks twice a second."""

    def __init__(self, db_path: Path) -> None:
        self._folder = db_path.parent
        self._prefix = db_path.name.encode()
        self._fd = -1

    def __enter__(self) -> ChangeWaiter:
        if sys.platform.startswith("linux"):
            libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd >= 0:
                mask = _IN_MODIFY | _IN_CREATE | _IN_MOVED_TO
                if libc.inotify_add_watch(fd, os.fsencode(self._folder), mask) >= 0:
                    self._fd = fd
                else:
                    os.close(fd)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def wait(self, timeout_s: float) -> None:
        """Return once a database file changed, or after `timeout_s` at most."""
        if self._fd < 0:
            time.sleep(min(timeout_s, 0.5))
            return
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self._fd], [], [], left)
            if ready and self._ours(os.read(self._fd, 64 * 1024)):
                return

    def _ours(self, events: bytes) -> bool:
        offset = 0
        while offset + _EVENT.size <= len(events):
            _wd, _mask, _cookie, length = _EVENT.unpack_from(events, offset)
            name = events[offset + _EVENT.size : offset + _EVENT.size + length].rstrip(b"\0")
            offset += _EVENT.size + length
            if name.startswith(self._prefix):
                return True
        return False


# ----------------------------------------------------------------- moments


_AGO: Final = re.compile(r"^(\d+)([smhd])$")


def moment_ms(text: str, now: datetime | None = None) -> int:
    """A time a person writes: `15m`, `2h`, `7d` (that long ago), or ISO 8601
    (`2026-11-23`, `2026-11-23T10:00`, with an offset or in local time)."""
    now = now or datetime.now(UTC)
    match = _AGO.match(text.strip())
    if match:
        amount, unit = int(match.group(1)), match.group(2)
        span = timedelta(
            **{{"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[unit]: amount}
        )
        return int((now - span).timestamp() * 1000)
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise WorkerError(
            "validation_error",
            f"{text!r} is not a time: write e.g. 15m, 2h, 7d (ago) or 2026-11-23T10:00",
        ) from None
    if moment.tzinfo is None:
        moment = moment.astimezone()  # local time, as a person means it
    return int(moment.timestamp() * 1000)


@contextlib.contextmanager
def reading(db_path: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection to a state database (never creates one)."""
    if not db_path.exists():
        raise WorkerError(
            "not_found",
            f"no telemetry yet: {db_path} does not exist (a worker writes it on its first call)",
        )
    conn = sqlite3.connect(f"{db_path.as_uri()}?mode=ro", uri=True, timeout=10.0)
    try:
        yield conn
    finally:
        conn.close()
