"""The worker's part of a sandbox's start, done while bubblewrap holds it at its start
line (--block-fd): after its namespaces exist, before the program runs.

Some counts the kernel keeps per user are shared by every program of that user on the
machine, and one sandbox could take all of one: the 128 inotify instances of its user
(fs.inotify.max_user_instances) and their watches (review8 finding 02). The person's
editors, file managers and IDEs, `tail -f`, systemd's path units and the worker's own
`agentworker telemetry --follow` then got EMFILE from inotify_init while it ran (up to
exec's timeout; again at every call). Since Linux 5.11 those counts are kept per user
namespace and charged up the chain to the machine's, each level against its own limit
(/proc/sys/user/max_inotify_* as seen from that namespace; a new namespace starts
unlimited). bubblewrap gives each sandbox user namespaces of its own, so a small limit
there bounds the sandbox's processes together and leaves the rest to the person: each
sandbox may take `USER_LIMITS` (8 of the 128 instances: the worker's default of 8
calls at once leaves the person half of them).

Writing those limits wants CAP_SYS_RESOURCE over the sandbox's namespace, which the
sandbox's processes have dropped (bubblewrap's --cap-drop ALL, and the program never
gets it back) and its owner holds: the worker, root or the person alike. So the
sandbox's entry helper is run outside (`settle`: `entry -O FD -u NAME:VALUE ...`, one
small static process): it joins the sandbox's user namespace through a pidfd of its
first process and writes each limit. For a root worker the same process first sets the
last pid of the sandbox's pid namespace (`-N`, see sandbox._pidcap).

bubblewrap reports the first pid before it builds the sandbox, and with
--disable-userns it makes a second user namespace inside the first before it waits at
the start line: the helper joins whichever the process is in when it looks. The
program runs in the inner one, which is charged at the outer one too, so a limit at
either holds it.

Without the entry helper (no Landlock, or no C compiler) nothing writes the limits, and
`agentworker doctor` says so; on a kernel before 5.11 there is nothing per namespace to
write.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import os
import signal
from pathlib import Path
from typing import Final

from sandbox._bwrap import SandboxUnavailableError
from sandbox._pidcap import RESERVED_PIDS
from sandbox._spawn import Spawned, Starts

USER_SYSCTLS: Final = Path("/proc/sys/user")
# Each sandbox's share of its user's per-user counts, its processes together.
USER_LIMITS: Final = (
    ("max_inotify_instances", 8),  # of the user's 128 (fs.inotify.max_user_instances)
    ("max_inotify_watches", 8192),  # of the user's ~190,000 here (max_user_watches)
    # None of its 128 fanotify groups: the filter refuses fanotify_init (EPERM), but
    # where it is off (a machine without its table), an unprivileged program could make
    # them since Linux 5.13 (FAN_REPORT_FID); then it answers EMFILE.
    ("max_fanotify_groups", 0),
)


@functools.lru_cache(maxsize=1)
def user_limits() -> tuple[tuple[str, int], ...]:
    """The limits this kernel keeps per user namespace (none before Linux 5.11)."""
    return tuple((name, value) for name, value in USER_LIMITS if (USER_SYSCTLS / name).exists())


async def settle(
    entry: str,
    sandbox_pidfd: int,
    starts: Starts,
    *,
    last_pid: bool,
    limits: tuple[tuple[str, int], ...],
) -> None:
    """The sandbox whose first process `sandbox_pidfd` names (held at its start): its
    last pid set to RESERVED_PIDS where `last_pid` (a root worker, see
    sandbox._pidcap), and `limits` written in its user namespace. The entry helper run
    outside with `-O` (see sandbox/entry.c): started on the loop, as bubblewrap is (a
    vfork and exec of a small static program), and watched through a pidfd: no thread,
    no wait. Its exit must be seen, and be 0: anything else refuses the exec."""
    line = [entry, "-O", "3"]
    if last_pid:
        line += ["-N", str(RESERVED_PIDS)]
    for name, value in limits:
        line += ["-u", f"{name}:{value}"]
    loop = asyncio.get_running_loop()
    message_r, message_w = os.pipe()
    watch = -1
    pid: int | None = None
    status: os.waitid_result | None = None
    try:
        try:
            pid = _start(line, sandbox_pidfd, message_w)
        except OSError as exc:
            raise SandboxUnavailableError(f"could not set the sandbox's limits: {exc}") from exc
        finally:
            os.close(message_w)
        watch = os.pidfd_open(pid)
        while status is None:
            exited = loop.create_future()
            loop.add_reader(watch, exited.set_result, None)
            try:
                await exited
            finally:
                loop.remove_reader(watch)
            status = _exit_of(watch)
        said = b"" if status.si_status == 0 else os.read(message_r, 1024)
    finally:
        os.close(message_r)
        if watch >= 0:
            if pid is not None and status is None:  # cancelled: not left behind
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(watch, signal.SIGKILL)
                starts.not_reaped(Spawned(pid))
            os.close(watch)
    if status.si_code != os.CLD_EXITED or status.si_status != 0:
        why = said.decode(errors="replace").strip()[:300]
        raise SandboxUnavailableError(
            "could not set the sandbox's limits: "
            + (why or f"its helper ended with status {status.si_status}")
        )


def _start(line: list[str], sandbox_pidfd: int, message_w: int) -> int:
    """posix_spawn (vfork and exec) `line` with the sandbox's pidfd as its 3 and
    `message_w` as its 2; its pid. Each is moved first above 3 where it is not, so that
    no move onto 0-3 overwrites the other before it is made."""
    moved = [
        fd if fd > 3 else fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 4)
        for fd in (sandbox_pidfd, message_w)
    ]
    try:
        return os.posix_spawn(
            line[0],
            line,
            {},
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_DUP2, moved[1], 2),
                (os.POSIX_SPAWN_DUP2, moved[0], 3),
            ],
            setsigmask=(),
        )
    finally:
        for fd, was in zip(moved, (sandbox_pidfd, message_w), strict=True):
            if fd != was:
                os.close(fd)


def _exit_of(watch: int) -> os.waitid_result | None:
    """The helper's exit, reaped through its pidfd; None while it runs. One reaped by
    another (its exit never seen) refuses the exec."""
    try:
        return os.waitid(os.P_PIDFD, watch, os.WEXITED | os.WNOHANG)
    except ChildProcessError:
        raise SandboxUnavailableError(
            "could not set the sandbox's limits: its helper's exit was not seen"
        ) from None
