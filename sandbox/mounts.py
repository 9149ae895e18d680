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

A local type is not enough where that file system itself reads from elsewhere: an
overlay looks names up in its upper and lower folders, which may lie on FUSE or NFS
(mounted anywhere, not on the way to the root), and an ext4 or squashfs on a loop
device reads its backing file, which may too (review8 finding 05). So an overlay is
local only when each of its folders (its mountinfo options: lowerdir, upperdir,
lowerdir+, datadir+) is, by the same rule, and a file system on a loop device only
when its backing file is (/sys/dev/block/M:N/loop/backing_file). A block device
served by a program or a network (nbd, ublk, drbd, rbd) may hang; so may a loop
device whose backing file cannot be read. An overlay without folders in its options
counts as one that may hang. (iSCSI disks look like any SCSI disk: not told apart.)

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
from collections.abc import Callable, Iterable, Iterator
from typing import Final, NamedTuple

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
# Options of an overlay that name its folders (layers), each a path whose own mounts count.
_LAYER_OPTIONS: Final = ("lowerdir", "upperdir", "lowerdir+", "datadir+")
# Block devices served by a program of this machine or by another machine: what a file
# system on them reads may never come (by the device's kernel name, without its number).
_REMOTE_DEVICES: Final = re.compile(r"(nbd|ublkb|drbd|rbd)\d")
_SYS_BLOCK: Final = "/sys/dev/block"


class Mount(NamedTuple):
    point: str  # where it is mounted
    kind: str  # its file system type
    device: str = ""  # major:minor
    layers: tuple[str, ...] | None = ()  # an overlay's folders; None: unknown


# What the block device "major:minor" reads from: () a device of this machine, a tuple
# of paths (a loop device's backing file) that must be local too, None: may hang.
Backing = Callable[[str], "tuple[str, ...] | None"]


def _unescape(text: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), text)


def _layers(options: str) -> tuple[str, ...] | None:
    """An overlay's folders, from its super options (None when none are named)."""
    layers: list[str] = []
    for option in options.split(","):  # a comma inside a value is written \054
        name, _, value = _unescape(option).partition("=")
        if name not in _LAYER_OPTIONS:
            continue
        # lowerdir is a ':' list ('::' before data layers); '\' escapes ':' and ','.
        for part in re.split(r"(?<!\\):", value):
            if part:
                layers.append(re.sub(r"\\(.)", r"\1", part))
    return tuple(layers) or None


def parse(mountinfo: str) -> list[Mount]:
    """Each mount of a mountinfo text: its point, type, device and (overlay) folders."""
    mounts = []
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, after = head.split(" "), tail.split(" ")
        if not sep or len(fields) < 5 or not after[0]:
            continue
        kind = after[0]
        layers = _layers(after[2] if len(after) > 2 else "") if kind == "overlay" else ()
        mounts.append(Mount(_unescape(fields[4]), kind, fields[2], layers))
    return mounts


def _plain(device: str) -> tuple[str, ...] | None:
    """Backing of no device: every device counts as this machine's own."""
    return ()


def block_backing(device: str, sys_block: str = _SYS_BLOCK) -> tuple[str, ...] | None:
    """What block device `device` ("major:minor") reads from, by /sys: a loop device
    its backing file (a partition, its whole device's), nbd/ublk/drbd/rbd None (may
    hang), any other device () (a disk of this machine). No /sys/dev/block at all:
    () for every device (nothing to tell them apart by, as before this check)."""
    if device.startswith("0:") or not os.path.isdir(sys_block):
        return ()  # major 0: no device (tmpfs, btrfs's anonymous numbers)
    node = os.path.join(sys_block, device)
    try:
        real = os.path.realpath(node)
        if os.path.exists(os.path.join(real, "partition")):
            real = os.path.dirname(real)
        name = os.path.basename(real)
        if _REMOTE_DEVICES.match(name):
            return None
        if name.startswith("loop"):
            with open(os.path.join(real, "loop", "backing_file"), encoding="utf-8") as f:
                backing = f.read().rstrip("\n")
            return (backing,) if backing.startswith("/") else None
    except (OSError, UnicodeDecodeError):
        return None  # a loop device whose file cannot be told: may hang
    return ()


def local_under(mounts: Iterable[Mount], path: str, backing: Backing = _plain) -> bool:
    """Whether every mount a lookup to or beneath `path` (absolute, no '..') may cross
    is of a local type, and so is what each reads from (an overlay's folders, a loop
    device's backing file): those at `path` and its parents, and those inside it."""
    return _local(list(mounts), path, backing, set())


def may_hang_under(mounts: Iterable[Mount], path: str, backing: Backing = _plain) -> list[Mount]:
    """The mounts on the way to or beneath `path` that `local_under` finds may hang."""
    listed = list(mounts)
    return [m for m in _crossed(listed, path) if not _mount_local(listed, m, backing, {path})]


def _crossed(mounts: list[Mount], path: str) -> Iterator[Mount]:
    """The mounts a lookup to or beneath `path` may cross."""
    path = path.rstrip("/") or "/"
    inside = "/" if path == "/" else path + "/"
    for mount in mounts:
        point = mount.point
        on_the_way = point == "/" or point == path or inside.startswith(point.rstrip("/") + "/")
        if on_the_way or point.startswith(inside):
            yield mount


def _local(mounts: list[Mount], path: str, backing: Backing, seen: set[str]) -> bool:
    if path in seen:  # a folder already being judged: its answer comes from there
        return True
    seen.add(path)
    return all(_mount_local(mounts, m, backing, seen) for m in _crossed(mounts, path))


def _mount_local(mounts: list[Mount], mount: Mount, backing: Backing, seen: set[str]) -> bool:
    if mount.kind not in LOCAL_TYPES:
        return False
    sources = mount.layers if mount.kind == "overlay" else backing(mount.device)
    if sources is None:
        return False
    return all(
        source.startswith("/") and _local(mounts, source, backing, seen) for source in sources
    )


class MountTable:
    """This process's mounts, read again when they change; verdicts kept per path."""

    def __init__(self, path: str = MOUNTINFO, backing: Backing = block_backing) -> None:
        self._path = path
        self._backing = backing
        self._lock = threading.Lock()
        self._verdicts: dict[str, bool] = {}
        self._mounts: list[Mount] | None = None
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

    def _read(self) -> list[Mount]:
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
                verdict = self._mounts is not None and local_under(
                    self._mounts, path, self._backing
                )
                if len(self._verdicts) >= _CACHED:
                    self._verdicts.clear()
                self._verdicts[path] = verdict
            return verdict

    def may_hang(self, path: str) -> tuple[str, ...]:
        """The mounts on the way to or beneath `path` that may hang, as "type at point"
        (for a message: not kept; empty where the table cannot be read)."""
        with self._lock:
            mounts = self._mounts
        if mounts is None:
            return ()
        return tuple(f"{m.kind} at {m.point}" for m in may_hang_under(mounts, path, self._backing))

    def close(self) -> None:
        if self._closer is not None:
            self._closer()
            self._closer = None
        self._fd = -1
        self._poll = None
