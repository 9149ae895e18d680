"""Places held still while an asked program is looked at, approved and run.

An exec `ask` binds what its arguments name as it is at the look (the worker's
exec_arg_files); the program opens those files again later, by name. An agent that
kept replacing the file meanwhile (an atomic overwrite every ~2 ms) had its own
script run under an approval "for this plan" 10 times in 30 (review18 F5). So from
before the look until the program has ended, the places its arguments name are
held: a write by the worker there (or beneath, for a folder) is refused, and an
asked program whose arguments name a place being written is refused. Both sides
check and register under one lock, so one of the two always sees the other.

Places are real paths as the kernel resolves them (a held path and a written one are
compared by text, each resolved first), so a name reached through a link in a shared
folder is held under the name it leads to.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable
from typing import Any


class HeldError(Exception):
    """The place is held (or written) by another call: `path` and `by` (that call's
    correlation id) say which; `holding` says whether that call holds it (an asked
    program) or writes it."""

    def __init__(self, path: str, by: str, *, holding: bool) -> None:
        self.path, self.by, self.holding = path, by, holding
        super().__init__(path)


class HeldPlaces:
    """The places asked programs hold and the places being written, worker-wide."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._numbers = itertools.count()
        self._held: dict[int, tuple[str, tuple[str, ...]]] = {}  # n -> (by, places)
        self._writing: dict[int, tuple[str, str]] = {}  # n -> (by, place)

    def hold(self, places: Iterable[str], by: str) -> Registered:
        """Hold `places` (and what is beneath them) from now until the returned
        registration's block ends; HeldError, now, when one is being written."""
        wanted = tuple(sorted(set(places)))
        with self._lock:
            for writer, written in self._writing.values():
                for place in wanted:
                    if _at_or_beneath(written, place):
                        raise HeldError(written, writer, holding=False)
            number = next(self._numbers)
            self._held[number] = (by, wanted)
        return Registered(self._lock, self._held, number)

    def write(self, place: str, by: str) -> Registered:
        """Register a write of `place` from now until the returned registration's
        block ends; HeldError, now, when a program holds it (or a folder above it)."""
        with self._lock:
            for holder, places in self._held.values():
                for held in places:
                    if _at_or_beneath(place, held):
                        raise HeldError(held, holder, holding=True)
            number = next(self._numbers)
            self._writing[number] = (by, place)
        return Registered(self._lock, self._writing, number)


class Registered:
    """A hold or a write registered: `with` it, and it is let go as the block ends."""

    def __init__(self, lock: threading.Lock, table: dict[int, Any], number: int) -> None:
        self._lock, self._table, self._number = lock, table, number

    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: object) -> None:
        with self._lock:
            self._table.pop(self._number, None)


def _at_or_beneath(path: str, place: str) -> bool:
    return path == place or path.startswith(place.rstrip("/") + "/")
