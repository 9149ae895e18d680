"""What this machine's kernel lets the exec sandbox add beyond bubblewrap, said once.

bubblewrap gives every program fresh namespaces, only the shared folders and no
capabilities. On top of that:

- a seccomp filter (sandbox._seccomp) refuses the system calls no allowlisted tool
  needs;
- Landlock (Linux 5.13+), applied by the sandbox's entry helper (sandbox._entry)
  just before the program starts, lets the program execute only its pinned path
  (and its ELF interpreter), and write only beneath the shared read-write folders,
  the sandbox's own /tmp and its /dev: anything else is refused with EACCES, for
  the program and everything it starts. From Landlock ABI 6 (Linux 6.12) it is
  scoped too: no abstract unix socket, and no process, made outside the sandbox
  can be reached (connect and kill answer EPERM).

Unix sockets are doors to services outside that run as the person (review8 findings
14 and 15): the filter refuses socket(AF_UNIX) and socketpair(AF_UNIX, SOCK_DGRAM),
whose ends sendto any named datagram socket (review9 finding 02), and lets socket()
make TCP and UDP sockets of AF_INET and AF_INET6 only (review9 findings 01 and 03).
A rule that keeps the network shares the machine's network namespace, whose abstract
sockets (the person's X server at @/tmp/.X11-unix/X0) no file rule hides: where
neither the filter nor Landlock's scope can be had, exec refuses such a rule
(sandbox_unavailable) rather than open them.

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

from sandbox import _entry, _seccomp, _startline

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
            "folders it is given read-write (shared folders, or its plan's workspace in "
            "sandbox mode) and the sandbox's /tmp"
            + (
                "; it reaches no abstract unix socket or process outside the sandbox"
                if self.scopes
                else ""
            ),
        )

    @property
    def scopes(self) -> bool:
        """Whether the helper scopes the sandbox (Landlock ABI 6+): no abstract unix
        socket or signal outside its domain."""
        return self.abi >= SCOPED_ABI

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


SCOPED_ABI = 6  # LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET and LANDLOCK_SCOPE_SIGNAL


def abstract_sockets_open(
    entry: str | None, landlock: Landlock, unix_sockets: bool = False
) -> str | None:
    """Why a sandbox that shares the machine's network namespace would reach its
    abstract unix sockets (neither the filter's refusal of socket(AF_UNIX), which a
    rule's `unix_sockets` lifts, nor Landlock's scope applies), or None when it cannot."""
    refused = not unix_sockets and _seccomp.filter_for_machine() is not None
    if refused or (entry is not None and landlock.scopes):
        return None
    filter_off = (
        "lifted by the rule: unix_sockets = true"
        if unix_sockets
        else f"no table for {os.uname().machine}"
    )
    return (
        "a rule that keeps the network shares the machine's abstract unix sockets (the "
        "person's X server's among them), and this machine has neither the seccomp filter's "
        f"refusal of unix sockets ({filter_off}) nor Landlock ABI {SCOPED_ABI} (Linux 6.12) "
        "to close them"
        + (f" ({landlock.problem})" if landlock.problem else f" (ABI {landlock.abi})")
    )


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
            "userfaultfd, io_uring, unix sockets (socket(AF_UNIX), datagram socketpairs) and "
            "other kernel doors, and lets socket() make only TCP and UDP sockets of AF_INET "
            "and AF_INET6 (no vsock, netlink, MPTCP or raw)"
            if seccomp
            else f"no system-call table for {machine}: exec runs without the filter",
        )
    ]
    if landlock is not None:
        layers.append(landlock.layer())
        layers.append(user_limits_layer(landlock))
        if not seccomp and not (landlock.scopes and landlock.problem is None):
            layers.append(
                Layer(
                    "unix sockets",
                    False,
                    "a named socket in a shared folder can be connected to, and rules with "
                    "network = true answer sandbox_unavailable (they would reach the machine's "
                    "abstract sockets, the X server's among them)",
                )
            )
    return layers


def user_limits_layer(landlock: Landlock) -> Layer:
    """Whether each sandbox gets a share of its user's inotify instances and watches
    (sandbox._startline), not all of them: written by the entry helper, on Linux 5.11+."""
    limits = _startline.user_limits()
    whole = {name: _user_limit(name) for name in ("max_inotify_instances", "max_inotify_watches")}
    mine = dict(limits)
    if landlock.layer().active and "max_inotify_instances" in mine:
        shares = " and ".join(
            f"{mine[name]:,} of its user's {whole[name]} {what}"
            for name, what in (
                ("max_inotify_instances", "inotify instances"),
                ("max_inotify_watches", "inotify watches"),
            )
            if name in mine
        )
        if mine.get("max_fanotify_groups") == 0:
            shares += ", and no fanotify group"
        return Layer("user limits", True, f"each sandbox may take {shares}")
    why = (
        "this kernel counts them per user only (Linux 5.11+ counts them per user namespace)"
        if "max_inotify_instances" not in mine
        else "the entry helper writes each sandbox's share, and Landlock is off"
    )
    return Layer(
        "user limits",
        False,
        f"a sandboxed program can take all {whole['max_inotify_instances']} inotify "
        "instances of the worker's user (the person's editors and file managers then get "
        f"none while it runs): {why}",
    )


def _user_limit(name: str) -> str:
    """The user's whole of a per-user count, as the machine's sysctl says (its
    /proc/sys/user, else fs.inotify's own, before Linux 5.11)."""
    old = {"max_inotify_instances": "max_user_instances", "max_inotify_watches": "max_user_watches"}
    for path in (_startline.USER_SYSCTLS / name, Path("/proc/sys/fs/inotify") / old[name]):
        try:
            return f"{int(path.read_text()):,}"
        except (OSError, ValueError):
            continue
    return "?"
