"""Holding a sandbox's processes still while its workspace is counted.

A count walks a workspace while its programs may run: a program told by inotify where
the walk is can move its files out of the walk's way every time, into a folder it
already passed (review5 finding 01), and no check of the walk's own sees that. So the
workbench stops every process of the plan's running sandboxes (SIGSTOP, which no
program can catch or ignore) for the walk, and lets them go on (SIGCONT) after it. A
process the program had stopped itself goes on too.

SIGSTOP holds a process only until something sends it SIGCONT, and a program can have
the kernel do that on an event of its choosing: an inotify descriptor with O_ASYNC and
F_SETSIG, woken by the walk opening a folder it watches (review7 finding 03), a POSIX
timer. So `runs` notes how often each stopped thread has been put on a CPU before the
walk, and again after it, with each thread's state (`settled`): a thread that ran
meanwhile, or was woken and waits for a CPU, was not held, and the count is marked as
one things moved under.

Standard library only, no worker imports: it can be reviewed and tested alone.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from typing import Final

from sandbox.held_open import GONE, descendants, stat_fields

# Rounds of "stop what is new" before a stop gives up looking for more: a process sent
# SIGSTOP may fork once more before it stops; its child is found in the next round.
ROUNDS: Final = 8
_STILL: Final = (b"T", b"t", b"Z", b"X")  # stopped, traced, or ended


class Stopped:
    """Processes stopped by `stop`, held by pidfd: `resume` reaches each one, never a
    process that took its pid after it ended."""

    def __init__(self) -> None:
        self.pids: set[int] = set()
        self._fds: list[int] = []

    def add(self, pid: int) -> None:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return
        try:
            signal.pidfd_send_signal(fd, signal.SIGSTOP)
        except ProcessLookupError:  # ended meanwhile
            os.close(fd)
            return
        self.pids.add(pid)
        self._fds.append(fd)

    def resume(self) -> None:
        """Lets them go on (SIGCONT); those that ended meanwhile are skipped."""
        fds, self._fds, self.pids = self._fds, [], set()
        for fd in fds:
            try:
                signal.pidfd_send_signal(fd, signal.SIGCONT)
            except ProcessLookupError:
                pass
            finally:
                os.close(fd)


def stop(sandbox_pid: int, stopped: Stopped | None = None) -> Stopped:
    """Sends SIGSTOP to every descendant of `sandbox_pid` (bubblewrap's) not in
    `stopped` yet, again for any new one, for at most ROUNDS rounds; call `resume` on
    what it returns. A chain of processes each forking the next may outrun it: see
    `settled`."""
    stopped = Stopped() if stopped is None else stopped
    try:
        for _ in range(ROUNDS):
            new = [pid for pid in descendants(sandbox_pid) if pid not in stopped.pids]
            if not new:
                break
            for pid in new:
                stopped.add(pid)
    except BaseException:
        stopped.resume()
        raise
    return stopped


def settled(sandbox_pid: int, stopped: Stopped) -> bool:
    """Whether every descendant of `sandbox_pid` now is one `stopped` holds, with each
    of its threads stopped (a signal is taken when a thread next leaves the kernel: a
    long system call finishes first)."""
    now = descendants(sandbox_pid)
    return set(now) <= set(stopped.pids) and not moving(now)


def runs(held: Iterable[Stopped]) -> dict[int, int]:
    """For each thread of the processes `held` holds: how many times it has been put on
    a CPU (/proc/TID/schedstat's third field, which only a thread's arrival on a CPU
    moves; a kernel without it: its context switches). A stopped thread's figure stays
    the same until something lets it run."""
    seen: dict[int, int] = {}
    for each in held:
        for pid in each.pids:
            try:
                threads = os.listdir(f"/proc/{pid}/task")
            except GONE:  # ended: the figures of before have it, so they differ
                continue
            for thread in threads:
                count = _times_run(f"/proc/{pid}/task/{thread}")
                if count is not None:
                    seen[int(thread)] = count
    return seen


def _times_run(task: str) -> int | None:
    try:
        with open(f"{task}/schedstat", "rb") as handle:
            return int(handle.read().split()[2])
    except FileNotFoundError:  # no schedstat in this kernel, or the thread ended
        pass
    except ProcessLookupError:
        return None
    try:
        with open(f"{task}/status", "rb") as handle:
            lines = handle.read().splitlines()
    except GONE:
        return None
    return sum(int(line.split()[1]) for line in lines if b"ctxt_switches:" in line)


def moving(pids: Iterable[int]) -> list[int]:
    """Those of `pids` with a thread not stopped yet."""
    found = []
    for pid in pids:
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except GONE:  # ended
            continue
        for thread in threads:
            fields = stat_fields(f"/proc/{pid}/task/{thread}")
            if fields is not None and fields[0] not in _STILL:
                found.append(pid)
                break
    return found
