"""How bubblewrap is started: os.posix_spawn where the entry helper runs, else Popen.

os.posix_spawn is glibc's clone(CLONE_VFORK) and exec: the same wait for the exec as
subprocess's vfork path, without Popen's Python and its close_fds pass in the child
(0.12-0.13 ms a start against 0.30-0.32 here). It closes no descriptor (Python 3.11
has no closefrom action), so it is used only where the sandbox's entry helper closes
every descriptor above 2 before the program starts (sandbox/entry.c), and only while
this process holds no inheritable descriptor: every one the worker opens is
close-on-exec (Python's default), the ones bubblewrap needs are duplicated onto their
own numbers (which clears the flag in the child only), and `Starts.check` looks, while
each sandbox runs, for one a library opened without O_CLOEXEC or that came from
whatever started the worker, and starts bubblewrap with Popen's close_fds from then on
should it find one. Elsewhere (no entry helper: the program itself would inherit
what bubblewrap did) it is Popen with close_fds, always.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

# What posix_spawn sets to SIG_DFL in the child: all it may (glibc's own internal
# signals are not among Python's valid ones, and SIGKILL and SIGSTOP cannot be set).
_EVERY_SIGNAL = frozenset(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}


class Spawned:
    """bubblewrap's process as os.posix_spawn started it: what a Popen gives the child
    watcher (its pid, and its exit status once reaped)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by another (as Popen.poll answers then)
                self.returncode = 0
            else:
                if pid == self.pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def _dup2_onto_itself_keeps() -> bool:
    """Whether posix_spawn's dup2 of a descriptor onto its own number clears its
    close-on-exec flag, as the descriptors kept for bubblewrap need: glibc 2.29 and
    later, and musl. An older glibc leaves the flag set, so bubblewrap would start
    without them and every exec fail: Popen then starts it."""
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return True  # not glibc
    name, _, version = libc.partition(" ")
    if name != "glibc":
        return True
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (2, 29)


class Starts:
    """How this worker starts bubblewrap, kept from one sandbox to the next (the
    worker's `Containment` holds one): whether posix_spawn may still be used, and the
    processes it started that were killed and not yet reaped."""

    def __init__(self) -> None:
        self.posix_spawn = _dup2_onto_itself_keeps()
        self._unreaped: list[Spawned] = []

    def start(
        self,
        line: list[str],
        env: Mapping[str, str],
        stdin: int,
        stdout: int,
        stderr: int,
        keep: Sequence[int],
        *,
        closes_all: bool,
        as_uid: int | None = None,
    ) -> Spawned | subprocess.Popen[bytes]:
        """Start `line` (argv only, no shell) in a process group of its own, in the
        worker's session (sandbox.process's doc says why), with `stdin` (a descriptor,
        or subprocess.DEVNULL), `stdout` and `stderr` as its 0-2 and the descriptors
        `keep` at their own numbers; SIGPIPE and SIGXFSZ at their defaults (Python
        ignores them). `closes_all`: the entry helper runs first in the sandbox and
        closes every other descriptor (see the module's doc). `as_uid`: started as that
        uid (and gid, no other group): Popen, whose child changes them before the exec
        (posix_spawn cannot)."""
        self._unreaped = [spawned for spawned in self._unreaped if spawned.poll() is None]
        low = min(stdout, stderr, *keep, stdin if stdin >= 0 else 3)
        if as_uid is not None or not (closes_all and self.posix_spawn) or low <= 2:
            # As asyncio's subprocess_exec does: vfork and exec, on the loop (a fork
            # where the child changes its uid first).
            ids: dict[str, Any] = (
                {} if as_uid is None else {"user": as_uid, "group": as_uid, "extra_groups": []}
            )
            return subprocess.Popen(
                line,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                env=dict(env),
                cwd="/",
                pass_fds=keep,
                process_group=0,  # not a new session: see sandbox.process's doc
                **ids,
            )
        actions: list[tuple[int, ...] | tuple[int, int, str, int, int]] = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)
            if stdin == subprocess.DEVNULL
            else (os.POSIX_SPAWN_DUP2, stdin, 0),
            (os.POSIX_SPAWN_DUP2, stdout, 1),
            (os.POSIX_SPAWN_DUP2, stderr, 2),
            # A descriptor duplicated onto its own number loses close-on-exec (POSIX;
            # glibc 2.29 and later, musl): these, and no other, reach bubblewrap.
            *((os.POSIX_SPAWN_DUP2, fd, fd) for fd in keep),
        ]
        pid = os.posix_spawn(
            line[0],
            line,
            env,
            file_actions=actions,
            setpgroup=0,
            setsigmask=(),
            # Every disposition to its default, not only what Python set (SIGPIPE,
            # SIGXFSZ): a worker started with signals ignored (nohup, a shell's
            # background job) must not hand that to the program.
            setsigdef=_EVERY_SIGNAL,
        )
        return Spawned(pid)

    def not_reaped(self, spawned: Spawned) -> None:
        """A process killed and not reaped in time: reaped at a later start (as Popen
        does with its own)."""
        self._unreaped.append(spawned)

    def check(self) -> None:
        """Go back to Popen's close_fds for good, saying so, should this process hold
        an inheritable descriptor above 2: the entry helper closes it before the
        program runs either way, but bubblewrap need not hold it. Run while a sandbox
        runs, off the call's path (0.03-0.09 ms)."""
        if not self.posix_spawn:
            return
        try:
            names = os.listdir("/proc/self/fd")
        except OSError:
            return
        for name in names:
            fd = int(name)
            if fd <= 2:
                continue
            try:
                inheritable = os.get_inheritable(fd)
            except OSError:  # closed since (the listing's own descriptor among them)
                continue
            if inheritable:
                self.posix_spawn = False
                log.info(
                    "descriptor %d of this process is inheritable (%s); bubblewrap is "
                    "started with close_fds from now on",
                    fd,
                    _described(fd),
                )
                return


def _described(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "unknown"
