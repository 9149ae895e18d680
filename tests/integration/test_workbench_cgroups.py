"""Per-plan cgroups end to end: a real hub, a real `agentworker run --sandbox`, real
bubblewrap, the real kernel.

Here (and on CI) the worker runs as root on a hybrid cgroup layout, so its plans'
cgroups are cgroup v1 (tests/sandbox/test_plan_cgroups.py tests the backend
itself). The worker's plans are held to a small plan-wide cap on processes and
memory: a fork bomb spread over several calls of one plan, and a memory hog, meet
the plan's limits while another plan and the worker go on. Waits are on the
cgroups' own counters, never on the clock.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox import cgroups
from tests.support.cluster import Cluster, wait_for
from tests.support.policies import PYTHON3, exec_config
from tests.support.procs import marker, processes_with, wait_until_gone
from tests.support.workbench import call, in_parallel, key_of, run, sandbox_cluster, teardown

CAP = 24  # processes of one plan, all its sandboxes together
MEMORY_MB = 96

# Forks children that wait, until a fork is refused; then waits itself. It starts
# forking once `sys.argv[2]` programs have said they run, each by a file in the plan's
# workspace (shared by its calls): a sandbox joins its plan's cgroup before its program
# runs, and one joining a plan its others had filled is refused, not run past the cap.
FORKS = (
    "import os, sys, time\nopen('joined-' + os.urandom(8).hex(), 'w').close()\n"
    "while sum(n.startswith('joined-') for n in os.listdir('.')) < int(sys.argv[2]):\n"
    "    time.sleep(0.01)\n"
    "r, w = os.pipe()\nmade = 0\nwhile made < 200:\n"
    "    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
    "    if pid == 0:\n        os.close(w)\n        os.read(r, 1)\n        os._exit(0)\n"
    "    made += 1\nprint(made, flush=True)\ntime.sleep(600)\n"
)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if not isinstance(cgroups.choose("any").backend, cgroups.CgroupV1):
        pytest.skip("these tests need cgroup v1 as root, as on this project's CI")
    base = tmp_path_factory.mktemp("cgroups")
    settings = exec_config(base, PYTHON3) + (
        f"\n[sandbox]\nplan_execs = 3\nplan_processes = {CAP}\nplan_memory_mb = {MEMORY_MB}\n"
    )
    with sandbox_cluster(base, extra_config=settings) as c:
        yield c


def new_plan() -> str:
    return f"plan-{uuid.uuid4().hex[:12]}"


def plan_folders(live: Cluster, plan: str) -> list[Path]:
    """The plan's cgroup in each hierarchy, found beneath the folders the worker named
    at start."""
    said = next(p for p in live.procs if p.name == "bench").log()
    found = re.search(r"per-plan limits by cgroup v1 \(root\) at (.*?): all of", said)
    assert found, said
    key = key_of(live, plan)[:16]
    return [
        folder
        for base in found.group(1).split(", ")
        for folder in Path(base).glob(f"{cgroups.PLAN_PREFIX}{key}-*")
    ]


def counter(folder: Path, name: str, key: str) -> int:
    for line in (folder / name).read_text().splitlines():
        if line.startswith(key + " "):
            return int(line.split()[1])
    return 0


def test_a_fork_bomb_over_several_calls_is_capped_plan_wide_and_teardown_ends_it(
    live: Cluster,
) -> None:
    bombing, quiet = new_plan(), new_plan()
    tag = marker()
    box: dict[str, Any] = {}

    def detonate() -> None:
        calls = [(bombing, ["python3", "-c", FORKS, tag, "3"], {"timeout_s": 120})] * 3
        box["answers"] = in_parallel(live, calls)

    thread = threading.Thread(target=detonate, daemon=True)
    thread.start()
    wait_for(lambda: len(plan_folders(live, bombing)) == 3, 20)
    (pids,) = (f for f in plan_folders(live, bombing) if "pids" in f.parts)
    # Each of the three calls is refused a fork: the cap is the plan's, not a call's.
    wait_for(lambda: counter(pids, "pids.events", "max") >= 3, 20)
    assert int((pids / "pids.current").read_text()) <= CAP
    assert int((pids / "pids.peak").read_text()) <= CAP
    out, _ = call(live, quiet, "fs_write", {"path": "still.txt"}, b"working")
    assert out["status"] == "ok", out
    # The parent waits for its child: the sandbox ends with its first process, and on a
    # busy machine a child not yet run would be killed before it printed.
    forks = "import os; pid = os.fork(); print('ok', flush=True); pid and os.waitpid(pid, 0)"
    out, blob = run(live, quiet, ["python3", "-c", forks])
    assert out["status"] == "ok" and blob == b"ok\nok\n", (out, blob)
    assert teardown(live, bombing)["status"] == "ok"
    thread.join(30)
    assert [a[0]["error"]["code"] for a in box["answers"]] == ["cancelled"] * 3
    assert wait_until_gone(tag) == []
    assert plan_folders(live, bombing) == []  # removed in every hierarchy
    assert teardown(live, quiet)["status"] == "ok"


def test_a_memory_hog_is_killed_with_a_clear_answer_and_another_plan_works(
    live: Cluster,
) -> None:
    hungry, other = new_plan(), new_plan()
    out, _ = run(live, hungry, ["python3", "-c", "b = b'x' * (512 * 1024**2)"])
    assert out["status"] == "ok", out
    assert out["result"]["signal"] == "SIGKILL" and out["result"]["plan_limits"] == ["memory"]
    out, blob = run(live, other, ["python3", "-c", "b = b'x' * (32 * 1024**2); print(len(b))"])
    assert out["status"] == "ok" and out["result"]["exit_code"] == 0, (out, blob)
    assert out["result"]["plan_limits"] == []
    (memory,) = (f for f in plan_folders(live, hungry) if "memory" in f.parts)
    assert counter(memory, "memory.oom_control", "oom_kill") >= 1
    assert teardown(live, hungry)["status"] == "ok"
    assert plan_folders(live, hungry) == []
    assert processes_with(hungry) == []
    assert teardown(live, other)["status"] == "ok"


def bases(live: Cluster) -> list[Path]:
    said = next(p for p in live.procs if p.name == "bench").log()
    found = re.search(r"per-plan limits by cgroup v1 \(root\) at (.*?): all of", said)
    assert found, said
    return [Path(base) for base in found.group(1).split(", ")]


def test_a_plan_whose_cgroup_cannot_be_made_is_refused_not_run_unlimited(live: Cluster) -> None:
    plan = new_plan()
    pids = next(base for base in bases(live) if "pids" in base.parts)
    assert list(pids.glob("plan-*")) == [], "the tests before tear their plans down"
    pids.rmdir()  # the kernel now refuses the plan's cgroup in the pids hierarchy
    try:
        out, _ = run(live, plan, ["python3", "-c", "open('ran', 'w')"])
        assert out["status"] == "error", out
        error = out["error"]
        assert error["code"] == "sandbox_unavailable" and error["retryable"], error
        assert "plan's cgroup" in error["message"] and "never run without" in error["message"]
        assert call(live, plan, "fs_stat", {"path": "ran"})[0]["error"]["code"] == "not_found"
    finally:
        pids.mkdir()
    out, _ = run(
        live, plan, ["python3", "-c", "open('ran', 'w')"]
    )  # the next call makes the cgroup afresh
    assert out["status"] == "ok" and out["result"]["exit_code"] == 0, out
    assert len(plan_folders(live, plan)) == 3
    assert teardown(live, plan)["status"] == "ok"
