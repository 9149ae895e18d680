"""List a folder tree beneath a root without ever stepping out of it.

The walk holds an fd for each folder it is in and opens every child with
O_NOFOLLOW relative to it: names from the directory itself never contain '/' or
'..', and a symlink is reported as what it is, never entered. Folders are walked
depth first with names sorted, so the same tree lists the same way twice, and
only `depth` folders are ever open at once.

Two bounds keep a hostile tree from exhausting the worker: at most `limit`
entries are returned, and at most `scan_limit` names are read from any one
folder (both set `truncated`).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from sandbox.paths import ConfinedDir, ConfinementError, Problem, _translating

_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class Entry(NamedTuple):
    """One name in the tree: `path` is relative to the listed folder, '/'-separated.
    A tuple, not a frozen dataclass: a listing makes 10,000 of them."""

    path: str
    name: str
    stat: os.stat_result
    # Why a folder's contents are missing, if they are: a Problem, or the errno's name.
    error: Problem | str | None = None


@dataclass
class Listing:
    entries: list[Entry] = field(default_factory=list)
    truncated: bool = False


def list_tree(
    root: ConfinedDir,
    relative: str,
    *,
    depth: int = 1,
    limit: int = 1000,
    hidden: bool = False,
    scan_limit: int = 100_000,
) -> Listing:
    """Entries under the folder `relative` (followed only while inside the root).

    `depth` 1 lists the folder's own children; each more level descends once more
    into real (not symlinked) subfolders. Names starting with '.' are skipped
    unless `hidden`.
    """
    listing = Listing()
    top = root.open(relative, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK)
    try:
        skip = root.withheld_ids
        for entry in _walk(top, "", depth, hidden, scan_limit, listing, skip):
            if len(listing.entries) == limit:
                listing.truncated = True
                break
            listing.entries.append(entry)
    finally:
        os.close(top)
    return listing


def _walk(
    dir_fd: int,
    prefix: str,
    depth: int,
    hidden: bool,
    scan_limit: int,
    listing: Listing,
    skip: frozenset[tuple[int, int]] = frozenset(),
) -> Iterator[Entry]:
    for name in _names(dir_fd, scan_limit, listing):
        if not hidden and name.startswith("."):
            continue
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue  # removed while we looked
        if skip and (st.st_dev, st.st_ino) in skip:
            continue  # the worker's own folders are never shown
        path = f"{prefix}{name}"
        if depth <= 1 or not stat.S_ISDIR(st.st_mode):
            yield Entry(path, name, st)
            continue
        try:
            with _translating(path):
                child = os.open(name, _OPEN_DIR, dir_fd=dir_fd)
        except ConfinementError as exc:  # e.g. no permission, or swapped for a link
            yield Entry(path, name, st, error=exc.problem)
            continue
        except OSError as exc:
            yield Entry(path, name, st, error=errno.errorcode.get(exc.errno or 0, "unreadable"))
            continue
        try:
            yield Entry(path, name, st)
            yield from _walk(child, f"{path}/", depth - 1, hidden, scan_limit, listing, skip)
        finally:
            os.close(child)


def _names(dir_fd: int, scan_limit: int, listing: Listing) -> list[str]:
    names: list[str] = []
    with os.scandir(dir_fd) as found:
        for item in found:
            if len(names) == scan_limit:
                listing.truncated = True
                break
            names.append(item.name)
    names.sort()
    return names
