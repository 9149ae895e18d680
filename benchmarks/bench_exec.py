"""workerHost.exec through the whole pipeline, beside a raw subprocess.run, same run.

Two commands: `true` (the fixed cost of a call) and `cat` of a 1 MiB file (the
cost of carrying output back). Each is timed three ways, one call at a time:

  raw        subprocess.run(argv) in this process, no isolation at all
  sandbox    sandbox.process.run: bubblewrap + prlimit (+ the pid cap as root)
  pipeline   caller → hub → worker → allowlist → sandbox → back (`agentworker up`)

Printed: p50/p99 latency and each figure's ratio to raw.

    python benchmarks/bench_exec.py [--calls 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandbox import environment
from sandbox.process import Limits, Mount, View, run
from tests.support.cluster import free_port, until_worker_connected, wait_for
from worker.client import ControlClient
from worker.proto import agentworker_pb2 as pb

CONFIG = """
[hub]
listen = "{listen}"
[[root]]
path = "{workspace}"
mode = "ro"
[[grant]]
agent = "bench"
scopes = ["workerHost.exec"]
"""
MIB = 1024 * 1024


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def timed(one_call: Callable[[], Awaitable[None]], calls: int) -> list[float]:
    for _ in range(max(5, calls // 20)):  # warm up
        await one_call()
    latencies = []
    for _ in range(calls):
        start = time.perf_counter()
        await one_call()
        latencies.append((time.perf_counter() - start) * 1000)
    return latencies


def raw_call(argv: list[str], cwd: Path, expect: int) -> Callable[[], Awaitable[None]]:
    async def one() -> None:
        out = subprocess.run(argv, cwd=cwd, capture_output=True, check=True)
        if len(out.stdout) != expect:
            raise RuntimeError("raw output has the wrong size")

    return one


def sandbox_call(argv: list[str], workspace: Path, expect: int) -> Callable[[], Awaitable[None]]:
    view = View(
        cwd=str(workspace),
        mounts=(Mount(str(workspace), False),),
        env=environment.build(os.environ, ["LANG"]),
    )

    async def one() -> None:
        done = await run(argv, view, Limits())
        if done.exit_code != 0 or len(done.stdout) != expect:
            raise RuntimeError(f"sandboxed {argv} failed: {done}")

    return one


def pipeline_call(
    client: ControlClient, argv: list[str], expect: int
) -> Callable[[], Awaitable[None]]:
    request = pb.DispatchRequest(
        agent_id="bench",
        surface="workerHost",
        action="exec",
        args_json=json.dumps({"argv": argv}),
    )

    async def one() -> None:
        reply = await client.stub.Dispatch(request, metadata=client.metadata)
        if reply.result.status != pb.ActionResult.OK or len(reply.result.blob) != expect:
            raise RuntimeError(reply.result.error.message or "wrong output size")

    return one


def report(label: str, rows: list[tuple[str, list[float]]]) -> None:
    raw_p50, raw_p99 = statistics.median(rows[0][1]), percentile(rows[0][1], 0.99)
    print(f"\n{label}")
    print(f"  {'':26}{'p50 ms':>9}{'p99 ms':>9}{'p50/raw':>9}{'p99/raw':>9}")
    for name, samples in rows:
        p50, p99 = statistics.median(samples), percentile(samples, 0.99)
        print(f"  {name:26}{p50:9.2f}{p99:9.2f}{p50 / raw_p50:9.1f}{p99 / raw_p99:9.1f}")


async def bench(calls: int, home: Path) -> None:
    listen = f"127.0.0.1:{free_port()}"
    workspace = home / "workspace"
    workspace.mkdir(parents=True)
    (workspace / "one-mib.bin").write_bytes(os.urandom(MIB))
    (home / "config.toml").write_text(CONFIG.format(listen=listen, workspace=workspace))
    env = {**os.environ, "AGENTWORKER_HOME": str(home)}
    up = subprocess.Popen(
        [sys.executable, "-m", "worker", "up"], env=env, stderr=subprocess.DEVNULL
    )
    try:
        wait_for(lambda: (home / "hub.token").exists(), 15)
        client = ControlClient.connect(listen, (home / "hub.token").read_text().strip())
        await until_worker_connected(client)
        for argv, expect in ((["true"], 0), (["cat", "one-mib.bin"], MIB)):
            pinned = ["/usr/bin/" + argv[0], *argv[1:]]
            rows = [
                ("raw subprocess.run", await timed(raw_call(pinned, workspace, expect), calls)),
                (
                    "sandbox.process.run",
                    await timed(sandbox_call(pinned, workspace, expect), calls),
                ),
                ("exec via hub → worker", await timed(pipeline_call(client, argv, expect), calls)),
            ]
            report(f"exec {' '.join(argv)}: {calls} calls, 1 in flight", rows)
        await client.close()
    finally:
        up.terminate()
        up.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    root = "root (pid cap via pid_max)" if os.geteuid() == 0 else "a regular user"
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, {os.uname().release}, {root}")
    with tempfile.TemporaryDirectory() as home:
        asyncio.run(bench(args.calls, Path(home)))


if __name__ == "__main__":
    main()
