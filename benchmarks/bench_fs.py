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
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import (
    ECHO_SERVER,
    MIB,
    OneCall,
    agentworker,
    connected,
    dispatch_call,
    make_home,
    report,
    timed,
)
from tests.support.cluster import free_port
from worker.hub.client import ControlClient
from worker.wire.transport import MAX_MESSAGE_BYTES

SCOPES = ["workerHost.fs_read", "workerHost.fs_write", "workerDiag.probe"]


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


async def timed_rows(calls: list[tuple[str, OneCall]], count: int) -> list[tuple[str, list[float]]]:
    """Each call timed `count` times, in order (a pipeline row fills its `inside` list)."""
    return [(name, await timed(one, count, min_warm_up=3)) for name, one in calls]


async def read_table(
    client: ControlClient, channel: grpc.aio.Channel, file: Path, data: bytes, reads: int
) -> None:
    inside: list[float] = []
    fs_read = dispatch_call(client, "workerHost.fs_read", {"path": file.name}, b"", MIB, inside)
    rows = await timed_rows(
        [
            ("raw open/read/close", raw_read(file, MIB)),
            ("raw gRPC unary echo, 1 MiB", echo(channel, data)),
            ("fs_read via hub → worker", fs_read),
        ],
        reads,
    )
    rows.append(("  of which inside the worker (telemetry)", inside[-reads:]))
    report(f"fs_read 1 MiB: {reads} calls, 1 in flight", rows, name_width=44, size=MIB)


async def write_table(
    client: ControlClient, channel: grpc.aio.Channel, raw_target: Path, data: bytes, writes: int
) -> None:
    inside: list[float] = []
    overwrite = {"path": "out.bin", "mode": "overwrite"}
    rows = await timed_rows(
        [
            ("raw open/write/close", raw_write(raw_target, data, sync=False)),
            ("raw write + fsync", raw_write(raw_target, data, sync=True)),
            ("raw atomic (temp, fsync, rename)", raw_atomic(raw_target, data)),
            ("raw gRPC unary echo, 16 MiB", echo(channel, data)),
            (
                "16 MiB blob to a no-op (workerDiag.probe)",
                dispatch_call(client, "workerDiag.probe", {}, data, 0),
            ),
            (
                "fs_write via hub → worker",
                dispatch_call(client, "workerHost.fs_write", overwrite, data, 0, inside),
            ),
        ],
        writes,
    )
    rows.append(("  of which inside the worker (telemetry)", inside[-writes:]))
    report(f"fs_write 16 MiB: {writes} calls, 1 in flight", rows, name_width=44, size=16 * MIB)


async def bench(reads: int, writes: int, home_dir: Path) -> None:
    diagnostics = "[worker]\ndiagnostics = true\n"  # for the no-op workerDiag.probe row
    home = make_home(home_dir, mode="rw", scopes=SCOPES, extra_config=diagnostics)
    echo_addr = f"127.0.0.1:{free_port()}"
    one_mib, sixteen = os.urandom(MIB), os.urandom(16 * MIB)
    (home.workspace / "one-mib.bin").write_bytes(one_mib)
    echo_server = subprocess.Popen(
        [sys.executable, "-c", ECHO_SERVER, echo_addr, str(MAX_MESSAGE_BYTES)]
    )
    limits = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]
    try:
        with agentworker(["up"], home):
            async with (
                connected(home) as client,
                grpc.aio.insecure_channel(echo_addr, options=limits) as channel,
            ):
                await channel.channel_ready()
                await read_table(client, channel, home.workspace / "one-mib.bin", one_mib, reads)
                await write_table(client, channel, home_dir / "raw-target.bin", sixteen, writes)
    finally:
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
