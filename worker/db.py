"""SQLite opened the same way everywhere: WAL, a busy timeout, one schema script.

`synchronous=NORMAL` in WAL mode keeps every committed row across a process crash
(the case the at-most-once rules are about); only a power cut can lose the last
few commits. That keeps a call's bookkeeping to microseconds instead of an fsync.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def connect(path: Path, schema: str) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    conn = sqlite3.connect(path, isolation_level=None, timeout=10.0, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.executescript(schema)
    # A checkpoint copies the log into the database and fsyncs. SQLite runs it inside
    # whichever commit crosses its threshold, stalling that call for milliseconds; a
    # background thread checkpoints often (sqlite3 releases the GIL meanwhile), so the
    # in-commit one finds little left to do. It stays: only a writer can restart the log.
    _checkpointer.watch(conn, path)
    return conn


def close(conn: sqlite3.Connection) -> None:
    _checkpointer.forget(conn)
    conn.close()


class _Checkpointer:
    """One daemon thread per process that checkpoints each open database's log."""

    def __init__(self, every_s: float = 0.1) -> None:
        self._every_s = every_s
        self._users: dict[sqlite3.Connection, Path] = {}  # open connections -> their file
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def watch(self, conn: sqlite3.Connection, path: Path) -> None:
        with self._lock:
            self._users[conn] = path.resolve()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="sqlite-checkpoint", daemon=True
                )
                self._thread.start()

    def forget(self, conn: sqlite3.Connection) -> None:
        with self._lock:
            self._users.pop(conn, None)

    def _run(self) -> None:
        own: dict[Path, sqlite3.Connection] = {}
        while True:
            time.sleep(self._every_s)
            with self._lock:
                paths = set(self._users.values())
            for path in set(own) - paths:  # nobody has it open any more
                own.pop(path).close()
            for path in paths:
                try:
                    if path not in own:
                        # mode=rw: never create a file that was removed meanwhile.
                        own[path] = sqlite3.connect(f"{path.as_uri()}?mode=rw", uri=True)
                    own[path].execute("PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error as exc:  # busy or gone: next round
                    log.debug("checkpoint of %s skipped: %s", path, exc)
                    if path in own:
                        own.pop(path).close()


_checkpointer = _Checkpointer()


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """Statements inside commit together, or not at all; inside an already open
    transaction, that one's commit covers them."""
    if conn.in_transaction:
        yield
        return
    conn.execute("BEGIN")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def write_many(conn: sqlite3.Connection, sql: str, rows: Sequence[Sequence[Any]]) -> None:
    """Run `sql` for each row in one commit (one statement commits by itself)."""
    if len(rows) == 1:
        conn.execute(sql, rows[0])
    elif rows:
        with transaction(conn):
            conn.executemany(sql, rows)
