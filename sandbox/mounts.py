"""Which shared folders no path lookup can hang in: every mount on the way to them and
beneath them is of a file system the kernel serves from local storage or memory.

A lookup, an open or a stat on a file system served from elsewhere waits for that
server: a FUSE mount whose daemon is stopped or gone (sshfs, rclone), NFS, CIFS, 9p
or ceph whose server does not answer. It may wait forever, and it cannot be
interrupted. The worker makes a few such system calls on its event loop for speed
(fs_stat; fs_read of a cached page; exec's path checks), where one that never
returns would stop every other call, the heartbeats and the kill switch; it does so
only under a root this module calls local, and in a thread everywhere else.

Fail safe: a type not in LOCAL_TYPES counts as one that may hang (FUSE of any kind,
network file systems, autofs, which may mount one on a lookup), and so does every
root where the mount table cannot be read (no /proc: macOS, Windows).

The table (`MountTable`, one per worker, in its `Containment`) is /proc/self/mountinfo,
read again only when the kernel says it changed:
the file reports POLLPRI after a mount or unmount in this mount namespace, and a
`poll` with no wait per check (about a microsecond) asks. A mount made between
that check and the lookup (microseconds) is not seen by that call.
"""

from __future__ import annotations

import os
import re
import select
import threading
import weakref
from collections.abc import Iterable
from typing import Final

MOUNTINFO: Final = "/proc/self/mountinfo"

# Served by the kernel from a local block device or from memory: a lookup there never
# waits for another machine or a process of user space.
LOCAL_TYPES: Final = frozenset(
    {
        "ext2",
        "ext3",
        "ext4",
        "xfs",
        "btrfs",
        "bcachefs",
        "f2fs",
        "jfs",
        "reiserfs",
        "nilfs2",
        "zfs",
        "vfat",
        "msdos",
        "exfat",
        "ntfs3",
        "hfsplus",
        "iso9660",
        "udf",
        "squashfs",
        "erofs",
        "tmpfs",
        "ramfs",
        "overlay",
        "devtmpfs",
        "devpts",
        "mqueue",
        "hugetlbfs",
        "proc",
        "sysfs",
        "cgroup",
        "cgroup2",
        "tracefs",
        "debugfs",
        "securityfs",
        "pstore",
        "bpf",
        "configfs",
        "efivarfs",
    }
)

_ESCAPE: Final = re.compile(r"\\([0-7]{3})")  # the kernel writes space, tab, \n, \ as \ooo
_CACHED: Final = 4096  # verdicts kept (one per root; a sandbox makes one root per plan)


def parse(mountinfo: str) -> list[tuple[str, str]]:
    """(mount point, file system type) of each line of a mountinfo text."""
    mounts = []
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, after = head.split(" "), tail.split(" ")
        if not sep or len(fields) < 5 or not after[0]:
            continue
        point = _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), fields[4])
        mounts.append((point, after[0]))
    return mounts


def local_under(mounts: Iterable[tuple[str, str]], path: str) -> bool:
    """Whether every mount a lookup to or beneath `path` (absolute, no '..') may cross
    is of a local type: those at `path` and its parents, and those inside it."""
    path = path.rstrip("/") or "/"
    inside = "/" if path == "/" else path + "/"
    for point, kind in mounts:
        on_the_way = point == "/" or point == path or inside.startswith(point.rstrip("/") + "/")
        if (on_the_way or point.startswith(inside)) and kind not in LOCAL_TYPES:
            return False
    return True


class MountTable:
    """This process's mounts, read again when they change; verdicts kept per path."""

    def __init__(self, path: str = MOUNTINFO) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._verdicts: dict[str, bool] = {}
        self._mounts: list[tuple[str, str]] | None = None
        self._fd = -1  # opened at the first question; closed with the table
        self._closer: weakref.finalize[[int], MountTable] | None = None
        self._poll: select.poll | None = None
        self._opened = False

    def _open(self) -> None:
        self._opened = True
        try:
            self._fd = os.open(self._path, os.O_RDONLY | os.O_CLOEXEC)
            self._closer = weakref.finalize(self, os.close, self._fd)
            self._poll = select.poll()
            self._poll.register(self._fd, select.POLLPRI)
            self._mounts = self._read()
        except (OSError, AttributeError, ValueError):  # no /proc (or no poll): none is local
            self.close()
            self._mounts = None

    def _read(self) -> list[tuple[str, str]]:
        chunks = []
        offset = 0
        while chunk := os.pread(self._fd, 1 << 16, offset):
            chunks.append(chunk)
            offset += len(chunk)
        return parse(b"".join(chunks).decode("utf-8", "surrogateescape"))

    def local(self, path: str) -> bool:
        """Whether no lookup to or beneath `path` can reach a file system that may hang."""
        with self._lock:
            if not self._opened:
                self._open()
            elif self._poll is not None and self._poll.poll(0):  # mounted or unmounted since
                try:
                    self._mounts = self._read()
                except OSError:
                    self._mounts = None
                self._verdicts.clear()
            verdict = self._verdicts.get(path)
            if verdict is None:
                verdict = self._mounts is not None and local_under(self._mounts, path)
                if len(self._verdicts) >= _CACHED:
                    self._verdicts.clear()
                self._verdicts[path] = verdict
            return verdict

    def close(self) -> None:
        if self._closer is not None:
            self._closer()
            self._closer = None
        self._fd = -1
        self._poll = None
