"""Temporary files of our own atomic writes: their names, and sweeping up after a crash.

`write_atomic` writes into a temporary file beside the target and renames it
into place. If the worker dies in between (a crash, a power cut, SIGKILL), the
temporary file stays in the person's folder. `sweep` removes such leftovers the
next time the worker writes in that folder.

It must never remove a file of the person's, so a name is swept only when all of
these hold: it has exactly the shape `temp_name` makes (a dot, the target's
name, a dot, 8 hex digits, `.agentworker-tmp`); it is a regular file with one
name (a hard link elsewhere keeps its content, but the name is still not ours to
guess about); it belongs to the user the worker runs as; and it has not been
written to for `STALE_S`, far longer than any one write takes, so a write in
progress (ours, or another worker's on the same folder) is never cut short.
A folder is swept at most once per `RESWEEP_S`, so a busy folder with many
names costs one scan now and then, not one per write. And a name an asked program
holds is never swept (the caller's `guard`): an agent could give its script that
shape, and an unlink of the held name took its pins away in every sandbox beside
(review23 C10).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Final

from sandbox import plan_uids

SUFFIX: Final = ".agentworker-tmp"
STALE_S: Final = 15 * 60
RESWEEP_S: Final = 10 * 60
SCAN_LIMIT: Final = 100_000  # names read from one folder per sweep
_NAME_MAX: Final = 255
_SHAPE: Final = re.compile(r"\..+\.[0-9a-f]{8}" + re.escape(SUFFIX), re.DOTALL)
_REMEMBERED: Final = 4096  # folders whose last sweep time is kept


def temp_name(name: str) -> str:
    """A fresh temporary name beside `name`, within the 255-byte name limit."""
    raw = os.fsencode(name)
    room = _NAME_MAX - len(SUFFIX) - 12  # '.', '.', 8 hex digits and a margin
    return f".{os.fsdecode(raw[:room])}.{secrets.token_hex(4)}{SUFFIX}"


def is_temp_name(name: str) -> bool:
    return _SHAPE.fullmatch(name) is not None


class Leftovers:
    """Sweeps the leftovers of our own interrupted writes, each folder at most once every
    RESWEEP_S; remembers when it swept which folder. One per worker, owned by its owner
    (see sandbox.state), never a module global."""

    def __init__(self) -> None:
        self._swept: dict[tuple[int, int], float] = {}

    def sweep(
        self,
        dir_fd: int,
        *,
        now: float | None = None,
        force: bool = False,
        guard: Guard | None = None,
    ) -> list[str]:
        """Remove stale leftovers of our writes from the folder `dir_fd`; the names removed.

        Best effort: a folder that cannot be read or a name that cannot be removed is
        left as it is. `force` sweeps even if the folder was swept moments ago. `guard`
        (a name and its file's (st_dev, st_ino)) registers each removal as a write, and
        raises to leave the name be (sandbox.held: a place an asked program holds).
        """
        try:
            here = os.fstat(dir_fd)
        except OSError:
            return []
        key = (here.st_dev, here.st_ino)
        clock = time.monotonic()
        last = self._swept.get(key)
        if not force and last is not None and clock - last < RESWEEP_S:
            return []
        if len(self._swept) >= _REMEMBERED:
            self._swept.clear()
        self._swept[key] = clock
        wall = time.time() if now is None else now
        removed = []
        for name in _candidates(dir_fd):
            with contextlib.suppress(Exception):  # OSError; a guard's refusal
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if not _stale_and_ours(st, wall):
                    continue
                inode = (st.st_dev, st.st_ino)
                with guard(name, inode) if guard else contextlib.nullcontext():
                    os.unlink(name, dir_fd=dir_fd)
                removed.append(name)
        return removed


# Registers the removal of a name (and its file's inode) for as long as it is entered.
Guard = Callable[[str, tuple[int, int]], AbstractContextManager[object]]


def _candidates(dir_fd: int) -> list[str]:
    found: list[str] = []
    with contextlib.suppress(OSError), os.scandir(dir_fd) as entries:
        for count, entry in enumerate(entries):
            if count == SCAN_LIMIT:
                break
            if is_temp_name(entry.name):
                found.append(entry.name)
    return found


def _stale_and_ours(st: os.stat_result, now: float) -> bool:
    return (
        stat.S_ISREG(st.st_mode)
        and st.st_nlink == 1
        and st.st_uid == plan_uids.acting_uid()  # a plan's own uid's, beneath its files/
        and now - st.st_mtime >= STALE_S
    )
