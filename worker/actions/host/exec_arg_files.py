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


def arg_files(
    roots: Sequence[Root],
    cwd: str,
    argv: Sequence[str],
    seen_outside: Callable[[str], str] = lambda path: path,
) -> tuple[ArgFile, ...]:
    """What `argv`'s arguments (each, or the value of `--option=value`) name in `roots`,
    resolved from `cwd` as the program will; absolute paths through `seen_outside` (a
    workspace's /workspace/... as the host sees it). A path outside every shared folder
    (bar /proc and /dev) is left out: nothing the agent can write."""
    found: list[ArgFile] = []
    hashed = 0
    for index, arg in enumerate(argv[1:], start=1):
        if index > LOOKED_AT:
            found.append(_unbound(index, "…", f"arguments past the {LOOKED_AT}th are not read"))
            break
        for named in _names(arg):
            path = seen_outside(named) if named.startswith("/") else os.path.join(cwd, named)
            file = _bound(roots, index, named, path, HASHED_BYTES - hashed)
            if file is not None:
                found.append(file)
                hashed += file.size if file.sha256 else file.read
    return tuple(found)


def held_places(
    cwd: str, argv: Sequence[str], seen_outside: Callable[[str], str] = lambda path: path
) -> tuple[str, ...]:
    """The places `argv`'s arguments name, as `arg_files` finds them, each as written
    and as its links resolve now: held (sandbox.held) from before the look until the
    program has ended, so that what was bound is what the program opens, and a name
    bound as naming nothing stays so (review18 F5)."""
    places: set[str] = set()
    for arg in argv[1 : LOOKED_AT + 1]:
        for named in _names(arg):
            path = seen_outside(named) if named.startswith("/") else os.path.join(cwd, named)
            places.add(os.path.normpath(path))
            places.add(os.path.realpath(path))
    return tuple(sorted(places))


def written_beside(writers: Sequence[str]) -> ArgFile:
    """What binds an asked command while programs of other calls (`writers`) run that
    may write what its arguments name (sandbox.held): nothing that lasts."""
    calls = ", ".join(writers[:3]) + (" and others" if len(writers) > 3 else "")
    return _unbound(0, "what its arguments name", f"the running call {calls} may write there")


def _names(arg: str) -> tuple[str, ...]:
    """What in an argument may name a file: itself, and an option's `=value`."""
    if not arg or "\0" in arg:
        return ()
    if arg.startswith("-") and "=" in arg:
        value = arg.split("=", 1)[1]
        return (value,) if value else ()
    return (arg,)


def _bound(roots: Sequence[Root], index: int, shown: str, path: str, room: int) -> ArgFile | None:
    try:
        located = locate(roots, path)
    except (ConfinementError, ValueError):
        if os.path.normpath(path).startswith(_MAGIC) or path.startswith(_MAGIC):
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


def _folder(index: int, shown: str, path: os.PathLike[str], room: int) -> ArgFile:
    """A folder an argument names (`python3 pkg` runs pkg/__main__.py), bound by what is
    in it, links not followed: each entry's name, type and size, and a regular file's
    contents (SHA-256, while `room` lasts; past it its mtime and ctime)."""
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
            except OSError:
                continue  # gone meanwhile: the listing says so by its absence
            listed.append((os.path.relpath(where, path), kind, seen.st_size, what))
            if len(listed) > LISTED_AT_MOST:
                return _unbound(index, shown, f"a folder of more than {LISTED_AT_MOST:,} entries")
    digest = hashlib.sha256(json.dumps(listed).encode()).hexdigest()
    return ArgFile(index, shown, len(listed), identity=digest, kind="folder", read=read)


def _contents(where: str) -> str:
    """The SHA-256 of a regular file in a listed folder (opened without following a
    link, never blocking)."""
    fd = os.open(where, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        digest = hashlib.sha256()
        while chunk := os.read(fd, _CHUNK):
            digest.update(chunk)
        return digest.hexdigest()
    finally:
        os.close(fd)
