"""List a folder tree beneath a root without ever stepping out of it.

The walk holds an fd for each folder it is in and opens every child with
O_NOFOLLOW relative to it: names from the directory itself never contain '/' or
'..', and a symlink is reported as what it is, never entered. Folders are walked
depth first with names sorted, so the same tree lists the same way twice, and
only `depth` folders are ever open at once.

Two bounds keep a hostile tree from exhausting the worker: at most `limit`
entries are returned, and at most `scan_limit` names are read from any one
folder (both set `truncated`).

Each entry is handed to a `row` function as it is found and only what that returns
is kept, so a caller builds its own record in the same pass (fs_list: the answer's
dict) and no stat result outlives its entry. The walk is plain loops that append,
not generators: a 10,000-entry listing spends most of its time per entry.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar, overload

from sandbox.paths import ConfinedDir, ConfinementError, Problem, _translating

_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK

T = TypeVar("T")


class Entry(NamedTuple):
    """One name in the tree: `path` is relative to the listed folder, '/'-separated.
    A tuple, not a frozen dataclass: a listing makes 10,000 of them."""

    path: str
    name: str
    stat: os.stat_result
    # Why a folder's contents are missing, if they are: a Problem, or the errno's name.
    error: Problem | str | None = None


# What a listing keeps of one entry, made from (path, name, lstat, error) as for Entry.
Row = Callable[[str, str, os.stat_result, Problem | str | None], T]


@dataclass
class Listing(Generic[T]):
    entries: list[T] = field(default_factory=list)
    truncated: bool = False


@overload
def list_tree(
    root: ConfinedDir,
    relative: str,
    *,
    depth: int = 1,
    limit: int = 1000,
    hidden: bool = False,
    scan_limit: int = 100_000,
) -> Listing[Entry]: ...


@overload
def list_tree(
    root: ConfinedDir,
    relative: str,
    *,
    depth: int = 1,
    limit: int = 1000,
    hidden: bool = False,
    scan_limit: int = 100_000,
    row: Row[T],
) -> Listing[T]: ...


def list_tree(
    root: ConfinedDir,
    relative: str,
    *,
    depth: int = 1,
    limit: int = 1000,
    hidden: bool = False,
    scan_limit: int = 100_000,
    row: Row[Any] = Entry,
) -> Listing[Any]:
    """Entries under the folder `relative` (followed only while inside the root), as
    `row` makes them (an Entry each by default).

    `depth` 1 lists the folder's own children; each more level descends once more
    into real (not symlinked) subfolders. Names starting with '.' are skipped
    unless `hidden`.
    """
    top = root.open(relative, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK)
    try:
        walk = _Walk(limit, hidden, scan_limit, root.withheld_ids, row)
        walk.folder(top, "", depth)
    finally:
        os.close(top)
    return walk.listing


class _Walk:
    def __init__(
        self,
        limit: int,
        hidden: bool,
        scan_limit: int,
        skip: frozenset[tuple[int, int]],
        row: Row[Any],
    ) -> None:
        self.listing: Listing[Any] = Listing()
        self.limit = limit
        self.hidden = hidden
        self.scan_limit = scan_limit
        self.skip = skip  # (device, inode) of the worker's own folders: never shown
        self.row = row

    def folder(self, dir_fd: int, prefix: str, depth: int) -> bool:
        """Add the folder's entries (and its subfolders' while `depth` > 1); False
        once the listing is full and another entry was found (`truncated`)."""
        entries, limit, skip, row = self.listing.entries, self.limit, self.skip, self.row
        descend = depth > 1
        for name in self._names(dir_fd):
            try:
                st = os.lstat(name, dir_fd=dir_fd)
            except FileNotFoundError:
                continue  # removed while we looked
            if skip and (st.st_dev, st.st_ino) in skip:
                continue
            if len(entries) == limit:
                self.listing.truncated = True
                return False
            path = prefix + name
            if not (descend and stat.S_ISDIR(st.st_mode)):
                entries.append(row(path, name, st, None))
                continue
            try:
                with _translating(path):
                    child = os.open(name, _OPEN_DIR, dir_fd=dir_fd)
            except ConfinementError as exc:  # e.g. no permission, or swapped for a link
                entries.append(row(path, name, st, exc.problem))
                continue
            except OSError as exc:
                entries.append(
                    row(path, name, st, errno.errorcode.get(exc.errno or 0, "unreadable"))
                )
                continue
            try:
                entries.append(row(path, name, st, None))
                if not self.folder(child, f"{path}/", depth - 1):
                    return False
            finally:
                os.close(child)
        return True

    def _names(self, dir_fd: int) -> list[str]:
        """The folder's names, sorted; at most `scan_limit` are read (`truncated` if
        there were more), hidden ones then dropped unless asked for."""
        with os.scandir(dir_fd) as found:
            names = [item.name for item in itertools.islice(found, self.scan_limit + 1)]
        if len(names) > self.scan_limit:
            self.listing.truncated = True
            del names[self.scan_limit :]
        if not self.hidden:
            names = [name for name in names if name[0] != "."]
        names.sort()
        return names
