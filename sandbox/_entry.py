"""The sandbox's entry helper (entry.c): compiled once, kept where no agent can reach.

Landlock must be applied from inside the sandbox, after bubblewrap has made its
mounts (Landlock forbids mount()) and just before the pinned program starts;
bubblewrap cannot do it. `entry.c` does it, with the resource limits and the pid
cap, in the one process that then becomes the program. A Python helper would cost
10-25 ms per call; this one costs well under one.

It is compiled with the system's C compiler on first use, into a cache folder
under the worker's data folder (which fs_* and exec never show an agent), named by
the hash of its source, of the machine and of the ways it is built, so an edited
source never runs an old build. The build goes to a temporary name in that folder
and is renamed into place (atomic on one file system); a folder or file that others
could write is refused, never used.

On x86-64 it is first built without the C library (static, its own start and system
calls; see entry.c): the C library's start costs each exec 0.2-0.3 ms on a virtual
machine, most of it asking the processor for its features (CPUID traps to the
hypervisor). A build must also answer a trial run as the helper does (exit 125 and
its message when no program is named); where that build fails, or on another
machine, it is built with the C library, as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import hashlib
import os
import shutil
import stat
import struct
import subprocess
import tempfile
from pathlib import Path
from typing import Final

SOURCE: Final = Path(__file__).with_name("entry.c")
INSIDE: Final = "/run/agentworker/entry"  # where the sandbox sees it
PROC_INSIDE: Final = "/run/agentworker/proc"  # a procfs of the sandbox's own, for the pid cap
FAILED: Final = 125  # its exit code when it could not do what it was asked
SAYS: Final = b"agentworker-entry: "  # how its own messages start

_CREATE_RULESET: Final = 444  # the same number on every architecture
_VERSION: Final = 1


class EntryUnavailableError(Exception):
    """The helper cannot be had here; the message says why and what would fix it."""


def landlock_abi() -> tuple[int, str]:
    """The kernel's Landlock ABI version (0 when it has none) and, if none, why."""
    if os.uname().sysname != "Linux":
        return 0, "Landlock is Linux only"
    libc = ctypes.CDLL(None, use_errno=True)
    abi = int(libc.syscall(_CREATE_RULESET, None, 0, _VERSION))
    if abi > 0:
        return abi, ""
    err = ctypes.get_errno()
    why = {
        errno.ENOSYS: "this kernel was built without Landlock (it needs Linux 5.13+ with "
        "CONFIG_SECURITY_LANDLOCK)",
        errno.EOPNOTSUPP: "the kernel has Landlock but it is switched off at boot (add "
        "landlock to the lsm= boot parameter)",
    }.get(err, f"the kernel refused it: {os.strerror(err)}")
    return 0, why


# Each way of building the helper, tried in turn: without the C library where entry.c
# has its own start for the machine, then with it.
FREESTANDING: Final = (
    "-static",
    "-nostdlib",
    "-ffreestanding",
    "-fno-stack-protector",
    "-fno-pie",
    "-no-pie",
    "-DAGENTWORKER_NOLIBC",
)
WITH_LIBC: Final[tuple[str, ...]] = ()


def recipes(machine: str | None = None) -> list[tuple[str, ...]]:
    """The compiler flags to try, in order, on `machine` (this one by default)."""
    machine = machine or os.uname().machine
    return [FREESTANDING, WITH_LIBC] if machine == "x86_64" else [WITH_LIBC]


def digest() -> str:
    machine = os.uname().machine
    recipe = repr(recipes(machine)).encode()
    return hashlib.sha256(SOURCE.read_bytes() + machine.encode() + recipe).hexdigest()[:16]


def cached(cache_dir: Path) -> Path:
    """Where the build of this source lives in `cache_dir`."""
    return cache_dir / f"entry-{digest()}"


def build(cache_dir: Path, cc: str) -> str:
    """The helper's path, compiling it first if `cache_dir` has no build of this source."""
    target = cached(cache_dir)
    _private_folder(cache_dir)
    if target.exists():
        _check_ours(target)
        return str(target)
    compiler = shutil.which(cc)
    if compiler is None:
        raise EntryUnavailableError(
            f"no C compiler ({cc!r}) was found to build the sandbox's Landlock helper "
            "(Debian/Ubuntu: apt install gcc libc6-dev; or set [exec] cc)"
        )
    fd, temporary = tempfile.mkstemp(prefix=".entry-", dir=cache_dir)
    os.close(fd)
    said: str | None = None
    try:
        for flags in recipes():
            said = _compile(compiler, flags, temporary)
            if said is None:
                break
        else:
            raise EntryUnavailableError(
                f"{compiler} could not build the sandbox's Landlock helper: {said or 'no message'}"
            )
        os.chmod(temporary, 0o500)
        with open(temporary, "rb") as built:
            os.fsync(built.fileno())
        os.replace(temporary, target)
    except subprocess.TimeoutExpired:
        raise EntryUnavailableError(f"{compiler} took over 120 s to build the helper") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    return str(target)


def _compile(compiler: str, flags: tuple[str, ...], target: str) -> str | None:
    """Build the helper into `target` with `flags`: None once built and answering as
    the helper does, else what went wrong."""
    done = subprocess.run(  # a fixed command line, no shell
        [compiler, "-O2", "-Wall", *flags, "-o", target, str(SOURCE)],
        capture_output=True,
        timeout=120,
        check=False,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C"},
    )
    if done.returncode != 0:
        return done.stderr.decode(errors="replace").strip()[-400:]
    os.chmod(target, 0o700)
    try:  # no program named: it must say so, as itself, and exit 125
        trial = subprocess.run([target], capture_output=True, timeout=30, check=False, env={})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the build did not run: {exc}"
    if trial.returncode != FAILED or not trial.stderr.startswith(SAYS):
        return f"the build did not answer as the helper does (exit {trial.returncode})"
    return None


def _private_folder(folder: Path) -> None:
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise EntryUnavailableError(
            f"{folder} is not a folder of this user's that only it can write; the sandbox's "
            "helper is never kept where others could replace it (remove the folder)"
        )


def _check_ours(path: Path) -> None:
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise EntryUnavailableError(
            f"{path} is not a file of this user's that only it can write; it is not run "
            "(remove it and it is built again)"
        )


@functools.lru_cache(maxsize=256)
def _interpreter(path: str, _identity: tuple[int, int, int]) -> str | None:
    with open(path, "rb") as program:
        head = program.read(4096)
        if head.startswith(b"#!"):
            line = head[2:].split(b"\n", 1)[0].strip().split()
            return os.fsdecode(line[0]) if line else None
        if head[:4] != b"\x7fELF" or len(head) < 64:
            return None
        wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
        if wide:
            phoff, phentsize, phnum = struct.unpack_from(order + "Q14xHH", head, 32)
        else:
            phoff, phentsize, phnum = struct.unpack_from(order + "I10xHH", head, 28)
        for index in range(phnum):
            program.seek(phoff + index * phentsize)
            header = program.read(phentsize)
            if (
                len(header) < (56 if wide else 32)
                or struct.unpack_from(order + "I", header)[0] != 3
            ):
                continue  # not PT_INTERP
            if wide:
                offset, size = struct.unpack_from(order + "Q8x8xQ", header, 8)
            else:
                offset, size = struct.unpack_from(order + "I4x4xI", header, 4)
            program.seek(offset)
            return os.fsdecode(program.read(min(size, 4096)).rstrip(b"\x00"))
    return None


def interpreter_of(path: str) -> str | None:
    """The program the kernel loads to start `path` (its ELF interpreter, or the
    `#!` line's program), which Landlock must let execute too; None for none."""
    try:
        st = os.stat(path)
        return _interpreter(path, (st.st_dev, st.st_ino, st.st_mtime_ns))
    except (OSError, struct.error):
        return None
