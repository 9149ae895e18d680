"""fs_read of 1 MiB, fs_write of 16 MiB and fs_list of 10,000 entries end to end,
beside raw local I/O and raw gRPC, same run; and head-of-line blocking.

Each operation is timed one call at a time, several ways, on the same bytes, the
ways taking turns in rounds (each round in the other order): a shared machine's speed
drifts over seconds, and taking turns weighs that drift on the raw baselines and on
ours alike (rows timed one after the other gave fs_list 1.60-2.29x its baseline):

  fs_read 1 MiB    raw open/read/close in this process
                   raw gRPC unary echo of 1 MiB (what carrying the bytes costs)
                   raw two-hop relay carrying 1 MiB back (_common.RELAY: the shape of
                   caller → hub → worker with nothing of ours in it)
                   fs_read via caller → hub → worker → back (`agentworker up`)
  fs_write 16 MiB  raw open/write/close (page cache only)
                   raw write + fsync
                   raw atomic replace: temp file, write, fsync, rename, fsync folder
                   raw gRPC unary echo of 16 MiB
                   raw gRPC unary call carrying 16 MiB one way (an empty answer)
                   raw two-hop relay carrying 16 MiB down
                   the same 16 MiB sent through the pipeline to a no-op action (`up`)
                   fs_write (overwrite) via `up` (caller → hub and worker in one
                   process) and via `agentworker hub` + `agentworker run` (caller →
                   hub → worker process), sent as ControlClient sends it (a
                   DispatchUpload: the hub relays each part as it comes), and the
                   same as a unary Dispatch; the part of each spent inside the worker
                   (its telemetry duration_ms); each beside its stages in series, the
                   bytes' way in and the raw atomic write (through `up` a one-way
                   16 MiB unary call, through hub + run two 16 MiB hops: as many bytes
                   as the echo carries), which overlapping them goes under, and the
                   fully overlapped floor (the slower of the one-way hop and the
                   atomic write); then the CPU each write took (user + system, every
                   process: the caller, the hub, the worker), beside the CPU of the
                   bare parts a write via hub + run cannot do without, same run: the
                   raw two-hop relay of 16 MiB down, the worker's SHA-256 (its answer
                   hashes the bytes it wrote), the hub's BLAKE3 (the call's digest),
                   the raw atomic write. A write with every core busy takes no less
                   than its CPU over the cores: the line says what the goal leaves
  fs_list 10,000   raw os.scandir + lstat of each entry, in this process
                   raw two-hop relay carrying back as many bytes as fs_list's answer
                   fs_list (limit 10,000) via caller → hub → worker → back, and the
                   part of it spent inside the worker (its telemetry duration_ms); and
                   the CPU time of each: the raw listing's thread, `up`'s threads per
                   fs_list (its event loop apart), which load moves far less than latency
  head of line     a small unary echo's latency while another process streams 16 MiB
                   echoes at the same server, beside fs_stat's while another process
                   streams 16 MiB fs_writes through the same hub and worker (`up`), sent
                   as ControlClient and `agentworker call` send them (a DispatchUpload in
                   1 MiB parts: the goal's row), and the same writes as unary Dispatches
                   (each 16 MiB request received whole: printed beside, no goal); the
                   loads take turns too, in blocks (`--blocks`), their samples pooled

Printed: p50/p99 latency, throughput at p50, and each figure's ratio to the
first (raw local) row; each goal of issue 12 beside its baseline and ratio
(`benchmarks._common.goal`, gathered by `make bench`'s summary). Telemetry
durations are whole milliseconds.

    python benchmarks/bench_fs.py [--reads 200] [--writes 30] [--lists 30] [--stats 300]
                                  [--rounds 10] [--blocks 3]
                                  [--tables read write list head_of_line]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import blake3
import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import (
    ECHO_SERVER,
    MIB,
    Home,
    OneCall,
    agentworker,
    connected,
    dispatch_call,
    goal,
    loadavg,
    machine,
    make_home,
    percentile,
    relay,
    relay_call,
    report,
    timed,
)
from tests.support.cluster import START_WITHIN_S, free_port, wait_for
from worker.hub.client import ControlClient
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.transport import MAX_MESSAGE_BYTES

SCOPES = ["workerHost.fs_read", "workerHost.fs_write", "workerHost.fs_list"]
SCOPES += ["workerHost.fs_stat", "workerDiag.probe"]
LIST_ENTRIES = 10_000
# The topologies a caller reaches a worker through: `agentworker up` (hub and worker in
# one process, the worker's stream in memory: the product's main command), and
# `agentworker hub` + `agentworker run` (two processes, the stream over gRPC).
UP = "`up`"
SPLIT = "hub + run"
DIAGNOSTICS = "[worker]\ndiagnostics = true\n"  # for the no-op workerDiag.probe row

# A background load for the head-of-line rows, run as another process:
# `python -c LOADER echo ADDRESS` (16 MiB unary echoes),
# `python -c LOADER hub ADDRESS TOKEN` (16 MiB fs_writes through the hub as ControlClient
# sends them: a DispatchUpload) or `python -c LOADER unary ADDRESS TOKEN` (the same
# fs_writes as unary Dispatches), until killed.
LOADER = """
import asyncio, json, os, sys, grpc
sys.path.insert(0, os.getcwd())
from worker import memory
from worker.hub.client import ControlClient
from worker.wire.proto import agentworker_pb2 as pb
async def main(kind, address, token=""):
    memory.keep_large_buffers()
    data = os.urandom(16 * 1024 * 1024)
    limit = 32 * 1024 * 1024
    if kind == "echo":
        options = [(f"grpc.max_{way}_message_length", limit) for way in ("send", "receive")]
        async with grpc.aio.insecure_channel(address, options=options) as channel:
            call = channel.unary_unary("/Echo/Call")
            print("ready", flush=True)
            while True:
                await call(data)
    client = ControlClient.connect(address, token)
    args = json.dumps({"path": "load.bin", "mode": "overwrite"})
    request = pb.DispatchRequest(agent_id="bench", surface="workerHost", action="fs_write",
                                 args_json=args, blob=data)
    print("ready", flush=True)
    while True:
        if kind == "unary":
            reply = await client.stub.Dispatch(request, metadata=client.metadata)
        else:
            reply = await client.dispatch(agent_id="bench", surface="workerHost",
                                          action="fs_write", args_json=args, blob=data)
        assert reply.result.status == pb.ActionResult.OK, reply.result.error.message
asyncio.run(main(*sys.argv[1:]))
"""


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


# How many turns the ways of one table take (`timed_rows`); --rounds sets it.
ROUNDS = 10


def warm_up_calls(count: int) -> int:
    """The calls each row of `timed_rows` makes before `count` timed ones."""
    return max(3, count // 20)


async def timed_rows(calls: list[tuple[str, OneCall]], count: int) -> list[tuple[str, list[float]]]:
    """Each call timed `count` times, the calls taking turns in ROUNDS rounds, each round
    in the other order, after a warm-up of each; a pipeline row fills its `inside`
    list (warm-up first, so its last `count` entries are the timed calls')."""
    for _name, one in calls:
        for _ in range(warm_up_calls(count)):
            await one()
    samples: dict[str, list[float]] = {name: [] for name, _one in calls}
    rounds = max(1, min(ROUNDS, count))
    for turn in range(rounds):
        share = count // rounds + (1 if turn < count % rounds else 0)
        for name, one in calls if turn % 2 == 0 else calls[::-1]:
            for _ in range(share):
                start = time.perf_counter()
                await one()
                samples[name].append((time.perf_counter() - start) * 1000)
    return [(name, samples[name]) for name, _one in calls]


async def read_table(
    client: ControlClient,
    channel: grpc.aio.Channel,
    relayed: grpc.aio.Channel,
    file: Path,
    data: bytes,
    reads: int,
) -> None:
    inside: list[float] = []
    fs_read = dispatch_call(client, "workerHost.fs_read", {"path": file.name}, b"", MIB, inside)
    rows = await timed_rows(
        [
            ("raw open/read/close", raw_read(file, MIB)),
            ("raw gRPC unary echo, 1 MiB", echo(channel, data)),
            ("raw two-hop relay, 1 MiB back", relay_call(relayed, b"", MIB)),
            ("fs_read via hub → worker", fs_read),
        ],
        reads,
    )
    rows.append(("  of which inside the worker (telemetry)", inside[-reads:]))
    report(f"fs_read 1 MiB: {reads} calls, 1 in flight", rows, name_width=44, size=MIB)
    _goal("fs_read 1 MiB / 1 MiB echo (p50)", rows[3][1], rows[1][1], "1 MiB echo", 1.5)
    beside_relay("fs_read 1 MiB", rows[3][1], rows[2][1])


def sink(channel: grpc.aio.Channel, data: bytes) -> OneCall:
    """A unary call carrying `data` one way, answered with nothing (/Echo/Sink)."""
    unary = channel.unary_unary("/Echo/Sink")

    async def one() -> None:
        if len(await unary(data)) != 0:
            raise RuntimeError("the sink answered bytes")

    return one


async def write_table(
    clients: dict[str, ControlClient],
    channel: grpc.aio.Channel,
    relayed: grpc.aio.Channel,
    raw_target: Path,
    data: bytes,
    writes: int,
    pids: dict[str, dict[str, int]],
) -> None:
    """fs_write of 16 MiB through each topology (`clients`: UP and SPLIT), beside the
    raw rows, every way taking turns; then the CPU the writes and the bare parts took
    (`pids`: the processes of each topology, of "relay" and of "echo")."""
    overwrite = {"path": "out.bin", "mode": "overwrite"}
    inside: dict[str, list[float]] = {name: [] for name in clients}
    warm = warm_up_calls(writes)
    accounts = {name: CpuAccount(processes, skip=warm) for name, processes in pids.items()}
    atomic_cpu: list[float] = []
    ours = [
        (
            f"fs_write via {name}",
            accounts[name].timed(
                dispatch_call(client, "workerHost.fs_write", overwrite, data, 0, inside[name])
            ),
        )
        for name, client in clients.items()
    ]
    # The same write as a unary Dispatch (the whole blob at the hub before it relays any):
    # the way every caller went before DispatchUpload, and still goes for small blobs.
    for name, client in clients.items():
        whole = ControlClient(client.channel, client.metadata)
        whole.uploads = False
        ours.append(
            (
                f"  the same, unary Dispatch, {name}",
                dispatch_call(whole, "workerHost.fs_write", overwrite, data, 0),
            )
        )
    rows = await timed_rows(
        [
            ("raw open/write/close", raw_write(raw_target, data, sync=False)),
            ("raw write + fsync", raw_write(raw_target, data, sync=True)),
            (
                "raw atomic (temp, fsync, rename)",
                cpu_timed(raw_atomic(raw_target, data), atomic_cpu),
            ),
            ("raw gRPC unary echo, 16 MiB", accounts["echo"].timed(echo(channel, data))),
            ("raw gRPC unary, 16 MiB one way", sink(channel, data)),
            (
                "raw two-hop relay, 16 MiB down",
                accounts["relay"].timed(relay_call(relayed, data, 0)),
            ),
            (
                f"16 MiB blob to a no-op via {UP}",
                dispatch_call(clients[UP], "workerDiag.probe", {}, data, 0),
            ),
            *ours,
        ],
        writes,
    )
    for name in clients:
        rows.append((f"  of which inside the worker, {name}", inside[name][-writes:]))
    report(
        f"fs_write 16 MiB: {writes} calls, 1 in flight ({loadavg()})",
        rows,
        name_width=44,
        size=16 * MIB,
    )
    by_name = dict(rows)
    atomic, echoed = (
        by_name["raw atomic (temp, fsync, rename)"],
        by_name["raw gRPC unary echo, 16 MiB"],
    )
    one_way, relayed_down = (
        by_name["raw gRPC unary, 16 MiB one way"],
        by_name["raw two-hop relay, 16 MiB down"],
    )
    beside_relay(
        f"16 MiB to a no-op via {UP}", by_name[f"16 MiB blob to a no-op via {UP}"], relayed_down
    )
    # The stages of a write, in series: the bytes' way in and the raw atomic write (the
    # write is durable: fsync before the rename). Through `up` the bytes take one gRPC
    # hop, one way (caller → hub; the worker gets them in the process): a one-way 16 MiB
    # unary call. Through hub + run they take two, the second down the worker's stream:
    # as many bytes as the echo carries, there and back. A unary Dispatch arrives whole
    # before anything is relayed or written, so this was a floor; a DispatchUpload
    # relays each part as it comes and the worker writes it meanwhile, so the stages
    # overlap, and the goal is to be under their sum. What no overlap goes under: the
    # slowest stage alone (the bytes' one-way hop, or the atomic write), printed beside.
    serial = {
        UP: (
            "one-way 16 MiB unary + raw atomic",
            statistics.median(one_way) + statistics.median(atomic),
        ),
        SPLIT: ("16 MiB echo + raw atomic", statistics.median(echoed) + statistics.median(atomic)),
    }
    overlapped = max(statistics.median(one_way), statistics.median(atomic))
    for name in clients:
        samples = by_name[f"fs_write via {name}"]
        _goal(
            f"fs_write 16 MiB via {name} / 16 MiB echo (p50)", samples, echoed, "16 MiB echo", 1.5
        )
        serial_name, in_series = serial[name]
        goal(
            f"fs_write 16 MiB via {name} / its stages in series (p50)",
            statistics.median(samples),
            " ms",
            1.0,
            baseline=in_series,
            baseline_name=serial_name,
            on="ratio",
        )
        unary = statistics.median(by_name[f"  the same, unary Dispatch, {name}"])
        print(
            f"  fs_write via {name} (p50): {statistics.median(samples):.2f} ms; as a unary "
            f"Dispatch {unary:.2f} ms ({statistics.median(samples) / unary:.2f}x); fully "
            f"overlapped floor, max(one-way 16 MiB unary, raw atomic) {overlapped:.2f} ms "
            f"({statistics.median(samples) / overlapped:.2f}x)"
        )
    cpu_account(accounts, statistics.median(atomic_cpu), data, statistics.median(echoed))


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used so far, its ended threads' too
    (a write's own threads end with it)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuAccount:
    """The CPU (user + system) the calls of one row took in this process (the caller)
    and in the processes `pids` (by name), summed over its calls but the first `skip`
    (its warm-up: the first calls fault in the heap's pages): counted in clock ticks, a
    few ms a call is only told apart summed."""

    def __init__(self, pids: dict[str, int], skip: int = 0) -> None:
        self.pids = pids
        self.spent = dict.fromkeys(["caller", *pids], 0.0)
        self.calls = 0
        self._skip = skip

    def _now(self) -> dict[str, float]:
        return {"caller": time.process_time()} | {
            name: process_cpu(pid) for name, pid in self.pids.items()
        }

    def timed(self, one: OneCall) -> OneCall:
        """`one`, its CPU added to the account."""

        async def counted() -> None:
            if self._skip > 0:
                self._skip -= 1
                await one()
                return
            before = self._now()
            await one()
            after = self._now()
            for name in self.spent:
                self.spent[name] += after[name] - before[name]
            self.calls += 1

        return counted

    def per_call(self) -> dict[str, float]:
        """ms of CPU per call, by process."""
        return {name: 1000 * spent / max(1, self.calls) for name, spent in self.spent.items()}

    def shown(self) -> str:
        per = self.per_call()
        parts = ", ".join(f"{name} {ms:.1f}" for name, ms in per.items())
        return f"{sum(per.values()):.1f} ms ({parts})"


def hashing_cpu(data: bytes) -> dict[str, float]:
    """The CPU ms of SHA-256 and of BLAKE3 over `data` in this thread (medians of 5)."""
    spent = {}
    for name, hasher in (("SHA-256", hashlib.sha256), ("BLAKE3", blake3.blake3)):
        times = []
        for _ in range(5):
            start = time.thread_time()
            hasher(data).digest()
            times.append((time.thread_time() - start) * 1000)
        spent[name] = statistics.median(times)
    return spent


def cpu_account(
    accounts: dict[str, CpuAccount], atomic_ms: float, data: bytes, echo_p50: float
) -> None:
    """The CPU each 16 MiB write took, beside the bare parts a write via hub + run cannot
    do without, measured in this run: the two hops of its bytes (the raw two-hop relay),
    the worker's SHA-256 of the bytes it wrote (its answer's), the hub's BLAKE3 (the
    call's digest) and the raw atomic write. With every core busy, the write can take no
    less wall time than its CPU spread over the cores: the floor beside the goal."""
    hashing = hashing_cpu(data)
    parts = {
        "two hops (relay)": sum(accounts["relay"].per_call().values()),
        "SHA-256": hashing["SHA-256"],
        "BLAKE3": hashing["BLAKE3"],
        "raw atomic write": atomic_ms,
    }
    floor = sum(parts.values())
    cores = len(os.sched_getaffinity(0))
    ours = sum(accounts[SPLIT].per_call().values())
    print(
        f"  CPU per 16 MiB fs_write (user + system, whole processes): via {SPLIT} "
        f"{accounts[SPLIT].shown()}; via {UP} {accounts[UP].shown()}"
    )
    print(
        f"  the bare parts of a write via {SPLIT}, this run: raw two-hop relay 16 MiB down "
        f"{accounts['relay'].shown()}, SHA-256 {hashing['SHA-256']:.1f}, BLAKE3 "
        f"{hashing['BLAKE3']:.1f}, raw atomic write {atomic_ms:.1f}: {floor:.1f} ms; the "
        f"16 MiB echo {accounts['echo'].shown()}"
    )
    print(
        f"  on {cores} cores: the write's CPU {ours:.1f} ms / {cores} = {ours / cores:.1f} ms, "
        f"its bare parts' {floor:.1f} ms / {cores} = {floor / cores:.1f} ms, beside 1.5x the "
        f"echo's p50: {1.5 * echo_p50:.1f} ms"
    )


def beside_relay(what: str, samples: list[float], relayed: list[float]) -> None:
    """Ours beside the bare relay carrying the same bytes: what is ours, apart from the hops."""
    ratio = statistics.median(samples) / statistics.median(relayed)
    print(f"  {what} beside the raw two-hop relay (p50): {ratio:.2f}x")


def _goal(
    what: str, samples: list[float], raw: list[float], raw_name: str, limit: float, q: float = 0.5
) -> None:
    """A goal on the ratio of `samples` to `raw` at quantile `q` (the median by default)."""
    value, baseline = (
        (statistics.median(samples), statistics.median(raw))
        if q == 0.5
        else (percentile(samples, q), percentile(raw, q))
    )
    goal(what, value, " ms", limit, baseline=baseline, baseline_name=raw_name, on="ratio")


def raw_list(folder: Path) -> OneCall:
    async def one() -> None:
        found = 0
        with os.scandir(folder) as entries:
            for entry in entries:
                entry.stat(follow_symlinks=False)
                found += 1
        if found != LIST_ENTRIES:
            raise RuntimeError(f"listed {found}")

    return one


def hub_list(
    client: ControlClient, folder: str, inside: list[float]
) -> Callable[[], Awaitable[int]]:
    request = pb.DispatchRequest(
        agent_id="bench",
        surface="workerHost",
        action="fs_list",
        args_json=json.dumps({"path": folder, "limit": LIST_ENTRIES}),
    )

    async def one() -> int:
        reply = await client.stub.Dispatch(request, metadata=client.metadata)
        if reply.result.status != pb.ActionResult.OK:
            raise RuntimeError(reply.result.error.message)
        # Counted, not parsed: decoding 10,000 entries is the caller's cost, not ours.
        if reply.result.result_json.count('"symlink_target"') != LIST_ENTRIES:
            raise RuntimeError("short listing")
        inside.append(float(reply.result.invocation.duration_ms))
        return len(reply.result.result_json)

    return one


async def list_table(
    client: ControlClient, relayed: grpc.aio.Channel, folder: Path, lists: int, up_pid: int
) -> None:
    inside: list[float] = []
    listing = hub_list(client, folder.name, inside)
    answer_bytes = await listing()
    raw_cpu: list[float] = []
    before, calls_before = thread_cpu(up_pid), len(inside)
    rows = await timed_rows(
        [
            ("raw os.scandir + lstat", cpu_timed(raw_list(folder), raw_cpu)),
            (f"raw two-hop relay, {answer_bytes:,} B back", relay_call(relayed, b"", answer_bytes)),
            ("fs_list via hub → worker", listing),
        ],
        lists,
    )
    after, calls = thread_cpu(up_pid), len(inside) - calls_before
    rows.append(("  of which inside the worker (telemetry)", inside[-lists:]))
    report(f"fs_list of {LIST_ENTRIES:,} entries: {lists} calls, 1 in flight", rows, name_width=44)
    # CPU time, which a loaded machine changes far less than it changes latency.
    spent = {tid: (after[tid] - before.get(tid, 0.0)) * 1000 / calls for tid in after}
    loop_ms = spent.get(up_pid, 0.0)  # the main thread: the event loop's
    print(
        f"  CPU per call: raw scandir+lstat {statistics.median(raw_cpu):.1f} ms (its thread); "
        f"`up` per fs_list {sum(spent.values()):.1f} ms "
        f"(event loop {loop_ms:.1f}, other threads {sum(spent.values()) - loop_ms:.1f})"
    )
    _goal("fs_list 10k / scandir+lstat (p50)", rows[2][1], rows[0][1], "scandir+lstat", 1.5)


def cpu_timed(one: OneCall, spent: list[float]) -> OneCall:
    """`one`, adding the CPU time of each call (ms, this thread's) to `spent`."""

    async def timed_one() -> None:
        start = time.thread_time()
        await one()
        spent.append((time.thread_time() - start) * 1000)

    return timed_one


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) each thread of process `pid` has used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    spent = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        spent[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return spent


async def _under_load(argv: list[str], one: OneCall, count: int) -> list[float]:
    """`one` timed `count` times while LOADER runs with `argv` in another process."""
    loader = subprocess.Popen(
        [sys.executable, "-c", LOADER, *argv], stdout=subprocess.PIPE, cwd=Path(__file__).parents[1]
    )
    try:
        assert loader.stdout is not None
        await asyncio.to_thread(loader.stdout.readline)  # "ready": its load begins
        return await timed(one, count, min_warm_up=20)
    finally:
        loader.terminate()
        loader.wait(30)


# How many blocks the head-of-line rows take turns in (`head_of_line_table`); --blocks.
BLOCKS = 3


async def head_of_line_table(
    client: ControlClient, channel: grpc.aio.Channel, echo_addr: str, home: Home, stats: int
) -> None:
    """Each row timed `stats` times in BLOCKS blocks, the rows (and so the loads) taking
    turns, each block in the other order; each row's samples pooled. The goal is judged
    on the writes as callers send them (ControlClient, `agentworker call`: a
    DispatchUpload in parts); the same writes as unary Dispatches are printed beside.
    A unary 16 MiB request is received whole on the hub's event loop (gRPC copies it
    twice there), and into pages faulted afresh whenever the heap was trimmed
    meanwhile (protobuf's upb trims it per 10,000 blocks of message memory it frees):
    8-23 ms in one loop step; an upload's parts are received a MiB at a time."""
    small = echo(channel, b"x" * 64)
    fs_stat = dispatch_call(client, "workerHost.fs_stat", {"path": "."}, b"", 0)
    token = home.token_file.read_text().strip()
    hub_load, unary_load = ["hub", home.listen, token], ["unary", home.listen, token]
    names = [
        "raw small echo, alone",
        "raw small echo, 16 MiB echoes streaming",
        "fs_stat via hub → worker, alone",
        "fs_stat, 16 MiB fs_writes streaming",
        "  the same writes as unary Dispatches",
    ]

    async def alone(one: OneCall, count: int) -> list[float]:
        return await timed(one, count, min_warm_up=20)

    ways = [
        lambda count: alone(small, count),
        lambda count: _under_load(["echo", echo_addr], small, count),
        lambda count: alone(fs_stat, count),
        lambda count: _under_load(hub_load, fs_stat, count),
        lambda count: _under_load(unary_load, fs_stat, count),
    ]
    samples: list[list[float]] = [[] for _ in names]
    blocks = max(1, min(BLOCKS, stats))
    for block in range(blocks):
        share = stats // blocks + (1 if block < stats % blocks else 0)
        order = range(len(ways)) if block % 2 == 0 else reversed(range(len(ways)))
        for index in order:
            samples[index] += await ways[index](share)
    rows = list(zip(names, samples, strict=True))
    report(f"head of line: {stats} small calls, 1 in flight ({loadavg()})", rows, name_width=44)
    _goal(
        "head of line: fs_stat p99 / echo p99 under 16 MiB load",
        rows[3][1],
        rows[1][1],
        "small echo p99",
        2.0,
        0.99,
    )
    unary, echoed = percentile(rows[4][1], 0.99), percentile(rows[1][1], 0.99)
    print(
        f"  fs_stat p99 under 16 MiB unary Dispatches: {unary:.2f} ms, {unary / echoed:.2f}x "
        f"the small echo's p99 under 16 MiB echoes (no goal: callers upload blobs this large)"
    )


TABLES = ("read", "write", "list", "head_of_line")


@contextlib.asynccontextmanager
async def split(path: Path, pids: dict[str, int]) -> AsyncIterator[ControlClient]:
    """`agentworker hub` and `agentworker run` in a fresh home (its workspace on the
    same file system as `up`'s); a client of the hub once the worker is in. `pids` is
    told their process ids ("hub", "run")."""
    home = make_home(path, mode="rw", scopes=SCOPES, extra_config=DIAGNOSTICS)
    with contextlib.ExitStack() as processes:  # stopped last started, first
        for argv in (["hub"], ["run"]):
            pids[argv[0]] = processes.enter_context(agentworker(argv, home)).pid
            wait_for(home.token_file.exists, START_WITHIN_S)  # `run` reads the token `hub` writes
        async with connected(home) as client:
            yield client


async def bench(
    reads: int,
    writes: int,
    lists: int,
    stats: int,
    home_dir: Path,
    tables: tuple[str, ...] = TABLES,
) -> None:
    home = make_home(home_dir / UP.strip("`"), mode="rw", scopes=SCOPES, extra_config=DIAGNOSTICS)
    echo_addr = f"127.0.0.1:{free_port()}"
    one_mib, sixteen = os.urandom(MIB), os.urandom(16 * MIB)
    (home.workspace / "one-mib.bin").write_bytes(one_mib)
    listed = home.workspace / "ten-thousand"
    listed.mkdir()
    for i in range(LIST_ENTRIES):
        (listed / f"entry-{i:05d}.txt").write_bytes(b"x" * (i % 100))
    echo_server = subprocess.Popen(
        [sys.executable, "-c", ECHO_SERVER, echo_addr, str(MAX_MESSAGE_BYTES)]
    )
    limits = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]
    try:
        relay_pids: dict[str, int] = {}
        with agentworker(["up"], home) as up, relay(relay_pids) as relay_addr:
            async with (
                connected(home) as client,
                grpc.aio.insecure_channel(echo_addr, options=limits) as channel,
                grpc.aio.insecure_channel(relay_addr, options=limits) as relayed,
            ):
                await channel.channel_ready()
                one_mib_file = home.workspace / "one-mib.bin"
                if "read" in tables:
                    await read_table(client, channel, relayed, one_mib_file, one_mib, reads)
                raw_target = home_dir / "raw-target.bin"
                if "write" in tables:
                    split_pids: dict[str, int] = {}
                    async with split(home_dir / "split", split_pids) as split_client:
                        clients = {UP: client, SPLIT: split_client}
                        pids = {
                            UP: {"`up`": up.pid},
                            SPLIT: split_pids,
                            "relay": relay_pids,
                            "echo": {"echo server": echo_server.pid},
                        }
                        await write_table(
                            clients, channel, relayed, raw_target, sixteen, writes, pids
                        )
                if "list" in tables:
                    await list_table(client, relayed, listed, lists, up.pid)
                if "head_of_line" in tables:
                    await head_of_line_table(client, channel, echo_addr, home, stats)
    finally:
        echo_server.terminate()
        echo_server.wait(10)


def main() -> None:
    global ROUNDS, BLOCKS  # set once, from the command line, before anything runs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--writes", type=int, default=30)
    parser.add_argument("--lists", type=int, default=30)
    parser.add_argument("--stats", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="turns the ways of a table take")
    parser.add_argument("--blocks", type=int, default=BLOCKS, help="turns the loads take")
    parser.add_argument(
        "--tables", nargs="+", choices=TABLES, default=list(TABLES), help="the tables to run"
    )
    args = parser.parse_args()
    ROUNDS, BLOCKS = args.rounds, args.blocks
    print(machine())
    tables = tuple(args.tables)
    with tempfile.TemporaryDirectory() as home:
        asyncio.run(bench(args.reads, args.writes, args.lists, args.stats, Path(home), tables))


if __name__ == "__main__":
    main()
