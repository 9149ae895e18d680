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
answers that call only). That counts one started during an earlier hold too: its pins
were of that hold's places as they existed then, and a rename over a pinned name once
that hold ended takes the pin away in every namespace (review23 C8).

Places are real paths as the kernel resolves them (a held path and a written one are
compared by text, each resolved first), so a name reached through a link in a shared
folder is held under the name it leads to.

A file has as many names as hard links, and a name is all a path pins: the same bytes
changed through another name ran lines the person never saw in an approved bash script
(review21 B1). So a hold also knows the files it holds by inode (`Registered.know`, once
held, before the look): a write landing in one of them in place (an append) by any name
is refused, and, while a held file has other names, a program that could write in a
shared folder does not start (`run`): those names are not known, so not pinned. Nor
does one while a hold's files are still being looked for, between `hold` and `know`:
it would get no pin for what is learnt then (review23 C2).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import stat
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sandbox import _openat2
from sandbox.paths import ConfinementError, Problem, Root

_AT_FDCWD: Final = -100


class HeldError(Exception):
    """The place is held (or written) by another call: `path` and `by` (that call's
    correlation id) say which; `holding` says whether that call holds it (an asked
    program) or writes it; `other_names`, that what is held is a file with other names
    (hard links) a program now starting could change it through."""

    def __init__(
        self,
        path: str,
        by: str,
        *,
        holding: bool,
        other_names: bool = False,
    ) -> None:
        self.path, self.by, self.holding, self.other_names = path, by, holding, other_names
        super().__init__(path)


# A file as the kernel knows it, whatever its names: (st_dev, st_ino).
Inode = tuple[int, int]


@dataclass(frozen=True)
class HeldFile:
    """A regular file a hold holds: its real path, its inode, and how many names it had."""

    place: str
    inode: Inode
    names: int


@dataclass(frozen=True)
class HeldFiles:
    """What `held_files` found, and the links it did not follow (`unfollowed`): past
    LINKS_FOLLOWED_AT_MOST, or through a magic link (/proc/self/cwd/..., which the
    program resolves as its own and the worker as the worker's: review23 C14). Where
    those lead is not held: the asker's approval answers its call only."""

    files: tuple[HeldFile, ...] = ()
    unfollowed: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        return not self.unfollowed


class PinDeniedError(Exception):
    """A held place that could not be looked up to be pinned: the permissions on its
    way say no (a program beside made a folder on it 000, then a second one could have
    made it 755 again and written the place unpinned: review21). A program that would
    start without it pinned does not start."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(path)


class HeldPlaces:
    """The places asked programs hold and the places being written, worker-wide."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._numbers = itertools.count()
        self._held: dict[int, tuple[str, tuple[str, ...]]] = {}  # n -> (by, places)
        self._held_files: dict[int, HeldFiles] = {}  # n -> what its places are
        # n -> the folders the holding call may write: where a held file's other names
        # and a held folder's links can be, and all a program must share to be held up.
        self._hold_roots: dict[int, tuple[str, ...]] = {}
        # n -> the calls whose programs started beside it while it looked for its files
        # (a hold not yet known), ended since or not: see `_know`.
        self._started_looking: dict[int, set[str]] = {}
        # The holds such a program may have given names of its own: see `_may_start`.
        self._unsure: set[int] = set()
        self._writing: dict[int, tuple[str, str, Inode | None]] = {}  # n -> (by, place, inode)
        # n -> (by, its folders shared read-write)
        self._running: dict[int, tuple[str, tuple[str, ...]]] = {}

    def hold(self, places: Iterable[str], by: str, roots: Sequence[str] = ("/",)) -> Registered:
        """Hold `places` (and what is beneath them) from now until the returned
        registration's block ends; HeldError, now, when one is being written. Its
        `writers`: the calls whose programs run now and could write one of them.
        `roots`: the folders the holding call may write (its read-write shared folders),
        beneath which `places` and the files it will `know` lie."""
        wanted = tuple(sorted(set(places)))
        with self._lock:
            for writer, written, _ in self._writing.values():
                for place in wanted:
                    if at_or_beneath(written, place):
                        raise HeldError(written, writer, holding=False)
            writers = self._writers(wanted, by)
            number = next(self._numbers)
            self._held[number] = (by, wanted)
            self._hold_roots[number] = tuple(roots)
        return Registered(self._lock, self._held, number, tuple(sorted(writers)), places=self)

    def _know(self, number: int, found: HeldFiles) -> set[str]:
        """The hold `number` holds `found` too: by inode, and by their real paths (a
        link's target out of a held folder: review21). HeldError when one is being
        written now, by whatever name. The calls whose programs run now and could write
        a place it holds: those started since the hold too, which got no pin for what
        is learnt only now (review23 C2)."""
        files = found.files
        inodes = {file.inode for file in files}
        with self._lock:
            for writer, written, inode in self._writing.values():
                if (inode is not None and inode in inodes) or any(
                    at_or_beneath(written, file.place) for file in files
                ):
                    raise HeldError(written, writer, holding=False)
            if number in self._held:
                by, places = self._held[number]
                # Only what no place held holds already (a link's target out of a held
                # folder): a held folder is pinned whole, not its thousands of files.
                beyond = {
                    file.place
                    for file in files
                    if not any(at_or_beneath(file.place, place) for place in places)
                }
                places = tuple(sorted({*places, *beyond}))
                self._held[number] = (by, places)
                self._held_files[number] = found
                # A program that started while the files were looked for got no pin for
                # what is learnt only now, and may have given one of them a name of its
                # own (a hard link, made after its count of names was read) and ended:
                # it is a writer, and while the hold lasts no program that could write
                # beside it starts, as for a file known to have other names (review23
                # C21).
                started = self._started_looking.pop(number, set())
                if started:
                    self._unsure.add(number)
                return self._writers(places, by) | started
        return set()

    def _writers(self, places: Iterable[str], by: str) -> set[str]:
        """The calls other than `by` whose programs run now with a read-write folder over
        or beneath one of `places` (the lock held). Shown a place read-only by an
        earlier hold or not: a pin is made only for what existed then, and a rename over
        it (an fs_write once that hold ended) takes it away in every namespace (review23
        C8); a folder beneath a held folder was bound writable on top of its pin (C7)."""
        return {
            runner
            for runner, writable in self._running.values()
            if runner != by and any(overlap(place, w) for place in places for w in writable)
        }

    def run(self, writable: Sequence[str], by: str) -> tuple[Registered, tuple[str, ...]]:
        """Register a program about to start with `writable` folders shared read-write,
        until the returned registration's block ends; with it, the places other calls
        hold in those folders now, which it must be shown read-only (`pins_for`)."""
        with self._lock:
            if writable:
                self._may_start(by, writable)
                self._started_beside(by, writable)
            shown = {
                place
                for holder, places in self._held.values()
                if holder != by
                for place in places
                if any(at_or_beneath(place, folder) for folder in writable)
            }
            number = next(self._numbers)
            self._running[number] = (by, tuple(writable))
        return Registered(self._lock, self._running, number), tuple(sorted(shown))

    def _started_beside(self, by: str, writable: Sequence[str]) -> None:
        """A program of `by` that could write in `writable` starts (the lock held): each
        hold still looking for its files, sharing a folder with it, remembers the call."""
        for number, (holder, _places) in self._held.items():
            if holder == by or number in self._held_files:
                continue
            if self._shares(number, writable):
                self._started_looking.setdefault(number, set()).add(by)

    def _shares(self, number: int, writable: Sequence[str]) -> bool:
        """Whether folders `writable` share anything with those the holding call of hold
        `number` may write (its roots), where its files' other names can be."""
        roots = self._hold_roots.get(number, ("/",))
        return any(overlap(root, folder) for root in roots for folder in writable)

    def _let_go(self, number: int) -> None:
        """What is known of hold `number`, beside its places, goes (the lock held)."""
        self._held_files.pop(number, None)
        self._hold_roots.pop(number, None)
        self._started_looking.pop(number, None)
        self._unsure.discard(number)

    def _may_start(self, by: str, writable: Sequence[str]) -> None:
        """HeldError unless a program of `by` that could write in `writable` may start
        now (the lock held): not while a held file has other names, which are not
        known, so not pinned (review21 B1). Only a program sharing a folder with the
        holding call's read-write ones is held up: those names can be nowhere else,
        and one plan's waiting prompt stopped every program of every other plan
        (review23 C4). One starting while a hold's files are still being looked for
        starts, and is a writer the hold names once it knows them (`_know`)."""
        for number, (holder, places) in self._held.items():
            found = self._held_files.get(number)
            if holder == by or found is None:
                continue
            if not self._shares(number, writable):
                continue
            if number in self._unsure:
                raise HeldError(places[0], holder, holding=True, other_names=True)
            linked = next((file for file in found.files if file.names > 1), None)
            if linked is not None:
                raise HeldError(linked.place, holder, holding=True, other_names=True)

    def write(self, place: str, by: str, inode: Inode | None = None) -> Registered:
        """Register a write of `place` from now until the returned registration's
        block ends; HeldError, now, when a program holds it (or a folder above it) or,
        for a write in place into the file `inode`, holds that file by any name."""
        with self._lock:
            for number, (holder, places) in self._held.items():
                for held in places:
                    if at_or_beneath(place, held):
                        raise HeldError(held, holder, holding=True)
                files = self._held_files.get(number, HeldFiles()).files
                if inode is not None and any(file.inode == inode for file in files):
                    raise HeldError(place, holder, holding=True)
            number = next(self._numbers)
            self._writing[number] = (by, place, inode)
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
        *,
        places: HeldPlaces | None = None,
    ) -> None:
        self._lock, self._table, self._number = lock, table, number
        self.writers = writers
        self._places = places

    def know(self, found: HeldFiles) -> None:
        """A hold's places are these files (`held_files`, looked at once held): held by
        inode too. HeldError when one is being written in place now. `writers` then
        names the programs started since the hold too."""
        assert self._places is not None, "only a hold holds files"
        since = self._places._know(self._number, found)
        self.writers = tuple(sorted({*self.writers, *since}))

    def __enter__(self) -> tuple[str, ...]:
        return self.writers

    def __exit__(self, *_: object) -> None:
        with self._lock:
            self._table.pop(self._number, None)
            if self._places is not None:
                self._places._let_go(self._number)


# A held folder's links followed at most, each one lookup the kernel walks (up to 40
# links of 4 KiB each: 3.3 ms here). Past them the hold does not know where the rest
# lead, and holds up every program that could write beside it (`HeldFiles.complete`).
LINKS_FOLLOWED_AT_MOST: Final = 128


def held_files(
    places: Iterable[str],
    most: int,
    within: Sequence[str] = ("/",),
    follow: Callable[[str], str | None] | None = None,
) -> HeldFiles:
    """The regular files `places` hold beneath the folders `within` (the holding call's
    read-write ones: a file elsewhere it cannot change, and /usr/bin/perl has two names),
    links followed, each by its real path and inode with its count of names: a place
    that is one, and those in a held folder (at most `most` entries looked at, as a
    folder argument is bound: exec_arg_files).

    It runs before the person is asked, so it costs a stat a file and, for a link,
    one lookup the kernel walks, for LINKS_FOLLOWED_AT_MOST links at most
    (os.path.realpath took an lstat a part and every link: 4,000 links of 4 KiB
    `d/../d/..` targets kept it 9 s, chains of 39 such links minutes: review23 C3).
    The links past them, and those through a magic link, are `unfollowed`. `follow`
    follows a link as the program will (the binder's way, exec_arg_files: in sandbox mode
    `/workspace/...` is the plan's workspace, which the host has elsewhere: review23 C17),
    or None where it cannot say; without it the host's kernel follows it."""
    found: dict[Inode, HeldFile] = {}
    unfollowed: list[str] = []
    links = 0

    def add(path: str, st: os.stat_result) -> None:
        if stat.S_ISREG(st.st_mode) and any(at_or_beneath(path, w) for w in within):
            inode = (st.st_dev, st.st_ino)
            found[inode] = HeldFile(path, inode, st.st_nlink)

    def followed(path: str) -> tuple[str, os.stat_result] | None:
        nonlocal links
        links += 1
        if links > LINKS_FOLLOWED_AT_MOST:
            unfollowed.append(path)
            return None
        if follow is not None:
            led = follow(path)
            if led is None:
                unfollowed.append(path)
                return None
            try:
                return led, os.stat(led, follow_symlinks=False)
            except (OSError, ValueError):
                return None  # names nothing now: bound as naming nothing
        try:
            return _followed(path)
        except _MagicLinkError:
            unfollowed.append(path)
        except (OSError, ValueError):
            pass  # names nothing now: bound as naming nothing
        return None

    looked = 0
    for place in places:
        try:
            st = os.lstat(place)
        except (OSError, ValueError):
            continue  # names nothing now: bound as naming nothing
        if stat.S_ISLNK(st.st_mode) and (real := followed(place)) is not None:
            add(*real)
        if not stat.S_ISDIR(st.st_mode):
            if stat.S_ISREG(st.st_mode):
                add(place, st)
            continue
        folders = [place]
        while folders and looked <= most and links <= LINKS_FOLLOWED_AT_MOST:
            top = folders.pop()
            try:
                with os.scandir(top) as listing:
                    entries = list(listing)
            except OSError:
                continue
            beneath = []
            for entry in entries:
                # Folders count too: a tree of empty folders was walked to its end.
                looked += 1
                if looked > most or links > LINKS_FOLLOWED_AT_MOST:
                    break  # past the links: `unfollowed` has the first one left
                if entry.is_symlink():  # a link to a folder is not walked into
                    if (real := followed(entry.path)) is not None:
                        add(*real)
                elif entry.is_dir(follow_symlinks=False):
                    beneath.append(entry.path)
                else:
                    with contextlib.suppress(OSError):  # gone meanwhile
                        add(entry.path, entry.stat(follow_symlinks=False))
            folders.extend(reversed(beneath))  # each folder's own, first to last
    return HeldFiles(tuple(found.values()), tuple(unfollowed))


_O_PATH: Final = getattr(os, "O_PATH", None)


class _MagicLinkError(Exception):
    """A link led through a magic link (/proc/self/cwd, /dev/fd/N): a program resolves
    it as its own, where the worker would follow it as the worker's."""


def _followed(path: str) -> tuple[str, os.stat_result]:
    """`path` with its links followed, by the kernel in one lookup (never through a
    magic link: _MagicLinkError): its real path and status. Where there is no O_PATH or
    /proc, os.path.realpath walks it part by part."""
    if _O_PATH is None or not os.path.isdir("/proc/self/fd"):
        return os.path.realpath(path), os.stat(path)
    if _openat2.available():
        try:
            fd = _openat2.openat2(
                _AT_FDCWD, path, _O_PATH | os.O_CLOEXEC, 0, _openat2.RESOLVE_NO_MAGICLINKS
            )
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a magic link, or more than 40 links
                raise _MagicLinkError(path) from None
            raise
    else:
        fd = os.open(path, _O_PATH | os.O_CLOEXEC)
    try:
        return os.readlink(f"/proc/self/fd/{fd}"), os.fstat(fd)
    finally:
        os.close(fd)


def at_or_beneath(path: str, place: str) -> bool:
    return path == place or path.startswith(place.rstrip("/") + "/")


def overlap(one: str, other: str) -> bool:
    """Whether two folders share anything: one is the other or beneath it."""
    return at_or_beneath(one, other) or at_or_beneath(other, one)


@dataclass(frozen=True)
class Pin:
    """A place bound onto itself in a sandbox by descriptor (bubblewrap's --bind-fd):
    `fd` (O_PATH, opened beneath its shared folder: no link leads it out), where it
    appears inside, and whether it is a folder on the way (bound as its shared folder
    has it, so that it cannot be moved) or the place held (read-only). Where each goes
    among the shared and hidden folders: sandbox._bwrap._held_pins."""

    fd: int
    inside: str
    on_the_way: bool


def pins_for(
    roots: Sequence[Root], places: Iterable[str], inside: Callable[[str], str] = str
) -> list[Pin]:
    """For a program starting while `places` are held: each that exists now as a
    regular file or a folder in a read-write shared folder (the deepest shared folder
    holding it: one in a read-only one cannot be written anyway), read-only, and each
    folder between that shared folder and it, as it was; shallowest first. A place
    naming nothing or a link is left out (a link cannot be bound onto itself).
    `inside` maps a path to where the sandbox shows it. The caller closes the fds."""
    pins: dict[str, Pin] = {}
    try:
        for place in sorted(set(places)):
            root = max(
                (r for r in roots if at_or_beneath(place, str(r.path))),
                key=lambda r: len(r.path.parts),
                default=None,
            )
            if root is not None and root.writable and place not in pins:
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
            pins[place] = Pin(fd, inside(place), on_the_way=False)
            parts = relative.split("/") if relative != "." else []
            for depth in range(1, len(parts)):
                folder = f"{root.path}/{'/'.join(parts[:depth])}"
                if folder not in pins:
                    way = confined.open(
                        folder[len(str(root.path)) + 1 :],
                        os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY,
                    )
                    pins[folder] = Pin(way, inside(folder), on_the_way=True)
    except ConfinementError as exc:
        if exc.problem is Problem.DENIED:
            raise PinDeniedError(place) from None
        return  # names nothing now, or not beneath its shared folder: nothing to pin
    except PermissionError:
        raise PinDeniedError(place) from None
    except OSError:
        return
