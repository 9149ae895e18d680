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
back into a shared folder), a link out of the shared folders, a FIFO or device, a
folder too large to list, or names past what one call looks at (`_looked_at`: each
name costs lookups, paid before anyone is asked: review21 B4), each make the approval
good for that call only: approved "for this plan", the next call asks again. An
argument naming nothing is left out (a file made there later adds itself to the
binding, and asks again), and one the kernel refuses (too long) is never looked up.
What an argument file names (`gcc @opts`, `java @args`) is looked at as the argv's
own arguments, while all programs read the file alike (words between spaces); else,
or past its bounds, the approval is for that call only. Not bound (docs/architecture.md,
"exec approvals"): files a program opens by its own choice (imports from the working
folder but for the modules named after `-m`, a Makefile's includes, pytest's
conftest.py, a jar manifest's Class-Path).

What the arguments name is held still from before the look until the program has
ended (`held_places`, sandbox.held): the worker writes nothing there meanwhile, so the
program opens the bytes that were bound (review18 F5: an agent replacing the script
every ~2 ms had it run unasked 10 times in 30). Not held: a program of the agent's that
is running beside it and writes there (docs/architecture.md, "exec approvals").
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import posixpath
import secrets
import stat
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib.machinery import BYTECODE_SUFFIXES, EXTENSION_SUFFIXES, SOURCE_SUFFIXES
from typing import Final

from sandbox import ConfinementError, Problem, Root, locate, open_regular
from sandbox._lexical import PATH_MAX_BYTES

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
    """What `argv`'s arguments name in `roots` (`_looked_at`: each, an option's value, a
    short option's attached value, the names an interpreter adds to one), found from
    `cwd` as the program will (`where`: sandbox mode's finds /workspace/... where the
    host keeps it). A path outside every shared folder (bar /proc and /dev) is left
    out: nothing the agent can write. What was not looked at binds a nonce."""
    found: list[ArgFile] = []
    hashed = 0
    looked = _looked_at(argv, functools.partial(_read_argument_file, roots, cwd, where))
    unbound: set[tuple[int, str]] = set()  # once an argument (its implied names too)
    for index, named in looked.names:
        path = where(cwd, named)
        if path is None:
            why = "it names the workspace by a way round (..) that is not followed"
            file: ArgFile | None = _unbound(index, named, why)
        elif len(os.fsencode(path)) > PATH_MAX_BYTES:
            # The program may reach it from its working folder; the kernel would not
            # take it whole from here.
            why = "the path from the working folder is too long"
            file = _unbound(index, named, why)
        else:
            file = _bound(roots, index, named, path, HASHED_BYTES - hashed, where)
        if file is None or (file.kind == "unbound" and (index, file.why) in unbound):
            continue
        if file.kind == "unbound":
            unbound.add((index, file.why))
        found.append(file)
        hashed += file.size if file.sha256 else file.read
    found.extend(_unbound(*unread) for unread in looked.unread)
    if looked.cut is not None:
        found.append(_unbound(*looked.cut))
    found.extend(_unbound(index, named, why) for index, named, why in _looked_up(argv))
    return tuple(found)


# node's options that load a module before the script: a bare name (`-r mymod`) is
# looked up in each node_modules folder from the working folder up (review23 C6: an
# approval of `node -r mymod app.js` ran node_modules/mymod/index.js rewritten).
_NODE_PRELOADS: Final = ("-r", "--require", "--import", "--loader", "--experimental-loader")


def _looked_up(argv: Sequence[str]) -> Iterator[tuple[int, str, str]]:
    """The arguments a program looks up by a name of its own search rather than by
    path, which the binding cannot follow: node's preloaded bare module names."""
    if not argv or not os.path.basename(argv[0]).startswith("node"):
        return
    for index, arg in enumerate(argv[1 : LOOKED_AT + 1], start=1):
        option, eq, value = arg.partition("=")
        if eq and option in _NODE_PRELOADS:
            named = value
        elif index > 1 and argv[index - 1] in _NODE_PRELOADS:
            named = arg
        else:
            continue
        if named and not named.startswith(("./", "../", "/", "file:")):
            why = "node looks a module named so up in node_modules folders, which are not bound"
            yield index, named, why


def held_places(
    roots: Sequence[Root], cwd: str, argv: Sequence[str], where: Finder = as_found
) -> tuple[str, ...]:
    """The places `argv`'s arguments name, as `arg_files` finds them, each as written
    and as its links resolve now: held (sandbox.held) from before the look until the
    program has ended, so that what was bound is what the program opens, and a name
    bound as naming nothing stays so (review18 F5). What an argument file names is
    read here before it is held: `reads_argument_files` says when to read it again."""
    places: set[str] = set()
    looked = _looked_at(argv, functools.partial(_read_argument_file, roots, cwd, where))
    for _index, named in looked.names:
        path = where(cwd, named)
        if path is not None:  # unbound: its approval answers one call
            places.add(os.path.normpath(path))
            places.add(_resolved(path))
    return tuple(sorted(places))


def reads_argument_files(argv: Sequence[str]) -> bool:
    """Whether what `argv` names depends on what a file holds (an argument file,
    `@args`): `held_places` read it before it was held, and a change made before the
    hold began named other places than those held."""
    return any(arg.startswith("@") for arg in argv[1 : LOOKED_AT + 1])


def _first_few(names: Sequence[str]) -> str:
    """The first three of `names`, and whether there are others, for a prompt."""
    return ", ".join(names[:3]) + (" and others" if len(names) > 3 else "")


def written_beside(writers: Sequence[str]) -> ArgFile:
    """What binds an asked command while programs of other calls (`writers`) run that
    may write what its arguments name (sandbox.held): nothing that lasts."""
    calls = _first_few(writers)
    return _unbound(0, "what its arguments name", f"the running call {calls} may write there")


def not_held(links: Sequence[str]) -> ArgFile:
    """What binds an asked command whose folder arguments hold links the hold does not
    follow (sandbox.held: past its bound, or through /proc): what they lead to may
    change before the program opens it, so nothing that lasts."""
    shown = _first_few(links)
    why = f"where the links {shown} lead is not held while it waits and runs"
    return _unbound(0, "what its arguments name", why)


# What an interpreter adds to a name (`node app` runs app.js, even beside a folder app/;
# `java Main` runs Main.class from the class path, "." by default).
IMPLIED_SUFFIXES: Final = (
    *(".js", ".mjs", ".cjs", ".json", ".node", ".ts", ".jsx", ".tsx"),
    ".class",
)
# What the kernel takes (linux/limits.h): a path of more bytes than PATH_MAX-1, or with
# a part of more than NAME_MAX, is refused whole (ENAMETOOLONG), so it names nothing for
# any program and is not looked at.
NAME_MAX_BYTES: Final = 255
# The names looked at for one call, at most, and their characters in all (review21 B4:
# one argument of 130,000 bytes cost 16 s of lookups before anyone was asked). Each
# name costs a lookup in `arg_files` and one in `held_places`, 50-150 us each on this
# project's 2-core CI machine: 2,048 names are looked at within ~0.3 s each. They fit
# 64 arguments with their implied names (12 each), a compiler's 64 flags (a tail a
# letter: `-fno-strict-aliasing` has 18) and 30 modules named after `-m unittest` (68
# each: `_loaded`'s 19 for each of test_x, test_x/__init__ and test_x/__main__, two
# __pycache__ folders; 40 more a further part of a dotted name); 256 Ki characters fit
# 64 names as long as the kernel takes. What is past either is not looked at, and the
# approval answers that call only.
NAMES_AT_MOST: Final = 2048
NAME_BYTES_AT_MOST: Final = 256 * 1024
_TOO_MANY: Final = (
    f"its arguments name more than {NAMES_AT_MOST:,} paths, or {NAME_BYTES_AT_MOST // 1024:,} "
    "KiB of them, and the rest were not looked at"
)


@dataclass(frozen=True)
class _Looked:
    """The names looked at, each with its argument's index; when the looking stopped
    short, where and why (`_unbound`'s index, shown name and why); and the argument
    files whose names were not read (each as `_unbound`'s)."""

    names: tuple[tuple[int, str], ...]
    cut: tuple[int, str, str] | None
    unread: tuple[tuple[int, str, str], ...] = ()


# What an argument file is, as `_Look` reads it: its bytes, why its names cannot be
# read (it binds a nonce), or None when it is no regular file in a shared folder
# (its own binding says what it is).
Lister = Callable[[str], "bytes | str | None"]

# An argument file (gcc's, clang's, ld's, javac's and java's `@file`) is read for the
# arguments it holds, and what they name is bound as an argument's (bind23 r1: `java
# @args` bound args, not the class folder it named, swapped: ran unasked). Read whole
# up to this much; nested ones (gcc reads an `@` in one) up to this many a call, and
# this deep.
ARGUMENT_FILE_BYTES: Final = 256 * 1024
ARGUMENT_FILES_AT_MOST: Final = 16
ARGUMENT_FILES_DEEP: Final = 4
# What each program reads its own way (a quote, a backslash: java escapes only inside
# quotes, gcc anywhere; `#`: java's comment, even inside a word, whose start it drops:
# `-cp x#y` then `cls` is `-cp cls` to java 17; a NUL: gcc's end of the file; a vertical
# tab: a space to gcc only). A file holding none is words between spaces, tabs and line
# ends to them all.
_READ_APART: Final = (b"'", b'"', b"\\", b"#", b"\0", b"\v")
_READ_APART_WHY: Final = (
    "it is an argument file holding quotes, a backslash, # or a NUL, which each "
    "program reads its own way"
)


class _Look:
    """The names `_looked_at` has found so far, within its bounds."""

    def __init__(self, listed: Lister) -> None:
        self.listed = listed
        self.names: list[tuple[int, str]] = []
        self.seen: set[str] = set()  # a name looked at once a call
        self.spent = 0
        self.read: set[str] = set()  # the argument files read
        self.unread: list[tuple[int, str, str]] = []

    def argument(self, index: int, arg: str, *, module: bool, deep: int = 0) -> bool:
        """Take the names `arg` may name (`_names`), and those of the arguments in the
        file after its `@`; False once past NAMES_AT_MOST or NAME_BYTES_AT_MOST."""
        for named in _names(arg, module=module):
            # Looking at a name costs its length, taken or not; one longer than the
            # kernel takes is refused unread (an argument may hold 128 KiB).
            self.spent += len(named) if len(named) <= PATH_MAX_BYTES else 0
            if self.spent > NAME_BYTES_AT_MOST or len(self.names) >= NAMES_AT_MOST:
                return False
            if named not in self.seen and _taken_by_kernel(named):
                self.seen.add(named)
                self.names.append((index, named))
        if arg.startswith("@") and _taken_by_kernel(arg[1:]) and arg[1:] not in self.read:
            return self._argument_file(index, arg[1:], deep)
        return True

    def _argument_file(self, index: int, named: str, deep: int) -> bool:
        if deep >= ARGUMENT_FILES_DEEP or len(self.read) >= ARGUMENT_FILES_AT_MOST:
            why = (
                f"it is an argument file past the {ARGUMENT_FILES_AT_MOST} read, or "
                f"{ARGUMENT_FILES_DEEP} deep in others, and what it names was not read"
            )
            self.unread.append((index, named, why))
            return True
        self.read.add(named)
        listed = self.listed(named)
        if isinstance(listed, bytes) and any(mark in listed for mark in _READ_APART):
            listed = _READ_APART_WHY
        if isinstance(listed, str):
            self.unread.append((index, named, listed))
        if not isinstance(listed, bytes):
            return True
        before = ""
        for word in listed.split():
            arg = os.fsdecode(word)
            if not self.argument(index, arg, module=_takes_a_module(before), deep=deep + 1):
                return False
            before = arg
        return True


def _no_argument_files(named: str) -> None:
    return None


def _looked_at(argv: Sequence[str], listed: Lister = _no_argument_files) -> _Looked:
    """Every name the first LOOKED_AT of `argv`'s arguments may name (`_names`), and
    those of the arguments in the argument files they name (read by `listed`), within
    NAMES_AT_MOST names and NAME_BYTES_AT_MOST characters; a name the kernel refuses
    is left out before any lookup."""
    look = _Look(listed)
    modules = False
    for index, arg in enumerate(argv[1:], start=1):
        if index > LOOKED_AT:
            why = f"arguments past the {LOOKED_AT}th are not read"
            return _Looked(tuple(look.names), (index, "…", why), tuple(look.unread))
        module = index > 1 and _takes_a_module(argv[index - 1])
        if not look.argument(index, arg, module=module or (modules and not arg.startswith("-"))):
            return _Looked(tuple(look.names), (index, "…", _TOO_MANY), tuple(look.unread))
        # Once python runs a module, the arguments after it may be modules it imports
        # by name (`-m unittest test_mod`, `-m runpy mod`: review23 C6).
        modules = modules or module or _runs_an_attached_module(arg)
    return _Looked(tuple(look.names), None, tuple(look.unread))


def _read_argument_file(
    roots: Sequence[Root], cwd: str, where: Finder, named: str
) -> bytes | str | None:
    """The bytes of the argument file `named` (after an `@`), found from `cwd` as the
    program will, read beneath its shared folder as `_bound` reads a file; why not,
    past ARGUMENT_FILE_BYTES or outside every shared folder (a file of the host's,
    whose words would be looked up and held: never read); None when it names no
    regular file in a shared folder (its own binding says what it is)."""
    path = where(cwd, named)
    if path is None or len(os.fsencode(path)) > PATH_MAX_BYTES:
        return None
    try:
        located = locate(roots, path)
    except (ConfinementError, ValueError):
        real = _resolved(path)
        if any(p.startswith(_MAGIC) for p in (path, os.path.normpath(path), real)):
            return None
        try:
            located = locate(roots, real)
        except (ConfinementError, ValueError):
            if not os.path.isfile(real):
                return None
            return "it is an argument file outside the shared folders, not read"
    try:
        with located.root.confined() as root:
            fd = open_regular(root, located.relative, allow_hard_links=True)
    except (ConfinementError, OSError, ValueError):
        return None
    try:
        data = b""
        while len(data) <= ARGUMENT_FILE_BYTES and (
            chunk := os.read(fd, ARGUMENT_FILE_BYTES + 1 - len(data))
        ):
            data += chunk
    finally:
        os.close(fd)
    if len(data) > ARGUMENT_FILE_BYTES:
        return (
            f"it is an argument file of more than {ARGUMENT_FILE_BYTES // 1024} KiB, and "
            "what it names was not read"
        )
    return data


def _taken_by_kernel(named: str) -> bool:
    """Whether the kernel takes `named` as a path (linear in its length, which a caller
    has bounded to PATH_MAX_BYTES characters)."""
    if not named or len(named) > PATH_MAX_BYTES:  # each character is a byte or more
        return False
    encoded = os.fsencode(named)
    if len(encoded) > PATH_MAX_BYTES:
        return False
    return all(len(part) <= NAME_MAX_BYTES for part in encoded.split(b"/"))


def _names(arg: str, *, module: bool = False) -> Iterator[str]:
    """What in an argument may name a file, lazily (an argument may hold 128 KiB):
    itself, a long option's `=value` and a `NAME=value`'s, after an `@` the file gcc,
    javac and java read more arguments from, and for a `-m`'s argument the module's
    files (`python3 -m mod` runs ./mod.py), each with the names an interpreter adds
    (`_suffixed`, `_class_file`) and, for a list of paths, each of its parts
    (`_listed_paths`: `java -cp a:lib/*`); and a short option's attached value
    (review19 A1c: `awk -fp3.awk`) as each tail after its first letter, however many
    flags come before (review21 B3: `make -kkkkkkkkkfb4.mk`) and whatever it holds
    (`make -fb=3.mk` reads b=3.mk), with the part before a ':' or '=' in it (a list's
    first, `-Djava.class.path=a:b`, `ruby -Ia:b`: the other parts are later tails; a
    java agent's jar before its options, `-javaagent:a.jar=opts`), after an
    `m` as a module too (`python3 -mmod`). A tail gets no implied names: no
    interpreter takes its script attached to an option, and a cluster's tails times
    IMPLIED_SUFFIXES were most of the names a compiler's flags cost."""
    if not arg or "\0" in arg:
        return
    for whole in _wholes(arg):
        yield whole
        yield from _suffixed(whole)
        yield from _class_file(whole)
        yield from _listed_paths(whole)
    if module:
        yield from _modules(arg)
    if arg.startswith("-") and not arg.startswith("--"):
        # A tail longer than the kernel takes names nothing: never made.
        start = max(2, len(arg) - PATH_MAX_BYTES)
        # Where the part each tail starts ends (the next ':' of a list, or '=' before an
        # option's own options: `-javaagent:agent.jar=opts` runs agent.jar), found in
        # one pass.
        ends, stop = [len(arg)] * (len(arg) - start), len(arg)
        for at in range(len(arg) - 1, start - 1, -1):
            ends[at - start] = stop
            stop = at if arg[at] in ":=" else stop
        for at in range(start, len(arg)):
            yield arg[at:]
            end = ends[at - start]
            if arg[at] not in ":=" and (end < len(arg) or arg.endswith("/*")):
                yield from _in_a_list(arg[at:end])
            if arg[at - 1] == "m":
                yield from _module_files(arg[at:])


def _wholes(arg: str) -> Iterator[str]:
    if arg.startswith("--") and "=" in arg:
        yield arg.split("=", 1)[1]
        return
    yield arg
    if not arg.startswith("-") and "=" in arg:
        yield arg.split("=", 1)[1]  # `make MAKEFILES=inc.mk` reads inc.mk first
    if arg.startswith("@"):
        yield arg[1:]


def _modules(arg: str) -> Iterator[str]:
    """The files of the module `arg` names: its own, or, for a relative `.py` path, the
    module's it is (`-m unittest tests/test_mod.py` imports tests.test_mod)."""
    yield from _module_files(arg)
    if arg.endswith(".py") and not arg.startswith("/"):
        yield from _module_files(plain(arg).removesuffix(".py").replace("/", "."))


def _listed_paths(whole: str) -> Iterator[str]:
    """Each part of a list of paths (`java -cp cls:lib.jar`, `--module-path=a:b`, a
    `NAME=a:b`'s value): java finds its classes in each (bind23 r1: `java -cp cls:x
    pkg.Main` bound nothing, and cls/pkg/Main.class swapped ran unasked). An empty
    part is the working folder, whose class `_class_file` names."""
    if whole.startswith("-") or (":" not in whole and not whole.endswith("*")):
        return
    for part in whole.split(":"):
        yield from _in_a_list(part)


def _in_a_list(part: str) -> Iterator[str]:
    """A part of a list of paths as it names a file or folder: itself, and for java's
    `dir/*` (each jar in dir) the folder, `*` the working folder's."""
    if not part:
        return
    if part == "*":
        yield "."
    elif part.endswith("/*"):
        yield part[:-2] or "/"
    else:
        yield part


def _class_file(name: str) -> tuple[str, ...]:
    """The class file java runs for a class named `name` from the working folder (its
    class path by default): `pkg.Main` runs pkg/Main.class (bind23 r1)."""
    if len(name) > PATH_MAX_BYTES or name.startswith("-"):
        return ()
    parts = name.split(".")
    if len(parts) < 2 or not all(part.replace("$", "_").isidentifier() for part in parts):
        return ()
    return ("/".join(parts) + ".class",)


def _takes_a_module(arg: str) -> bool:
    """Whether `arg` is a short-option cluster ending in `-m`: python reads the next
    argument as a module to run."""
    return arg.startswith("-") and not arg.startswith("--") and arg.endswith("m")


def _runs_an_attached_module(arg: str) -> bool:
    """Whether `arg` is a short-option cluster with a value after an `m` (`-mmod`)."""
    return arg.startswith("-") and not arg.startswith("--") and "m" in arg[1:-1]


# What python's import system may load for a module it finds in a folder, in
# FileFinder's order: an extension, the source, a sourceless .pyc. The extension's
# names are the worker's python's (EXTENSION_SUFFIXES) and, on this platform, each
# CPython 3.6 to 3.16's, free-threaded ones too: the allowlisted python may be another
# version than the worker's (review23 C15: a python3.12 loads
# mod.cpython-312-x86_64-linux-gnu.so, which 3.11's names left unbound).
def _extension_suffixes() -> tuple[str, ...]:
    mine = tuple(EXTENSION_SUFFIXES)
    tag = f".{sys.implementation.cache_tag}-"
    if not mine or not mine[0].startswith(tag):
        return mine  # not CPython's shape: its own only
    platform = mine[0].removeprefix(tag)  # x86_64-linux-gnu.so
    abis = (
        *(f"3{minor}m" for minor in (6, 7)),
        *(f"3{minor}" for minor in range(8, 17)),
        *(f"3{minor}t" for minor in range(13, 17)),
    )
    return tuple(dict.fromkeys((*mine, *(f".cpython-{abi}-{platform}" for abi in abis))))


_LOADED_SUFFIXES: Final = (*_extension_suffixes(), *SOURCE_SUFFIXES, *BYTECODE_SUFFIXES)
# Where python keeps the caches it takes over a source (__pycache__/<name>.<tag>[.opt-N]
# .pyc, a cache "unchecked hash-based" valid whatever the source holds: PEP 552,
# review23 C5, an fs_write of it swapped the code of an approved `python3 -m mod`): each
# version its own tag, so the folder is bound whole, and held, a cache of any python
# made there meanwhile `busy` (review23 C15).
_CACHES: Final = "__pycache__"


def _module_files(name: str) -> Iterator[str]:
    """The files python may run for the module `name` (`-m a.b`) found from its
    working folder (its first place to look), lazily: at each level (a, then a/b) what
    it imports as a package (a/__init__.py and its kin) or as a module (a.py and its
    kin: `_loaded`), the caches beside each (a's __pycache__ folder, a/__pycache__), and
    a package's __main__ (runpy runs a/b/__main__.py)."""
    if len(name) > PATH_MAX_BYTES:
        return
    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        return
    yield _CACHES
    stem = ""
    for part in parts:
        stem = f"{stem}/{part}" if stem else part
        yield from _loaded(f"{stem}/__init__")
        yield from _loaded(stem)
        yield f"{stem}/{_CACHES}"  # its own caches as a package, its modules' as a level
    yield from _loaded(f"{stem}/__main__")


def _loaded(stem: str) -> Iterator[str]:
    """What the import system may load for `stem` (a/b for the module a.b)."""
    for suffix in _LOADED_SUFFIXES:
        yield stem + suffix


def _suffixed(named: str) -> tuple[str, ...]:
    """The names an interpreter may run for `named` (`node app` loads app.js, whether
    or not there is a folder app: review19 A1c, review21 B3): itself with each of
    IMPLIED_SUFFIXES, a suffix of its own or not (`node app.v2` runs app.v2.js:
    review23 C6)."""
    if len(named) > PATH_MAX_BYTES:
        return ()
    last = named.rstrip("/").rsplit("/", 1)[-1]
    if not last or last in (".", "..") or named.startswith("-"):
        return ()
    return tuple(named + suffix for suffix in IMPLIED_SUFFIXES)


def _bound(
    roots: Sequence[Root], index: int, shown: str, path: str, room: int, where: Finder
) -> ArgFile | None:
    try:
        located = locate(roots, path)
    except (ConfinementError, ValueError):
        real = _resolved(path)
        if any(p.startswith(_MAGIC) for p in (path, os.path.normpath(path), real)):
            return _unbound(index, shown, "a path through /proc or /dev may reach a shared folder")
        try:  # a shared folder by another name (a symlink to it, or above it)
            located = locate(roots, real)
        except (ConfinementError, ValueError):
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
            return _folder(roots, index, shown, located.root.path / located.relative, room, where)
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


# The kernel's own limit on links followed in one lookup (ELOOP).
_LINKS_AT_MOST: Final = 40


def _resolved(path: str) -> str:
    """os.path.realpath(path) for an absolute `path` (its links followed; past a part
    that names nothing, the rest as written, each `..` taking a part off), with the
    kernel doing the walking: the deepest part it resolves found in a few opens, each
    linear in the path (realpath's lstat of every prefix is quadratic in its parts:
    review21 B4)."""
    # Each turn follows a link, or takes the `..`s past a part naming nothing (after
    # which none is left but a link's).
    for _ in range(2 * _LINKS_AT_MOST + 2):
        parts = [part for part in path.split("/") if part not in ("", ".")]
        known, head = _deepest(parts)
        if known == len(parts):
            return head
        rest = parts[known:]
        try:
            target = os.readlink(os.path.join(head, rest[0]))
        except (OSError, ValueError):  # names nothing (or is no link): as written on
            path = posixpath.normpath("/".join([head, *rest]))
            if ".." not in rest:
                return path
            continue  # `..` past a part naming nothing went back where links count
        path = posixpath.join(head, target, *rest[1:])
    return posixpath.normpath(path)  # links in a loop: realpath leaves them so too


def _deepest(parts: Sequence[str]) -> tuple[int, str]:
    """How many of `parts` (an absolute path's) the kernel resolves, and to where: the
    whole, else its folder (most names that name nothing), else by halving."""
    for known in (len(parts), len(parts) - 1):
        if known >= 0 and (real := _kernel_real(parts[:known])) is not None:
            return known, real
    low, high, real = 0, max(len(parts) - 2, 0), "/"
    while low < high:  # parts[:low] resolves; parts[:high + 1] does not
        middle = (low + high + 1) // 2
        if (found := _kernel_real(parts[:middle])) is not None:
            low = middle
        else:
            high = middle - 1
    found = _kernel_real(parts[:low])
    return low, found if found is not None else real


def _kernel_real(parts: Sequence[str]) -> str | None:
    """Where the kernel resolves `/parts...` (its links followed), or None: it does not,
    or to nothing a path names (a pipe behind /dev/fd/0)."""
    try:
        fd = os.open("/" + "/".join(parts), os.O_PATH | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    finally:
        os.close(fd)
    return real if real.startswith("/") else None


# What a folder may hold whose bytes are not in it (review21 B6: sub/Makefile a FIFO,
# `make -C sub` read what a program beside fed it, and the listing never changed: a
# FIFO's writes need no write access to the read-only pin, and leave its times as they
# were).
_FED: Final = frozenset({stat.S_IFIFO, stat.S_IFSOCK, stat.S_IFCHR, stat.S_IFBLK})
_FED_WHY: Final = "a folder holding a FIFO, socket or device, whose bytes are fed to it"


# The links a folder's listing follows, at most, and the steps (a path's parts, a link's
# target's parts) following one may take: each step is a lookup paid before anyone is
# asked (review23 C3: a link whose 4 KiB target is `d/../d/../...` cost ~800 lookups).
LINKS_FOLLOWED_AT_MOST: Final = 128
_STEPS_AT_MOST: Final = 256
_UNFOLLOWED_WHY: Final = "a folder holding a link that leads further than the program's view"


def _folder(
    roots: Sequence[Root], index: int, shown: str, path: os.PathLike[str], room: int, where: Finder
) -> ArgFile:
    """A folder an argument names (`python3 pkg` runs pkg/__main__.py), bound by what is
    in it: each entry's name, type and size, and a regular file's contents (SHA-256,
    while `room` lasts; past it its mtime and ctime). A link is bound by where it points
    and by what it points at as the program follows it (`where`: review19 A2,
    pkg/__main__.py -> ../s.py, its target rewritten, ran unasked; review23 C1, in
    sandbox mode -> /workspace/s.py, which the host never found, the same): a file's
    contents (or identity past `room`); a link to a folder, which the listing would
    have to follow without end, a FIFO, socket or device, in it or linked to, more than
    LINKS_FOLLOWED_AT_MOST links, or one the program's view cannot be followed through
    (through /proc or /dev: review23 C14), fail closed; one out of every shared folder
    is bound by where it leads (C16)."""
    listed: list[tuple[str, int, int, str]] = []
    read = links = 0
    for top, folders, files in _walked(os.fspath(path)):
        for name in folders + files:
            entry = os.path.join(top, name)
            try:
                seen = os.lstat(entry)
                kind = stat.S_IFMT(seen.st_mode)
                if kind in _FED:
                    return _unbound(index, shown, _FED_WHY)
                what = f"{seen.st_mtime_ns}:{seen.st_ctime_ns}"
                if kind == stat.S_IFREG and seen.st_size <= min(room - read, HASHED_FILE_BYTES):
                    what = _contents(entry)
                    read += seen.st_size
                elif kind == stat.S_IFLNK:
                    links += 1
                    if links > LINKS_FOLLOWED_AT_MOST:
                        why = f"a folder holding more than {LINKS_FOLLOWED_AT_MOST} links"
                        return _unbound(index, shown, why)
                    led = _led_to(roots, top, name, where, min(room - read, HASHED_FILE_BYTES))
                    if isinstance(led, _Unfollowed):
                        return _unbound(index, shown, led.why)
                    what += f":{os.readlink(entry)}{led[0]}"
                    read += led[1]
            except OSError:
                continue  # gone meanwhile: the listing says so by its absence
            listed.append((os.path.relpath(entry, path), kind, seen.st_size, what))
            if len(listed) > LISTED_AT_MOST:
                return _unbound(index, shown, f"a folder of more than {LISTED_AT_MOST:,} entries")
    digest = hashlib.sha256(json.dumps(listed).encode()).hexdigest()
    return ArgFile(index, shown, len(listed), identity=digest, kind="folder", read=read)


def _walked(path: str) -> Iterator[tuple[str, list[str], list[str]]]:
    """os.walk(path)'s folders, each with its folders and other entries sorted, in the
    same order, without following a link even to learn its kind (os.walk stats each:
    400 links into a chain of 40 4-KiB links cost it 8 s: review23 C3). A link to a
    folder is among the other entries (`_led_to` says what it leads to)."""
    tops = [path]
    while tops:
        top = tops.pop()
        try:
            with os.scandir(top) as listing:
                entries = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in listing]
        except OSError:
            continue  # gone meanwhile, or not to be listed: as os.walk leaves it
        folders = sorted(name for name, folder in entries if folder)
        yield top, folders, sorted(name for name, folder in entries if not folder)
        tops.extend(os.path.join(top, name) for name in reversed(folders))


@dataclass(frozen=True)
class _Unfollowed:
    why: str


def _led_to(
    roots: Sequence[Root], folder: str, name: str, where: Finder, room: int
) -> tuple[str, int] | _Unfollowed:
    """What the link `name` in `folder` leads to, as the program follows it
    (`followed_as_run`), and the bytes read to say so: a regular file's SHA-256 (past
    `room` its identity), "" for nothing; outside every shared folder, where it leads
    (nothing there is the agent's, and its digest went to the agent: review23 C16); a
    folder, a FIFO, socket or device, or a way the program's view cannot follow,
    _Unfollowed. The file is looked up once, and read through that lookup (no second
    walk, no swap between the look and the read)."""
    led = followed_as_run(os.path.join(folder, name), where)
    if led is None:
        return _Unfollowed(_UNFOLLOWED_WHY)
    try:
        locate(roots, led)
    except (ConfinementError, ValueError):
        return f":outside:{led}", 0
    try:
        fd = os.open(led, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return "", 0  # leads to nothing
    try:
        seen = os.fstat(fd)
        if stat.S_ISDIR(seen.st_mode):
            return _Unfollowed("a folder holding a link to a folder")
        if stat.S_IFMT(seen.st_mode) in _FED:
            return _Unfollowed(_FED_WHY)
        if not stat.S_ISREG(seen.st_mode):
            return _Unfollowed(_UNFOLLOWED_WHY)  # a link again: changed as it was followed
        if seen.st_size > room:
            identity = f"{seen.st_dev}:{seen.st_ino}:{seen.st_size}"
            return f":{identity}:{seen.st_mtime_ns}:{seen.st_ctime_ns}", 0
        return ":" + _contents(f"/proc/self/fd/{fd}", follow=True), seen.st_size
    finally:
        os.close(fd)


def followed_as_run(link: str, where: Finder) -> str | None:
    """The host path the program reaches through `link` (a host path whose folder is
    real: no link on its way), each link on the way followed as the program follows
    it: its target found by `where` from the link's folder (in sandbox mode
    `/workspace/...` is the plan's workspace: review23 C1); None through /proc or /dev,
    past LINKS_AT_MOST links or _STEPS_AT_MOST steps, or where `where` cannot say. Past
    a part naming nothing, the rest as written."""
    done, parts = os.path.dirname(link), [os.path.basename(link)]
    steps = links = 0
    while parts:
        part = parts.pop(0)
        steps += 1
        if steps > _STEPS_AT_MOST:
            return None
        if part in ("", "."):
            continue
        if part == "..":
            done = os.path.dirname(done)
            continue
        here = os.path.join(done, part)
        if here in ("/proc", "/dev") or here.startswith(_MAGIC):
            # The program's own /proc (and /dev/fd) there, the worker's here (review23
            # C14: pkg/__main__.py -> /proc/self/cwd/s.py was followed to nothing).
            return None
        try:
            target = os.readlink(here)
        except OSError as exc:
            if exc.errno == errno.EINVAL:  # no link: a part of the way, or the end
                done = here
                continue
            return posixpath.join(here, *parts)  # names nothing: as written on
        links += 1
        found = where(done, target) if links <= _LINKS_AT_MOST else None
        if found is None:
            return None
        if len(found) > PATH_MAX_BYTES:
            return None
        done, parts = "/", [*found.split("/"), *parts]
    return done


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
