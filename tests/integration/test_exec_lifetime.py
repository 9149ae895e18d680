"""A sandbox never outlives what started it: a worker killed mid-exec, and a plan killed
while bubblewrap is still starting, through a real hub and worker."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import Any

from tests.support.cluster import Cluster, cluster, wait_for
from tests.support.host_calls import call
from tests.support.procs import STUBBORN, marker, processes_with, wait_until_gone
from worker.wire.proto import agentworker_pb2 as pb

POLICY = """
[program.python3]
paths = ["/usr/bin/python3"]
[[program.python3.rule]]
id = "test-python"
reason = "tests: a program that resists being killed"
any_args = true
"""


def settings(tmp_path: Path, extra: str = "") -> str:
    policy = tmp_path / "allowlist.toml"
    policy.write_text(POLICY)
    return f'[exec]\npolicy = "{policy}"\n{extra}'


def in_background(live: Cluster, argv: list[str], **fields: Any) -> dict[str, Any]:
    box: dict[str, Any] = {}

    def go() -> None:
        try:
            box["out"], _ = call(live, "exec", {"argv": argv, "timeout_s": 600}, **fields)
        except Exception as exc:  # noqa: BLE001 - the worker is killed under it on purpose
            box["error"] = exc

    box["thread"] = threading.Thread(target=go, daemon=True)
    box["thread"].start()
    return box


def test_a_worker_killed_mid_exec_leaves_no_process_of_the_sandbox(tmp_path: Path) -> None:
    tag = marker()
    with cluster(tmp_path / "home", extra_config=settings(tmp_path)) as live:
        worker = next(proc for proc in live.procs if proc.name == "worker")
        running = in_background(live, ["python3", "-c", STUBBORN, tag])
        # The program (its sandbox's pid 1) and its setsid'd grandchild (bubblewrap's line
        # does not name the program: its entry helper is sent it, see sandbox.warm).
        wait_for(lambda: len(processes_with(tag)) >= 2 or "error" in running, 20, worker)
        assert "error" not in running, running
        worker.kill()  # SIGKILL: no cleanup runs in the worker
        assert wait_until_gone(tag, within_s=20) == []


SLOW_BWRAP = """#!/bin/sh
# bubblewrap, after a gate: the test holds it here, as if bubblewrap were still starting.
: > "{dir}/started"
read line < "{dir}/gate"
exec {bwrap} "$@"
"""


def test_a_kill_while_bubblewrap_starts_is_answered_and_leaves_nothing(tmp_path: Path) -> None:
    gate_dir = tmp_path / "gate"
    gate_dir.mkdir()
    os.mkfifo(gate_dir / "gate")
    slow = tmp_path / "slow-bwrap"
    slow.write_text(SLOW_BWRAP.format(dir=gate_dir, bwrap=shutil.which("bwrap")))
    slow.chmod(0o755)
    tag = marker()
    extra = settings(tmp_path, f'bwrap = "{slow}"\n')
    with cluster(tmp_path / "home", extra_config=extra) as live:
        running = in_background(live, ["python3", "-c", STUBBORN, tag], plan_id="doomed-plan")
        wait_for(lambda: (gate_dir / "started").exists(), 20)
        live.run(
            lambda c: c.stub.KillPlan(
                pb.KillPlanRequest(plan_id="doomed-plan", reason="test"), metadata=c.metadata
            )
        )
        running["thread"].join(20)
        assert not running["thread"].is_alive(), "the killed call was never answered"
        assert running["out"]["error"]["code"] == "plan_killed", running
        assert wait_until_gone(tag, within_s=20) == []
        again = live.call("workerHost.fs_stat", '{"path": "."}')
        assert again["status"] == "ok"


def test_a_worker_killed_while_its_sandbox_starts_never_lets_the_program_run(
    tmp_path: Path,
) -> None:
    """The window --die-with-parent leaves: bubblewrap arms its parent-death signal only
    after it started, and a sandbox the worker held at its start line (the old --block-fd
    handshake) went on when the worker died, with no parent left to kill it. Here the
    worker dies before bubblewrap even runs; bubblewrap then builds the sandbox, and the
    entry helper must find the worker gone and never start the program."""
    gate_dir = tmp_path / "gate"
    gate_dir.mkdir()
    os.mkfifo(gate_dir / "gate")
    slow = tmp_path / "slow-bwrap"
    slow.write_text(SLOW_BWRAP.format(dir=gate_dir, bwrap=shutil.which("bwrap")))
    slow.chmod(0o755)
    tag = marker()
    extra = settings(tmp_path, f'bwrap = "{slow}"\n')
    with cluster(tmp_path / "home", extra_config=extra) as live:
        worker = next(proc for proc in live.procs if proc.name == "worker")
        running = in_background(live, ["python3", "-c", STUBBORN, tag])
        wait_for(lambda: (gate_dir / "started").exists() or "error" in running, 20, worker)
        assert "error" not in running, running
        worker.kill()
        with (gate_dir / "gate").open("w") as gate:  # let bubblewrap start, worker gone
            gate.write("go\n")
        assert wait_until_gone(tag, within_s=20) == []
