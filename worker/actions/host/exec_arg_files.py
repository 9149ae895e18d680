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
symlink out). Not bound (docs/architecture.md, "exec approvals"): files a program
opens by its own choice (imports from the working folder, a Makefile's includes,
pytest's conftest.py), a folder given as an argument, and a change made between the
look and the program's start.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from sandbox import ConfinementError, Root, locate, open_regular

# Hashed whole up to this much each and in all; past it a file is bound by its identity.
HASHED_FILE_BYTES: Final = 4 * 1024 * 1024
HASHED_BYTES: Final = 16 * 1024 * 1024
# Arguments looked at, at most (an argv may have thousands: `rm` of a glob).
LOOKED_AT: Final = 64
_CHUNK: Final = 1024 * 1024


@dataclass(frozen=True)
class ArgFile:
    """A regular file an argument names: where (argv index, the path as found) and what
    binds it: `sha256` of its contents, or "" and `identity` when it was not hashed."""

    index: int
    path: str
    size: int
    sha256: str = ""
    identity: str = ""

    def bound(self) -> dict[str, object]:
        if self.sha256:
            return {"arg": self.index, "bytes": self.size, "sha256": self.sha256}
        return {"arg": self.index, "bytes": self.size, "identity": self.identity}

    def line(self) -> str:
        """How the prompt names it."""
        if self.sha256:
            return f"{self.path}: {self.size:,} bytes, sha256 {self.sha256}"
        return (
            f"{self.path}: {self.size:,} bytes, too large to read for the prompt: bound to "
            "this very file as it is now (any change asks again)"
        )


def arg_files(
    roots: Sequence[Root],
    cwd: str,
    argv: Sequence[str],
    seen_outside: Callable[[str], str] = lambda path: path,
) -> tuple[ArgFile, ...]:
    """The regular files in `roots` that `argv`'s arguments name (an argument, or the
    value of `--option=value`), resolved from `cwd` as the program will; absolute
    paths through `seen_outside` (a workspace's /workspace/... as the host sees it).
    Anything else (no such file, a folder, outside the roots) is left out."""
    found: list[ArgFile] = []
    hashed = 0
    for index, arg in enumerate(argv[1 : LOOKED_AT + 1], start=1):
        for named in _names(arg):
            path = seen_outside(named) if named.startswith("/") else os.path.join(cwd, named)
            file = _bound(roots, index, named, path, HASHED_BYTES - hashed)
            if file is not None:
                found.append(file)
                hashed += file.size if file.sha256 else 0
    return tuple(found)


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
        with located.root.confined() as root:
            fd = open_regular(root, located.relative, allow_hard_links=True)
    except (ConfinementError, OSError, ValueError):
        return None  # not a regular file in a shared folder: nothing the sandbox runs
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
