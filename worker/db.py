"""SQLite opened the same way everywhere: WAL, a busy timeout, one schema script.

`synchronous=NORMAL` in WAL mode keeps every committed row across a process crash
(the case the at-most-once rules are about); only a power cut can lose the last
few commits. That keeps a call's bookkeeping to microseconds instead of an fsync.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


DB_SUFFIXES = ("", "-wal", "-shm", "-journal")  # SQLite's files for one database (as config's)


def connect(path: Path, schema: str) -> sqlite3.Connection:
    private_folder(path.parent)
    _private_files(path)
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


def private_folder(folder: Path) -> None:
    """Make `folder` (0700) or tighten it to 0700; refuse one owned by someone else.

    The databases hold telemetry, call results and the hub's requests: nobody but
    this user may read them, nor swap files in their folder.
    """
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = folder.stat()
    if st.st_uid != os.getuid():
        raise PermissionError(
            f"the data folder {folder} belongs to another user (uid {st.st_uid}); "
            "use a folder of your own (AGENTWORKER_HOME)"
        )
    if stat.S_IMODE(st.st_mode) & 0o077:
        log.warning(
            "the data folder %s was open to others (mode %o); tightened to 0700",
            folder,
            stat.S_IMODE(st.st_mode),
        )
        folder.chmod(0o700)


def _private_files(path: Path) -> None:
    """The database and its -wal/-shm/-journal files: 0600, created so (SQLite gives
    the files it creates beside a database the database's own mode)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.close(fd)
    for suffix in DB_SUFFIXES:
        name = Path(f"{path}{suffix}")
        try:
            st = name.lstat()
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) & 0o077:
            name.chmod(0o600)


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
