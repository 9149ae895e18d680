"""SQLite opened the same way everywhere: WAL, a busy timeout, one schema script.

`synchronous=NORMAL` in WAL mode keeps every committed row across a process crash
(the case the at-most-once rules are about); only a power cut can lose the last
few commits. That keeps a call's bookkeeping to microseconds instead of an fsync.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def connect(path: Path, schema: str) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    conn = sqlite3.connect(path, isolation_level=None, timeout=10.0, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.executescript(schema)
    return conn


def write_many(conn: sqlite3.Connection, sql: str, rows: Sequence[Sequence[Any]]) -> None:
    """Run `sql` for each row in one commit: one statement needs no explicit
    transaction (it commits by itself), and inside an open one the caller commits."""
    if len(rows) == 1:
        conn.execute(sql, rows[0])
    elif conn.in_transaction:
        conn.executemany(sql, rows)
    elif rows:
        conn.execute("BEGIN")
        try:
            conn.executemany(sql, rows)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
