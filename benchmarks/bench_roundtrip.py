"""Round trip of workerHost.fs_stat through hub → worker → hub, beside raw gRPC echo.

Both servers run as separate processes on loopback and are measured in the same
run: `agentworker up` (hub + worker in one process, the default setup) and a bare
gRPC bidi echo with no work at all. Printed: p50/p99 latency with 1 call in flight,
throughput with 64 in flight, and each figure's ratio to the raw baseline.

    python benchmarks/bench_roundtrip.py [--calls 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.cluster import free_port, wait_for
from worker.client import ControlClient
from worker.proto import agentworker_pb2 as pb

ECHO_SERVER = """
import asyncio, sys, grpc
async def echo(requests, context):
    async for message in requests:
        yield message
async def main():
    server = grpc.aio.server()
    handler = grpc.stream_stream_rpc_method_handler(echo)
    routes = grpc.method_handlers_generic_handler("Echo", {"Stream": handler})
    server.add_generic_rpc_handlers((routes,))
    server.add_insecure_port(sys.argv[1])
    await server.start()
    await server.wait_for_termination()
asyncio.run(main())
"""

CONFIG = """
[hub]
listen = "{listen}"
[[root]]
path = "{workspace}"
mode = "ro"
[[grant]]
agent = "bench"
scopes = ["workerHost.fs_stat"]
"""


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(
    one_call: Callable[[], Awaitable[None]], calls: int, in_flight: int
) -> tuple[list[float], float]:
    """Latencies (ms) and calls/s with `in_flight` calls outstanding at all times."""
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

        for _ in range(200):
            await one()
        result = await measure(one, calls, in_flight)
        await call.done_writing()
        reading.cancel()
        return result


async def worker_bench(
    client: ControlClient, calls: int, in_flight: int
) -> tuple[list[float], float]:
    request = pb.DispatchRequest(
        agent_id="bench", surface="workerHost", action="fs_stat", args_json='{"path": "bench.txt"}'
    )

    async def one() -> None:
        reply = await client.stub.Dispatch(request, metadata=client.metadata)
        if reply.result.status != pb.ActionResult.OK:
            raise RuntimeError(reply.result.error.message)

    for _ in range(200):
        await one()
    return await measure(one, calls, in_flight)


def report(label: str, raw: tuple[list[float], float], ours: tuple[list[float], float]) -> None:
    raw_lat, raw_rate = raw
    lat, rate = ours
    raw_p50, p50 = statistics.median(raw_lat), statistics.median(lat)
    raw_p99, p99 = percentile(raw_lat, 0.99), percentile(lat, 0.99)
    print(f"\n{label}")
    print(f"  {'':22}{'p50 ms':>10}{'p99 ms':>10}{'calls/s':>11}")
    print(f"  {'raw gRPC bidi echo':22}{raw_p50:10.3f}{raw_p99:10.3f}{raw_rate:11.0f}")
    print(f"  {'fs_stat hub→worker':22}{p50:10.3f}{p99:10.3f}{rate:11.0f}")
    ratios = f"{p50 / raw_p50:10.2f}{p99 / raw_p99:10.2f}{rate / raw_rate:11.2f}"
    print(f"  {'ratio (ours / raw)':22}{ratios}")


async def run(calls: int, home: Path) -> None:
    echo_addr = f"127.0.0.1:{free_port()}"
    listen = f"127.0.0.1:{free_port()}"
    workspace = home / "workspace"
    workspace.mkdir(parents=True)
    (workspace / "bench.txt").write_text("bench")
    (home / "config.toml").write_text(CONFIG.format(listen=listen, workspace=workspace))
    env = {**os.environ, "AGENTWORKER_HOME": str(home)}
    echo = subprocess.Popen([sys.executable, "-c", ECHO_SERVER, echo_addr])
    up = subprocess.Popen(
        [sys.executable, "-m", "worker", "up"], env=env, stderr=subprocess.DEVNULL
    )
    try:
        wait_for(lambda: (home / "hub.token").exists(), 15)
        client = ControlClient.connect(listen, (home / "hub.token").read_text().strip())
        for _ in range(100):
            status = await client.stub.Status(pb.StatusRequest(), metadata=client.metadata)
            if status.connected_workers:
                break
            await asyncio.sleep(0.1)
        for in_flight in (1, 64):
            raw = await echo_bench(echo_addr, calls, in_flight)
            ours = await worker_bench(client, calls, in_flight)
            report(f"{calls} calls, {in_flight} in flight", raw, ours)
        await client.close()
    finally:
        up.terminate()
        echo.terminate()
        up.wait(30)
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
