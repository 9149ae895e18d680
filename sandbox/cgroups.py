"""Whether per-plan limits could come from cgroup v2 here, and why not when they cannot.

Bounding a plan's programs as a whole (processes, memory, CPU) takes cgroup v2:
a cgroup per plan holding every sandbox of the plan, with `pids.max`,
`memory.max` and `cpu.max`. That needs a cgroup v2 subtree delegated to the
worker (the worker in a cgroup of its own that it may write to, e.g. started
with `systemd-run --user --scope -p Delegate=yes`, or a service with
`Delegate=yes`) whose `cgroup.controllers` offers cpu, memory and pids.

`probe` finds out whether this process has one, from /proc/self/mountinfo,
/proc/self/cgroup and the cgroup's own files, and says what is missing when it
has not; it changes nothing. Sandbox mode reports its answer at start and in
`doctor`. The limits themselves are rlimits per sandbox today, everywhere (see
worker.actions.workbench): applying per-plan cgroups is not built yet. Standard
library only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

NEEDED: Final = ("cpu", "memory", "pids")
HOW: Final = (
    "start the worker in a delegated cgroup v2 subtree (systemd-run --user --scope "
    "-p Delegate=yes agentworker run --sandbox, or a service with Delegate=yes) on a "
    "machine whose cgroup v2 offers the cpu, memory and pids controllers"
)


@dataclass(frozen=True)
class CgroupSupport:
    """`usable`: a delegated cgroup v2 subtree with the controllers a plan needs is at
    `folder`. Otherwise `reason` says what is missing."""

    usable: bool
    folder: Path | None
    reason: str
    controllers: tuple[str, ...] = ()


def _cgroup2_mounts(mountinfo: str) -> list[tuple[str, str]]:
    """(root inside the hierarchy, mount point) of each cgroup2 mount."""
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        after = line.split(" - ", 1)[1].split()
        if after and after[0] == "cgroup2":
            found.append((fields[3], fields[4].replace("\\040", " ")))
    return found


def _v1_controllers(mountinfo: str) -> set[str]:
    """Controllers bound to a cgroup v1 hierarchy (so absent from v2)."""
    held: set[str] = set()
    for line in mountinfo.splitlines():
        if " - " not in line:
            continue
        after = line.split(" - ", 1)[1].split()
        if len(after) >= 3 and after[0] == "cgroup":
            held.update(option for option in after[2].split(",") if option in NEEDED)
    return held


def probe(
    mountinfo_path: str = "/proc/self/mountinfo", cgroup_path: str = "/proc/self/cgroup"
) -> CgroupSupport:
    """Whether per-plan cgroup v2 limits can apply to this process, and why not."""
    try:
        mountinfo = Path(mountinfo_path).read_text()
        membership = Path(cgroup_path).read_text()
    except OSError as exc:
        return CgroupSupport(False, None, f"cannot read the process's cgroups: {exc.strerror}")
    mounts = _cgroup2_mounts(mountinfo)
    if not mounts:
        return CgroupSupport(False, None, "no cgroup v2 hierarchy is mounted")
    own = next((line[3:] for line in membership.splitlines() if line.startswith("0::")), None)
    if own is None:
        return CgroupSupport(False, None, "the worker is in no cgroup v2 (cgroup v1 only)")
    for root, point in mounts:
        if own == root or own.startswith(root.rstrip("/") + "/"):
            folder = Path(point) / own[len(root) :].lstrip("/")
            break
    else:
        return CgroupSupport(False, None, f"the worker's cgroup {own} is not under a mount here")
    try:
        offered = tuple((folder / "cgroup.controllers").read_text().split())
    except OSError as exc:
        return CgroupSupport(False, folder, f"cannot read {folder}/cgroup.controllers: {exc}")
    missing = [name for name in NEEDED if name not in offered]
    if missing:
        on_v1 = sorted(set(missing) & _v1_controllers(mountinfo))
        where = f" (on cgroup v1 here: {', '.join(on_v1)})" if on_v1 else ""
        noun = "controllers" if len(missing) > 1 else "controller"
        return CgroupSupport(
            False,
            folder,
            f"cgroup v2 at {folder} offers no {', '.join(missing)} {noun}{where}",
            offered,
        )
    if own in ("/", ""):
        return CgroupSupport(
            False,
            folder,
            f"the worker runs in the root cgroup ({folder}), not in a subtree delegated to it",
            offered,
        )
    writable = all(
        os.access(path, os.W_OK)
        for path in (folder, folder / "cgroup.procs", folder / "cgroup.subtree_control")
    )
    if not writable:
        return CgroupSupport(
            False, folder, f"the worker's cgroup {folder} is not delegated to it (not writable)"
        )
    return CgroupSupport(True, folder, f"delegated cgroup v2 at {folder}", offered)
