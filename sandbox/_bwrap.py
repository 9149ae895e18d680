"""The bubblewrap command line for one sandboxed program, and the tools it needs.

The sandbox sees the system's programs and libraries read-only, a handful of
/etc files that programs need to start (the loader cache, passwd for names,
the time zone), a private /tmp, a read-only /proc of its own, and the shared
folders at their usual paths, read-only or read-write as configured. Nothing
else of the person's files exists inside, so a symlink in a shared folder that
points at ~/.ssh leads nowhere. Every namespace is fresh: its own pids (killing
its first process kills all of it), no network unless the policy says so, no
new user namespaces, no capabilities. Resource limits are set inside the
sandbox, after the user namespace exists: the kernel then counts processes per
sandbox, not per user, for RLIMIT_NPROC.

With the entry helper (`View.entry`, see sandbox._entry) the sandbox's first
process is that helper, run as its pid 1 (`--as-pid-1`: no bubblewrap init, one
fork fewer, and the program's exit ends every process it left): it sets the
limits, caps processes, applies Landlock and becomes the program. Without it,
`prlimit` sets the limits and Landlock is not applied.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from sandbox import _entry

SYSTEM_DIRS: Final = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES: Final = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/alternatives",
    "/etc/magic",
    "/etc/mime.types",
)


# The sandbox's /dev/shm, all its files together: semaphores and small shared memory.
SHM_BYTES: Final = 16 * 1024**2
# Signals queued and POSIX timers (each preallocates one) at once, the sandbox's
# processes together. The kernel counts them per user, in the sandbox's own user
# namespace and up the chain to the machine's, where one sandbox took all of the
# user's RLIMIT_SIGPENDING (96,346 timers here): every other program of the worker's
# user (root, or the person) then got EAGAIN from timer_create, sigqueue and
# mq_notify (review8 finding 02). The sandbox's count is held to its own limit.
SIGPENDING: Final = 512
# Bytes of POSIX message queues (mq_open), counted per user the same way: a sandbox
# without Landlock (whose rules refuse making a queue: EACCES) made 9 queues of the
# default size, all of its user's RLIMIT_MSGQUEUE (819,200 bytes), and every other
# program of the user got EMFILE from mq_open while it ran. None: no allowlisted tool
# uses them (Python, Node and glibc's own libraries make none); mq_open answers EMFILE.
MSGQUEUE: Final = 0
# Descriptors one sendmsg may pass (SCM_RIGHTS; the kernel's SCM_MAX_FD). The kernel
# counts descriptors in flight per user (the real uid's, outside every namespace) and
# refuses a program's next message once that count passes the sender's RLIMIT_NOFILE,
# so a sandbox can keep at most its open_files + SCM_MAX_FD in flight, however many
# processes it has: at 1,024 it kept 1,265, and every program of its user at the usual
# soft limit of 1,024 got ETOOMANYREFS from sendmsg while it ran (dbus, Wayland and
# systemd pass descriptors so). OPEN_FILES leaves such programs 259 (I1).
SCM_MAX_FD: Final = 253
OPEN_FILES: Final = 512


class SandboxUnavailableError(Exception):
    """The sandbox cannot be built here; the message says what is missing."""


@dataclass(frozen=True)
class Tools:
    bwrap: str
    prlimit: str  # runs inside the sandbox: must live under SYSTEM_DIRS
    nsenter: str
    tee: str


@dataclass(frozen=True)
class Mount:
    """A shared folder, bound at its own path inside the sandbox (or at `target`)."""

    path: str
    writable: bool
    target: str | None = None  # where it appears inside; None: at `path`

    @property
    def inside(self) -> str:
        return self.target or self.path


@dataclass(frozen=True)
class PrivateDir:
    """A folder that exists only inside the sandbox, on a tmpfs of its own, read-only.

    Its files are written from the worker's bytes when the sandbox is built and its
    links point where the worker says; nothing of it lives under a name in a shared
    folder, so nothing outside the sandbox can rename or replace it while the
    program runs (a bind mount over such a name is dropped by the kernel when the
    name is renamed over).
    """

    path: str
    files: Mapping[str, bytes] = field(default_factory=dict)  # name -> content
    links: Mapping[str, str] = field(default_factory=dict)  # name -> target


@dataclass(frozen=True)
class View:
    """What the sandboxed program sees and starts in."""

    cwd: str
    mounts: tuple[Mount, ...]
    env: Mapping[str, str]
    hidden: tuple[str, ...] = ()  # folders to blank out where a mount would expose them
    extra_files: tuple[str, ...] = ()  # more read-only files (a program outside /usr)
    private: tuple[PrivateDir, ...] = ()  # folders of the worker's own making
    seccomp: bool = True  # the filter of sandbox._seccomp, where this machine has one
    network: bool = False
    # socket(AF_UNIX) let through by the filter (a rule's unix_sockets = true): then
    # its named sockets in shared folders are in reach (review8 finding 15)
    unix_sockets: bool = False
    bwrap: str = "bwrap"
    # The sandbox's own root (where bubblewrap makes /etc and the mount points) made
    # read-only once everything is in place: only the writable folders and /tmp take writes.
    read_only_root: bool = False
    # The entry helper (sandbox._entry), built outside every shared folder: with it the
    # sandbox gets Landlock; None runs the program under prlimit without Landlock.
    entry: str | None = None
    # Programs the sandboxed program may execute beside argv[0] (under Landlock; their
    # ELF interpreters are added). The shipped policy names none.
    may_execute: tuple[str, ...] = ()
    # The uid bubblewrap runs as, and the program with it (a root worker's plan's own:
    # sandbox.plan_uids); None: the worker's.
    uid: int | None = None


@dataclass(frozen=True)
class Limits:
    """What one sandboxed program may use. Per process, except `processes`."""

    timeout_s: float = 30.0
    output_bytes: int = 1024 * 1024  # stdout + stderr together
    cpu_s: int = 300
    memory_bytes: int = 4 * 1024**3  # address space (RLIMIT_AS)
    file_size_bytes: int = 64 * 1024**2
    open_files: int = OPEN_FILES  # RLIMIT_NOFILE; also bounds descriptors in flight
    processes: int = 64
    tmp_bytes: int = 256 * 1024**2  # the sandbox's /tmp, all its files together
    drain_s: float = 1.0  # how long to wait for the pipes to close after exit


@functools.lru_cache(maxsize=8)
def find_tools(bwrap: str = "bwrap") -> Tools:
    found = {name: shutil.which(name) for name in ("prlimit", "nsenter", "tee")}
    found["bwrap"] = shutil.which(bwrap)
    missing = sorted(name for name, path in found.items() if path is None)
    if missing:
        raise SandboxUnavailableError(
            f"exec runs every command in a bubblewrap sandbox, and {', '.join(missing)} "
            "cannot be found. Install bubblewrap and util-linux (Debian/Ubuntu: "
            "apt install bubblewrap util-linux), then try again."
        )
    tools = Tools(**{name: os.path.realpath(str(path)) for name, path in found.items()})
    if not visible_by_default(tools.prlimit):
        raise SandboxUnavailableError(
            f"prlimit was found at {tools.prlimit}, outside {', '.join(SYSTEM_DIRS)}, so the "
            "sandbox could not see it. Install util-linux from the system's packages."
        )
    return tools


def command(
    tools: Tools,
    argv: Sequence[str],
    view: View,
    limits: Limits,
    *,
    info_fd: int | None,
    block_fd: int | None = None,
    file_fds: Sequence[int] = (),
    seccomp_fd: int | None = None,
    lifeline_fd: int | None = None,
    pid_cap: int | None = None,
    diag_fd: int | None = None,
    wait_fd: int | None = None,
    pins: Sequence[tuple[int, str, bool]] = (),
) -> list[str]:
    """bwrap [namespaces] [view] -- entry [limits, Landlock] -- argv, with `view.entry`;
    bwrap [namespaces] [view] -- prlimit [limits] -- argv without it.

    With `wait_fd` (entry only: a sandbox built ahead of its call, sandbox.warm) the
    entry's line ends before what is the call's own: it waits on `wait_fd` for
    `call_words` (the folder to start in, the environment, what may be executed and
    argv), and `argv`, `view.cwd` and `view.env` are not part of the line (bubblewrap
    starts in /, which the entry leaves for the call's folder).

    `file_fds` holds one readable descriptor per file of `view.private`, in order
    (see `private_files`); bubblewrap copies each into the sandbox's tmpfs.
    `seccomp_fd` reads the filter bubblewrap installs just before the program
    starts (see sandbox._seccomp). `lifeline_fd` (entry only) is the read end of a
    pipe whose write end only the worker holds: the entry exits when it finds it
    closed. `pid_cap` (entry only) is pid_max for the sandbox's pid namespace.
    `diag_fd` (entry only) is a socket over which the entry sends a sock_diag socket of
    the sandbox's network namespace (sandbox.sockets). `pins`: (descriptor, where
    inside, on the way) of places other calls hold, bound onto themselves among the
    shared folders (sandbox.held.pins_for, `_held_pins`).
    """
    args = [
        tools.bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
    ]
    if view.network:
        args.append("--share-net")
    args += _system_view()
    for path in view.extra_files:
        args += ["--ro-bind", path, path]
    # Its own /proc and /dev. /dev is a tmpfs without a size, so it is read-only (writes
    # to its devices still go through): no files kept there (review5 finding 03); POSIX
    # shared memory and semaphores get a small /dev/shm of their own (review6 04).
    # No ptys: each open of /dev/ptmx took one of the machine's shared pool (kernel.pty.max,
    # 3,072 for every non-initial devpts together) and bubblewrap's devpts has no max=;
    # an empty read-only tmpfs over /dev/pts leaves /dev/ptmx (a link to pts/ptmx) leading
    # nowhere (review6 07). The devpts beneath is out of reach: no capabilities, no mount.
    args += ["--proc", "/proc", "--remount-ro", "/proc", "--dev", "/dev"]
    args += ["--tmpfs", "/dev/pts", "--remount-ro", "/dev/pts", "--remount-ro", "/dev"]
    args += ["--size", str(SHM_BYTES), "--tmpfs", "/dev/shm"]  # noqa: S108 (its own tmpfs)
    # The sandbox's own /tmp: a private tmpfs, gone with it.
    # Its size bounds what a program keeps there: tmpfs pages are memory no rlimit
    # counts (GNU sort spilled 976 MiB there with memory_mb = 256). --size needs
    # bubblewrap 0.5.0 or later; an older one says so, and exec is unavailable.
    args += ["--size", str(limits.tmp_bytes), "--tmpfs", "/tmp"]  # noqa: S108
    args += _folders(view.mounts, view.hidden, pins)
    args += _private(view.private, file_fds)
    if view.entry is not None:
        args += ["--ro-bind", view.entry, _entry.INSIDE]
        if pid_cap is not None:
            args += ["--proc", _entry.PROC_INSIDE]
    if view.read_only_root:
        args += ["--remount-ro", "/"]
    args += ["--chdir", "/" if wait_fd is not None else view.cwd]
    if info_fd is not None:
        args += ["--info-fd", str(info_fd)]
    if block_fd is not None:
        args += ["--block-fd", str(block_fd)]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    if view.entry is None:
        if wait_fd is not None:
            raise ValueError("only the entry helper waits for its call")
        return [*args, "--", tools.prlimit, *_rlimits(limits), "--", *argv]
    if wait_fd is not None:
        waits = ["-W", str(wait_fd)]
        return [
            *args,
            "--as-pid-1",
            "--",
            _entry.INSIDE,
            *waits,
            *_entry_options(view, limits, lifeline_fd, pid_cap, diag_fd),
        ]
    return [
        *args,
        "--as-pid-1",
        "--",
        _entry.INSIDE,
        *_entry_options(view, limits, lifeline_fd, pid_cap, diag_fd),
        *_executables(argv, view),
        "--",
        *argv,
    ]


def call_words(argv: Sequence[str], view: View) -> list[str]:
    """What a sandbox built ahead of its call (`command(wait_fd=...)`) is sent for it:
    the rest of the entry's line (see sandbox/entry.c, -W). The program's environment
    is `view.env` with PWD set to its folder, as bubblewrap's --chdir sets it."""
    env = dict(view.env)
    env["PWD"] = view.cwd  # where it stood, or last (as bubblewrap's setenv puts it)
    words = ["-C", view.cwd]
    for name, value in env.items():
        words += ["-e", f"{name}={value}"]
    return [*words, *_executables(argv, view), "--", *argv]


@functools.lru_cache(maxsize=1)
def _system_view() -> tuple[str, ...]:
    """The system's programs and libraries (each folder bound read-only, or its
    symbolic link made again) and the /etc files programs need: what every sandbox
    sees of the machine. Looked up once: 14 system calls per exec otherwise."""
    args: list[str] = []
    for folder in SYSTEM_DIRS:
        if os.path.islink(folder):
            args += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            args += ["--ro-bind", folder, folder]
    for path in ETC_FILES:
        args += ["--ro-bind-try", path, path]
    return tuple(args)


def _entry_options(
    view: View,
    limits: Limits,
    lifeline_fd: int | None,
    pid_cap: int | None,
    diag_fd: int | None = None,
) -> list[str]:
    """The entry helper's options (see sandbox/entry.c) that are not the call's own:
    limits, the pid cap and where writes may go."""
    line: list[str] = []
    if diag_fd is not None:  # before -L, which closes every other descriptor
        line += ["-n", str(diag_fd)]
    if lifeline_fd is not None:
        line += ["-L", str(lifeline_fd)]
    for number, soft, hard in _limits(limits):
        line += ["-r", f"{number}:{soft}:{hard}"]
    if pid_cap is not None:
        line += ["-p", f"{pid_cap}:{_entry.PROC_INSIDE}/sys/kernel/pid_max"]
    for mount in view.mounts:
        if mount.writable:
            line += ["-w", mount.inside]
    line += ["-w", "/tmp", "-w", "/dev/shm", "-d", "/dev"]  # noqa: S108 (its own tmpfses)
    return line


def _executables(argv: Sequence[str], view: View) -> list[str]:
    """The entry's -x options: the program and what else it may execute, each with its
    ELF interpreter."""
    line: list[str] = []
    for program in [argv[0], *view.may_execute]:
        interpreter = _entry.interpreter_of(program)
        line += ["-x", program] + (["-x", interpreter] if interpreter else [])
    return line


def _limits(limits: Limits) -> list[tuple[int, int, int]]:
    return [
        (resource.RLIMIT_CPU, limits.cpu_s, limits.cpu_s + 1),  # SIGXCPU, then SIGKILL
        (resource.RLIMIT_AS, limits.memory_bytes, limits.memory_bytes),
        (resource.RLIMIT_FSIZE, limits.file_size_bytes, limits.file_size_bytes),
        (resource.RLIMIT_NOFILE, limits.open_files, limits.open_files),
        (resource.RLIMIT_NPROC, limits.processes, limits.processes),
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_SIGPENDING, SIGPENDING, SIGPENDING),
        (resource.RLIMIT_MSGQUEUE, MSGQUEUE, MSGQUEUE),
    ]


def _folders(
    mounts: Sequence[Mount],
    hidden: Sequence[str],
    held: Sequence[tuple[int, str, bool]] = (),
) -> list[str]:
    """Shared folders and hidden folders, shallowest first so deeper ones land on top.

    A hidden place (the worker's own config and data) only matters where a shared
    folder would expose it: a folder becomes an empty read-only tmpfs, a file an
    empty one (/dev/null); one that does not exist has nothing to hide. Each folder
    on the way down to it is pinned (see `_pins`). `held`: the places other calls'
    asked programs hold, pinned in the same order (see `_held_pins`).
    """
    steps: list[tuple[int, int, list[str]]] = []
    sealed: list[str] = []  # read-only once every mount is in: deeper ones need mount points
    for mount in mounts:
        flag = "--bind" if mount.writable else "--ro-bind"
        steps.append((_depth(mount.inside), 0, [flag, mount.path, mount.inside]))
    covered = [path for path in hidden if os.path.lexists(path)]
    for path in covered:
        if not any(_inside(path, mount.inside) for mount in mounts):
            continue
        if os.path.isdir(path):
            steps.append((_depth(path), 1, ["--tmpfs", path]))
            sealed += ["--remount-ro", path]
        else:
            steps.append((_depth(path), 1, ["--ro-bind", "/dev/null", path]))
    steps += _pins(mounts, covered)
    steps += _held_pins(mounts, covered, held)
    steps = _read_only_beneath_held(steps, held)
    # By depth; at one depth, mounts and pins before what hides, a held place read-only
    # last; then by path, for a stable order.
    ordered = [
        arg for *_, step in sorted(steps, key=lambda s: (s[0], s[1], s[2][-1])) for arg in step
    ]
    return ordered + sealed


def _pins(mounts: Sequence[Mount], hidden: Sequence[str]) -> list[tuple[int, int, list[str]]]:
    """Every folder between a shared folder and a place in it (a hidden place, or
    another shared folder), bound onto itself.

    Hiding and sharing go by path. A program that renamed an ancestor of the worker's
    data folder (`mv ~/.local ~/x`, with the home shared) would bring that folder out
    from under its path, and the next sandbox would show it whole; one that moved a
    folder on the way to a shared folder nested in the home and put a link there
    (`mv ~/p/vendor ~/v0; ln -s ../.local ~/p/vendor`) would have the next sandbox,
    and fs_*, take the link's target for the shared folder. The kernel refuses to
    rename or remove a mount point of the caller's own namespace (EBUSY), so with the
    way down made of mount points, a program can move none of it. Nothing inside a
    hidden place is bound: that would show what the tmpfs covers.
    """
    pins: dict[str, list[str]] = {}
    for path in [*hidden, *(mount.inside for mount in mounts)]:
        parts = path.rstrip("/").split("/")
        for depth in range(2, len(parts)):
            folder = "/".join(parts[:depth])
            holder = _deepest_holder(mounts, folder)
            if holder is None or holder.inside == folder or folder in pins:
                continue
            if any(_inside(folder, place) for place in hidden):
                continue
            source = holder.path + folder[len(holder.inside.rstrip("/")) :]
            flag = "--bind" if holder.writable else "--ro-bind"
            pins[folder] = [flag, source, folder]
    return [(_depth(folder), 0, step) for folder, step in pins.items()]


def _held_pins(
    mounts: Sequence[Mount], hidden: Sequence[str], held: Sequence[tuple[int, str, bool]]
) -> list[tuple[int, int, list[str]]]:
    """The places held (sandbox.held.pins_for: a descriptor, where it shows, and
    whether it is a folder on the way or the held place) as steps among the others.

    Appended after every mount and every hiding, a folder on the way bound onto itself
    from the host showed again what a hidden place's tmpfs covered (the worker's own
    config and data, a person's home shared: review21 B0), and, bound writable, made a
    read-only shared folder nested in it writable (B8). So each goes at its depth like
    `_pins`: never inside a hidden place, a folder on the way as its deepest shared
    folder has it (read-only in a read-only one), the held place read-only after the
    mount at its own path."""
    steps = []
    for fd, inside, on_the_way in held:
        if any(_inside(inside, place) for place in hidden):
            continue
        holder = _deepest_holder(mounts, inside)
        if holder is None:
            continue
        if on_the_way:
            if holder.inside == inside:
                continue  # a mount point already
            flag = "--bind-fd" if holder.writable else "--ro-bind-fd"
            steps.append((_depth(inside), 0, [flag, str(fd), inside]))
        else:
            steps.append((_depth(inside), 2, ["--ro-bind-fd", str(fd), inside]))
    return steps


_READ_ONLY: Final = {"--bind": "--ro-bind", "--bind-fd": "--ro-bind-fd"}


def _read_only_beneath_held(
    steps: list[tuple[int, int, list[str]]], held: Sequence[tuple[int, str, bool]]
) -> list[tuple[int, int, list[str]]]:
    """Every bind at or beneath a held place, read-only. A held folder is bound
    read-only at its depth, but what is bound deeper lands on top of it: a read-write
    shared folder nested in it, or a folder on the way to one (or to a hidden place),
    bound writable, let a program beside rewrite files of an approved folder while the
    approved program ran (review23 C7)."""
    places = [inside for _fd, inside, on_the_way in held if not on_the_way]
    if not places:
        return steps
    return [
        (depth, order, [_READ_ONLY.get(step[0], step[0]), *step[1:]])
        if any(_inside(step[-1], place) for place in places)
        else (depth, order, step)
        for depth, order, step in steps
    ]


def _deepest_holder(mounts: Sequence[Mount], path: str) -> Mount | None:
    holders = [mount for mount in mounts if _inside(path, mount.inside)]
    return max(holders, key=lambda mount: _depth(mount.inside), default=None)


def private_files(private: Sequence[PrivateDir]) -> list[bytes]:
    """The contents `command` expects descriptors for, in its order."""
    return [content for folder in private for content in folder.files.values()]


def _private(private: Sequence[PrivateDir], file_fds: Sequence[int]) -> list[str]:
    """Each private folder: a fresh tmpfs, its files and links, then read-only."""
    if len(file_fds) != len(private_files(private)):
        raise ValueError("one descriptor is needed per private file")
    fds = iter(file_fds)
    args: list[str] = []
    for folder in private:
        args += ["--tmpfs", folder.path]
        for name in folder.files:
            args += ["--perms", "0444", "--file", str(next(fds)), f"{folder.path}/{name}"]
        for name, target in folder.links.items():
            args += ["--symlink", target, f"{folder.path}/{name}"]
        args += ["--remount-ro", folder.path]
    return args


def _rlimits(limits: Limits) -> list[str]:
    return [
        f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}",  # SIGXCPU first, SIGKILL a second later
        f"--as={limits.memory_bytes}",
        f"--fsize={limits.file_size_bytes}",
        f"--nofile={limits.open_files}",
        f"--nproc={limits.processes}",
        "--core=0",
        f"--sigpending={SIGPENDING}",
        f"--msgqueue={MSGQUEUE}",
    ]


def _depth(path: str) -> int:
    return len([part for part in path.split("/") if part])


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def visible_by_default(path: str) -> bool:
    """Whether `path` is inside the system folders every sandbox sees."""
    real = os.path.realpath(path)
    return any(_inside(real, folder) for folder in _system_dirs_real())


@functools.lru_cache(maxsize=1)
def _system_dirs_real() -> tuple[str, ...]:
    return tuple(os.path.realpath(folder) for folder in SYSTEM_DIRS)
