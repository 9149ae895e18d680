"""fs_read of 1 MiB and fs_write of 16 MiB end to end, beside raw local I/O, same run.

Each operation is timed one call at a time, several ways, on the same bytes:

  fs_read 1 MiB    raw open/read/close in this process
                   raw gRPC unary echo of 1 MiB (what carrying the bytes costs)
                   fs_read via caller → hub → worker → back (`agentworker up`)
  fs_write 16 MiB  raw open/write/close (page cache only)
                   raw write + fsync
                   raw atomic replace: temp file, write, fsync, rename, fsync folder
                   raw gRPC unary echo of 16 MiB
                   the same 16 MiB sent through the pipeline to a no-op action
                   fs_write (overwrite) via caller → hub → worker → back, and the
                   part of it spent inside the worker (its telemetry duration_ms)

Printed: p50/p99 latency, throughput at p50, and each figure's ratio to the
first (raw local) row. Telemetry durations are whole milliseconds.

    python benchmarks/bench_fs.py [--reads 200] [--writes 30]
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

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.cluster import free_port, until_worker_connected, wait_for
from worker.client import ControlClient
from worker.proto import agentworker_pb2 as pb
from worker.transport import MAX_MESSAGE_BYTES

MIB = 1024 * 1024
CONFIG = """
[hub]
listen = "{listen}"
[[root]]
path = "{workspace}"
mode = "rw"
[[grant]]
agent = "bench"
scopes = ["workerHost.fs_read", "workerHost.fs_write", "workerDiag.probe"]
[worker]
diagnostics = true
"""
ECHO_SERVER = """
import asyncio, sys, grpc
async def call(request, context):
    return request
async def main():
    limit = int(sys.argv[2])
    options = [("grpc.max_send_message_length", limit), ("grpc.max_receive_message_length", limit)]
    server = grpc.aio.server(options=options)
    handler = grpc.unary_unary_rpc_method_handler(call)
    routes = grpc.method_handlers_generic_handler("Echo", {"Call": handler})
    server.add_generic_rpc_handlers((routes,))
    server.add_insecure_port(sys.argv[1])
    await server.start()
    await server.wait_for_termination()
asyncio.run(main())
"""

OneCall = Callable[[], Awaitable[None]]


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def timed(one_call: OneCall, calls: int) -> list[float]:
    for _ in range(max(3, calls // 20)):  # warm up
        await one_call()
    latencies = []
    for _ in range(calls):
        start = time.perf_counter()
        await one_call()
        latencies.append((time.perf_counter() - start) * 1000)
    return latencies


def raw_read(path: Path, size: int) -> OneCall:
    async def one() -> None:
        with path.open("rb") as f:
            if len(f.read()) != size:
                raise RuntimeError("short read")

    return one


def raw_write(path: Path, data: bytes, *, sync: bool) -> OneCall:
    async def one() -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)

    return one


def raw_atomic(path: Path, data: bytes) -> OneCall:
    async def one() -> None:
        temp = path.with_name(f".{path.name}.tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, path)
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)

    return one


def echo(channel: grpc.aio.Channel, data: bytes) -> OneCall:
    unary = channel.unary_unary("/Echo/Call")

    async def one() -> None:
        if len(await unary(data)) != len(data):
            raise RuntimeError("short echo")

    return one


def pipeline(
    client: ControlClient,
    action: str,
    args: dict[str, object],
    blob: bytes,
    expect: int,
    inside: list[float] | None = None,
) -> OneCall:
    """One dispatch; `inside` collects the worker's own duration_ms from telemetry."""
    surface, _, name = action.rpartition(".")
    request = pb.DispatchRequest(
        agent_id="bench", surface=surface, action=name, args_json=json.dumps(args), blob=blob
    )

    async def one() -> None:
        reply = await client.stub.Dispatch(request, metadata=client.metadata)
        if reply.result.status != pb.ActionResult.OK:
            raise RuntimeError(reply.result.error.message)
        if len(reply.result.blob) != expect:
            raise RuntimeError("the result blob has the wrong size")
        if inside is not None:
            inside.append(float(reply.result.invocation.duration_ms))

    return one


def report(label: str, size: int, rows: list[tuple[str, list[float]]]) -> None:
    raw_p50, raw_p99 = statistics.median(rows[0][1]), percentile(rows[0][1], 0.99)
    print(f"\n{label}")
    print(f"  {'':44}{'p50 ms':>9}{'p99 ms':>9}{'MiB/s':>9}{'p50/raw':>9}{'p99/raw':>9}")
    for name, samples in rows:
        p50, p99 = statistics.median(samples), percentile(samples, 0.99)
        rate = size / MIB / (p50 / 1000) if p50 > 0 else float("inf")  # telemetry: whole ms
        print(f"  {name:44}{p50:9.2f}{p99:9.2f}{rate:9.0f}{p50 / raw_p50:9.1f}{p99 / raw_p99:9.1f}")


async def bench(reads: int, writes: int, home: Path) -> None:
    listen, echo_addr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    workspace = home / "workspace"
    workspace.mkdir(parents=True)
    one_mib, sixteen = os.urandom(MIB), os.urandom(16 * MIB)
    (workspace / "one-mib.bin").write_bytes(one_mib)
    (home / "config.toml").write_text(CONFIG.format(listen=listen, workspace=workspace))
    env = {**os.environ, "AGENTWORKER_HOME": str(home)}
    up = subprocess.Popen(
        [sys.executable, "-m", "worker", "up"], env=env, stderr=subprocess.DEVNULL
    )
    echo_server = subprocess.Popen(
        [sys.executable, "-c", ECHO_SERVER, echo_addr, str(MAX_MESSAGE_BYTES)]
    )
    limits = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]
    try:
        wait_for(lambda: (home / "hub.token").exists(), 15)
        client = ControlClient.connect(listen, (home / "hub.token").read_text().strip())
        await until_worker_connected(client)
        async with grpc.aio.insecure_channel(echo_addr, options=limits) as channel:
            await channel.channel_ready()
            read_inside: list[float] = []
            read_rows = [
                (
                    "raw open/read/close",
                    await timed(raw_read(workspace / "one-mib.bin", MIB), reads),
                ),
                ("raw gRPC unary echo, 1 MiB", await timed(echo(channel, one_mib), reads)),
                (
                    "fs_read via hub → worker",
                    await timed(
                        pipeline(
                            client,
                            "workerHost.fs_read",
                            {"path": "one-mib.bin"},
                            b"",
                            MIB,
                            read_inside,
                        ),
                        reads,
                    ),
                ),
                ("  of which inside the worker (telemetry)", read_inside[-reads:]),
            ]
            report(f"fs_read 1 MiB: {reads} calls, 1 in flight", MIB, read_rows)
            raw_target = home / "raw-target.bin"
            inside: list[float] = []
            write_rows = [
                (
                    "raw open/write/close",
                    await timed(raw_write(raw_target, sixteen, sync=False), writes),
                ),
                (
                    "raw write + fsync",
                    await timed(raw_write(raw_target, sixteen, sync=True), writes),
                ),
                (
                    "raw atomic (temp, fsync, rename)",
                    await timed(raw_atomic(raw_target, sixteen), writes),
                ),
                ("raw gRPC unary echo, 16 MiB", await timed(echo(channel, sixteen), writes)),
                (
                    "16 MiB blob to a no-op (workerDiag.probe)",
                    await timed(pipeline(client, "workerDiag.probe", {}, sixteen, 0), writes),
                ),
                (
                    "fs_write via hub → worker",
                    await timed(
                        pipeline(
                            client,
                            "workerHost.fs_write",
                            {"path": "out.bin", "mode": "overwrite"},
                            sixteen,
                            0,
                            inside,
                        ),
                        writes,
                    ),
                ),
                ("  of which inside the worker (telemetry)", inside[-writes:]),
            ]
            report(f"fs_write 16 MiB: {writes} calls, 1 in flight", 16 * MIB, write_rows)
        await client.close()
    finally:
        up.terminate()
        up.wait(30)
        echo_server.terminate()
        echo_server.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--writes", type=int, default=30)
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, grpcio {grpc.__version__}, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as home:
        asyncio.run(bench(args.reads, args.writes, Path(home)))


if __name__ == "__main__":
    main()
