"""Sandbox mode (the workbench): exec in a plan's sandbox beside plain exec and raw
bubblewrap, and a plan's first call beside its later ones, all in one run.

`exec true`, one call at a time, five ways:

  raw true          subprocess.run(["/usr/bin/true"]): no isolation at all
  raw bwrap true    subprocess.run of bubblewrap with the workbench's namespaces and
                    mounts around `true`: what the isolation alone costs
  workerHost.exec   caller → hub → worker → allowlist → sandbox → back (`up`)
  workbenchHost     the same through a sandbox-mode worker (`up --sandbox`), in one plan,
                    with its plan's cgroup where this machine offers cgroups (the sandbox
                    is held at its start line while it joins it)
  … rlimits only    the same with `[sandbox] cgroups = "off"`: what the plan's cgroup costs

A plan's first call makes its workspace (and the hub places the plan); each
"first call" row uses a fresh plan per call, beside calls of one plan made before.

Printed: p50/p99 latency and each row's ratio to its table's first row.

    python benchmarks/bench_sandbox.py [--calls 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import OneCall, agentworker, connected, machine, make_home, report, timed
from sandbox._bwrap import _system_view
from worker.hub.client import ControlClient
from worker.wire.proto import agentworker_pb2 as pb

TRUE = "/usr/bin/true"


def raw_call(argv: list[str]) -> OneCall:
    async def one() -> None:
        subprocess.run(argv, check=True)

    return one


def bwrap_argv(workspace: Path) -> list[str]:
    """bubblewrap as the workbench runs it (namespaces, read-only system, private /tmp,
    the workspace at /workspace), minus the worker's own steps (limits, start line)."""
    args = ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent"]
    args += ["--new-session", "--cap-drop", "ALL"]
    args += _system_view()  # the read-only system, as the sandbox binds it
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]  # noqa: S108 - its own tmpfs
    args += ["--bind", str(workspace), "/workspace", "--remount-ro", "/", "--chdir", "/workspace"]
    return [*args, "--", TRUE]


def dispatch(client: ControlClient, surface: str, action: str, args: object, plan: str) -> OneCall:
    """One call as agent `bench`; `plan` "" means a fresh plan for every call."""

    async def one() -> None:
        request = pb.DispatchRequest(
            agent_id="bench",
            plan_id=plan or f"fresh-{uuid.uuid4().hex}",
            surface=surface,
            action=action,
            args_json=json.dumps(args),
        )
        reply = await client.stub.Dispatch(request, metadata=client.metadata)
        if reply.result.status != pb.ActionResult.OK:
            raise RuntimeError(f"{surface}.{action}: {reply.result.error.message}")

    return one


async def bench(calls: int, base: Path) -> None:
    plain = make_home(base / "plain", mode="ro", scopes=["workerHost.exec"])
    # The "first call" row makes a plan per call: more than the default max_plans (64).
    many = "\n[sandbox]\nmax_plans = 100000\n"
    sandboxed = make_home(base / "sandboxed", mode="ro", scopes=[], extra_config=many)
    no_cgroups = make_home(
        base / "no-cgroups", mode="ro", scopes=[], extra_config=many + 'cgroups = "off"\n'
    )
    scratch = base / "scratch"
    scratch.mkdir(mode=0o700)
    exec_true = {"argv": ["true"]}
    with (
        agentworker(["up"], plain),
        agentworker(["up", "--sandbox"], sandboxed),
        agentworker(["up", "--sandbox"], no_cgroups),
    ):
        async with (
            connected(plain) as host,
            connected(sandboxed) as bench_client,
            connected(no_cgroups) as rlimits_client,
        ):
            limits = said_limits(sandboxed.path / "up.log")
            rows = [
                ("raw true", await timed(raw_call([TRUE]), calls)),
                ("raw bwrap … true", await timed(raw_call(bwrap_argv(scratch)), calls)),
                (
                    "workerHost.exec true",
                    await timed(dispatch(host, "workerHost", "exec", exec_true, "p"), calls),
                ),
                (
                    "workbenchHost.exec true",
                    await timed(
                        dispatch(bench_client, "workbenchHost", "exec", exec_true, "p"), calls
                    ),
                ),
                (
                    "… rlimits only",
                    await timed(
                        dispatch(rlimits_client, "workbenchHost", "exec", exec_true, "p"), calls
                    ),
                ),
            ]
            print(f"workbenchHost: {limits}")
            report(f"exec true: {calls} calls, 1 in flight", rows, name_width=26)
            stat = {"path": "."}
            for label, action, args in (("fs_stat", "fs_stat", stat), ("exec", "exec", exec_true)):
                later = dispatch(bench_client, "workbenchHost", action, args, "kept")
                first = dispatch(bench_client, "workbenchHost", action, args, "")
                rows = [
                    (f"{label}, later call of a plan", await timed(later, calls)),
                    (f"{label}, first call of a plan", await timed(first, calls, min_warm_up=1)),
                ]
                report(f"workbenchHost.{label}: first call beside later ones", rows, name_width=32)


def said_limits(log: Path) -> str:
    """Which per-plan limits the sandbox-mode worker said apply (its start log)."""
    for line in log.read_text(errors="replace").splitlines():
        if "per-plan limits by " in line:
            return "per-plan limits by " + line.split("per-plan limits by ", 1)[1].split(":")[0]
    return "per-plan limits: not said"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory() as base:
        asyncio.run(bench(args.calls, Path(base)))


if __name__ == "__main__":
    main()
