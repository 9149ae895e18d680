"""What this machine's kernel lets the exec sandbox add beyond bubblewrap, said once.

bubblewrap gives every program fresh namespaces, only the shared folders and no
capabilities. On top of that:

- a seccomp filter (sandbox._seccomp) refuses the system calls no allowlisted tool
  needs;
- Landlock (Linux 5.13+), applied by the sandbox's entry helper (sandbox._entry)
  just before the program starts, lets the program execute only its pinned path
  (and its ELF interpreter), and write only beneath the shared read-write folders,
  the sandbox's own /tmp and its /dev: anything else is refused with EACCES, for
  the program and everything it starts.

Where a layer cannot be had (no Landlock in the kernel, no C compiler to build the
helper), exec still runs, inside bubblewrap with the seccomp filter, and the
worker says so when it starts and in `agentworker doctor`: it never runs with
less than it claims. `[exec] landlock = "require"` makes exec refuse instead.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from sandbox import _entry, _seccomp

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Layer:
    name: str
    active: bool
    detail: str


class Landlock:
    """Landlock for one worker: whether this machine has it, and the entry helper
    (built in `cache_dir` with `cc` on first use) that applies it."""

    def __init__(self, cache_dir: Path, cc: str) -> None:
        self.cache_dir = cache_dir
        self.cc = cc
        self.abi, why = _entry.landlock_abi()
        self.problem: str | None = why or None  # why Landlock is off, once known
        self.path: str | None = None  # the built helper
        self._building = threading.Lock()

    def layer(self) -> Layer:
        """What `report` says: on, or off and why (without building anything)."""
        unbuilt = self.path is None and not _entry.cached(self.cache_dir).exists()
        if self.problem is None and unbuilt and shutil.which(self.cc) is None:
            self.problem = (
                f"no C compiler ({self.cc!r}) to build the sandbox's Landlock helper "
                "(Debian/Ubuntu: apt install gcc libc6-dev; or set [exec] cc)"
            )
        if self.problem is not None:
            return Layer(
                "landlock", False, f"{self.problem}; exec runs in bubblewrap with seccomp only"
            )
        return Layer(
            "landlock",
            True,
            f"ABI {self.abi}: a program may execute only itself and write only in the "
            "read-write shared folders and the sandbox's /tmp",
        )

    async def entry(self) -> str | None:
        """The helper's path (built on the first call, off the event loop), or None when
        Landlock cannot be had here; `problem` then says why."""
        if self.path is not None or self.problem is not None:
            return self.path
        return await asyncio.to_thread(self._build)

    def _build(self) -> str | None:
        with self._building:
            if self.path is None and self.problem is None:
                try:
                    self.path = _entry.build(self.cache_dir, self.cc)
                except (_entry.EntryUnavailableError, OSError) as exc:
                    self.problem = str(exc)
                    log.warning("exec sandbox: landlock off: %s", self.problem)
        return self.path


@functools.cache
def landlock_for(cache_dir: Path, cc: str = "cc") -> Landlock:
    """The one Landlock of a worker whose helper lives in `cache_dir`."""
    return Landlock(cache_dir, cc)


def report(landlock: Landlock | None = None) -> list[Layer]:
    """Each confinement layer beyond bubblewrap: whether exec gets it, and why (not)."""
    machine = os.uname().machine
    seccomp = _seccomp.filter_for_machine() is not None
    layers = [
        Layer(
            "seccomp",
            seccomp,
            "refuses ptrace, mount, namespaces, keyrings, bpf, perf events, "
            "userfaultfd, io_uring and other kernel doors"
            if seccomp
            else f"no system-call table for {machine}: exec runs without the filter",
        )
    ]
    if landlock is not None:
        layers.append(landlock.layer())
    return layers
