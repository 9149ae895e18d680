"""Reading and writing one file beneath a root, the ways that cannot be tricked.

`ConfinedDir` keeps a lookup inside a root; this module decides what happens once
the lookup lands. Reading opens only regular files, and looks before it opens:
opening a device can have effects (a tape rewinds, a terminal becomes ours) and
opening a FIFO for reading can wait forever, so the kind is checked on an O_PATH
handle, which opens nothing, and confirmed again on the real descriptor.

Writing never follows the last component: the new content goes to a temporary
file beside the target, is flushed to disk, then renamed over the name (or linked
to it, for a name that must not exist yet). A symlink planted at the name is
refused, one planted in the moment between the check and the rename is replaced,
never followed, and a crash at any point leaves either the old file whole or the
new one (and, at worst, a temporary file that sandbox._leftovers sweeps up later).
Appending writes in place, so it checks the file it opened, not the name.

A file with more than one name (hard link) may have another name outside every
root; both readers and appenders refuse such files unless the caller allows them.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import queue
import stat
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from sandbox._leftovers import temp_name
from sandbox.arriving import Arriving, each_part
from sandbox.fs_types import file_kind
from sandbox.paths import ConfinedDir, ConfinementError, Problem, _show, _translating

# O_NONBLOCK: a FIFO that slipped past the kind check still cannot block the open.
# O_NOCTTY: a terminal that slipped past it never becomes our controlling terminal.
_READ_FLAGS: Final = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY
_NEW_FILE_MODE: Final = 0o666  # narrowed by the process umask, as for any program
_KEPT_MODE_BITS: Final = 0o777  # setuid/setgid/sticky never survive a rewrite


class HardLinkError(ConfinementError):
    """A regular file with more than one name was refused (`links` names in all)."""

    def __init__(self, path: str, links: int) -> None:
        super().__init__(
            Problem.OUTSIDE,
            f"{_show(path)} has {links} names (hard links); another name may lie outside "
            "the shared folder, so the file is refused.",
        )
        self.links = links


@dataclass(frozen=True)
class Written:
    """What a write did: whether it created the file, and the file's size after."""

    created: bool
    size: int


class ChangedWhileOpenedError(ConfinementError):
    """Another name was renamed over the file between its check and its open."""


def _not_regular(path: str, st: os.stat_result) -> ConfinementError:
    kind = file_kind(st)
    if kind == "directory":
        return ConfinementError(
            Problem.A_FOLDER,
            f"{_show(path)} is a folder, not a file. List it, or name a file in it.",
        )
    if kind == "symlink":
        return ConfinementError(
            Problem.OUTSIDE,
            f"{_show(path)} is a symbolic link, which is never written through. Write to the "
            "file it names, or remove the link first.",
        )
    return ConfinementError(
        Problem.NOT_A_FILE,
        f"{_show(path)} is a {kind.replace('_', ' ')}, not a regular file; only regular files "
        "can be read or written.",
    )


def _check_links(path: str, st: os.stat_result, allow_hard_links: bool) -> None:
    if not allow_hard_links and stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        raise HardLinkError(path, st.st_nlink)


def open_regular(root: ConfinedDir, relative: str, *, allow_hard_links: bool = False) -> int:
    """A read-only fd for the regular file at `relative` (symlinks inside are followed).

    Anything else is refused before it is opened: a folder (`is_directory`), a FIFO,
    socket or device (`not_supported`), a file with several names unless
    `allow_hard_links`. The caller closes the fd.
    """
    handle = root.open(relative, os.O_PATH)
    try:
        seen = os.fstat(handle)
    finally:
        os.close(handle)
    if not stat.S_ISREG(seen.st_mode):
        raise _not_regular(relative, seen)
    _check_links(relative, seen, allow_hard_links)
    fd = root.open(relative, _READ_FLAGS)
    try:
        opened = os.fstat(fd)
        # Swapped between the look and the open: refuse what arrived instead.
        if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (
            seen.st_dev,
            seen.st_ino,
        ):
            raise ChangedWhileOpenedError(
                Problem.MISSING, f"{_show(relative)} changed while it was opened. Try again."
            )
        _check_links(relative, opened, allow_hard_links)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_at(fd: int, offset: int, length: int) -> bytes:
    """Up to `length` bytes at `offset`; fewer only at the end of the file."""
    chunks: list[bytes] = []
    got = 0
    while got < length:
        chunk = os.pread(fd, length - got, offset + got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


# preadv's flag for "answer from the page cache or not at all" (Linux 4.14 and later).
_NOWAIT: Final = getattr(os, "RWF_NOWAIT", None)


def read_cached(fd: int, offset: int, length: int) -> memoryview | None:
    """Up to `length` bytes at `offset` (fewer only at the end of the file, as far as
    it reached when this began), if the kernel holds all of them in its page cache:
    read with RWF_NOWAIT, which never waits for a disk. None when some are not there,
    or when the system cannot read that way (not Linux, a file system without it).

    The bytes are a read-only view of the buffer they were read into, which nothing
    else holds, not a copy of it: preadv needs a writable buffer, and copying it into
    a `bytes` took a third of the user-space instructions of an fs_read of 1 MiB
    through `up` (callgrind: 7.05 -> 5.98 million a call without it); whoever needs
    `bytes` (a protobuf field) copies it then, as the hub's response does anyway."""
    if _NOWAIT is None:
        return None
    length = min(length, max(0, os.fstat(fd).st_size - offset))
    buffer = bytearray(length)
    got = 0
    with memoryview(buffer) as view:
        while got < length:
            try:
                read = os.preadv(fd, [view[got:]], offset + got, _NOWAIT)
            except OSError:  # EAGAIN: not cached; EOPNOTSUPP: cannot say
                return None
            if not read:
                break
            got += read
    return memoryview(buffer)[:got].toreadonly()


def _lstat(parent_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _regular_or_missing(parent_fd: int, name: str, shown: str) -> os.stat_result | None:
    """`name`'s own status (a link is not followed), None when there is none yet.

    Writing goes only to regular files: a symlink, folder, FIFO or device is refused.
    """
    existing = _lstat(parent_fd, name)
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        raise _not_regular(shown, existing)
    return existing


# What a write takes: bytes, or the pieces they came in (written one after another,
# never joined into one buffer first), of which one may still be coming (`Arriving`:
# its parts are written as they come).
Data = bytes | Sequence[bytes | memoryview | Arriving]


def _pieces(data: Data) -> Iterator[bytes | memoryview]:
    """Every piece of `data`, in order; an `Arriving` one's parts as they come."""
    if isinstance(data, bytes):
        yield data
        return
    yield from each_part(data)


def data_size(data: Data) -> int:
    """The bytes of `data` (an `Arriving` piece counts its announced size; never waits)."""
    return len(data) if isinstance(data, bytes) else sum(len(piece) for piece in data)


# A write of at least WRITEBACK_FROM bytes goes in WRITEBACK_BYTES slices, and the
# kernel is told to start writing each slice to disk as soon as it is in the page cache
# (sync_file_range's SYNC_FILE_RANGE_WRITE, which starts the writeback and waits for
# nothing). The fsync that follows then waits only for the tail, where it used to
# start all of it: for 16 MiB here, the copy into the page cache 3.7 -> 4.5 ms and the
# fsync after it 6.4-7.0 -> 2.3-3.5 ms. It is a hint, never the durability: the fsync
# still comes before the write is answered or renamed into place.
WRITEBACK_FROM: Final = 2 * 1024 * 1024
WRITEBACK_BYTES: Final = 1024 * 1024
_SYNC_FILE_RANGE_WRITE: Final = 2  # <fcntl.h>


@functools.cache
def _writeback() -> Callable[[int, int, int], object] | None:
    """libc's sync_file_range (Linux), loaded on first use; None elsewhere. ctypes lets
    go of the GIL around the call."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # only here: a process that never writes a large file never loads it

    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int

    def start(fd: int, offset: int, length: int) -> object:
        return function(fd, offset, length, _SYNC_FILE_RANGE_WRITE)  # an error: no hint

    return start


def _write_all(
    fd: int, data: Data, *, at: int | None = None, wrote: Callable[[int], None] | None = None
) -> None:
    """Write every byte of `data` at the file's position. `at`, when given, is where that
    position is in the file: a large write then starts its writeback as it goes (see
    WRITEBACK_FROM). `wrote`, if given, is told how many bytes of `data` are in after
    each write (a slice at a time for a large one)."""
    start = _writeback() if at is not None and data_size(data) >= WRITEBACK_FROM else None
    done = started = 0
    for piece in _pieces(data):
        view = memoryview(piece)
        while view:
            written = os.write(fd, view if start is None else view[:WRITEBACK_BYTES])
            view = view[written:]
            done += written
            if wrote is not None:
                wrote(done)
            if start is not None and done - started >= WRITEBACK_BYTES:
                start(fd, (at or 0) + started, done - started)
                started = done


class _Releaser:
    """Closes descriptors of replaced files in a thread of its own (see `write_atomic`).

    A file whose last name goes is freed (its page cache and its blocks) when its last
    descriptor closes; replaced by a rename with none open, inside the rename: 3.7 ms
    of a 16 MiB overwrite's 16 here, in series with the write's answer. Held open
    through the rename and closed here, it is freed beside the answer instead. The
    thread starts on first use and lives as long as the process (a daemon: at exit the
    kernel closes what is left); a child process forked meanwhile starts afresh, its
    own thread on its first use. `drain` waits until it has closed all it was given."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._fds: queue.SimpleQueue[int | threading.Event] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def close_later(self, fd: int) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="sandbox-release", daemon=True
                )
                self._thread.start()
        self._fds.put(fd)

    def drain(self) -> None:
        """Return once every descriptor handed over so far is closed."""
        done = threading.Event()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                return
        self._fds.put(done)
        done.wait()

    def _run(self) -> None:
        while True:
            item = self._fds.get()
            if isinstance(item, threading.Event):
                item.set()
                continue
            with contextlib.suppress(OSError):
                os.close(item)


releaser: Final = _Releaser()


def _hold(parent_fd: int, name: str) -> int | None:
    """A descriptor of the file now at `name` (O_PATH: it opens nothing, needs no
    permission on the file and never follows a link), or None."""
    try:
        return os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    except OSError:
        return None


def write_atomic(
    parent_fd: int,
    name: str,
    data: Data,
    *,
    replace: bool,
    shown: str = "",
    data_in: Callable[[], None] | None = None,
    before_place: Callable[[], None] | None = None,
    wrote: Callable[[int], None] | None = None,
) -> Written:
    """Make `name` in the directory `parent_fd` hold exactly `data`, atomically.

    `replace=False` refuses an existing name (`already_exists`); `replace=True`
    swaps the content of an existing regular file, keeping its permission bits.
    A symlink, folder, FIFO or device at `name` is refused. Other links to a
    replaced file keep the old content: the name gets a new file. Messages name
    `shown` (the caller's path), else `name`. `data_in`, if given, is called once
    every byte is in the (temporary) file, before it is flushed to disk;
    `before_place` once the file is on disk, before anything at `name` changes: if
    it raises, the temporary file is removed and nothing else is done. `wrote`, if
    given, is told how many bytes of `data` are in the file as they go in.
    """
    shown = shown or name
    with _translating(shown):
        existing = _regular_or_missing(parent_fd, name, shown)
        if existing is not None and not replace:
            raise ConfinementError(
                Problem.EXISTS,
                f"{_show(shown)} already exists. Choose another name, or overwrite it.",
            )
        temp = temp_name(name)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temp, flags, _NEW_FILE_MODE, dir_fd=parent_fd)
        # The file replaced, held through the rename: freed once the write is done,
        # beside its answer, not inside the rename (_Releaser).
        replaced: int | None = None
        try:
            try:
                try:
                    _write_all(fd, data, at=0, wrote=wrote)
                    if data_in is not None:
                        data_in()
                    if existing is not None:
                        _keep_owner(fd, existing)
                        os.fchmod(fd, stat.S_IMODE(existing.st_mode) & _KEPT_MODE_BITS)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                if before_place is not None:
                    before_place()
                if replace:
                    replaced = _hold(parent_fd, name) if existing is not None else None
                    os.rename(temp, name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
                else:
                    _link_new(parent_fd, temp, name)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=parent_fd)
                raise
            os.fsync(parent_fd)
        finally:
            if replaced is not None:
                releaser.close_later(replaced)
    return Written(created=existing is None, size=data_size(data))


def _keep_owner(fd: int, existing: os.stat_result) -> None:
    """Give the new file the old one's owner where we may (a worker running as root
    must not turn a person's file into root's); otherwise it stays ours."""
    if (existing.st_uid, existing.st_gid) != (os.geteuid(), os.getegid()):
        with contextlib.suppress(PermissionError):
            os.fchown(fd, existing.st_uid, existing.st_gid)


def _link_new(parent_fd: int, temp: str, name: str) -> None:
    """Give the finished temp file its name only if the name is free, then drop the temp."""
    try:
        os.link(temp, name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        # A file system without hard links: claim the name, then rename over the claim.
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        os.close(os.open(name, flags, 0o600, dir_fd=parent_fd))
        os.rename(temp, name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
    else:
        os.unlink(temp, dir_fd=parent_fd)


def append_bytes(
    parent_fd: int,
    name: str,
    data: Data,
    *,
    allow_hard_links: bool = False,
    shown: str = "",
    data_in: Callable[[], None] | None = None,
    wrote: Callable[[int], None] | None = None,
) -> Written:
    """Add `data` at the end of the regular file `name` (created when missing), in place.

    Not atomic: a crash part-way leaves some of `data` appended. The name is never
    followed; the file actually opened is checked before a byte is written. `data_in`
    and `wrote` as for `write_atomic`.
    """
    shown = shown or name
    with _translating(shown):
        existing = _regular_or_missing(parent_fd, name, shown)
        if existing is not None:
            _check_links(shown, existing, allow_hard_links)
        flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
        flags |= os.O_CLOEXEC
        created = existing is None
        if created:
            try:
                fd = os.open(name, flags | os.O_CREAT | os.O_EXCL, _NEW_FILE_MODE, dir_fd=parent_fd)
            except FileExistsError:  # made by someone else meanwhile: append to theirs
                created = False
                fd = os.open(name, flags, dir_fd=parent_fd)
        else:
            fd = os.open(name, flags, dir_fd=parent_fd)
        try:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode):
                raise _not_regular(shown, opened)
            _check_links(shown, opened, allow_hard_links)
            os.set_blocking(fd, True)
            _write_all(fd, data, at=opened.st_size, wrote=wrote)
            if data_in is not None:
                data_in()
            os.fsync(fd)
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if created:
            os.fsync(parent_fd)
    return Written(created=created, size=size)


def make_parents(
    root: ConfinedDir, relative: str, check_parent: Callable[[int], None] | None = None
) -> None:
    """Create the missing folders above `relative` (a normalised path from `locate`).

    Each folder is made with mkdir in a parent resolved beneath the root, so a
    symlink on the way is followed only while it stays inside. `check_parent`, given
    each parent's fd before the mkdir, may raise to refuse it (a parent that landed
    in a read-only root nested in this one, say).
    """
    parts = [part for part in relative.split("/") if part not in ("", ".")][:-1]
    for depth in range(1, len(parts) + 1):
        prefix = "/".join(parts[:depth])
        try:
            os.close(root.open(prefix, os.O_PATH | os.O_DIRECTORY))
            continue
        except ConfinementError as exc:
            if exc.problem is not Problem.MISSING:
                raise
        parent, name = root.open_parent(prefix)
        try:
            if check_parent is not None:
                check_parent(parent)
            with _translating(prefix), contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o777, dir_fd=parent)
        finally:
            os.close(parent)
