"""Resolve a path beneath a directory fd one component at a time (no openat2).

Every step is an openat() with O_NOFOLLOW relative to a directory fd already held,
so the kernel never follows a symlink or '..' for us. Symlinks are followed by
hand: the target is read from the very inode that was opened and resolved by the
same rules, so a link only takes effect while it stays beneath the root. '..' goes
back to the directory fd we came from instead of asking the kernel for a parent.

Known limit, shared with RESOLVE_BENEATH (which re-checks only at '..'): if another
process moves a directory out of the root while the walk is inside it, the walk
goes along with it. Escapes need write access outside the root to set up.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
from pathlib import Path

from sandbox._lexical import beneath, components

MAX_HOPS = 40  # the kernel's MAXSYMLINKS


def walk_open(root_fd: int, root: Path, relative: str, flags: int, mode: int) -> int:
    """Open `relative` (no leading '/') beneath `root_fd`, whose path is `root`.

    Raises OSError like openat2 with RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS would:
    EXDEV for a way out, ELOOP for loops and /proc magic links.
    """
    follow_last = not flags & os.O_NOFOLLOW
    todo = [part for part in relative.split("/") if part not in ("", ".")]
    held: list[int] = []  # directories entered beneath root_fd, innermost last
    hops = 0
    try:
        while todo:
            here = held[-1] if held else root_fd
            name = todo.pop(0)
            if name == "..":
                if not held:
                    raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))
                os.close(held.pop())
                continue
            if todo:
                fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=here)
                kind = os.fstat(fd).st_mode
                if stat.S_ISDIR(kind):
                    held.append(fd)
                    continue
                if not stat.S_ISLNK(kind):
                    os.close(fd)
                    raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
                target = _read_link(fd)
            else:
                opened = _open_last(here, name, flags, mode, follow_last)
                if isinstance(opened, int):
                    return opened
                target = opened
            hops += 1
            if hops > MAX_HOPS or _in_proc_subdir(here):
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
            if target.startswith("/"):
                inside = beneath(root.parts, components(target) or [])
                if inside is None:
                    raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))
                while held:  # restart from the root
                    os.close(held.pop())
                todo[:0] = inside
            else:
                todo[:0] = [part for part in target.split("/") if part not in ("", ".")]
        # Nothing left to resolve: the path named a directory we hold (or the root).
        return os.open(".", flags, mode, dir_fd=held[-1] if held else root_fd)
    finally:
        for fd in held:
            os.close(fd)


def _open_last(dir_fd: int, name: str, flags: int, mode: int, follow: bool) -> int | str:
    """Open the final component; return its fd, or its target text if it is a link to follow."""
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW, mode, dir_fd=dir_fd)
    except OSError as exc:
        # O_NOFOLLOW on a symlink fails with ELOOP, or ENOTDIR when O_DIRECTORY is set.
        if not follow or exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        failure = exc
    else:
        # O_PATH | O_NOFOLLOW opens a symlink itself instead of failing.
        if follow and flags & os.O_PATH and stat.S_ISLNK(os.fstat(fd).st_mode):
            return _read_link(fd)
        return fd
    try:
        link = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        raise failure from None
    if not stat.S_ISLNK(os.fstat(link).st_mode):
        os.close(link)
        raise failure
    return _read_link(link)


def _read_link(fd: int) -> str:
    """The target of the symlink open as O_PATH `fd` (which is closed)."""
    try:
        return os.readlink("", dir_fd=fd)  # the link we hold, not whatever the name is now
    finally:
        os.close(fd)


@functools.cache
def _proc_root() -> os.stat_result | None:
    try:
        return os.stat("/proc")
    except OSError:
        return None


def _in_proc_subdir(dir_fd: int) -> bool:
    """Whether a link in `dir_fd` could be a /proc magic link (like /proc/self/fd/3).

    Links directly in /proc (self, thread-self, mounts) are ordinary; those in the
    per-process directories below are magic. openat2 refuses magic links outright
    (RESOLVE_NO_MAGICLINKS); this keeps the walk's answer the same.
    """
    proc = _proc_root()
    if proc is None:
        return False
    here = os.fstat(dir_fd)
    return here.st_dev == proc.st_dev and here.st_ino != proc.st_ino
