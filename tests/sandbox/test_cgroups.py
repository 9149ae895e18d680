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

import pytest

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


# ----------------------------------------------------------------- the cgroup v2 backend


class FakeCgroupFs(cgroups.Files):
    """The far side of the kernel boundary for the cgroup v2 backend: a cgroup v2
    file system in memory, with the rules the backend must respect: a cgroup with
    processes cannot hand controllers to its children (no internal processes); a
    controller can be enabled only where the parent offers it, and its files appear
    in the children only then; moving a process takes it out of its old cgroup;
    cgroup.kill empties the cgroup; rmdir refuses a cgroup with processes or
    children; a limit the kernel would refuse is refused (EINVAL).

    What this does NOT prove: that a real kernel accepts these writes in a delegated
    subtree (ownership, nsdelegate, the common-ancestor rule for moves), that it
    enforces pids.max, memory.max, memory.swap.max and cpu.max, that cgroup.kill
    kills, or that a sandbox held by bubblewrap joins a v2 cgroup in time. The
    cgroup v1 backend proves those on the real kernel here
    (tests/sandbox/test_plan_cgroups.py); this machine's cgroup v2 has no
    controllers to prove them with.
    """

    def __init__(self, root: Path, processes: list[int], offered: str) -> None:
        self.nodes: dict[Path, dict[str, object]] = {}
        self.writes: list[tuple[str, str]] = []
        self.nodes[root] = self._node(offered.split())
        self.nodes[root]["procs"] = list(processes)

    @staticmethod
    def _node(offered: list[str]) -> dict[str, object]:
        files = {"cgroup.kill": "", "cgroup.events": "populated 0\n"}
        if "pids" in offered:
            files |= {"pids.max": "max\n", "pids.events": "max 0\n"}
        if "memory" in offered:
            files |= {"memory.max": "max\n", "memory.swap.max": "max\n"}
            files |= {"memory.events": "oom 0\noom_kill 0\n"}
        if "cpu" in offered:
            files |= {"cpu.max": "max 100000\n", "cpu.stat": "nr_throttled 0\n"}
        return {"procs": [], "offered": offered, "enabled": [], "files": files}

    def _at(self, path: Path) -> tuple[dict[str, object], str]:
        node = self.nodes.get(path.parent)
        if node is None:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return node, path.name

    def read(self, path: Path) -> str:
        node, name = self._at(path)
        if name == "cgroup.procs":
            return "".join(f"{pid}\n" for pid in node["procs"])  # type: ignore[attr-defined]
        if name == "cgroup.controllers":
            return " ".join(node["offered"]) + "\n"  # type: ignore[arg-type]
        if name == "cgroup.subtree_control":
            return " ".join(node["enabled"]) + "\n"  # type: ignore[arg-type]
        if name == "pids.current" and "pids.max" in node["files"]:  # type: ignore[operator]
            return f"{len(node['procs'])}\n"  # type: ignore[arg-type]
        files: dict[str, str] = node["files"]  # type: ignore[assignment]
        if name not in files:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return files[name]

    def write(self, path: Path, text: str) -> None:
        node, name = self._at(path)
        self.writes.append((str(path), text.strip()))
        procs: list[int] = node["procs"]  # type: ignore[assignment]
        if name == "cgroup.procs":
            if node["enabled"]:
                raise OSError(16, "Device or resource busy", str(path))
            pid = int(text)
            for other in self.nodes.values():
                if pid in other["procs"]:  # type: ignore[operator]
                    other["procs"].remove(pid)  # type: ignore[attr-defined]
            procs.append(pid)
        elif name == "cgroup.subtree_control":
            asked = [word.lstrip("+") for word in text.split()]
            if any(c not in node["offered"] for c in asked):  # type: ignore[operator]
                raise FileNotFoundError(2, "No such file or directory", str(path))
            if procs:  # no internal processes (this is not the system's root cgroup)
                raise OSError(16, "Device or resource busy", str(path))
            node["enabled"] = sorted({*node["enabled"], *asked})  # type: ignore[misc]
        elif name == "cgroup.kill":
            procs.clear()
        elif name == "cpu.max" and int(text.split()[0]) < 1000:
            raise OSError(22, "Invalid argument", str(path))
        else:
            files: dict[str, str] = node["files"]  # type: ignore[assignment]
            if name not in files:
                raise FileNotFoundError(2, "No such file or directory", str(path))
            files[name] = text

    def exists(self, path: Path) -> bool:
        if path in self.nodes:
            return True
        node = self.nodes.get(path.parent)
        fixed = ("cgroup.procs", "cgroup.controllers", "cgroup.subtree_control")
        return node is not None and (path.name in fixed or path.name in node["files"])  # type: ignore[operator]

    def mkdir(self, path: Path) -> None:
        if path in self.nodes:
            raise FileExistsError(17, "File exists", str(path))
        parent = self.nodes.get(path.parent)
        if parent is None:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        self.nodes[path] = self._node(list(parent["enabled"]))  # type: ignore[call-overload]

    def rmdir(self, path: Path) -> None:
        node = self.nodes.get(path)
        if node is None:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        if node["procs"] or any(p.parent == path for p in self.nodes):
            raise OSError(16, "Device or resource busy", str(path))
        del self.nodes[path]

    def listdir(self, path: Path) -> list[str]:
        return [p.name for p in self.nodes if p.parent == path]

    def value(self, path: Path) -> str:
        return self.read(path).strip()


DELEGATED = Path("/fake/cg/user.slice/run-r1.scope")
INSIDE = "/user.slice/run-r1.scope"
LIMITS = cgroups.PlanLimits(processes=100, memory_bytes=256 * 1024**2, cpus=1.5)


def test_v2_moves_the_worker_into_a_leaf_before_it_enables_the_controllers() -> None:
    fake = FakeCgroupFs(DELEGATED, [os.getpid(), 4242], "cpu io memory pids")
    backend = cgroups.CgroupV2(DELEGATED, INSIDE, files=fake)
    assert backend.prepare() == []
    leaf = DELEGATED / cgroups.LEAF
    assert fake.value(leaf / "cgroup.procs").split() == [str(os.getpid()), "4242"]
    assert fake.value(DELEGATED / "cgroup.procs") == ""
    assert fake.value(DELEGATED / "cgroup.subtree_control").split() == ["cpu", "memory", "pids"]
    # Ready again (a restart in the same cgroup): nothing to move, nothing to enable.
    assert backend.prepare() == []


def test_v2_makes_each_plan_a_cgroup_of_its_own_with_its_limits() -> None:
    fake = FakeCgroupFs(DELEGATED, [os.getpid()], "cpu memory pids")
    backend = cgroups.CgroupV2(DELEGATED, INSIDE, files=fake)
    backend.prepare()
    one = backend.create("a" * 32, LIMITS)
    again = backend.create("a" * 32, LIMITS)  # the same plan after a teardown
    assert one.folders != again.folders and one.folders[0].parent == DELEGATED
    folder = one.folders[0]
    assert fake.value(folder / "pids.max") == "100"
    assert fake.value(folder / "memory.max") == str(256 * 1024**2)
    assert fake.value(folder / "memory.swap.max") == "0"
    assert fake.value(folder / "cpu.max") == "150000 100000"
    one.join(os.getpid())
    assert fake.value(folder / "cgroup.procs") == str(os.getpid())
    assert one.counters() == cgroups.Counters()
    one.destroy()
    assert (str(folder / "cgroup.kill"), "1") in fake.writes
    assert not fake.exists(folder) and fake.exists(again.folders[0])


def test_v2_a_refused_limit_leaves_no_cgroup_and_names_the_file() -> None:
    fake = FakeCgroupFs(DELEGATED, [os.getpid()], "cpu memory pids")
    backend = cgroups.CgroupV2(DELEGATED, INSIDE, files=fake)
    backend.prepare()
    with pytest.raises(cgroups.CgroupError, match=r"cpu\.max\): Invalid argument"):
        backend.create("b" * 32, cgroups.PlanLimits(100, 2**28, 0.001))
    assert fake.listdir(DELEGATED) == [cgroups.LEAF]


def test_v2_a_previous_runs_plan_cgroups_are_killed_and_removed_at_start() -> None:
    fake = FakeCgroupFs(DELEGATED, [os.getpid()], "cpu memory pids")
    earlier = cgroups.CgroupV2(DELEGATED, INSIDE, files=fake)
    earlier.prepare()
    left = earlier.create("c" * 32, LIMITS)
    left.join(4343)
    later = cgroups.CgroupV2(DELEGATED, INSIDE, files=fake)
    assert later.prepare() == [left.name]
    assert (str(left.folders[0] / "cgroup.kill"), "1") in fake.writes
    assert fake.listdir(DELEGATED) == [cgroups.LEAF]
