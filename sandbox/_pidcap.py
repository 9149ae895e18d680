"""A process cap that holds for root, who is exempt from RLIMIT_NPROC.

For anyone else the kernel enforces RLIMIT_NPROC per user namespace, so the
prlimit inside each sandbox caps that sandbox alone. Root is exempt from it, so
a fork bomb run by a root worker needs another bound: since Linux 6.14 each pid
namespace has its own `kernel.pid_max`, and a sandbox is its own pid namespace.
Once a namespace has handed out pid 300 (the kernel's RESERVED_PIDS) its pids wrap
back to 300, never below, so pid_max N leaves pids 300 to N - 1; before that every
pid from 1 up is free (a cap of 300 + 64 + 3 let 366 run at once, review7 finding
04), so the namespace's last pid is set to 300 before the program starts. The
sandbox's entry helper (sandbox/entry.c) writes the cap from inside, through a
procfs of the sandbox's own, before it applies Landlock, which then refuses every
write outside the shared read-write folders, /tmp and /dev (so the program cannot
raise the cap again, nor write any other sysctl). The last pid it cannot set (that
wants CAP_CHECKPOINT_RESTORE over the namespace, which belongs to the machine's user
namespace for a root worker): while bubblewrap holds the sandbox at its start line
(--block-fd), the worker runs the same helper outside (sandbox._startline: `-N`, one
small static process that joins the sandbox's pid namespace and forks a child to
write its `ns_last_pid`). Without the entry helper, a helper that joins only the
sandbox's pid namespace writes the cap, and a second one its `ns_last_pid` (300:
the worker, root over the namespace, may); the sysctl each opens belongs to the
writer's pid namespace, so nothing outside changes. There the sandbox cannot raise
it again: its /proc is read-only and it has no capabilities.

Writing pid_max from a namespace on an older kernel would change it for the
whole machine, so this refuses to run there, and it checks the machine's value
before and after each write (restoring it, and refusing from then on, should it
ever move).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Final

from sandbox._bwrap import SandboxUnavailableError, Tools
from sandbox.environment import SAFE_PATH

PID_MAX: Final = Path("/proc/sys/kernel/pid_max")
NS_LAST_PID: Final = Path("/proc/sys/kernel/ns_last_pid")
# Once a pid namespace's pids wrap, new ones start again at RESERVED_PIDS (300), not 1:
# a cap of 301 left a sandbox one pid after its first 300 (review6 finding 90).
RESERVED_PIDS: Final = 300
PID_MAX_LEAST: Final = RESERVED_PIDS + 1  # the kernel refuses a lower pid_max
NAMESPACED_SINCE: Final = (6, 14)


def needed() -> bool:
    """Only root needs this: RLIMIT_NPROC already caps everyone else per sandbox."""
    return os.geteuid() == 0


def kernel_namespaces_pid_max(release: str | None = None) -> bool:
    release = release if release is not None else os.uname().release
    numbers = []
    for part in release.split("-")[0].split(".")[:2]:
        digits = "".join(ch for ch in part if ch.isdigit())
        numbers.append(int(digits) if digits else 0)
    return tuple(numbers) >= NAMESPACED_SINCE


def cap_for(processes: int) -> int:
    """pid_max for a sandbox allowed `processes` at once, its first process (pid 1:
    the program, or bubblewrap's init without the entry) among them: pids 1 to
    RESERVED_PIDS are spent before the program starts, so the others get pids from
    RESERVED_PIDS to pid_max - 1 (`most_at_once`)."""
    return max(PID_MAX_LEAST, RESERVED_PIDS + processes - 1)


def most_at_once(processes: int) -> int:
    """Processes a root worker's sandbox allowed `processes` can hold at once: that
    many (2 when it is 1, the least pid_max the kernel takes)."""
    return cap_for(processes) - RESERVED_PIDS + 1


_MOVED: Final = (
    "capping a sandbox's processes changed the whole machine's pid_max; it was put "
    "back, and exec is refused until the worker restarts. Please report this kernel: "
    f"{os.uname().release}."
)


class PidCap:
    """The machine-wide facts the cap checks across sandboxes: the machine's pid_max as
    first seen, and the refusal that latches once the cap cannot be trusted. One per
    worker (its owner passes it to every `sandbox.process.run`), so two workers in one
    process, or two tests, never share a latch."""

    def __init__(self) -> None:
        self.refused: str | None = None
        self.machine: str | None = None  # the machine's pid_max, as first seen

    def check_kernel(self) -> None:
        """Refuse (SandboxUnavailableError) where a sandbox's processes cannot be capped."""
        if self.refused is not None:
            raise SandboxUnavailableError(self.refused)
        if self.machine is not None:
            return  # this kernel passed already (it does not change under a running worker)
        if not kernel_namespaces_pid_max():
            self.refused = (
                "this worker runs as root, which the kernel exempts from process limits, and "
                f"this kernel ({os.uname().release}) cannot cap processes per sandbox (that "
                "needs Linux 6.14 or later). Run the worker as a regular user, or on a newer "
                "kernel."
            )
            raise SandboxUnavailableError(self.refused)
        self.machine = _read_pid_max()

    def check_machine(self) -> None:
        """After a sandbox capped itself: the machine's pid_max must not have moved. If it
        did, put it back and refuse every exec from then on."""
        if self.machine is None:
            return
        now = _read_pid_max()
        if now != self.machine:
            PID_MAX.write_text(self.machine + "\n")
            self.refused = _MOVED
            raise SandboxUnavailableError(self.refused)

    async def cap_processes(self, tools: Tools, init_pid: int, processes: int) -> None:
        """Set pid_max inside the sandbox whose first process is `init_pid`, and its last
        pid to RESERVED_PIDS, so the program's pids start past them (from outside: only
        where the entry helper is not used, while the sandbox is held at its start)."""
        self.check_kernel()
        before = _read_pid_max()
        failed: SandboxUnavailableError | None = None
        try:
            for sysctl, value in ((PID_MAX, cap_for(processes)), (NS_LAST_PID, RESERVED_PIDS)):
                await _write_inside(tools, init_pid, sysctl, value)
        except SandboxUnavailableError as exc:
            failed = exc
        if _read_pid_max() != before:
            PID_MAX.write_text(before + "\n")
            self.refused = _MOVED
            raise SandboxUnavailableError(self.refused)
        if failed is not None:
            raise failed


async def _write_inside(tools: Tools, init_pid: int, sysctl: Path, value: int) -> None:
    """`value` into `sysctl` as a process of the pid namespace of `init_pid` sees it."""
    helper = await asyncio.create_subprocess_exec(
        tools.nsenter,
        f"--target={init_pid}",
        "--pid",
        "--",
        tools.tee,
        str(sysctl),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": SAFE_PATH, "LANG": "C"},
    )
    try:
        _, err = await helper.communicate(f"{value}\n".encode())
    finally:
        if helper.returncode is None:  # cancelled mid-write: do not leave it behind
            helper.kill()
            await helper.wait()
    if helper.returncode != 0:
        raise SandboxUnavailableError(
            "could not cap the sandbox's processes: " + err.decode(errors="replace").strip()[:300]
        )


def _read_pid_max() -> str:
    """The machine's pid_max as the kernel says it: one open, read and close (read after
    every exec of a root worker, so without pathlib's layers)."""
    fd = os.open(PID_MAX, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 64).decode("ascii").strip()
    finally:
        os.close(fd)
