"""sandbox.files against a real file system, with both resolvers.

Reading opens only regular files and never opens anything else at all; writing
never follows the last name, and a crash part-way leaves the old content whole.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox import (
    ConfinedDir,
    ConfinementError,
    HardLinkError,
    Problem,
    _leftovers,
    append_bytes,
    files,
    make_parents,
    open_regular,
    read_at,
    read_cached,
    write_atomic,
)
from sandbox._leftovers import Leftovers
from tests.sandbox.support import INSIDE, SECRET, Tree


@contextlib.contextmanager
def parent_of(root: ConfinedDir, relative: str) -> Iterator[tuple[int, str]]:
    fd, name = root.open_parent(relative)
    try:
        yield fd, name
    finally:
        os.close(fd)


def read(root: ConfinedDir, relative: str) -> bytes:
    fd = open_regular(root, relative)
    try:
        return read_at(fd, 0, 1 << 20)
    finally:
        os.close(fd)


def refusal(call: object, *args: object, **kwargs: object) -> ConfinementError:
    with pytest.raises(ConfinementError) as caught:
        result = call(*args, **kwargs)  # type: ignore[operator]
        if isinstance(result, int):
            os.close(result)
    return caught.value


# --- open_regular -------------------------------------------------------------------


def test_reads_a_regular_file_and_follows_links_inside(tree: Tree, confined: ConfinedDir) -> None:
    (tree.root / "alias").symlink_to("data.txt")
    assert read(confined, "data.txt") == INSIDE.encode()
    assert read(confined, "alias") == INSIDE.encode()


def test_a_fifo_is_refused_without_blocking(tree: Tree, confined: ConfinedDir) -> None:
    os.mkfifo(tree.root / "fifo")  # no writer: a plain open for reading would wait forever
    error = refusal(open_regular, confined, "fifo")
    assert error.problem == Problem.NOT_A_FILE
    assert "fifo" in error.message


def test_a_socket_is_refused(tree: Tree, confined: ConfinedDir) -> None:
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(tree.root / "sock"))
        assert refusal(open_regular, confined, "sock").problem == Problem.NOT_A_FILE


def test_a_folder_is_refused(confined: ConfinedDir) -> None:
    assert refusal(open_regular, confined, "sub").problem == Problem.A_FOLDER
    assert refusal(open_regular, confined, ".").problem == Problem.A_FOLDER


def test_a_device_is_refused_without_being_opened(use_openat2: bool) -> None:
    with ConfinedDir(Path("/dev"), use_openat2=use_openat2) as dev:
        for name in ("zero", "null", "tty"):
            if os.path.exists(f"/dev/{name}"):
                assert refusal(open_regular, dev, name).problem == Problem.NOT_A_FILE


def test_a_hard_link_is_refused_unless_allowed(tree: Tree, confined: ConfinedDir) -> None:
    os.link(tree.secret, tree.root / "hard")
    error = refusal(open_regular, confined, "hard")
    assert isinstance(error, HardLinkError)
    assert error.problem == Problem.OUTSIDE and error.links == 2
    fd = open_regular(confined, "hard", allow_hard_links=True)
    os.close(fd)


def test_read_at_pages_and_stops_at_the_end(tree: Tree, confined: ConfinedDir) -> None:
    fd = open_regular(confined, "data.txt")
    try:
        assert read_at(fd, 0, 6) == b"inside"
        assert read_at(fd, 7, 100) == b"data\n"
        assert read_at(fd, 1000, 10) == b""
    finally:
        os.close(fd)


def test_a_cached_read_reads_what_read_at_reads(tree: Tree, confined: ConfinedDir) -> None:
    """A file just written is in the page cache: read from it, page by page, as read_at
    reads, never more than the file holds."""
    (tree.root / "big.bin").write_bytes(os.urandom(3 * 65536 + 17))
    fd = open_regular(confined, "big.bin")
    try:
        for offset, length in [(0, 6), (0, 1 << 20), (65536, 65536), (196600, 100), (10**9, 10)]:
            assert read_cached(fd, offset, length) == read_at(fd, offset, length)
        assert read_cached(fd, 5, 0) == b""
    finally:
        os.close(fd)


def test_a_cached_read_hands_over_its_buffer_read_only(tree: Tree, confined: ConfinedDir) -> None:
    """The page is a read-only view of the buffer preadv filled, not a copy of it (a
    third of an fs_read's instructions through `up`): no one can change it through the
    view, and it is exactly the bytes read."""
    data = os.urandom(65536 + 3)
    (tree.root / "page.bin").write_bytes(data)
    fd = open_regular(confined, "page.bin")
    try:
        cached = read_cached(fd, 1, 1 << 20)
    finally:
        os.close(fd)
    assert isinstance(cached, memoryview) and cached.readonly
    assert isinstance(cached.obj, bytearray) and len(cached.obj) == len(data) - 1
    assert cached == data[1:] and bytes(cached) == data[1:]
    with pytest.raises(TypeError):
        cached[0] = 0


def test_a_page_the_kernel_let_go_is_not_read_from_the_cache(
    tree: Tree, confined: ConfinedDir
) -> None:
    path = tree.root / "cold.bin"
    with open(path, "wb") as out:
        out.write(os.urandom(1 << 20))
        out.flush()
        os.fsync(out.fileno())  # clean pages, which the kernel may drop
    fd = open_regular(confined, "cold.bin")
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        cached = read_cached(fd, 0, 1 << 20)
        if cached is not None:  # kept in memory all the same (tmpfs): never partial
            assert cached == path.read_bytes()
            pytest.skip("this file system keeps files in memory: it had the page")
        assert read_at(fd, 0, 1 << 20) == path.read_bytes()
    finally:
        os.close(fd)


# --- write_atomic ---------------------------------------------------------------------


def test_create_refuses_an_existing_name(tree: Tree, confined: ConfinedDir) -> None:
    with parent_of(confined, "sub/new.txt") as (parent, name):
        written = write_atomic(parent, name, b"new", replace=False)
        assert written.created and written.size == 3
        assert refusal(write_atomic, parent, name, b"again", replace=False).problem == (
            Problem.EXISTS
        )
    assert (tree.root / "sub" / "new.txt").read_bytes() == b"new"


def test_replace_swaps_content_and_keeps_permissions(tree: Tree, confined: ConfinedDir) -> None:
    target = tree.root / "data.txt"
    target.chmod(0o640)
    with parent_of(confined, "data.txt") as (parent, name):
        written = write_atomic(parent, name, b"replaced", replace=True)
    assert not written.created
    assert target.read_bytes() == b"replaced"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


def test_replace_never_writes_through_a_hard_link(tree: Tree, confined: ConfinedDir) -> None:
    os.link(tree.secret, tree.root / "hard")
    with parent_of(confined, "hard") as (parent, name):
        write_atomic(parent, name, b"mine now", replace=True)
    assert (tree.root / "hard").read_bytes() == b"mine now"
    assert tree.secret.read_text() == SECRET, "the other name keeps the old file"


@pytest.mark.parametrize("replace", [False, True], ids=["create", "overwrite"])
def test_a_planted_symlink_is_never_written_through(
    tree: Tree, confined: ConfinedDir, replace: bool
) -> None:
    (tree.root / "planted").symlink_to(tree.secret)
    (tree.root / "dangling").symlink_to(tree.outside / "new.txt")
    for link in ("planted", "dangling"):
        with parent_of(confined, link) as (parent, name):
            error = refusal(write_atomic, parent, name, b"pwned", replace=replace)
        assert error.problem == Problem.OUTSIDE
        assert "symbolic link" in error.message
    assert tree.secret.read_text() == SECRET
    assert not (tree.outside / "new.txt").exists()
    assert sorted(p.name for p in tree.outside.iterdir()) == ["secret.txt"]


def test_writing_onto_a_folder_or_fifo_is_refused(tree: Tree, confined: ConfinedDir) -> None:
    os.mkfifo(tree.root / "fifo")
    for path, code in (("sub", Problem.A_FOLDER), ("fifo", Problem.NOT_A_FILE)):
        with parent_of(confined, path) as (parent, name):
            assert refusal(write_atomic, parent, name, b"x", replace=True).problem == code
            assert refusal(append_bytes, parent, name, b"x").problem == code


def test_no_temporary_file_is_left_behind(tree: Tree, confined: ConfinedDir) -> None:
    with parent_of(confined, "sub/inner.txt") as (parent, name):
        write_atomic(parent, name, b"one", replace=True)
        refusal(write_atomic, parent, name, b"two", replace=False)
    assert sorted(os.listdir(tree.root / "sub")) == ["inner.txt"]


def test_a_crash_mid_write_leaves_the_old_content_whole(tree: Tree, confined: ConfinedDir) -> None:
    """A child process is killed by SIGXFSZ part-way through writing 4 MiB (its file
    size limit is 1 MiB): no cleanup runs, exactly as in a crash or power cut."""
    old = b"old content\n" * 1000
    (tree.root / "precious").write_bytes(old)
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it by default
            resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
            parent, name = confined.open_parent("precious")
            write_atomic(parent, name, b"N" * (4 << 20), replace=True)
        finally:
            os._exit(0)  # reached only if the crash did not happen
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXFSZ
    assert (tree.root / "precious").read_bytes() == old
    debris = [p for p in tree.root.iterdir() if p.name.endswith(".agentworker-tmp")]
    assert len(debris) == 1 and debris[0].stat().st_size == 1 << 20, "it died mid-write"


def _deleted_files_held() -> list[str]:
    """What this process's descriptors name that has no name any more."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.endswith(" (deleted)"):
                held.append(target)
    return held


def test_a_replaced_file_is_let_go_once_the_write_is_done(
    tree: Tree, confined: ConfinedDir
) -> None:
    """The old file is held through the rename (freed beside the answer, not inside the
    rename) and closed by the releaser: nothing of it stays open."""
    (tree.root / "big.bin").write_bytes(b"old" * 100_000)
    with parent_of(confined, "big.bin") as (parent, name):
        for content in (b"new", b"newer"):
            write_atomic(parent, name, content, replace=True)
    files.releaser.drain()
    assert (tree.root / "big.bin").read_bytes() == b"newer"
    assert not [held for held in _deleted_files_held() if "big.bin" in held]


def test_data_in_is_called_once_the_bytes_are_in_before_the_name_changes(
    tree: Tree, confined: ConfinedDir
) -> None:
    """`data_in` comes once every byte is in the temporary file and the name still
    holds the old content; a write refused before its bytes went in never calls it."""
    (tree.root / "data.txt").write_bytes(b"old")
    seen: list[tuple[bytes, list[bytes]]] = []

    def data_in() -> None:
        temps = [p.read_bytes() for p in tree.root.iterdir() if p.name.endswith("-tmp")]
        seen.append(((tree.root / "data.txt").read_bytes(), temps))

    with parent_of(confined, "data.txt") as (parent, name):
        write_atomic(parent, name, [b"new ", memoryview(b"bytes")], replace=True, data_in=data_in)
        refusal(write_atomic, parent, name, b"x", replace=False, data_in=data_in)
        append_bytes(parent, name, b"!", data_in=data_in)
    with parent_of(confined, "sub") as (parent, name):
        refusal(append_bytes, parent, name, b"x", data_in=data_in)
    assert seen == [(b"old", [b"new bytes"]), (b"new bytes!", [])]
    assert (tree.root / "data.txt").read_bytes() == b"new bytes!"


def test_before_place_comes_once_the_file_is_on_disk_and_its_no_places_nothing(
    tree: Tree, confined: ConfinedDir
) -> None:
    """`before_place` (fs_write's wait for its claim) comes with every byte in the
    temporary file and the name unchanged; when it raises, the temporary file goes and
    the name keeps its old content (or stays free)."""
    (tree.root / "data.txt").write_bytes(b"old")
    seen: list[tuple[bytes, list[bytes]]] = []

    def look() -> list[bytes]:
        return [p.read_bytes() for p in tree.root.iterdir() if p.name.endswith("-tmp")]

    def placed() -> None:
        seen.append(((tree.root / "data.txt").read_bytes(), look()))

    def refused() -> None:
        placed()
        raise RuntimeError("not claimed")

    with parent_of(confined, "data.txt") as (parent, name):
        write_atomic(parent, name, [b"new ", b"bytes"], replace=True, before_place=placed)
        with pytest.raises(RuntimeError, match="not claimed"):
            write_atomic(parent, name, b"newer", replace=True, before_place=refused)
    with (
        parent_of(confined, "fresh.txt") as (parent, name),
        pytest.raises(RuntimeError, match="not claimed"),
    ):
        write_atomic(parent, name, b"never", replace=False, before_place=refused)
    assert seen == [
        (b"old", [b"new bytes"]),
        (b"new bytes", [b"newer"]),
        (b"new bytes", [b"never"]),
    ]
    assert (tree.root / "data.txt").read_bytes() == b"new bytes"
    assert not (tree.root / "fresh.txt").exists() and look() == []


def test_a_crash_while_waiting_to_place_leaves_the_old_content_and_a_temporary_file_swept_later(
    tree: Tree, confined: ConfinedDir
) -> None:
    """The worker dies (SIGKILL: no cleanup runs) with the new content on disk in its
    temporary file, waiting for its claim: the name still holds the old content whole,
    and the temporary file is our leftover, which a sweep takes once it is stale."""
    old, new = b"old content\n" * 1000, os.urandom(3 * files.WRITEBACK_BYTES + 5)
    (tree.root / "precious").write_bytes(old)
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            parent, name = confined.open_parent("precious")
            die = lambda: os.kill(os.getpid(), signal.SIGKILL)  # noqa: E731
            write_atomic(parent, name, new, replace=True, before_place=die)
        finally:
            os._exit(0)  # reached only if the crash did not happen
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert (tree.root / "precious").read_bytes() == old
    (debris,) = [p for p in tree.root.iterdir() if p.name.endswith(".agentworker-tmp")]
    assert debris.read_bytes() == new, "it died with the whole file written"
    folder = os.open(tree.root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        stale = time.time() + _leftovers.STALE_S + 1
        assert Leftovers().sweep(folder, now=stale) == [debris.name]
    finally:
        os.close(folder)
    assert not debris.exists() and (tree.root / "precious").read_bytes() == old


def test_a_rename_that_fails_leaves_no_temporary_file_and_holds_nothing(
    tree: Tree, confined: ConfinedDir
) -> None:
    """The name turns into a folder once the bytes are in (another program's doing):
    the rename fails, the temporary file goes, and what was held for it is let go."""
    target = tree.root / "swapped"
    target.write_bytes(b"old" * 100_000)

    def swap() -> None:
        target.unlink()
        target.mkdir()
        (target / "inside").write_bytes(b"keep")

    with parent_of(confined, "swapped") as (parent, name):
        error = refusal(write_atomic, parent, name, b"new", replace=True, data_in=swap)
    assert error.problem == Problem.A_FOLDER
    files.releaser.drain()
    assert sorted(os.listdir(tree.root / "swapped")) == ["inside"]
    assert not [p for p in tree.root.iterdir() if p.name.endswith(".agentworker-tmp")]
    assert not [held for held in _deleted_files_held() if "swapped" in held]


def _recording_writeback(
    monkeypatch: pytest.MonkeyPatch, real: bool = True
) -> list[tuple[int, int]]:
    """The ranges whose writeback a write starts (the real hint still given), or with
    `real` False, a system without sync_file_range."""
    started: list[tuple[int, int]] = []
    start = files._writeback()
    if real:
        assert start is not None, "Linux has sync_file_range"

    def recorded(fd: int, offset: int, length: int) -> object:
        started.append((offset, length))
        return None if start is None else start(fd, offset, length)

    monkeypatch.setattr(files, "_writeback", lambda: recorded if real else None)
    return started


def test_a_large_write_starts_its_writeback_slice_by_slice(
    tree: Tree, confined: ConfinedDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pieces of odd sizes, across slice boundaries: every byte lands in order, and the
    writeback of each whole slice is started as it goes in (the tail is the fsync's);
    an append's slices are counted from where the file ended."""
    started = _recording_writeback(monkeypatch)
    slice_ = files.WRITEBACK_BYTES
    pieces = [os.urandom(3), os.urandom(slice_ + 5), memoryview(os.urandom(700_000))]
    pieces += [os.urandom(2 * slice_ - 3), b"", os.urandom(123_457)]
    data = b"".join(pieces)
    with parent_of(confined, "big.bin") as (parent, name):
        written = write_atomic(parent, name, pieces, replace=True)
        assert written.size == len(data)
        assert (tree.root / "big.bin").read_bytes() == data
        _in_order_from(0, started, len(data))
        started.clear()
        append_bytes(parent, name, pieces)
    assert (tree.root / "big.bin").read_bytes() == data + data
    _in_order_from(len(data), started, len(data))


def _in_order_from(at: int, started: list[tuple[int, int]], size: int) -> None:
    """Slices of at least WRITEBACK_BYTES each, one after another from `at`, leaving
    less than one slice to the fsync."""
    for offset, length in started:
        assert offset == at and length >= files.WRITEBACK_BYTES
        at += length
    assert 0 <= size - sum(length for _offset, length in started) < files.WRITEBACK_BYTES


def test_wrote_tells_how_much_is_in_as_it_goes_in(tree: Tree, confined: ConfinedDir) -> None:
    """`wrote` counts the bytes of `data` in the file after each write: a slice at a
    time for a large write, up to all of it, for a replace and an append alike."""
    large = [os.urandom(files.WRITEBACK_BYTES + 1), os.urandom(files.WRITEBACK_FROM)]
    for data, count in ((b"small", 5), (large, sum(len(p) for p in large))):
        counts: list[int] = []
        with parent_of(confined, "counted.bin") as (parent, name):
            write_atomic(parent, name, data, replace=True, wrote=counts.append)
            assert counts == sorted(counts) and counts[-1] == count
            assert all(
                b - a <= files.WRITEBACK_BYTES for a, b in zip([0, *counts], counts, strict=False)
            )
            counts.clear()
            append_bytes(parent, name, data, wrote=counts.append)
            assert counts == sorted(counts) and counts[-1] == count


def test_a_small_write_or_a_system_without_the_hint_writes_all_the_same(
    tree: Tree, confined: ConfinedDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = _recording_writeback(monkeypatch)
    small = os.urandom(files.WRITEBACK_FROM - 1)
    with parent_of(confined, "small.bin") as (parent, name):
        write_atomic(parent, name, small, replace=True)
    assert (tree.root / "small.bin").read_bytes() == small and started == []
    _recording_writeback(monkeypatch, real=False)
    large = os.urandom(3 * files.WRITEBACK_BYTES + 1)
    with parent_of(confined, "large.bin") as (parent, name):
        write_atomic(parent, name, [large[:10], large[10:]], replace=False)
    assert (tree.root / "large.bin").read_bytes() == large


# --- append_bytes ---------------------------------------------------------------------


def test_append_adds_to_the_end_and_creates_when_missing(tree: Tree, confined: ConfinedDir) -> None:
    with parent_of(confined, "log.txt") as (parent, name):
        first = append_bytes(parent, name, b"one\n")
        second = append_bytes(parent, name, b"two\n")
    assert first.created and not second.created and second.size == 8
    assert (tree.root / "log.txt").read_bytes() == b"one\ntwo\n"


def test_append_refuses_links(tree: Tree, confined: ConfinedDir) -> None:
    (tree.root / "planted").symlink_to(tree.secret)
    os.link(tree.secret, tree.root / "hard")
    with parent_of(confined, "planted") as (parent, name):
        assert refusal(append_bytes, parent, name, b"x").problem == Problem.OUTSIDE
    with parent_of(confined, "hard") as (parent, name):
        assert isinstance(refusal(append_bytes, parent, name, b"x"), HardLinkError)
    assert tree.secret.read_text() == SECRET


# --- make_parents ---------------------------------------------------------------------


def test_make_parents_creates_missing_folders(tree: Tree, confined: ConfinedDir) -> None:
    make_parents(confined, "sub/a/b/c/file.txt")
    assert (tree.root / "sub" / "a" / "b" / "c").is_dir()
    make_parents(confined, "sub/a/b/c/file.txt")  # again: nothing to do


def test_make_parents_does_not_follow_a_link_out(tree: Tree, confined: ConfinedDir) -> None:
    (tree.root / "esc").symlink_to(tree.outside)
    assert refusal(make_parents, confined, "esc/new/file.txt").problem == Problem.OUTSIDE
    assert not (tree.outside / "new").exists()


def test_make_parents_stops_at_a_file(confined: ConfinedDir) -> None:
    assert refusal(make_parents, confined, "data.txt/x/file.txt").problem == Problem.NOT_A_FOLDER


def test_replace_keeps_the_owner_where_it_may(tree: Tree, confined: ConfinedDir) -> None:
    target = tree.root / "data.txt"
    if os.geteuid() == 0:
        os.chown(target, 65534, 65534)  # as root the worker must not take the file over
    before = target.stat()
    with parent_of(confined, "data.txt") as (parent, name):
        write_atomic(parent, name, b"replaced", replace=True)
    after = target.stat()
    assert (after.st_uid, after.st_gid) == (before.st_uid, before.st_gid)
