"""SQLite opened the same way everywhere: WAL, a busy timeout, one schema script.

`synchronous=NORMAL` in WAL mode keeps every committed row across a process crash
(the case the at-most-once rules are about); only a power cut can lose the last
few commits. That keeps a call's bookkeeping to microseconds instead of an fsync.

Disk stays bounded: pages freed by deleted rows and dropped blobs are reused by the
next writes, `auto_vacuum=INCREMENTAL` lets `give_back_free_pages` return a surplus
to the file system after each prune (beyond `FREE_BYTES_KEPT`; in short steps, on a
connection and thread of its own, so no writer waits long), and the log is cut back to
`WAL_LIMIT_BYTES` after each checkpoint that empties it.

Pages are `PAGE_BYTES` (4 KiB, SQLite's own) in a new database. They were 32 KiB for a
while, for large rows that are not blobs (a 1.5 MB listing): each page is a frame in the
log, and such a row committed in 1.4 ms with 32 KiB against 4.7-9.7 ms with 4 KiB then;
measured again once blobs had left the databases, a 1 MB row commits in 0.74 ms (32 KiB)
against 1.15 ms (4 KiB). But every small row in a grown database dirties a leaf of each
index on a random key (a call's id) and writes it whole: with 300,000 calls in hub.db an
insert in a 130-row commit took 26.7 us with 32 KiB pages against 14.8 us with 4 KiB,
and ControlService.Dispatch at 64 in flight with grown databases (300,000 rows in each
big table) went from 1,150-1,430 to 1,400-1,810 calls/s through `up` and from
1,230-1,430 to 1,590-1,950 through hub + run (two runs of alternated rounds, load
27-31; 8 KiB pages did about as well; with fresh databases the sizes did alike).
A database with other pages (32 KiB ones from before) keeps them unless it is at most
`CONVERT_UP_TO_BYTES`: converting is one VACUUM, which holds every other process (the
kill switch included) out while it runs. One without
`auto_vacuum` (from before that) is converted whatever its size, as it always was.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import sqlite3
import stat
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

log = logging.getLogger(__name__)


DB_SUFFIXES = ("", "-wal", "-shm", "-journal")  # SQLite's files for one database (as config's)
# The write-ahead log is truncated to this after a checkpoint that empties it.
WAL_LIMIT_BYTES = 4 * 1024 * 1024
PAGE_BYTES = 4 * 1024
# A database whose pages are not PAGE_BYTES is given them (one VACUUM, at its owner's
# start) only while it is this small: a VACUUM holds every other process out meanwhile.
CONVERT_UP_TO_BYTES = 16 * 1024 * 1024
# Free pages beyond these bytes of them are given back to the file system.
FREE_BYTES_KEPT = 4 * 1024 * 1024
# Free pages go back in steps that hold the write lock about this long each, at least
# GIVE_BACK_PAUSE_S and four times the last step apart, and of at most this many pages
# (see give_back_free_pages).
GIVE_BACK_STEP_S = 0.005
GIVE_BACK_PAUSE_S = 0.02
GIVE_BACK_MOST_PAGES = 64
_INCREMENTAL = 2  # PRAGMA auto_vacuum's value for INCREMENTAL
# The checkpointer copies the log in after this many commits, or once they have
# written this many bytes, or once commits have stopped for this long (see Checkpointer).
CHECKPOINT_COMMITS = 64
CHECKPOINT_BYTES = 16 * 1024 * 1024
# SQLite's own checkpoint, inside a commit on the writer's path, only past this much
# log (in_commit_checkpoint_pages): a bound should the checkpointer fall behind.
IN_COMMIT_CHECKPOINT_BYTES = 2 * CHECKPOINT_BYTES
CHECKPOINT_QUIET_S = 1.0


_T = TypeVar("_T")
# A commit of at least this many bytes (a 10,000-entry listing's 1.5 MB answer) is made
# in the connection's writer thread (`Database.off_loop`), not on the event loop:
# SQLite writes such a row as a log frame per page, 3-6 ms of the loop. Smaller ones
# commit where they are: the hop to the thread and back would cost more.
OFF_LOOP_BYTES: Final = 64 * 1024


async def ended(job: concurrent.futures.Future[Any]) -> None:
    """Wait on the running event loop until `job` (a writer thread's) ended, whatever its
    outcome. Leaving early never cancels it: `asyncio.wrap_future` would cancel a job
    not yet started, and its commit with it."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not done.done():
            done.set_result(None)

    def woken(_job: concurrent.futures.Future[Any]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(wake)

    job.add_done_callback(woken)
    await done


class Database(sqlite3.Connection):
    """A connection opened the project's way (see `connect`); it owns the thread that
    checkpoints its log, which stops when it closes, and wakes it after each commit
    that changed rows (its statements are the only writes to its log).

    It may own a writer thread too (`off_loop`), for large commits: while a job runs
    there, any other thread's use of the connection (a statement, `in_transaction`, a
    commit) first waits for it to end (`settle`). So one thread at a time uses the
    connection, and each sees every write handed over before, in the order handed;
    the event loop waits only when it touches the database before the job is done."""

    checkpointer: Checkpointer | None = None
    _changes = 0  # total_changes when the checkpointer was last woken
    _bytes = 0  # bytes the statements since then were given (what their commit writes)
    _writer: concurrent.futures.ThreadPoolExecutor | None = None
    _writing: concurrent.futures.Future[Any] | None = None  # the last job handed over
    _writer_ident = 0  # the writer thread's id, once it ran a job
    # A transaction opened by `begin_deferred` whose BEGIN is not sent yet.
    _deferred = False

    def begin_deferred(self) -> None:
        """Open a transaction as `BEGIN` would, sent with the first use of the
        connection inside it (`end_deferred` ends it): one that reads and writes nothing
        (an intake of effect-free calls, which the ledger need not look up) then costs
        no statement at all; until then it counts as open (`in_transaction`). A deferred
        BEGIN takes no lock until its first statement, so no one can tell the two apart."""
        self._deferred = True

    def end_deferred(self) -> None:
        """COMMIT the transaction `begin_deferred` opened, if it was begun."""
        if self._deferred:
            self._deferred = False
            return
        self.execute("COMMIT")

    def _begin_deferred_now(self) -> None:
        super().execute("BEGIN")
        self._deferred = False

    def off_loop(self, job: Callable[[], _T]) -> concurrent.futures.Future[_T]:
        """Run `job` (statements on this connection, a commit) in this connection's
        writer thread, after the jobs handed over before it; its future says when it
        committed (or raised). Any other use of the connection meanwhile waits for it.
        Inside a transaction open on this thread it runs here and now, in it: its
        writes commit with that transaction, never before. (While a job is under way
        no other thread has a transaction open: its BEGIN waited for the job.)"""
        if not self.writing and (self._deferred or sqlite3.Connection.in_transaction.__get__(self)):
            done: concurrent.futures.Future[_T] = concurrent.futures.Future()
            try:
                done.set_result(job())
            except Exception as exc:  # noqa: BLE001 - the future carries it, as the thread's would
                done.set_exception(exc)
            return done
        if self._writer is None:
            self._writer = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="sqlite writer"
            )
        future = self._writer.submit(self._as_writer, job)
        self._writing = future
        return future

    def _as_writer(self, job: Callable[[], _T]) -> _T:
        self._writer_ident = threading.get_ident()
        return job()

    @property
    def writing(self) -> bool:
        """Whether a job handed to the writer thread is not done yet."""
        return self._writing is not None and not self._writing.done()

    async def writer_idle(self) -> None:
        """`settle` without holding the event loop: wait there until the jobs handed to
        the writer thread are done (one may wait for a lock another process holds)."""
        while (writing := self._writing) is not None and not writing.done():
            await ended(writing)

    def settle(self) -> None:
        """Wait until the jobs handed to the writer thread are done (unless in it)."""
        writing = self._writing
        if writing is None or threading.get_ident() == self._writer_ident:
            return
        concurrent.futures.wait([writing])
        if self._writing is writing:
            self._writing = None

    @property
    def in_transaction(self) -> bool:
        self.settle()
        return self._deferred or bool(sqlite3.Connection.in_transaction.__get__(self))

    def commit(self) -> None:
        self.settle()
        self._deferred = False  # a transaction never begun: nothing to commit
        super().commit()

    def rollback(self) -> None:
        self.settle()
        self._deferred = False
        super().rollback()

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        self.settle()
        if self._deferred:
            self._begin_deferred_now()
        return super().cursor(*args, **kwargs)

    def executescript(self, sql_script: str, /) -> sqlite3.Cursor:
        self.settle()
        if self._deferred:
            self._begin_deferred_now()
        return super().executescript(sql_script)

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        if self._writing is not None:
            self.settle()
        if self._deferred:
            self._begin_deferred_now()
        cursor = super().execute(sql, parameters)
        self._bytes += _weight(parameters)
        self._committed()
        return cursor

    def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:
        if self._writing is not None:
            self.settle()
        if self._deferred:
            self._begin_deferred_now()
        cursor = super().executemany(sql, parameters)
        if isinstance(parameters, list | tuple):  # an iterator is spent: not counted
            self._bytes += _weight_rows(parameters)
        self._committed()
        return cursor

    def _committed(self) -> None:
        """After a statement: rows changed and no transaction left open means a commit
        reached the log, so the checkpointer has work (a read costs one comparison)."""
        changes = self.total_changes
        if self.in_transaction:
            return
        if changes != self._changes:
            self._changes = changes
            if self.checkpointer is not None:
                self.checkpointer.wake(self._bytes)
        self._bytes = 0

    def close(self) -> None:
        self.settle()
        if self._writer is not None:
            self._writer.shutdown()
            self._writer = None
        if self.checkpointer is not None:
            self.checkpointer.stop()
            self.checkpointer = None
        super().close()


# What `_weight` reads and counts: tuples, not unions such as `bytes | str | memoryview`
# (isinstance against a union is several times slower: weighing a telemetry row, 22
# values, took 2.9 us of its 9.9 us write, and takes 1.2 us).
_ROWS: Final = (list, tuple)
_SIZED: Final = (bytes, str, memoryview)


def _weight(parameters: Any) -> int:
    """About how many bytes a statement's parameters bring to the log: its texts and
    blobs (a tuple or list of values, or a mapping's)."""
    values: Iterable[Any]
    if isinstance(parameters, dict):
        values = parameters.values()
    elif isinstance(parameters, _ROWS):
        values = parameters
    else:
        return 0
    return sum([len(v) for v in values if isinstance(v, _SIZED)])


def _weight_rows(rows: Sequence[Any]) -> int:
    """The sum of `_weight` of each row of an executemany, in one comprehension: a
    call of `_weight` per row took half the time of weighing a batch of telemetry
    rows (two rows a call: its invocation row, and its ledger row once acked)."""
    return sum(
        [
            len(v)
            for row in rows
            for v in (row if isinstance(row, _ROWS) else _values_of(row))
            if isinstance(v, _SIZED)
        ]
    )


def _values_of(parameters: Any) -> Iterable[Any]:
    """What `_weight` weighs of parameters that are not a tuple or list."""
    return parameters.values() if isinstance(parameters, dict) else ()


def connect(path: Path, schema: str, *, convert: bool = False) -> Database:
    """Open (or make) the database at `path` with `schema`. `convert=True` only for the
    worker or hub that owns it, at its start: a database from before is converted
    then; a command-line tool converting it would hold every other process out (the
    worker's kill switch included) for as long as that takes."""
    private_folder(path.parent)
    _private_files(path)
    conn = sqlite3.connect(
        path, isolation_level=None, timeout=10.0, check_same_thread=False, factory=Database
    )
    _page_layout(conn, path, convert)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
    conn.executescript(schema)
    # A checkpoint copies the log into the database and fsyncs. SQLite runs it inside
    # whichever commit crosses its threshold, stalling that call for milliseconds; this
    # database's own checkpointer does it off the writers' path (sqlite3 releases the
    # GIL meanwhile). SQLite's threshold is set above the checkpointer's so that it
    # stays a bound, not the rule (see Checkpointer).
    page = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.execute(f"PRAGMA wal_autocheckpoint={in_commit_checkpoint_pages(page)}")
    conn.checkpointer = Checkpointer(path)
    # Dropped without close(): the thread still ends (without waiting for it here).
    weakref.finalize(conn, conn.checkpointer.stop, wait=False)
    return conn


def in_commit_checkpoint_pages(page_bytes: int) -> int:
    """Log pages at which SQLite checkpoints inside a commit: twice the checkpointer's
    byte threshold, and never fewer than SQLite's own default (1,000)."""
    return max(1000, IN_COMMIT_CHECKPOINT_BYTES // page_bytes)


def _page_layout(conn: sqlite3.Connection, path: Path, convert: bool) -> None:
    """Give the database PAGE_BYTES pages whose free ones can be given back: set
    before its first table (a new one), or by one VACUUM (one from before, if
    `convert`, out of WAL mode for it, since a log's pages keep their size; skipped
    while another connection is busy with it, to be done at a later open). One that
    can give free pages back already keeps its page size unless it is at most
    CONVERT_UP_TO_BYTES (a larger VACUUM would hold the other processes out)."""
    size = conn.execute("PRAGMA page_size").fetchone()[0]
    vacuum = conn.execute("PRAGMA auto_vacuum").fetchone()[0]
    if size == PAGE_BYTES and vacuum == _INCREMENTAL:
        return
    if conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
        conn.execute(f"PRAGMA page_size={PAGE_BYTES}")  # both take effect with the first table
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        return
    if not convert:
        return
    try:
        file_bytes = path.stat().st_size
    except OSError:
        return
    if vacuum == _INCREMENTAL and file_bytes > CONVERT_UP_TO_BYTES:
        return  # keeps its pages: they work, and converting would stall every process
    log.warning(
        "converting %s (%.0f MB) to %d-byte pages, once; other processes wait meanwhile",
        path,
        file_bytes / 1e6,
        PAGE_BYTES,
    )
    try:
        if size != PAGE_BYTES:
            conn.execute("PRAGMA journal_mode=DELETE")
            conn.execute(f"PRAGMA page_size={PAGE_BYTES}")
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        conn.execute("VACUUM")
    except sqlite3.DatabaseError as exc:  # busy, or a page VACUUM cannot read: not fatal
        log.info("%s: left as it is for now (%s); converted at a later start", path, exc)


def give_back_free_pages(
    target: sqlite3.Connection | Path,
    keep: int | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Return free pages beyond `keep` (default: FREE_BYTES_KEPT of the database's own
    pages) to the file system; how many went. Blocks until done (or `stop` is set):
    off the event loop (`give_back_off_loop`), called after deletes (pruning).

    On a connection of its own, in steps of about GIVE_BACK_STEP_S each (the write
    lock is held for one step), with GIVE_BACK_PAUSE_S between them for the other
    writers (the kill switch, the worker's calls): a step moves each page in use at
    the end of the file into a free one nearer its start, and one page took 0.08 to
    3.5 ms (worst case, 1.4 GB free under its 77 MB of newest rows, at load 21). The
    log it writes is copied in as it goes; the file shrinks at that checkpoint.

    Python's sqlite3 steps a statement without result columns once and drops it, and
    `PRAGMA incremental_vacuum(N)` frees one page per step: `execute` gave back one page
    per call. `executescript` steps it to its end."""
    path = path_of(target) if isinstance(target, sqlite3.Connection) else target
    try:
        own = sqlite3.connect(
            f"{path.resolve().as_uri()}?mode=rw", uri=True, timeout=10.0, isolation_level=None
        )
    except sqlite3.Error as exc:
        log.debug("free pages of %s not given back: %s", path, exc)
        return 0
    try:
        own.execute("PRAGMA synchronous=NORMAL")
        own.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
        if own.execute("PRAGMA auto_vacuum").fetchone()[0] != _INCREMENTAL:
            return 0  # only a VACUUM shrinks it (its owner converts it at its start)
        page = int(own.execute("PRAGMA page_size").fetchone()[0])
        if keep is None:
            keep = FREE_BYTES_KEPT // page
        return _give_back_in_steps(own, keep, page, stop or threading.Event())
    except sqlite3.Error as exc:  # busy past the timeout, or closing: the next prune
        log.info("giving back free pages of %s stopped: %s", path, exc)
        return 0
    finally:
        own.close()


def _give_back_in_steps(
    own: sqlite3.Connection, keep: int, page: int, stop: threading.Event
) -> int:
    """A page's cost jumps as the file's end goes from free pages (microseconds) to
    pages in use (each moved, up to milliseconds): a step's size is the time wanted
    over the dearest page seen lately (a spike wears off by a twentieth a step), never
    more than GIVE_BACK_MOST_PAGES."""
    given = 0
    since_checkpoint = 0
    dearest_s = GIVE_BACK_STEP_S / GIVE_BACK_MOST_PAGES
    while not stop.is_set():
        free = int(own.execute("PRAGMA freelist_count").fetchone()[0])
        if free <= keep:
            break
        step = max(1, min(GIVE_BACK_MOST_PAGES, int(GIVE_BACK_STEP_S / dearest_s)))
        pages = min(step, free - keep)
        started = time.perf_counter()
        own.executescript(f"PRAGMA incremental_vacuum({pages});")
        took = time.perf_counter() - started
        gone = free - int(own.execute("PRAGMA freelist_count").fetchone()[0])
        if gone <= 0:
            break  # nothing more can go (never expected: not a loop for ever)
        given += gone
        since_checkpoint += gone
        dearest_s = max(took / gone, dearest_s * 0.95, GIVE_BACK_STEP_S / GIVE_BACK_MOST_PAGES)
        if since_checkpoint * page >= CHECKPOINT_BYTES:
            own.execute("PRAGMA wal_checkpoint(PASSIVE)")  # off every writer's path
            since_checkpoint = 0
        stop.wait(max(GIVE_BACK_PAUSE_S, 4 * took))  # the other writers' turn
    if given:
        own.execute("PRAGMA wal_checkpoint(PASSIVE)")  # the file shrinks here
    return given


async def give_back_off_loop(target: sqlite3.Connection | Path) -> int:
    """`give_back_free_pages` in a thread; a cancel stops it within one step."""
    path = path_of(target) if isinstance(target, sqlite3.Connection) else target
    stop = threading.Event()
    try:
        return await asyncio.to_thread(give_back_free_pages, path, None, stop)
    finally:
        stop.set()


def path_of(conn: sqlite3.Connection) -> Path:
    """The file of a connection's main database."""
    for _seq, name, file in conn.execute("PRAGMA database_list"):
        if name == "main":
            return Path(file)
    raise ValueError("a connection without a main database")


def private_folder(folder: Path) -> None:
    """Make `folder` (0700) or tighten it to 0700; refuse one owned by someone else.

    The databases hold telemetry, call results and the hub's requests: nobody but
    this user may read them, nor swap files in their folder. Others' search bit alone
    (0701) is kept: a root worker with [sandbox] uids sets it so that plans' uids pass
    through to their workspaces (sandbox.plan_uids); it lists nothing and opens no
    file that is not itself open to others (the databases are 0600).
    """
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = folder.stat()
    if st.st_uid != os.getuid():
        raise PermissionError(
            f"the data folder {folder} belongs to another user (uid {st.st_uid}); "
            "use a folder of your own (AGENTWORKER_HOME)"
        )
    if stat.S_IMODE(st.st_mode) & 0o076:
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
    conn.close()


class Checkpointer:
    """Copies one database's log into the database file, off the writers' path.

    A checkpoint ends in fsyncs of the log and of the database, and on a journalling
    file system a commit's own write waits while they run (its file times go in the
    same journal), so it checkpoints once `every` commits have reached the log, or
    once they have written `every_bytes`, or once commits have stopped for `quiet_s`
    (an idle database ends with its log copied in), never after each one: a
    checkpoint after every call took the worker's and the hub's commits during exec
    from 0.1 ms to 0.6-0.8 ms at p90, 13-33 ms at worst. It sleeps until its
    database's first commit since its last round wakes it (`wake`); while it waits
    for more it looks once per `quiet_s`, never per commit; an idle database costs no
    wake-ups at all. Under a stream of commits it runs at most one round per `gap_s`.
    SQLite's own threshold (`IN_COMMIT_CHECKPOINT_BYTES` of log, set at `connect`)
    still checkpoints inside a commit should the log outgrow it first, so the log
    stays bounded; the bytes counted keep large rows from reaching it first. SQLite's
    default, 1,000 pages, was 32 MiB with 32 KiB pages but is 4 MiB with 4 KiB ones,
    which a stream of small commits (each dirtying 10-30 pages of tables and indexes)
    fills before 64 commits: at 64 Dispatches in flight through `up` the event loop
    ran 28 fdatasyncs in 8 s (265 ms, up to 25 ms each) inside commits. Before they were counted, 64
    commits of a 10,000-entry fs_list's answer (1.5 MB each, stored by the hub and by
    the ledger) passed it every 21 listings, and the event loop copied 32 MiB into the
    database and waited for its fsyncs inside a commit (about a seventh of the
    loop's time while listings ran). Its own connection is opened read-write only (a
    removed file is never re-created).
    """

    def __init__(
        self,
        path: Path,
        gap_s: float = 0.1,
        every: int = CHECKPOINT_COMMITS,
        quiet_s: float = CHECKPOINT_QUIET_S,
        every_bytes: int = CHECKPOINT_BYTES,
    ) -> None:
        self._path = path.resolve()
        self._gap_s = gap_s
        self._every = every
        self._every_bytes = every_bytes
        self._quiet_s = quiet_s
        self._commits = 0  # commits since the last round (a lost count only delays one)
        self._bytes = 0  # what they wrote, about (likewise)
        self._stopping = threading.Event()
        self._written = threading.Event()
        self._scrub = False  # the next round empties the log to nothing (`scrub`)
        self._log = self._path.with_name(self._path.name + "-wal")
        self._rounds = 0
        self._changed = threading.Condition()
        self._thread = threading.Thread(
            target=self._run, name=f"checkpoint {self._path.name}", daemon=True
        )
        self._thread.start()

    @property
    def rounds(self) -> int:
        """Checkpoints run so far."""
        return self._rounds

    def wake(self, written_bytes: int = 0) -> None:
        """A commit of about `written_bytes` reached the log (any thread). Wakes the
        thread for the first commit since its last round, and once `every` have come
        or `every_bytes` been written; counts the others."""
        self._commits += 1
        self._bytes += written_bytes
        if self._commits == 1 or self._commits >= self._every or self._bytes >= self._every_bytes:
            self._written.set()

    def scrub(self) -> None:
        """Make the next round empty the log to nothing (a TRUNCATE checkpoint), not
        only copy it in: rows rewritten to leave no trace (a secret masked) still lie
        whole in the log's older frames, which a PASSIVE round leaves for later writes
        to overwrite, and an idle database keeps for good (review26 H3). It briefly
        holds writers back, so only as asked. Any thread."""
        self._scrub = True
        self.wake()

    def _full(self) -> bool:
        return self._commits >= self._every or self._bytes >= self._every_bytes

    def wait_for(self, ready: Callable[[], bool], timeout_s: float) -> bool:
        """Block until `ready()` holds after a checkpoint (or already does); for tests."""
        with self._changed:
            return self._changed.wait_for(ready, timeout_s)

    def stop(self, *, wait: bool = True) -> None:
        """Stop the thread (it closes what it holds); with `wait`, once it has."""
        self._stopping.set()
        self._written.set()
        if wait and threading.current_thread() is not self._thread:
            self._thread.join()

    def _run(self) -> None:
        own: sqlite3.Connection | None = None
        seen: tuple[int, int] = (-1, -1)
        try:
            while True:
                self._written.wait()
                if self._stopping.is_set():
                    return
                self._written.clear()
                if not self._gathered():
                    return
                self._commits = 0
                self._bytes = 0
                try:
                    st = self._log.stat()
                except FileNotFoundError:
                    continue
                scrub, self._scrub = self._scrub, False
                if scrub or (st.st_mtime_ns, st.st_size) != seen:
                    try:
                        if own is None:
                            own = sqlite3.connect(f"{self._path.as_uri()}?mode=rw", uri=True)
                        mode = "TRUNCATE" if scrub else "PASSIVE"
                        busy, _log, _done = own.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
                        if scrub and busy:  # readers or a writer held it: a round again
                            self._scrub = True
                            self._written.set()
                        seen = (st.st_mtime_ns, st.st_size)
                    except (sqlite3.Error, OSError) as exc:  # busy or gone: next commit
                        log.debug("checkpoint of %s skipped: %s", self._path, exc)
                        if own is not None:
                            own.close()
                            own = None
                with self._changed:
                    self._rounds += 1
                    self._changed.notify_all()
                # A rate, not a poll: commits meanwhile set `_written` for the next round.
                if self._stopping.wait(self._gap_s):
                    return
        finally:
            if own is not None:
                own.close()

    def _gathered(self) -> bool:
        """Wait until `every` commits have come since the last round (or `every_bytes`
        been written), or none for `quiet_s`; False if the database is closing meanwhile."""
        seen = self._commits
        while not self._full():
            self._written.wait(self._quiet_s)
            if self._stopping.is_set():
                return False
            self._written.clear()
            if self._commits == seen:
                break  # quiet: copy in what there is
            seen = self._commits
        return True


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


@contextlib.contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """Like `transaction`, holding the write lock from its start: for a change made
    after reading what is there (a table from before, converted on open), so that of
    two processes opening the database at once the second reads what the first made."""
    if conn.in_transaction:
        yield
        return
    conn.execute("BEGIN IMMEDIATE")
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


# Work on a database done in steps (a generator: each `yield` ends a step, its return
# value is the work's): at once, or with the event loop's other work between steps.
Steps = Generator[None, None, int]


def at_once(steps: Steps) -> int:
    """Every step of `steps` now; what it returned."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return int(done.value)


async def in_steps(steps: Steps) -> int:
    """The steps of `steps`, a turn of the event loop for other work after each."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return int(done.value)
        await asyncio.sleep(0)


def newest_within(
    conn: sqlite3.Connection,
    table: str,
    size: str,
    where: str = "1",
    *,
    most_bytes: int,
    most_rows: int | None = None,
    walk_rows: int,
) -> Generator[None, None, tuple[int, int]]:
    """How many of `table`'s newest rows matching `where` fit within `most_rows` and
    `most_bytes` (each row's `size`, an SQL expression), and the rowid of the newest
    that does not (0: every one fits); the rows looked at `walk_rows` a step, from the
    newest (a table's rows sized by its newest few let large ones hide under small)."""
    kept = total = 0
    below = None
    while True:
        after = "" if below is None else f" AND rowid < {below}"
        rows = conn.execute(
            f"SELECT rowid, {size} FROM {table} WHERE {where}{after}"
            f" ORDER BY rowid DESC LIMIT {walk_rows}"
        ).fetchall()
        for rowid, row_bytes in rows:
            total += row_bytes
            if (most_rows is not None and kept >= most_rows) or total > most_bytes:
                return kept, int(rowid)
            kept += 1
        if len(rows) < walk_rows:
            return kept, 0
        below = int(rows[-1][0])
        yield


def delete_oldest(
    conn: sqlite3.Connection, table: str, where: str, parameters: Sequence[Any], *, batch: int
) -> Steps:
    """Every row of `table` matching `where`, oldest first, `batch` a statement (a step
    each, so a large removal never holds the loop long); how many went."""
    statement = (
        f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} WHERE {where}"
        f" ORDER BY rowid LIMIT {batch})"
    )
    gone = 0
    while True:
        removed: int = conn.execute(statement, parameters).rowcount
        gone += removed
        if removed < batch:
            return gone
        yield
