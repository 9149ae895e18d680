"""What this machine's kernel lets the exec sandbox add beyond bubblewrap, said once.

bubblewrap gives every program fresh namespaces, only the shared folders and no
capabilities. On top of that a seccomp filter (sandbox._seccomp) refuses the
system calls no allowlisted tool needs. Where a layer cannot be had, the worker
says so when it starts (and `report()` says so to anyone who asks): it never
runs with less than it claims.

Landlock (limiting which programs a sandboxed program may execute and where it may
write) is not applied yet: bubblewrap cannot apply it, and applying it from
inside the sandbox needs a helper process per call; `report()` says so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from sandbox import _seccomp


@dataclass(frozen=True)
class Layer:
    name: str
    active: bool
    detail: str


def report() -> list[Layer]:
    """Each confinement layer beyond bubblewrap: whether exec gets it, and why (not)."""
    machine = os.uname().machine
    seccomp = _seccomp.filter_for_machine() is not None
    return [
        Layer(
            "seccomp",
            seccomp,
            "refuses ptrace, mount, namespaces, keyrings, bpf, perf events, "
            "userfaultfd, io_uring and other kernel doors"
            if seccomp
            else f"no system-call table for {machine}: exec runs without the filter",
        ),
        Layer(
            "landlock",
            False,
            "not applied: a sandboxed program could start any program the sandbox shows "
            "(the system's); the allowlist's grammars are what keep admitted programs from it",
        ),
    ]
