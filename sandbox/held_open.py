"""Disk a sandbox's programs hold in files they removed but keep open.

A file a program unlinks while it holds it open keeps its blocks until the last
descriptor closes, and no walk of the workspace's names sees it. Each such file is
bounded by RLIMIT_FSIZE (the room left in the plan's quota) and their number by the
sandbox's open-files limit, which together are many times the quota. So while a
program runs, the workbench's watch adds what this module finds to its count of the
workspace (worker.actions.workbench, `_overfilled`).

Found by pid, from the outside: every process descended from bubblewrap's (all of the
sandbox's processes are: orphans in its pid namespace go to its pid 1), each of its
descriptors that leads to a regular file with no name left (st_nlink 0) on the
workspace's file system, counted once per inode by its allocated blocks. Files on
another file system (the sandbox's private /tmp, memfds) are memory, bounded elsewhere.

Standard library only, no worker imports: it can be reviewed and tested alone.
"""

from __future__ import annotations

import os
import stat
from collections import defaultdict
from typing import Final

# Descriptors one look examines, at most: what a sandbox may hold with the default
# limits (64 processes of 1,024 files). About 5 us each.
MOST_LOOKED_AT: Final = 65_536


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
        try:
            threads = os.listdir(f"/proc/{parent}/task")
        except OSError:  # it ended meanwhile
            continue
        for thread in threads:
            try:
                with open(f"/proc/{parent}/task/{thread}/children", "rb") as handle:
                    children = [int(word) for word in handle.read().split()]
            except OSError:
                continue
            found += children
            todo += children
    return found


def _descendants_by_parent(pid: int) -> list[int]:
    children: defaultdict[int, list[int]] = defaultdict(list)
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                line = handle.read()
        except OSError:  # it ended meanwhile
            continue
        # The name (in parentheses) may hold spaces and parentheses: the fields after
        # its last ")" are state, then the parent's pid.
        fields = line[line.rindex(b")") + 2 :].split()
        children[int(fields[1])].append(int(name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def held_open_bytes(pid: int, device: int, most: int = MOST_LOOKED_AT) -> int:
    """Bytes on disk (allocated blocks) of files on `device` that no name leads to any
    more and that `pid`'s descendants hold open; 0 once they have all ended. At most
    `most` descriptors are looked at (the cost is the program's to choose)."""
    seen: set[int] = set()
    total = 0
    for process in descendants(pid):
        folder = f"/proc/{process}/fd"
        try:
            names = os.listdir(folder)
        except OSError:  # ended, or not ours to look into
            continue
        names = names[:most]
        most -= len(names)
        for name in names:
            try:
                st = os.stat(f"{folder}/{name}")  # the open file itself, not the link
            except OSError:
                continue
            if (
                st.st_nlink == 0
                and st.st_dev == device
                and stat.S_ISREG(st.st_mode)
                and st.st_ino not in seen
            ):
                seen.add(st.st_ino)
                total += st.st_blocks * 512
    return total
