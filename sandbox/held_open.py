"""Disk a sandbox's programs hold in files they removed but keep open or mapped.

A file a program unlinks while it holds it open (or mapped) keeps its blocks until
the last descriptor and mapping go, and no walk of the workspace's names sees it.
Each such file is bounded by RLIMIT_FSIZE (the room left in the plan's quota) and
their number by the sandbox's open-files and mapping limits, which together are many
times the quota. So while a program runs, the workbench's watch adds what this module
finds to its count of the workspace (worker.actions.workbench, `_overfilled`).

Found by pid, from the outside: every process descended from bubblewrap's (all of the
sandbox's processes are: orphans in its pid namespace go to its pid 1), and in each,

- every thread's descriptor table (a thread may have a table of its own, and a
  process whose first thread exited shows no table at /proc/PID/fd), and
- its memory map (a file mapped and then closed has no descriptor left),

each regular file with no name left (st_nlink 0) on the workspace's file system,
counted once per inode by its allocated blocks. The file system is told by its
superblock's device, as memory maps name it: on btrfs stat's st_dev is a device per
subvolume, and a program may make subvolumes in its workspace (review7 finding 08), so
a removed file there is placed by its descriptor's mount (fdinfo's mnt_id, in the
process's mountinfo). A mapped file's blocks can be read
only by a root worker (/proc/PID/map_files); any other worker counts each one at
`unknown_bytes`, the most RLIMIT_FSIZE let it hold. Files on another file system (the
sandbox's private /tmp, bounded by its size) are not the workspace's.

What cannot be looked at fails closed (`UnseenError`): a process whose tables are not
ours to read (one that made itself non-dumpable, which the seccomp filter refuses),
or more descriptors and mappings than the sandbox's limits allow. A file passed in a
socket message still in flight (SCM_RIGHTS) is in no process's table: /proc cannot
show it, and only a per-plan file-system quota would bound it.

Standard library only, no worker imports: it can be reviewed and tested alone.
"""

from __future__ import annotations

import os
import stat
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Final

# Descriptors and mapped ranges one look examines, at most: what a sandbox may hold
# with the default limits (64 processes of 1,024 files), and as many mappings. About
# 5 us each. The worker passes its own figure from the limits it ran the program with.
MOST_LOOKED_AT: Final = 65_536
_DELETED: Final = b" (deleted)"


class UnseenError(Exception):
    """Part of what the sandbox holds could not be looked at; the message says which."""


# What reading a process's /proc files raises once it has ended. Any other error (no
# descriptor left: EMFILE) is raised to the caller: a process, thread or file left out
# of a look would be neither stopped nor counted (review7 finding 06).
GONE: Final = (FileNotFoundError, ProcessLookupError)


def descendants(pid: int) -> list[int]:
    """`pid`'s descendants now (a moment's view), not `pid` itself: read down from it
    through each thread's children file (Linux's CONFIG_PROC_CHILDREN), so the cost is
    the sandbox's processes, not the machine's; the machine's /proc where the kernel
    has no such file."""
    if not os.path.exists(f"/proc/{pid}/task/{pid}/children"):
        return _descendants_by_parent(pid)
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        for thread in _threads(parent):
            try:
                with open(f"/proc/{parent}/task/{thread}/children", "rb") as handle:
                    children = [int(word) for word in handle.read().split()]
            except GONE:  # ended meanwhile
                continue
            # Any other error (no descriptor left: EMFILE) is raised: a process left out
            # would be neither stopped nor looked at (review7 finding 06).
            found += children
            todo += children
    return found


def _threads(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except GONE:  # it ended meanwhile
        return []


def _descendants_by_parent(pid: int) -> list[int]:
    children: defaultdict[int, list[int]] = defaultdict(list)
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = stat_fields(f"/proc/{name}")
        if fields is not None:  # else it ended meanwhile
            children[int(fields[1])].append(int(name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def superblock_device(path: str) -> int:
    """The device of the file system holding `path` as memory maps and mountinfo name
    it (its superblock's); stat's st_dev is another on btrfs, one per subvolume."""
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        mount = _mount_id(f"/proc/self/fdinfo/{fd}")
        devices = _mount_devices("/proc/self")
    finally:
        os.close(fd)
    if mount is None or mount not in devices:
        raise OSError(f"no mount of {path} in /proc/self/mountinfo")
    return devices[mount]


def _mount_id(fdinfo: str) -> int | None:
    with open(fdinfo, "rb") as handle:
        for line in handle:
            if line.startswith(b"mnt_id:"):
                return int(line.split()[1])
    return None


def _mount_devices(process: str) -> dict[int, int]:
    """Mount id -> its file system's device, in `process`'s mount namespace."""
    devices = {}
    with open(f"{process}/mountinfo", "rb") as handle:
        for line in handle:
            fields = line.split(maxsplit=3)  # id, parent id, major:minor, ...
            major, minor = fields[2].split(b":")
            devices[int(fields[0])] = os.makedev(int(major), int(minor))
    return devices


@dataclass
class _Look:
    device: int  # the workspace's st_dev
    superblock: int  # its file system's device (the same but on btrfs)
    unknown_bytes: int
    left: int  # descriptors and mappings still to look at
    seen: set[tuple[int, int]] = field(default_factory=set)  # (device, inode) counted
    total: int = 0
    mounts: dict[str, dict[int, int]] = field(default_factory=dict)  # per process

    def on_workspace_fs(self, task: str, name: str, st: os.stat_result) -> bool:
        """Whether descriptor `name` of `task` (a /proc thread folder), a removed file
        `st`, is on the workspace's file system."""
        if st.st_dev == self.device:
            return True
        if self.superblock == self.device:  # st_dev is the file system's: another one
            return False
        process = "/".join(task.split("/")[:3])
        try:
            mount = _mount_id(f"{task}/fdinfo/{name}")
            if process not in self.mounts:
                self.mounts[process] = _mount_devices(process)
        except GONE:  # closed, or ended, meanwhile
            return False
        # A mount not listed (gone meanwhile): counted, as the look fails closed.
        return self.mounts[process].get(mount or -1, self.superblock) == self.superblock

    def spend(self, count: int) -> None:
        self.left -= count
        if self.left < 0:
            raise UnseenError(
                "the program holds more open files and mapped ranges than its limits "
                "allow to be looked at"
            )

    def count(self, inode: tuple[int, int], size: int) -> None:
        if inode not in self.seen:
            self.seen.add(inode)
            self.total += size


def held_open_bytes(
    pid: int,
    device: int,
    *,
    unknown_bytes: int,
    most: int = MOST_LOOKED_AT,
    superblock: int | None = None,
) -> int:
    """Bytes on disk (allocated blocks) of files on the file system of `device` (a
    stat's st_dev; `superblock` its superblock's device where that differs, on btrfs:
    `superblock_device`) that no name leads to any more and that `pid`'s descendants
    hold open or mapped; 0 once they have all ended. A removed mapped file whose blocks
    cannot be read counts `unknown_bytes`. Raises UnseenError past `most` descriptors
    and mappings, or for a table not ours to read."""
    look = _Look(device, device if superblock is None else superblock, unknown_bytes, most)
    for process in descendants(pid):
        mapped = False
        for thread in _threads(process):
            _descriptors(look, f"/proc/{process}/task/{thread}")
            # Threads share one memory map; a thread that ended (the first, say) shows
            # none, so the first that shows one is read.
            mapped = mapped or _mappings(look, process, thread)
    return look.total


def _descriptors(look: _Look, task: str) -> None:
    try:
        names = os.listdir(f"{task}/fd")
    except PermissionError:
        if _ended(task):  # an ended thread's files (root's, then) are closed
            return
        raise UnseenError(
            f"the open files of process {task.split('/')[2]} are not ours to read"
        ) from None
    except GONE:  # it ended
        return
    look.spend(len(names))
    for name in names:
        try:
            st = os.stat(f"{task}/fd/{name}")  # the open file itself, not the link
        except OSError:
            continue
        if st.st_nlink or not stat.S_ISREG(st.st_mode):
            continue
        if look.on_workspace_fs(task, name, st):
            look.count((st.st_dev, st.st_ino), st.st_blocks * 512)


def stat_fields(folder: str) -> list[bytes] | None:
    """The fields of the stat file of `folder` (a process's or a thread's /proc folder)
    after its name, state first, then the parent's pid; None once it is gone. The name
    (in parentheses) may hold spaces and parentheses, so the fields start after its
    last ")"."""
    try:
        with open(f"{folder}/stat", "rb") as handle:
            line = handle.read()
    except GONE:
        return None
    return line[line.rindex(b")") + 2 :].split()


def _ended(task: str) -> bool:
    """Whether the thread at `task` (a /proc folder) has exited: a zombie, or gone."""
    fields = stat_fields(task)
    return fields is None or fields[0] in (b"Z", b"X")


def _mappings(look: _Look, process: int, thread: str) -> bool:
    """Counts the removed files `thread`'s memory map holds; False if it shows none."""
    try:
        with open(f"/proc/{process}/task/{thread}/maps", "rb") as handle:
            lines = handle.read().splitlines()
    except PermissionError:
        raise UnseenError(f"the memory map of process {process} is not ours to read") from None
    except GONE:  # it ended
        return False
    look.spend(len(lines))
    for line in lines:
        if not line.endswith(_DELETED):
            continue
        # start-end perms offset major:minor inode path
        span, _, _, dev, inode = line.split(maxsplit=5)[:5]
        major, minor = (int(part, 16) for part in dev.split(b":"))
        mapped_on = os.makedev(major, minor)  # the superblock's device
        if mapped_on not in (look.device, look.superblock):
            continue
        try:
            # A thread's own pid shows its map's files (/proc/PID/task/TID has none).
            st = os.stat(f"/proc/{thread}/map_files/{span.decode()}")
        except PermissionError:  # only root may follow these links
            look.count((mapped_on, int(inode)), look.unknown_bytes)
            continue
        except OSError:  # unmapped meanwhile
            continue
        if st.st_nlink == 0 and stat.S_ISREG(st.st_mode):
            look.count((st.st_dev, st.st_ino), st.st_blocks * 512)
    return bool(lines)
