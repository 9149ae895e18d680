"""Places held still while an asked program is looked at, approved and run.

An exec `ask` binds what its arguments name as it is at the look (the worker's
exec_arg_files); the program opens those files again later, by name. An agent that
kept replacing the file meanwhile (an atomic overwrite every ~2 ms) had its own
script run under an approval "for this plan" 10 times in 30 (review18 F5). So from
before the look until the program has ended, the places its arguments name are
held: a write by the worker there (or beneath, for a folder) is refused, and an
asked program whose arguments name a place being written is refused. Both sides
check and register under one lock, so one of the two always sees the other.

Programs run beside it are the agent's too. One that starts while places are held
(`run`) gets each that exists bound read-only onto itself, and the folders on the way
bound onto themselves (`pins_for`): it can neither change a held place (EROFS) nor
move it, or a folder above it, away and put another in its place (EBUSY: a mount
point of its own namespace). One already running when a hold begins could: the hold
says so (`Registered.writers`), and the asker binds nothing then (its approval
answers that call only).

Places are real paths as the kernel resolves them (a held path and a written one are
compared by text, each resolved first), so a name reached through a link in a shared
folder is held under the name it leads to.
"""

from __future__ import annotations

import itertools
import os
import stat
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sandbox.paths import ConfinementError, Root


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
        # n -> (by, its folders shared read-write, the places it was shown read-only)
        self._running: dict[int, tuple[str, tuple[str, ...], frozenset[str]]] = {}

    def hold(self, places: Iterable[str], by: str) -> Registered:
        """Hold `places` (and what is beneath them) from now until the returned
        registration's block ends; HeldError, now, when one is being written. Its
        `writers`: the calls whose programs run now and could write one of them."""
        wanted = tuple(sorted(set(places)))
        with self._lock:
            for writer, written in self._writing.values():
                for place in wanted:
                    if _at_or_beneath(written, place):
                        raise HeldError(written, writer, holding=False)
            writers = {
                runner
                for runner, writable, shown in self._running.values()
                if runner != by
                and any(
                    place not in shown and any(_at_or_beneath(place, w) for w in writable)
                    for place in wanted
                )
            }
            number = next(self._numbers)
            self._held[number] = (by, wanted)
        return Registered(self._lock, self._held, number, tuple(sorted(writers)))

    def run(self, writable: Sequence[str], by: str) -> tuple[Registered, tuple[str, ...]]:
        """Register a program about to start with `writable` folders shared read-write,
        until the returned registration's block ends; with it, the places other calls
        hold in those folders now, which it must be shown read-only (`pins_for`)."""
        with self._lock:
            shown = {
                place
                for holder, places in self._held.values()
                if holder != by
                for place in places
                if any(_at_or_beneath(place, folder) for folder in writable)
            }
            number = next(self._numbers)
            self._running[number] = (by, tuple(writable), frozenset(shown))
        return Registered(self._lock, self._running, number), tuple(sorted(shown))

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
    """A hold, a write or a program registered: `with` it, and it is let go as the
    block ends. A hold's `writers`: see HeldPlaces.hold."""

    def __init__(
        self,
        lock: threading.Lock,
        table: dict[int, Any],
        number: int,
        writers: tuple[str, ...] = (),
    ) -> None:
        self._lock, self._table, self._number = lock, table, number
        self.writers = writers

    def __enter__(self) -> tuple[str, ...]:
        return self.writers

    def __exit__(self, *_: object) -> None:
        with self._lock:
            self._table.pop(self._number, None)


def _at_or_beneath(path: str, place: str) -> bool:
    return path == place or path.startswith(place.rstrip("/") + "/")


@dataclass(frozen=True)
class Pin:
    """A place bound onto itself in a sandbox by descriptor (bubblewrap's --bind-fd):
    `fd` (O_PATH, opened beneath its shared folder: no link leads it out), where it
    appears inside, and whether it stays writable (a folder on the way, bound so that
    it cannot be moved) or is read-only (a place held)."""

    fd: int
    inside: str
    writable: bool


def pins_for(
    roots: Sequence[Root], places: Iterable[str], inside: Callable[[str], str] = str
) -> list[Pin]:
    """For a program starting while `places` are held: each that exists now as a
    regular file or a folder in a read-write shared folder, read-only, and each folder
    between that shared folder and it, as writable as before; shallowest first. A
    place naming nothing or a link is left out (a link cannot be bound onto itself).
    `inside` maps a path to where the sandbox shows it. The caller closes the fds."""
    pins: dict[str, Pin] = {}
    try:
        for place in sorted(set(places)):
            root = max(
                (r for r in roots if r.writable and _at_or_beneath(place, str(r.path))),
                key=lambda r: len(r.path.parts),
                default=None,
            )
            if root is not None and place not in pins:
                _pin(root, place, inside, pins)
    except BaseException:
        for pin in pins.values():
            os.close(pin.fd)
        raise
    return sorted(pins.values(), key=lambda pin: (pin.inside.count("/"), pin.inside))


def _pin(root: Root, place: str, inside: Callable[[str], str], pins: dict[str, Pin]) -> None:
    relative = place[len(str(root.path)) :].strip("/") or "."
    try:
        with root.confined() as confined:
            fd = confined.open(relative, os.O_PATH | os.O_NOFOLLOW)
            kind = stat.S_IFMT(os.fstat(fd).st_mode)
            if kind not in (stat.S_IFREG, stat.S_IFDIR):
                os.close(fd)
                return
            pins[place] = Pin(fd, inside(place), writable=False)
            parts = relative.split("/") if relative != "." else []
            for depth in range(1, len(parts)):
                folder = f"{root.path}/{'/'.join(parts[:depth])}"
                if folder not in pins:
                    way = confined.open(
                        folder[len(str(root.path)) + 1 :],
                        os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY,
                    )
                    pins[folder] = Pin(way, inside(folder), writable=True)
    except (ConfinementError, OSError):
        return  # names nothing now, or not beneath its shared folder: nothing to pin
