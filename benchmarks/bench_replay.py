"""Replay of fs_stat steps, in this process and through a hub, beside the raw
ControlService.Dispatch rate measured in the same run.

- raw ControlService.Dispatch: the baseline, one fs_stat Dispatch RPC after
  another into `agentworker up` (hub + worker in one process), as a caller
  that needs no script would make them; once with ids the hub makes, once with
  a correlation id of the caller's each (as a replay sends), which the hub
  must look up before it sends the call on;
- replay through the hub: the same `agentworker up`, the steps of a script sent
  by the replay engine (`agentworker replay --server`): one Dispatch per step,
  plus reading the step, its correlation id and checking its expectation;
- replay in-process: a worker's pipeline built in this process from the same
  config, no network (`agentworker replay` without --server).

Steps run one after another, as a replay runs them. The three are measured in
alternating rounds and pooled, so a shared machine's drift weighs on all alike;
each replay round gets a run label of its own, so its steps run anew rather than
being answered from the hub's record.

    python benchmarks/bench_replay.py [--steps 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import Home, agentworker, connected, exited, machine, make_home
from tests.support.bounds import Bound
from worker.config import Paths, load
from worker.hub.client import ControlClient
from worker.replay import in_process, parse, replay, through_hub
from worker.replay.runner import Report
from worker.wire.proto import agentworker_pb2 as pb

ROUNDS = 5
STEP = {"action": "fs_stat", "args": {"path": "bench.txt"}, "agent": "bench"}


UP_TIMEOUT_S = 90  # idle; stretched with the machine's load (tests.support.bounds)


async def until_up(up: subprocess.Popen[bytes], home: Home) -> None:
    """Wait for `agentworker up` to have its worker in, failing at once with its log
    should it exit first."""
    bound = Bound(UP_TIMEOUT_S)
    while not bound.passed():
        if up.poll() is not None:
            raise exited(up, home, "up", "before its worker connected")
        if home.token_file.exists():
            client = ControlClient.connect(home.listen, home.token_file.read_text().strip())
            try:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    status = await client.stub.Status(
                        pb.StatusRequest(), metadata=client.metadata, timeout=2
                    )
                    if status.connected_workers:
                        return
            finally:
                await client.close()
        await asyncio.sleep(0.1)
    raise exited(up, home, "up", f"without a worker connected within {bound}")


def script_text(steps: int) -> str:
    return "".join(json.dumps(STEP) + "\n" for _ in range(steps))


def checked(report: Report) -> float:
    """The round's steps/s, once every step passed."""
    failed = [s for s in report.steps if s.outcome != "passed"]
    if failed:
        raise RuntimeError(f"{len(failed)} steps did not pass, e.g. line {failed[0].line}")
    return len(report.steps) / report.seconds


async def raw_dispatch(client: ControlClient, calls: int, ids: str = "") -> float:
    """Dispatch RPCs one after another; with `ids`, each carries a new id of ours."""
    request = pb.DispatchRequest(
        agent_id="bench", surface="workerHost", action="fs_stat", args_json='{"path": "bench.txt"}'
    )
    begun = time.perf_counter()
    for i in range(calls):
        if ids:
            request.correlation_id = f"{ids}-{i}"
        reply = await client.stub.Dispatch(request, metadata=client.metadata)
        if reply.result.status != pb.ActionResult.OK:
            raise RuntimeError(reply.result.error.message)
    return calls / (time.perf_counter() - begun)


async def run(steps: int, path: Path) -> None:
    home: Home = make_home(path / "home", mode="ro", scopes=["workerHost.fs_stat"])
    (home.workspace / "bench.txt").write_text("bench")
    paths = Paths(config_dir=home.path, data_dir=home.path)
    config = load(paths)
    per_round = max(1, steps // ROUNDS)
    text = script_text(per_round)
    rates: dict[str, list[float]] = {"raw": [], "raw-ids": [], "hub": [], "local": []}
    with agentworker(["up"], home) as up:
        await until_up(up, home)
        async with connected(home) as client:
            token = home.token_file.read_text().strip()
            async with through_hub(home.listen, token) as hub:
                # A round of each first, not counted.
                checked(await replay(parse(text, base=path, run_label="warm"), hub, mode="hub"))
                await raw_dispatch(client, per_round)
                async with in_process(config, home.path, path / "warm") as worker:
                    warm = parse(text, base=path, run_label="warm")
                    checked(await replay(warm, worker, mode="in-process"))
                for i in range(ROUNDS):
                    rates["raw"].append(await raw_dispatch(client, per_round))
                    rates["raw-ids"].append(await raw_dispatch(client, per_round, f"raw-{i}"))
                    hub_script = parse(text, base=path, run_label=f"hub-{i}")
                    rates["hub"].append(checked(await replay(hub_script, hub, mode="hub")))
                    local_script = parse(text, base=path, run_label=f"local-{i}")
                    async with in_process(config, home.path, path / f"local-{i}") as worker:
                        report = await replay(local_script, worker, mode="in-process")
                    rates["local"].append(checked(report))
    report_rates(steps, rates)


def report_rates(steps: int, rates: dict[str, list[float]]) -> None:
    raw = statistics.median(rates["raw"])
    print(f"\n{ROUNDS * max(1, steps // ROUNDS)} fs_stat steps, one at a time, {ROUNDS} rounds")
    print(f"  {'':34}{'steps/s':>9}{'ms/step':>9}{'rate/raw':>9}")
    names = {
        "raw": "raw ControlService.Dispatch",
        "raw-ids": "  the same, caller's ids",
        "hub": "replay through the hub",
        "local": "replay in-process",
    }
    for key, name in names.items():
        rate = statistics.median(rates[key])
        print(f"  {name:34}{rate:9.0f}{1000 / rate:9.3f}{rate / raw:9.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(args.steps, Path(tmp)))


if __name__ == "__main__":
    main()
