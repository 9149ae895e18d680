"""Whether per-plan limits could come from cgroup v2: the probe on this machine, and
on cgroup layouts it must tell apart (their files written in a folder, read by the
real probe).

This machine cannot exercise per-plan cgroup v2 limits: its cgroup v2 hierarchy
offers none of the cpu, memory and pids controllers (they are bound to cgroup v1),
and there is no user systemd to delegate a subtree. So what is proven here is the
fallback: the probe says why cgroup v2 does not apply, and the worker (its start log,
tests/integration/test_workbench.py) and `doctor` (below) say that rlimits apply and
why. Nowhere is a test skipped for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sandbox import cgroups

V1_AND_V2 = """\
31 1 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
32 31 0:27 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
33 31 0:28 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
34 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
41 31 0:38 / {point} rw,relatime - cgroup2 cgroup2 rw
"""
V2_ONLY = "41 1 0:38 / {point} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def layout(tmp_path: Path, mountinfo: str, own: str, controllers: str) -> tuple[str, str, Path]:
    """A cgroup v2 mount at tmp_path/cg whose cgroup `own` offers `controllers`."""
    point = tmp_path / "cg"
    folder = point / own.lstrip("/")
    folder.mkdir(parents=True)
    for name in ("cgroup.procs", "cgroup.subtree_control"):
        (folder / name).write_text("")
    (folder / "cgroup.controllers").write_text(controllers + "\n")
    (tmp_path / "mountinfo").write_text(mountinfo.format(point=point))
    (tmp_path / "cgroup").write_text(f"0::{own}\n")
    return str(tmp_path / "mountinfo"), str(tmp_path / "cgroup"), folder


def test_a_delegated_subtree_with_the_controllers_is_usable(tmp_path: Path) -> None:
    own = "/user.slice/user-1000.slice/user@1000.service/app.slice/run-r1.scope"
    mountinfo, cgroup, folder = layout(tmp_path, V2_ONLY, own, "cpuset cpu io memory pids")
    support = cgroups.probe(mountinfo, cgroup)
    assert support.usable and support.folder == folder, support
    assert {"cpu", "memory", "pids"} <= set(support.controllers)


def test_controllers_bound_to_cgroup_v1_are_named(tmp_path: Path) -> None:
    mountinfo, cgroup, _ = layout(tmp_path, V1_AND_V2, "/", "hugetlb")
    support = cgroups.probe(mountinfo, cgroup)
    assert not support.usable
    assert "offers no cpu, memory, pids controllers" in support.reason
    assert "on cgroup v1 here: cpu, memory, pids" in support.reason


def test_the_root_cgroup_is_not_a_delegated_subtree(tmp_path: Path) -> None:
    mountinfo, cgroup, _ = layout(tmp_path, V2_ONLY, "/", "cpu memory pids")
    support = cgroups.probe(mountinfo, cgroup)
    assert not support.usable and "root cgroup" in support.reason


def test_a_cgroup_the_worker_cannot_write_is_not_delegated(tmp_path: Path) -> None:
    mountinfo, cgroup, folder = layout(tmp_path, V2_ONLY, "/system.slice/x", "cpu memory pids")
    for name in ("cgroup.procs", "cgroup.subtree_control"):
        (folder / name).chmod(0o444)
    folder.chmod(0o555)
    try:
        support = cgroups.probe(mountinfo, cgroup)
    finally:
        folder.chmod(0o755)
    if os.geteuid() == 0:  # root may write anything: what the kernel would say decides
        assert support.usable
    else:
        assert not support.usable and "not delegated" in support.reason


def test_no_cgroup_v2_at_all(tmp_path: Path) -> None:
    (tmp_path / "mountinfo").write_text(V1_AND_V2.splitlines()[1] + "\n")
    (tmp_path / "cgroup").write_text("4:memory:/\n")
    support = cgroups.probe(str(tmp_path / "mountinfo"), str(tmp_path / "cgroup"))
    assert not support.usable and support.reason == "no cgroup v2 hierarchy is mounted"


def test_on_this_machine_the_probe_and_doctor_agree_on_which_limits_apply(
    tmp_path: Path,
) -> None:
    support = cgroups.probe()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTWORKER_")}
    env["AGENTWORKER_HOME"] = str(tmp_path / "home")
    out = subprocess.run(
        [sys.executable, "-m", "worker", "doctor", "--json", "--offline"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    found = [f for f in json.loads(out.stdout)["findings"] if f["check"] == "plan limits"]
    assert len(found) == 1, out.stdout
    limits = found[0]
    choice = cgroups.choose("any")
    assert limits["details"]["cgroup_v2"] is support.usable
    if choice.backend is not None:  # as here: cgroup v1, as root
        assert limits["details"]["applies"] == choice.backend.kind
        assert f"per-plan limits by {choice.backend.kind} at " in limits["summary"]
        assert not limits["fix"]
    else:
        assert limits["details"]["applies"] == "rlimits"
        assert limits["details"]["reason"] == support.reason
        assert "per-plan limits by rlimits" in limits["summary"]
        assert "not cgroup v2: " in limits["summary"] and "Delegate=yes" in limits["fix"]
