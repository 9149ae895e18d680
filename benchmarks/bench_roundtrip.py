"""Round trip of workerHost.fs_stat through hub → worker → hub, beside raw gRPC echo.

Everything runs on loopback and is measured in the same run:

- raw gRPC bidi echo: one message out on a stream and its echo back, no work at all
  (the baseline every ratio is against), and a raw unary echo for context;
- hub → worker → hub: the reference hub runs inside this process, as a server would
  embed it, and sends each call down the stream to a real `agentworker run` process;
  this is the path a call takes in production, and the one the raw bidi echo mirrors;
- the same through the hub's ControlService (`agentworker call` does this): a unary
  RPC from this process into `agentworker up` (hub + worker in one process) or into
  `agentworker hub` + `agentworker run`. That is a second RPC hop per call, so set
  these rows beside the unary echo too, and beside a raw two-hop relay (a unary call
  into one process, sent down a bidi stream to another and answered back: the
  shape of caller → hub → worker with nothing of ours in it; see _common.RELAY).

Printed: p50/p99 latency and calls/s with 1 and with 64 calls in flight, and each
figure's ratio to the raw bidi echo, with the machine's load beside each table. A
shared machine's speed drifts over seconds, so each figure is measured in rounds
that take turns with its baseline's and pooled: the bidi echo with hub → worker →
hub, and the unary echo, the relay and both Dispatch topologies (all started first)
with each other. The drift then weighs on the baseline and on ours alike (a Dispatch
row measured after its unary echo once read 3.07x the echo one run and 3.70x the
next with the same code).

    python benchmarks/bench_roundtrip.py [--calls 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import (
    ECHO_SERVER,
    START_WITHIN_S,
    Home,
    OneCall,
    agentworker,
    connected,
    exited,
    goal,
    listening,
    loadavg,
    make_home,
    percentile,
    relay,
    relay_call,
)
from tests.support.bounds import Bound
from tests.support.cluster import free_port, wait_for
from worker import app
from worker.config import Paths, load
from worker.hub.client import ControlClient
from worker.hub.server import Hub
from worker.wire.proto import agentworker_pb2 as pb


async def warmed(one_call: OneCall, calls: int) -> None:
    """A warm-up for a measurement of `calls`: a fifth of them (5 to 200), one at a time."""
    for _ in range(min(200, max(5, calls // 5))):
        await one_call()


async def measure(
    one_call: OneCall, calls: int, in_flight: int, *, warm_up: bool = True
) -> tuple[list[float], float]:
    """Latencies (ms) and calls/s with `in_flight` calls outstanding at all times, after
    a warm-up, one call at a time, of a fifth of `calls` (5 to 200) that is not counted."""
    if warm_up:
        await warmed(one_call, calls)
    latencies: list[float] = []
    remaining = calls

    async def lane() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            start = time.perf_counter()
            await one_call()
            latencies.append((time.perf_counter() - start) * 1000)

    begin = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(in_flight)))
    return latencies, calls / (time.perf_counter() - begin)


async def echo_bench(address: str, calls: int, in_flight: int) -> tuple[list[float], float]:
    """A bare bidi stream: each call is one message out and its echo back."""
    async with grpc.aio.insecure_channel(address) as channel:
        stream = channel.stream_stream("/Echo/Stream")
        call = stream()
        waiters: asyncio.Queue[asyncio.Future[None]] = asyncio.Queue()
        payload = b'{"path": "bench.txt"}' + b"x" * 200

        async def reader() -> None:
            while True:
                message = await call.read()
                if message is grpc.aio.EOF:
                    return
                (await waiters.get()).set_result(None)

        reading = asyncio.create_task(reader())
        lock = asyncio.Lock()  # one writer at a time, as on the worker stream

        async def one() -> None:
            done = asyncio.get_running_loop().create_future()
            async with lock:
                await waiters.put(done)
                await call.write(payload)
            await done

        result = await measure(one, calls, in_flight)
        await call.done_writing()
        reading.cancel()
        return result


FS_STAT = pb.DispatchRequest(
    agent_id="bench", surface="workerHost", action="fs_stat", args_json='{"path": "bench.txt"}'
)
FS_STAT_REPLY_BYTES = 400  # about what fs_stat's result takes on the wire


async def stream_bench(hub: Hub, calls: int, in_flight: int) -> tuple[list[float], float]:
    """Each call sent by the hub in this process down the worker's stream."""

    async def one() -> None:
        reply = await hub.dispatch(FS_STAT)
        if reply.result.status != pb.ActionResult.OK:
            raise RuntimeError(reply.result.error.message)

    return await measure(one, calls, in_flight)


Measured = tuple[list[float], float]
ROUNDS = 5
CONNECT_TIMEOUT_S = 20  # idle; stretched with the load (tests.support.bounds)


def pooled(rounds: list[Measured]) -> Measured:
    """Rounds of one measurement as one: all latencies, and calls over total time."""
    latencies = [ms for lat, _ in rounds for ms in lat]
    seconds = sum(len(lat) / rate for lat, rate in rounds)
    return latencies, len(latencies) / seconds


async def alternating(
    echo_address: str, path: Path, calls: int, in_flight: int
) -> tuple[Measured, Measured]:
    """The raw bidi echo and hub → worker → hub, in alternating rounds."""
    raw: list[Measured] = []
    ours: list[Measured] = []
    async with embedded_hub(path) as hub:
        for _ in range(ROUNDS):
            raw.append(await echo_bench(echo_address, calls // ROUNDS, in_flight))
            ours.append(await stream_bench(hub, calls // ROUNDS, in_flight))
    return pooled(raw), pooled(ours)


def report(
    label: str, raw: Measured, unary: Measured, relayed: Measured, ours: dict[str, Measured]
) -> None:
    """Each row beside the raw bidi echo baseline, with the ratio."""
    raw_p50, raw_p99, raw_rate = statistics.median(raw[0]), percentile(raw[0], 0.99), raw[1]
    print(f"\n{label}")
    print(f"  {'':28}{'p50 ms':>9}{'p99 ms':>9}{'calls/s':>9}   ratio p50 / p99 / rate")
    rows = {
        "raw gRPC bidi echo": raw,
        "raw gRPC unary echo": unary,
        "raw two-hop relay": relayed,
        **ours,
    }
    for name, (lat, rate) in rows.items():
        p50, p99 = statistics.median(lat), percentile(lat, 0.99)
        ratios = f"{p50 / raw_p50:6.2f} {p99 / raw_p99:6.2f} {rate / raw_rate:6.2f}"
        print(f"  {name:28}{p50:9.3f}{p99:9.3f}{rate:9.0f}   {ratios}")


DISPATCH_RATE_GOAL = 3000.0  # calls/s at 64 in flight
DISPATCH_P50_GOAL = 3.0  # x the raw unary echo's p50, 1 in flight


def beside_relay(relayed: Measured, ours: dict[str, Measured]) -> None:
    """Each Dispatch topology beside the bare relay: what is ours, apart from the two hops."""
    relay_p50, relay_rate = statistics.median(relayed[0]), relayed[1]
    for name in TOPOLOGIES:
        lat, rate = ours[name]
        print(
            f"  {name} beside the raw two-hop relay: p50 {statistics.median(lat) / relay_p50:.2f}x,"
            f" calls/s {rate / relay_rate:.2f}x"
        )


def dispatch_goals(in_flight: int, unary: Measured, ours: dict[str, Measured]) -> None:
    """Issue 12 item 2: Dispatch's p50 alone beside a raw unary echo, its rate with
    64 in flight."""
    print()
    for name in TOPOLOGIES:
        lat, rate = ours[name]
        where = name.strip().removeprefix("via ")
        if in_flight == 1:
            goal(
                f"{where}: p50, 1 in flight",
                statistics.median(lat),
                " ms",
                DISPATCH_P50_GOAL,
                baseline=statistics.median(unary[0]),
                baseline_name="raw unary echo",
                on="ratio",
            )
        elif in_flight == 64:
            goal(
                f"{where}: calls/s, 64 in flight",
                rate,
                " calls/s",
                DISPATCH_RATE_GOAL,
                baseline=unary[1],
                baseline_name="raw unary echo",
                at_least=True,
            )


def _home(path: Path) -> Home:
    """A fresh home whose workspace holds the file every call stats."""
    home = make_home(path, mode="ro", scopes=["workerHost.fs_stat"])
    (home.workspace / "bench.txt").write_text("bench")
    return home


@contextlib.asynccontextmanager
async def embedded_hub(path: Path) -> AsyncIterator[Hub]:
    """The reference hub in this process and a worker process connected to it."""
    home = _home(path)
    paths = Paths(config_dir=path, data_dir=path)
    running = await app.start_hub(paths, load(paths))
    try:
        token = paths.token_file.read_text().strip()
        with agentworker(["run", "--server", running.address, "--token", token], home) as proc:
            bound = Bound(CONNECT_TIMEOUT_S)
            while not running.hub.sessions:
                if proc.poll() is not None:
                    raise exited(proc, home, "run", "before it connected")
                if bound.passed():
                    raise TimeoutError(f"the worker did not connect within {bound}")
                await asyncio.sleep(0.05)
            yield running.hub
            # Stop the worker while this loop still serves the hub: a blocking wait would
            # leave its goodbye unanswered until it gave up, 10 s later.
            proc.terminate()
            await asyncio.to_thread(proc.wait, 30)
    finally:
        await running.stop()


@dataclass
class Topology:
    """A client of the hub, and each agentworker process behind it by its command."""

    client: ControlClient
    pids: dict[str, int]


@contextlib.asynccontextmanager
async def topology(path: Path, commands: list[list[str]]) -> AsyncIterator[Topology]:
    """Start agentworker processes in a fresh home; yield a client once a worker is in."""
    home = _home(path)
    pids = {}
    with contextlib.ExitStack() as processes:  # stopped last started, first
        for argv in commands:
            pids[argv[0]] = processes.enter_context(agentworker(argv, home)).pid
            wait_for(home.token_file.exists, START_WITHIN_S)  # `run` reads the token `hub` writes
        async with connected(home) as client:
            yield Topology(client, pids)


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system, every thread) process `pid` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuSpent:
    """CPU a call of each process of a topology, and of this one (the caller), over
    the rounds measured: where a rate short of its goal goes, and the most the
    machine's cores could do at that cost."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.seconds = {"caller": 0.0, **{name: 0.0 for name in pids}}
        self.calls = 0

    async def measured(self, one: OneCall, calls: int, in_flight: int) -> Measured:
        await warmed(one, calls)
        before = {name: process_cpu(pid) for name, pid in self.pids.items()}
        mine = time.process_time()
        result = await measure(one, calls, in_flight, warm_up=False)
        self.seconds["caller"] += time.process_time() - mine
        for name, pid in self.pids.items():
            self.seconds[name] += process_cpu(pid) - before[name]
        self.calls += len(result[0])
        return result

    def line(self) -> str:
        each = {name: spent / self.calls * 1e6 for name, spent in self.seconds.items()}
        split = ", ".join(f"{name} {us:.0f}" for name, us in each.items())
        cores = os.cpu_count() or 1
        return (
            f"CPU us a call: {split}: {sum(each.values()):.0f} in all, so {cores} cores "
            f"kept busy do at most {cores * 1e6 / sum(each.values()):,.0f} calls/s"
        )


TOPOLOGIES = {
    "  via Dispatch, `up`": [["up"]],
    "  via Dispatch, hub + run": [["hub"], ["run"]],
}


# The unary echo served as the hub serves Dispatch: a client stream whose one request
# the handler reads in a time of its own (worker.hub.services._read_in_turn, which keeps
# a request waiting for its turn from being read meanwhile). Printed beside, no goal:
# what that shape costs gRPC itself.
READ_ONE = "  raw stream-unary echo"


async def taking_turns(
    echo: subprocess.Popen[bytes],
    echo_addr: str,
    relay_addr: str,
    started: dict[str, Topology],
    calls: int,
    in_flight: int,
) -> tuple[Measured, Measured, dict[str, Measured], dict[str, CpuSpent]]:
    """The raw unary echo, the raw relay and each Dispatch topology, in rounds taken in
    turn (the order rotating each round); each pooled over its rounds, and the CPU
    the unary echo's and each topology's processes spent a call."""
    async with (
        grpc.aio.insecure_channel(echo_addr) as echo_channel,
        grpc.aio.insecure_channel(relay_addr) as relay_channel,
    ):
        unary = echo_channel.unary_unary("/Echo/Call")
        read_in_turn = echo_channel.stream_unary("/Echo/ReadOne")
        payload = b'{"path": "bench.txt"}' + b"x" * 200

        async def echo_one() -> None:
            await unary(payload)

        async def read_one() -> None:
            await read_in_turn(iter((payload,)))

        def dispatch_one(client: ControlClient) -> OneCall:
            async def one() -> None:
                reply = await client.stub.Dispatch(FS_STAT, metadata=client.metadata)
                if reply.result.status != pb.ActionResult.OK:
                    raise RuntimeError(reply.result.error.message)

            return one

        cpu = {"unary": CpuSpent({"echo server": echo.pid})}
        cpu[READ_ONE] = CpuSpent({"echo server": echo.pid})
        cpu.update((name, CpuSpent(ran.pids)) for name, ran in started.items())
        ways: list[tuple[str, OneCall]] = [
            ("unary", echo_one),
            (READ_ONE, read_one),
            ("relay", relay_call(relay_channel, payload, FS_STAT_REPLY_BYTES)),
            *((name, dispatch_one(ran.client)) for name, ran in started.items()),
        ]
        rounds: dict[str, list[Measured]] = {name: [] for name, _ in ways}
        for turn in range(ROUNDS):
            for name, one in ways[turn % len(ways) :] + ways[: turn % len(ways)]:
                timed = cpu[name].measured if name in cpu else measure
                rounds[name].append(await timed(one, calls // ROUNDS, in_flight))
    pooled_rounds = {name: pooled(measured) for name, measured in rounds.items()}
    unary_m, relayed = pooled_rounds.pop("unary"), pooled_rounds.pop("relay")
    return unary_m, relayed, pooled_rounds, cpu


async def run(calls: int, home: Path) -> None:
    echo_addr = f"127.0.0.1:{free_port()}"
    echo = subprocess.Popen([sys.executable, "-c", ECHO_SERVER, echo_addr])
    try:
        wait_for(lambda: listening(echo_addr), START_WITHIN_S)
        for in_flight in (1, 64):
            before = loadavg()
            raw, stream = await alternating(echo_addr, home / f"{in_flight}-hub", calls, in_flight)
            ours = {"fs_stat hub → worker → hub": stream}
            async with contextlib.AsyncExitStack() as started:
                relay_addr = started.enter_context(relay())
                topologies = {
                    name: await started.enter_async_context(
                        topology(home / f"{in_flight}-{i}", commands)
                    )
                    for i, (name, commands) in enumerate(TOPOLOGIES.items())
                }
                unary, relayed, dispatched, cpu = await taking_turns(
                    echo, echo_addr, relay_addr, topologies, calls, in_flight
                )
            ours.update(dispatched)
            report(
                f"{calls} calls, {in_flight} in flight ({before}; after: {loadavg()})",
                raw,
                unary,
                relayed,
                ours,
            )
            dispatch_goals(in_flight, unary, ours)
            beside_relay(relayed, ours)
            for name, spent in cpu.items():
                shown = "raw gRPC unary echo" if name == "unary" else name.strip()
                print(f"  {shown}: {spent.line()}")
    finally:
        echo.terminate()
        echo.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=5000)
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, grpcio {grpc.__version__}, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as home:
        asyncio.run(run(args.calls, Path(home)))


if __name__ == "__main__":
    main()
