"""The files an exec's arguments name, bound into its allowlist `ask` (review16 F7).

An approval "for this plan" answers the same command in the same folder with the same
stdin (exec_cmd.ask_about). For `python3 script.py`, `sh x.sh` or `git apply p.diff`
the file is the program: an agent that may write there rewrote it between two calls,
and the second ran the new script under the approval of the first. So each argument
that names a regular file in a shared folder is bound too: by its contents (size and
SHA-256) while they are small enough to read at once, else by what changes whenever
they do (device, inode, size, mtime and ctime in ns: ctime cannot be set back by the
agent). A file changed, swapped or moved in asks again.

Read in a thread, never on the event loop; every path resolved beneath its shared
folder by the kernel (sandbox.files.open_regular: no FIFO, device or /proc file, no
symlink out). What the binder cannot bind fails closed (review18 F1: each of these let
a rewritten script run under an approval "for this plan"): a folder by a bounded listing
of what is in it (names, types, sizes, and contents or mtimes and ctimes); an argument
past the 64th, a path through /proc or /dev (`/proc/self/cwd/x.py`, the kernel's ways
back into a shared folder), a link out of the shared folders, a FIFO or device, or a
folder too large to list, each make the approval good for that call only: approved
"for this plan", the next call asks again. An argument naming nothing is left out (a
file made there later adds itself to the binding, and asks again). Not bound
(docs/architecture.md, "exec approvals"): files a program opens by its own choice
(imports from the working folder, a Makefile's includes, pytest's conftest.py).

What the arguments name is held still from before the look until the program has
ended (`held_places`, sandbox.held): the worker writes nothing there meanwhile, so the
program opens the bytes that were bound (review18 F5: an agent replacing the script
every ~2 ms had it run unasked 10 times in 30). Not held: a program of the agent's that
is running beside it and writes there (docs/architecture.md, "exec approvals").
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from sandbox import ConfinementError, Problem, Root, locate, open_regular

# Hashed whole up to this much each and in all; past it a file is bound by its identity.
HASHED_FILE_BYTES: Final = 4 * 1024 * 1024
HASHED_BYTES: Final = 16 * 1024 * 1024
# Arguments looked at, at most (an argv may have thousands: `rm` of a glob).
LOOKED_AT: Final = 64
# A folder given as an argument is bound by a listing of at most this many entries.
LISTED_AT_MOST: Final = 4096
_CHUNK: Final = 1024 * 1024
# Where the kernel reaches a shared folder by another path than its own.
_MAGIC: Final = ("/proc/", "/dev/")


@dataclass(frozen=True)
class ArgFile:
    """What an argument names and what binds it: where (argv index, the path as found),
    and `kind`: "file" (`sha256` of its contents, or "" and `identity` when it was not
    hashed), "folder" (`identity`: the digest of its listing), or "unbound" (`identity`
    a nonce: the approval answers this call only; `why` says why)."""

    index: int
    path: str
    size: int
    sha256: str = ""
    identity: str = ""
    kind: str = "file"
    why: str = ""
    read: int = 0  # a folder's: the bytes of its files read to bind it

    def bound(self) -> dict[str, object]:
        if self.kind != "file":
            return {"arg": self.index, self.kind: self.identity}
        if self.sha256:
            return {"arg": self.index, "bytes": self.size, "sha256": self.sha256}
        return {"arg": self.index, "bytes": self.size, "identity": self.identity}

    def line(self) -> str:
        """How the prompt names it."""
        if self.kind == "folder":
            return f"{self.path}: a folder of {self.size:,} entries, bound as listed now"
        if self.kind == "unbound":
            return (
                f"{self.path}: {self.why}, so it cannot be bound: an approval is for this "
                "call only, and the next asks again"
            )
        if self.sha256:
            return f"{self.path}: {self.size:,} bytes, sha256 {self.sha256}"
        return (
            f"{self.path}: {self.size:,} bytes, too large to read for the prompt: bound to "
            "this very file as it is now (any change asks again)"
        )


def _unbound(index: int, path: str, why: str) -> ArgFile:
    return ArgFile(index, path, 0, identity=secrets.token_hex(16), kind="unbound", why=why)


def as_found(cwd: str, named: str) -> str:
    """Where a program started in `cwd` finds the path `named`, as the host sees it (a
    program sees the host's folders at their own paths): a relative one joined to
    `cwd`, and `//` and `/./` taken as the kernel takes them, as `/` (review19 A1:
    `//proc/self/cwd/s.py` passed for no /proc path)."""
    return plain(named if named.startswith("/") else os.path.join(cwd, named))


def plain(path: str) -> str:
    """`path` with its empty and `.` parts dropped: the same place to the kernel."""
    parts = [part for part in path.split("/") if part not in ("", ".")]
    return ("/" if path.startswith("/") else "") + "/".join(parts)


# Where a program finds an argument's path, as the host sees it, from the working folder
# (host side) and the argument; None when it cannot be said (sandbox mode: a spelling
# of the workspace that only `..` leads to).
Finder = Callable[[str, str], "str | None"]


def arg_files(
    roots: Sequence[Root], cwd: str, argv: Sequence[str], where: Finder = as_found
) -> tuple[ArgFile, ...]:
    """What `argv`'s arguments (each, or the value of `--option=value`) name in `roots`,
    found from `cwd` as the program will (`where`: sandbox mode's finds /workspace/...
    where the host keeps it). A path outside every shared folder (bar /proc and /dev)
    is left out: nothing the agent can write."""
    found: list[ArgFile] = []
    hashed = 0
    for index, arg in enumerate(argv[1:], start=1):
        if index > LOOKED_AT:
            found.append(_unbound(index, "…", f"arguments past the {LOOKED_AT}th are not read"))
            break
        for named in _names(arg):
            path = where(cwd, named)
            if path is None:
                why = "it names the workspace by a way round (..) that is not followed"
                found.append(_unbound(index, named, why))
                continue
            file = _bound(roots, index, named, path, HASHED_BYTES - hashed)
            room = HASHED_BYTES - hashed
            files = (
                [file] if file is not None else _implied(roots, index, named, (where, cwd), room)
            )
            for file in files:
                found.append(file)
                hashed += file.size if file.sha256 else file.read
    return tuple(found)


def _implied(
    roots: Sequence[Root], index: int, named: str, found_by: tuple[Finder, str], room: int
) -> list[ArgFile]:
    """The files `_suffixed` names that exist, each bound, within `room` together."""
    where, cwd = found_by
    found: list[ArgFile] = []
    for implied in _suffixed(named):
        path = where(cwd, implied)
        file = None if path is None else _bound(roots, index, implied, path, room)
        if file is not None:
            found.append(file)
            room -= file.size if file.sha256 else file.read
    return found


def held_places(cwd: str, argv: Sequence[str], where: Finder = as_found) -> tuple[str, ...]:
    """The places `argv`'s arguments name, as `arg_files` finds them, each as written
    and as its links resolve now: held (sandbox.held) from before the look until the
    program has ended, so that what was bound is what the program opens, and a name
    bound as naming nothing stays so (review18 F5)."""
    places: set[str] = set()
    for arg in argv[1 : LOOKED_AT + 1]:
        for named in (name for whole in _names(arg) for name in (whole, *_suffixed(whole))):
            path = where(cwd, named)
            if path is not None:  # unbound: its approval answers one call
                places.add(os.path.normpath(path))
                places.add(os.path.realpath(path))
    return tuple(sorted(places))


def written_beside(writers: Sequence[str]) -> ArgFile:
    """What binds an asked command while programs of other calls (`writers`) run that
    may write what its arguments name (sandbox.held): nothing that lasts."""
    calls = ", ".join(writers[:3]) + (" and others" if len(writers) > 3 else "")
    return _unbound(0, "what its arguments name", f"the running call {calls} may write there")


# How many letters of a short-option cluster may come before its attached value
# (`awk -fprog.awk`, `make -vfb.mk`): each tail after them is looked at as a name.
CLUSTERED_AT_MOST: Final = 8
# What an interpreter adds to a name that names nothing (`node app` runs app.js).
IMPLIED_SUFFIXES: Final = (".js", ".mjs", ".cjs", ".json", ".node", ".ts", ".jsx", ".tsx")


def _names(arg: str) -> tuple[str, ...]:
    """What in an argument may name a file: itself, an option's `=value`, and a short
    option's attached value (review19 A1c: `awk -fp3.awk`, `make -fb2.mk` ran a
    rewritten p3.awk unasked): each tail after its first few letters."""
    if not arg or "\0" in arg:
        return ()
    if arg.startswith("-") and "=" in arg:
        value = arg.split("=", 1)[1]
        return (value,) if value else ()
    if arg.startswith("-") and not arg.startswith("--"):
        return (arg, *(arg[at:] for at in range(2, min(len(arg), CLUSTERED_AT_MOST + 2))))
    return (arg,)


def _suffixed(named: str) -> tuple[str, ...]:
    """The names an interpreter may run for `named` when it names nothing (`node app`
    loads app.js: review19 A1c): itself with each of IMPLIED_SUFFIXES, when its last
    part has no suffix of its own."""
    last = named.rstrip("/").rsplit("/", 1)[-1]
    if not last or "." in last or named.startswith("-"):
        return ()
    return tuple(named + suffix for suffix in IMPLIED_SUFFIXES)


def _bound(roots: Sequence[Root], index: int, shown: str, path: str, room: int) -> ArgFile | None:
    try:
        located = locate(roots, path)
    except (ConfinementError, ValueError):
        if any(p.startswith(_MAGIC) for p in (path, os.path.normpath(path), _real(path))):
            return _unbound(index, shown, "a path through /proc or /dev may reach a shared folder")
        try:  # a shared folder by another name (a symlink to it, or above it)
            located = locate(roots, os.path.realpath(path))
        except (ConfinementError, ValueError, OSError):
            return None  # outside every shared folder: nothing the agent can write
    try:
        with located.root.confined() as root:
            fd = open_regular(root, located.relative, allow_hard_links=True)
    except ConfinementError as exc:
        if exc.problem in (Problem.MISSING, Problem.NOT_A_FOLDER, Problem.TOO_LONG):
            # Names nothing (most arguments): left out, as before, so a grant kept
            # then still answers; a file made there later adds itself, and asks again.
            return None
        if exc.problem is Problem.A_FOLDER:
            return _folder(index, shown, located.root.path / located.relative, room)
        return _unbound(index, shown, f"it is not a regular file here ({exc.problem})")
    except (OSError, ValueError) as exc:
        return _unbound(index, shown, f"it could not be read ({exc.__class__.__name__})")
    try:
        seen = os.fstat(fd)
        limit = min(HASHED_FILE_BYTES, room)
        if seen.st_size <= limit:
            digest, size = hashlib.sha256(), 0
            while size <= limit and (chunk := os.read(fd, min(_CHUNK, limit + 1 - size))):
                digest.update(chunk)
                size += len(chunk)
            if size <= limit:
                return ArgFile(index, shown, size, sha256=digest.hexdigest())
            seen = os.fstat(fd)  # it grew as it was read: bound as it is now
        identity = (
            f"{seen.st_dev}:{seen.st_ino}:{seen.st_size}:{seen.st_mtime_ns}:{seen.st_ctime_ns}"
        )
        return ArgFile(index, shown, seen.st_size, identity=identity)
    finally:
        os.close(fd)


def _real(path: str) -> str:
    """`path` with the host's links followed (a link into /proc, /dev/fd), or itself."""
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):
        return path


def _folder(index: int, shown: str, path: os.PathLike[str], room: int) -> ArgFile:
    """A folder an argument names (`python3 pkg` runs pkg/__main__.py), bound by what is
    in it: each entry's name, type and size, and a regular file's contents (SHA-256,
    while `room` lasts; past it its mtime and ctime). A link is bound by where it points
    and by what it points at (review19 A2: pkg/__main__.py -> ../s.py, its target
    rewritten, ran unasked): a file's contents (or identity past `room`); a link to a
    folder, which the listing would have to follow without end, fails closed."""
    listed: list[tuple[str, int, int, str]] = []
    read = 0
    for top, folders, files in os.walk(path):
        folders.sort()
        for name in folders + sorted(files):
            where = os.path.join(top, name)
            try:
                seen = os.lstat(where)
                kind = stat.S_IFMT(seen.st_mode)
                what = f"{seen.st_mtime_ns}:{seen.st_ctime_ns}"
                if kind == stat.S_IFREG and seen.st_size <= min(room - read, HASHED_FILE_BYTES):
                    what = _contents(where)
                    read += seen.st_size
                elif kind == stat.S_IFLNK:
                    target = _followed(where)
                    if target is not None and stat.S_ISDIR(target.st_mode):
                        why = "a folder holding a link to a folder"
                        return _unbound(index, shown, why)
                    what += f":{os.readlink(where)}"
                    if target is not None and stat.S_ISREG(target.st_mode):
                        if target.st_size <= min(room - read, HASHED_FILE_BYTES):
                            what += ":" + _contents(where, follow=True)
                            read += target.st_size
                        else:
                            what += f":{target.st_dev}:{target.st_ino}:{target.st_size}"
                            what += f":{target.st_mtime_ns}:{target.st_ctime_ns}"
            except OSError:
                continue  # gone meanwhile: the listing says so by its absence
            listed.append((os.path.relpath(where, path), kind, seen.st_size, what))
            if len(listed) > LISTED_AT_MOST:
                return _unbound(index, shown, f"a folder of more than {LISTED_AT_MOST:,} entries")
    digest = hashlib.sha256(json.dumps(listed).encode()).hexdigest()
    return ArgFile(index, shown, len(listed), identity=digest, kind="folder", read=read)


def _followed(where: str) -> os.stat_result | None:
    """What a link points at, or None when it points at nothing."""
    try:
        return os.stat(where)
    except OSError:
        return None


def _contents(where: str, *, follow: bool = False) -> str:
    """The SHA-256 of a regular file in a listed folder (opened without following a
    link unless `follow`, never blocking)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(where, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "not a regular file"
        digest = hashlib.sha256()
        while chunk := os.read(fd, _CHUNK):
            digest.update(chunk)
        return digest.hexdigest()
    finally:
        os.close(fd)
