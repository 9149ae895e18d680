"""Each database's own checkpointer keeps its log copied in after writes, does no work while
nothing is written, and lets go of the database when it is closed."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from pathlib import Path

import pytest

from worker import db
from worker.core.ledger import State
from worker.hub.store import HubStore

SCHEMA = "CREATE TABLE IF NOT EXISTS t (v BLOB);"


def _database_pages(path: Path) -> int:
    """Pages in the main database file itself (the log not counted)."""
    return path.stat().st_size // db.PAGE_BYTES


def _layout(conn: sqlite3.Connection) -> tuple[int, int, str]:
    return (
        conn.execute("PRAGMA page_size").fetchone()[0],
        conn.execute("PRAGMA auto_vacuum").fetchone()[0],
        conn.execute("PRAGMA journal_mode").fetchone()[0],
    )


def _open_handles(path: Path) -> list[str]:
    """This process's file descriptors on `path` or its log."""
    fds = Path("/proc/self/fd")
    targets = []
    for fd in fds.iterdir():
        try:
            targets.append(os.readlink(fd))
        except FileNotFoundError:  # the listing's own descriptor, gone by now
            continue
    return [t for t in targets if t.startswith(str(path))]


def test_the_log_is_copied_in_without_a_commit_paying_for_it(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    conn = db.connect(path, SCHEMA)
    try:
        for _ in range(300):  # below SQLite's own 1000-page threshold: it would not run
            conn.execute("INSERT INTO t VALUES (?)", (os.urandom(4096),))
        assert path.with_name("x.db-wal").stat().st_size > 1_000_000
        assert conn.checkpointer is not None
        copied = conn.checkpointer.wait_for(lambda: _database_pages(path) >= 20, 30)
        assert copied, "the rows never reached the database file"
    finally:
        db.close(conn)


def test_commits_wake_the_checkpointer_and_reads_do_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No timer: the thread sleeps until a commit reaches the log."""
    conn = db.connect(tmp_path / "w.db", SCHEMA)
    try:
        assert conn.checkpointer is not None
        wakes: list[str] = []
        monkeypatch.setattr(conn.checkpointer, "wake", lambda _bytes: wakes.append("woken"))
        conn.execute("SELECT count(*) FROM t").fetchone()
        assert wakes == [], "a read wrote nothing"
        conn.execute("INSERT INTO t VALUES (x'01')")
        assert len(wakes) == 1, "a statement that commits by itself"
        with db.transaction(conn):
            conn.execute("INSERT INTO t VALUES (x'02')")
            conn.executemany("INSERT INTO t VALUES (?)", [(b"3",), (b"4",)])
            assert len(wakes) == 1, "nothing reaches the log before the commit"
        assert len(wakes) == 2, "one wake for the whole transaction"
        db.write_many(conn, "INSERT INTO t VALUES (?)", [(b"5",), (b"6",)])
        assert len(wakes) == 3
    finally:
        db.close(conn)


def test_the_checkpointer_is_woken_for_a_first_commit_and_a_full_batch_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each checkpoint ends in fsyncs that stall the writers' commits: it runs after
    `every` commits (or once they stop), never after each one."""
    checkpointer = db.Checkpointer(tmp_path / "c.db", every=4, quiet_s=3600)
    try:
        sets: list[int] = []
        monkeypatch.setattr(
            checkpointer._written, "set", lambda: sets.append(checkpointer._commits)
        )
        for _ in range(9):
            checkpointer.wake()
        assert sets[:2] == [1, 4], "the first commit, then the fourth"
        assert all(count >= 4 for count in sets[1:]), "no wake-up for a commit in between"
    finally:
        monkeypatch.undo()
        checkpointer.stop()


def test_the_checkpointer_is_woken_once_commits_have_written_enough(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large rows fill the log in few commits (a 10,000-entry listing's answer is 1.5 MB):
    what the commits wrote counts too, so that SQLite's own threshold, which copies
    the log in inside a commit on the event loop, is not reached first."""
    checkpointer = db.Checkpointer(tmp_path / "c.db", every=100, quiet_s=3600, every_bytes=1000)
    try:
        sets: list[int] = []
        monkeypatch.setattr(checkpointer._written, "set", lambda: sets.append(checkpointer._bytes))
        checkpointer.wake(10)
        checkpointer.wake(500)
        checkpointer.wake(600)
        assert sets == [10, 1110], "the first commit, then the one past 1,000 bytes"
    finally:
        monkeypatch.undo()
        checkpointer.stop()


def test_the_bytes_a_commit_writes_are_counted_for_the_checkpointer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = db.connect(tmp_path / "w.db", SCHEMA)
    try:
        assert conn.checkpointer is not None
        woken: list[int] = []
        monkeypatch.setattr(conn.checkpointer, "wake", woken.append)
        conn.execute("INSERT INTO t VALUES (?)", (b"x" * 5000,))
        with db.transaction(conn):
            conn.execute("INSERT INTO t VALUES (?)", ("y" * 300,))
            conn.executemany("INSERT INTO t VALUES (?)", [(b"z" * 100,), (b"z" * 200,)])
        conn.execute("SELECT count(*) FROM t WHERE v != ?", (b"w" * 7000,)).fetchone()
        conn.execute("INSERT INTO t VALUES (x'01')")
        conn.execute("INSERT INTO t VALUES (:v)", {"v": memoryview(b"m" * 50)})
        conn.executemany("INSERT INTO t VALUES (?)", [[7], ["n" * 40]])  # rows as lists
        conn.executemany("INSERT INTO t VALUES (:v)", [{"v": "k" * 30}, {"v": b"q" * 20}])
        assert woken == [5000, 600, 0, 50, 40, 50], (
            "each commit's texts and blobs; a read's count nothing"
        )
    finally:
        db.close(conn)


def test_a_large_commit_is_copied_in_without_waiting_for_more(tmp_path: Path) -> None:
    path = tmp_path / "large.db"
    conn = db.connect(path, SCHEMA)
    db.close(conn)  # the schema written; now a connection whose checkpointer never idles out
    conn = sqlite3.connect(path, isolation_level=None, factory=db.Database)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.checkpointer = db.Checkpointer(path, every=64, quiet_s=3600, every_bytes=1024 * 1024)
    try:
        conn.execute("INSERT INTO t VALUES (x'01')")  # the thread wakes, and waits for more
        conn.execute("INSERT INTO t VALUES (?)", (os.urandom(2 * 1024 * 1024),))
        pages = 2 * 1024 * 1024 // db.PAGE_BYTES
        assert conn.checkpointer.wait_for(lambda: _database_pages(path) >= pages, 30)
    finally:
        conn.close()


def test_a_batch_of_commits_is_copied_in_without_waiting_for_quiet(tmp_path: Path) -> None:
    path = tmp_path / "batch.db"
    conn = db.connect(path, SCHEMA)
    db.close(conn)  # the schema written; now a connection whose checkpointer never idles out
    conn = sqlite3.connect(path, isolation_level=None, factory=db.Database)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.checkpointer = db.Checkpointer(path, every=8, quiet_s=3600)
    try:
        for _ in range(8):
            conn.execute("INSERT INTO t VALUES (?)", (os.urandom(db.PAGE_BYTES),))
        assert conn.checkpointer.wait_for(lambda: _database_pages(path) >= 8, 30)
    finally:
        conn.close()


def test_small_commits_leave_the_checkpoint_to_the_checkpointer(tmp_path: Path) -> None:
    """SQLite's in-commit checkpoint came at 1,000 log pages, 4 MiB with 4 KiB pages:
    small commits (10-30 pages each) reached it before the checkpointer's 64 commits,
    and the event loop fsynced inside them. It comes now only past twice the
    checkpointer's byte threshold."""
    path = tmp_path / "small.db"
    conn = db.connect(path, SCHEMA)
    assert conn.checkpointer is not None
    conn.checkpointer.stop()  # only SQLite's own checkpoint from here on
    conn.checkpointer = None
    try:
        for _ in range(800):
            conn.execute("INSERT INTO t VALUES (?)", (os.urandom(db.PAGE_BYTES // 2),))
        other = sqlite3.connect(path)
        try:
            _busy, frames, _copied = other.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        finally:
            other.close()
        assert frames >= 1600, f"the log was restarted within the commits: {frames} frames"
        assert frames * db.PAGE_BYTES < db.IN_COMMIT_CHECKPOINT_BYTES
    finally:
        db.close(conn)


def test_each_database_has_its_own_checkpointer_thread(tmp_path: Path) -> None:
    first, second = db.connect(tmp_path / "a.db", SCHEMA), db.connect(tmp_path / "b.db", SCHEMA)
    try:
        names = {t.name for t in threading.enumerate()}
        assert {"checkpoint a.db", "checkpoint b.db"} <= names
    finally:
        db.close(first)
        db.close(second)
    names = {t.name for t in threading.enumerate()}
    assert not names & {"checkpoint a.db", "checkpoint b.db"}, "close() stops its thread"


def test_a_closed_database_is_let_go(tmp_path: Path) -> None:
    path = tmp_path / "gone.db"
    conn = db.connect(path, SCHEMA)
    for _ in range(db.CHECKPOINT_COMMITS):  # a round at once, not once they stop
        conn.execute("INSERT INTO t VALUES (x'00')")
    assert conn.checkpointer is not None
    checkpointer = conn.checkpointer
    assert checkpointer.wait_for(lambda: checkpointer.rounds >= 1, 30)
    db.close(conn)  # returns once the checkpointer's thread has closed its connection
    assert _open_handles(path) == [], "the checkpointer still holds the closed database"


def test_databases_and_their_logs_are_private_and_a_loose_folder_is_tightened(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "data"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    old = os.umask(0o022)
    try:
        conn = db.connect(folder / "x.db", SCHEMA)
        conn.execute("INSERT INTO t VALUES (x'00')")
        modes = {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()}
        db.close(conn)
    finally:
        os.umask(old)
    assert {"x.db", "x.db-wal", "x.db-shm"} <= set(modes), modes
    assert set(modes.values()) == {0o600}, modes
    assert folder.stat().st_mode & 0o777 == 0o700


def test_an_existing_database_open_to_others_is_made_private(tmp_path: Path) -> None:
    path = tmp_path / "y.db"
    db.close(db.connect(path, SCHEMA))
    for name in (path, Path(f"{path}-wal")):
        name.touch()
        name.chmod(0o644)
    db.close(db.connect(path, SCHEMA))
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_new_database_has_large_pages_whose_free_ones_can_be_given_back(
    tmp_path: Path,
) -> None:
    conn = db.connect(tmp_path / "new.db", SCHEMA)
    try:
        assert _layout(conn) == (db.PAGE_BYTES, 2, "wal")  # 2: INCREMENTAL
    finally:
        db.close(conn)


def test_a_database_from_before_is_converted_once_with_its_rows(tmp_path: Path) -> None:
    """4 KiB pages in WAL mode without auto_vacuum, as earlier versions made them."""
    path = tmp_path / "old.db"
    old = sqlite3.connect(path, isolation_level=None)
    old.execute("PRAGMA journal_mode=WAL")
    old.execute("CREATE TABLE t (v BLOB)")
    rows = [(os.urandom(3000),) for _ in range(50)]
    old.executemany("INSERT INTO t VALUES (?)", rows)
    assert _layout(old) == (4096, 0, "wal")
    old.close()
    conn = db.connect(path, SCHEMA, convert=True)
    try:
        assert _layout(conn) == (db.PAGE_BYTES, 2, "wal")
        assert conn.execute("SELECT v FROM t ORDER BY rowid").fetchall() == rows
    finally:
        db.close(conn)


def _file_page_size(path: Path) -> int:
    """The page size a database file was written with, read from the file itself."""
    with sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True) as reader:
        size: int = reader.execute("PRAGMA page_size").fetchone()[0]
    reader.close()
    return size


def test_a_new_hub_and_worker_database_have_4_kib_pages(tmp_path: Path) -> None:
    """Small rows on random keys dirty one index leaf each: 4 KiB pages write an eighth
    of what 32 KiB ones did (see worker.db)."""
    assert db.PAGE_BYTES == 4096
    ledger = State(tmp_path / "state.db", convert=True)
    store = HubStore(tmp_path / "hub.db")
    ledger.close()
    store.close()
    assert _file_page_size(tmp_path / "state.db") == 4096
    assert _file_page_size(tmp_path / "hub.db") == 4096


def _old_32_kib_database(path: Path, rows: int, row_bytes: int) -> None:
    """A database as the versions with 32 KiB pages made it (WAL, INCREMENTAL)."""
    old = sqlite3.connect(path, isolation_level=None)
    old.execute("PRAGMA page_size=32768")
    old.execute("PRAGMA auto_vacuum=INCREMENTAL")
    old.execute("PRAGMA journal_mode=WAL")
    old.execute("CREATE TABLE t (v BLOB)")
    old.execute("BEGIN")
    old.executemany(
        "INSERT INTO t VALUES (?)", [(bytes([i % 256]) * row_bytes,) for i in range(rows)]
    )
    old.execute("COMMIT")
    old.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert _layout(old) == (32768, 2, "wal")
    old.close()


def test_a_small_database_with_32_kib_pages_is_given_4_kib_ones(tmp_path: Path) -> None:
    path = tmp_path / "small.db"
    _old_32_kib_database(path, rows=20, row_bytes=1000)
    conn = db.connect(path, SCHEMA, convert=True)
    try:
        assert _layout(conn) == (db.PAGE_BYTES, 2, "wal")
        assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 20
    finally:
        db.close(conn)
    assert _file_page_size(path) == db.PAGE_BYTES


def test_a_large_database_with_32_kib_pages_keeps_them(tmp_path: Path) -> None:
    """Its VACUUM would hold every other process out: it works as it is."""
    path = tmp_path / "large.db"
    _old_32_kib_database(path, rows=db.CONVERT_UP_TO_BYTES // 8192 + 64, row_bytes=8192)
    assert path.stat().st_size > db.CONVERT_UP_TO_BYTES
    conn = db.connect(path, SCHEMA, convert=True)
    try:
        assert _layout(conn) == (32768, 2, "wal")
        conn.execute("INSERT INTO t VALUES (x'02')")  # and it works as it is
    finally:
        db.close(conn)


def test_a_database_another_connection_is_reading_is_left_for_a_later_start(
    tmp_path: Path,
) -> None:
    path = tmp_path / "busy.db"
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("PRAGMA journal_mode=WAL")
    other.execute("CREATE TABLE t (v BLOB)")
    other.execute("INSERT INTO t VALUES (x'01')")
    other.execute("BEGIN")
    other.execute("SELECT v FROM t").fetchall()  # holds a read: no conversion now
    conn = db.connect(path, SCHEMA, convert=True)
    try:
        assert _layout(conn)[0] == 4096
        conn.execute("INSERT INTO t VALUES (x'02')")  # and it works as it is
    finally:
        db.close(conn)
        other.close()
    conn = db.connect(path, SCHEMA, convert=True)
    try:
        assert _layout(conn) == (db.PAGE_BYTES, 2, "wal"), "converted at the next start"
        assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 2
    finally:
        db.close(conn)


def test_a_command_line_tool_leaves_the_conversion_to_the_worker(tmp_path: Path) -> None:
    """A tool (`agentworker kill`, `record`) converting would hold the worker out
    meanwhile: only its owner converts (convert=True at the worker's and hub's start)."""
    path = tmp_path / "old.db"
    old = sqlite3.connect(path, isolation_level=None)
    old.execute("CREATE TABLE t (v BLOB)")
    old.execute("INSERT INTO t VALUES (x'01')")
    old.close()
    conn = db.connect(path, SCHEMA)
    try:
        assert _layout(conn) == (4096, 0, "wal")
        conn.execute("INSERT INTO t VALUES (x'02')")  # and it works as it is
    finally:
        db.close(conn)
    conn = db.connect(path, SCHEMA, convert=True)
    try:
        assert _layout(conn) == (db.PAGE_BYTES, 2, "wal")
        assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 2
    finally:
        db.close(conn)


def test_a_job_off_the_loop_is_waited_for_by_any_other_use_of_its_connection(
    tmp_path: Path,
) -> None:
    conn = db.connect(tmp_path / "x.db", "CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, v);")
    go = threading.Event()

    def job() -> int:
        with db.transaction(conn):  # in the writer thread: no waiting for itself
            conn.execute("INSERT INTO t VALUES ('a', ?)", (b"x" * 200_000,))
            go.wait()
        return 1

    written = conn.off_loop(job)
    assert conn.writing
    threading.Thread(target=go.set).start()  # the job ends, whenever: this thread waits for it
    # Each use waits for the job: its BEGIN is never taken into the job's transaction,
    # and what it reads includes the job's commit.
    assert conn.in_transaction is False
    assert written.done() and written.result() == 1
    assert conn.execute("SELECT length(v) FROM t").fetchone() == (200_000,)
    conn.close()


def test_a_job_handed_over_inside_a_transaction_commits_with_it(tmp_path: Path) -> None:
    conn = db.connect(tmp_path / "x.db", "CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY);")
    with pytest.raises(RuntimeError), db.transaction(conn):
        done = conn.off_loop(lambda: conn.execute("INSERT INTO t VALUES ('a')"))
        assert done.done()  # run here, in the open transaction
        raise RuntimeError("rolled back: the job's write goes with it")
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,)
    conn.close()


def test_a_deferred_transaction_sends_nothing_until_used_then_commits_together(
    tmp_path: Path,
) -> None:
    """`begin_deferred`: a transaction nothing uses costs no statement; one that is
    used begins with its first statement, counts as open all along, takes a job
    handed over into it, and commits or rolls back as one."""
    conn = db.connect(tmp_path / "x.db", "CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY);")
    sent: list[str] = []
    conn.set_trace_callback(sent.append)
    conn.begin_deferred()
    assert conn.in_transaction
    conn.end_deferred()
    assert sent == [] and not conn.in_transaction
    conn.begin_deferred()
    conn.execute("INSERT INTO t VALUES ('a')")
    assert conn.off_loop(lambda: conn.execute("INSERT INTO t VALUES ('b')")).done()
    with contextlib.closing(sqlite3.connect(tmp_path / "x.db")) as other:
        assert other.execute("SELECT count(*) FROM t").fetchone() == (0,)  # not yet
    conn.end_deferred()
    assert sent[0] == "BEGIN" and sent[-1] == "COMMIT" and not conn.in_transaction
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (2,)
    conn.begin_deferred()
    conn.execute("INSERT INTO t VALUES ('c')")
    conn.rollback()  # ends it, as it would a transaction begun at once
    with pytest.raises(sqlite3.OperationalError, match="no transaction"):
        conn.end_deferred()
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (2,)
    conn.close()
