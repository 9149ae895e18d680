"""What the benchmarks share: a throwaway AGENTWORKER_HOME, the `agentworker`
processes in it and a client that waits for them, timing, the latency table, and
`goal`, which prints a figure beside its goal and records it for `make bench`'s
summary (benchmarks/summary.py).

The benchmarks run as scripts, and each puts the repository root on sys.path
before it imports this.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import grpc

from tests.support.cluster import START_WITHIN_S, free_port, until_worker_connected, wait_for
from worker import memory
from worker.hub.client import ControlClient
from worker.wire.proto import agentworker_pb2 as pb

# Every process of a benchmark allocates as the hub and the worker do (worker.memory):
# this one (the caller of both the raw baselines and ours), the echo servers and the
# loaders. Raw and ours then run on the same malloc settings.
memory.keep_large_buffers()
REPOSITORY = Path(__file__).resolve().parents[1]

OneCall = Callable[[], Awaitable[None]]
MIB = 1024 * 1024

# Where `goal` appends its rows, one JSON object a line; `make bench` names a file
# here and prints them all at the end. Unset: the rows are printed only.
GOALS_ENV = "AGENTWORKER_BENCH_GOALS"

# A bare gRPC echo, run as `python -c ECHO_SERVER ADDRESS [MAX_MESSAGE_BYTES]`:
# /Echo/Stream echoes each message of a bidi stream, /Echo/Call a unary request,
# /Echo/Sink takes a unary request and answers nothing (bytes one way only), and
# /Echo/ReadOne echoes the one request of a client stream, read by the handler within a
# time (the shape of the hub's Dispatch, read in turn: worker.hub.services._read_in_turn).
ECHO_SERVER = """
import asyncio, sys, grpc
sys.path.insert(0, REPOSITORY)
from worker import memory
memory.keep_large_buffers()
async def echo(requests, context):
    async for message in requests:
        yield message
async def call(request, context):
    return request
async def sink(request, context):
    return b""
async def read_one(requests, context):
    async with asyncio.timeout(30):
        return await context.read()
async def main():
    options = None
    if len(sys.argv) > 2:
        limit = int(sys.argv[2])
        options = [(f"grpc.max_{way}_message_length", limit) for way in ("send", "receive")]
    server = grpc.aio.server(options=options)
    handlers = {
        "Stream": grpc.stream_stream_rpc_method_handler(echo),
        "Call": grpc.unary_unary_rpc_method_handler(call),
        "Sink": grpc.unary_unary_rpc_method_handler(sink),
        "ReadOne": grpc.stream_unary_rpc_method_handler(read_one),
    }
    routes = grpc.method_handlers_generic_handler("Echo", handlers)
    server.add_generic_rpc_handlers((routes,))
    server.add_insecure_port(sys.argv[1])
    await server.start()
    await server.wait_for_termination()
asyncio.run(main())
""".replace("REPOSITORY", repr(str(REPOSITORY)))

_CONFIG = """
[hub]
listen = "{listen}"
[[root]]
path = "{workspace}"
mode = "{mode}"
[[grant]]
agent = "bench"
scopes = [{scopes}]
"""


# A bare two-hop relay, the shape of caller → hub → worker with nothing of ours in it:
# `python -c RELAY serve ADDRESS` answers each unary /Relay/Call by sending the
# request down the one bidi /Relay/Stream a `python -c RELAY work ADDRESS` process
# holds open (as a worker dials its hub), and answering with what comes back. A
# request is its id (8 bytes), the reply's size (4 bytes) and a payload; the relay
# worker answers the id and that many bytes. One message each way per call: no
# batching, no ledger, no digest, no checks.
RELAY = """
import asyncio, itertools, sys, grpc
sys.path.insert(0, REPOSITORY)
from worker import memory
memory.keep_large_buffers()
LIMIT = 32 * 1024 * 1024
OPTIONS = [(f"grpc.max_{way}_message_length", LIMIT) for way in ("send", "receive")]
async def serve(address):
    down, waiting, ids = asyncio.Queue(), {}, itertools.count()
    async def stream(requests, context):
        async def read():
            async for message in requests:
                waiting.pop(message[:8]).set_result(message[8:])
        reader = asyncio.ensure_future(read())
        try:
            while True:
                yield await down.get()
        finally:
            reader.cancel()
    async def call(request, context):
        key = next(ids).to_bytes(8, "big")
        waiting[key] = asyncio.get_running_loop().create_future()
        down.put_nowait(key + request)
        return await waiting[key]
    server = grpc.aio.server(options=OPTIONS)
    handlers = {
        "Stream": grpc.stream_stream_rpc_method_handler(stream),
        "Call": grpc.unary_unary_rpc_method_handler(call),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("Relay", handlers),))
    server.add_insecure_port(address)
    await server.start()
    await server.wait_for_termination()
async def work(address):
    async with grpc.aio.insecure_channel(address, options=OPTIONS) as channel:
        stream = channel.stream_stream("/Relay/Stream")()
        replies = {}
        while True:
            message = await stream.read()
            size = int.from_bytes(message[8:12], "big")
            if size not in replies:
                replies[size] = bytes(size)
            await stream.write(message[:8] + replies[size])
asyncio.run({"serve": serve, "work": work}[sys.argv[1]](sys.argv[2]))
""".replace("REPOSITORY", repr(str(REPOSITORY)))


@contextlib.contextmanager
def relay(pids: dict[str, int] | None = None) -> Iterator[str]:
    """RELAY's two processes on a free port; yields the address to call. `pids`, when
    given, is told their process ids ("relay", "relay's worker")."""
    address = f"127.0.0.1:{free_port()}"
    serving = subprocess.Popen([sys.executable, "-c", RELAY, "serve", address])
    working = None
    try:
        wait_for(lambda: listening(address), START_WITHIN_S)
        working = subprocess.Popen([sys.executable, "-c", RELAY, "work", address])
        if pids is not None:
            pids.update({"relay": serving.pid, "relay's worker": working.pid})
        yield address
    finally:
        for proc in (working, serving):
            if proc is not None:
                proc.terminate()
                proc.wait(10)


def listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket() as sock:
        return sock.connect_ex((host, int(port))) == 0


def relay_call(channel: grpc.aio.Channel, payload: bytes, reply_bytes: int) -> OneCall:
    """One call through RELAY carrying `payload` down and `reply_bytes` back."""
    call = channel.unary_unary("/Relay/Call")
    request = reply_bytes.to_bytes(4, "big") + payload

    async def one() -> None:
        if len(await call(request)) != reply_bytes:
            raise RuntimeError("short relay reply")

    return one


@dataclass(frozen=True)
class Home:
    path: Path
    listen: str
    workspace: Path
    env: dict[str, str]  # this process's environment, pointed at `path`

    @property
    def token_file(self) -> Path:
        return self.path / "hub.token"


def make_home(path: Path, *, mode: str, scopes: list[str], extra_config: str = "") -> Home:
    """A fresh home listening on a free port, with one root (its workspace, in `mode`)
    and agent `bench` granted `scopes`; `extra_config` is TOML appended as is."""
    listen = f"127.0.0.1:{free_port()}"
    workspace = path / "workspace"
    workspace.mkdir(parents=True)
    quoted = ", ".join(f'"{scope}"' for scope in scopes)
    config = _CONFIG.format(listen=listen, workspace=workspace, mode=mode, scopes=quoted)
    (path / "config.toml").write_text(config + extra_config)
    return Home(path, listen, workspace, {**os.environ, "AGENTWORKER_HOME": str(path)})


@contextlib.contextmanager
def agentworker(argv: list[str], home: Home) -> Iterator[subprocess.Popen[bytes]]:
    """`agentworker <argv>` in `home`, stopped on the way out; its log goes to
    `<home>/<command>.log` (see `exited`)."""
    with open(home.path / f"{argv[0]}.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "worker", *argv], env=home.env, stderr=log)
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(30)


def exited(proc: subprocess.Popen[bytes], home: Home, command: str, what: str) -> RuntimeError:
    """The error for `agentworker <command>` that stopped early, with its log's end."""
    log = (home.path / f"{command}.log").read_text(errors="replace").splitlines()[-15:]
    detail = "\n".join(f"  {line}" for line in log) or "  (its log is empty)"
    return RuntimeError(f"`agentworker {command}` exited ({proc.returncode}) {what}:\n{detail}")


@contextlib.asynccontextmanager
async def connected(home: Home) -> AsyncIterator[ControlClient]:
    """A client of the hub in `home`, once the hub answers and a worker is in."""
    wait_for(home.token_file.exists, START_WITHIN_S)
    client = ControlClient.connect(home.listen, home.token_file.read_text().strip())
    try:
        await until_worker_connected(client)
        yield client
    finally:
        await client.close()


def machine() -> str:
    """One line saying where the figures were taken, printed first by every benchmark."""
    import grpc

    who = "root (pid cap via pid_max)" if os.geteuid() == 0 else "a regular user"
    malloc = "large buffers kept" if memory.keep_large_buffers() else "default"
    return (
        f"python {sys.version.split()[0]}, grpcio {grpc.__version__}, {os.cpu_count()} cores, "
        f"{os.uname().release}, {who}, malloc {malloc} in every process"
    )


def loadavg() -> str:
    """The machine's load averages (1, 5 and 15 min), to print beside a figure: on a
    shared machine a figure means little without it."""
    return "load " + ", ".join(f"{avg:.2f}" for avg in os.getloadavg())


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def timed(one_call: OneCall, calls: int, *, min_warm_up: int = 5) -> list[float]:
    """Latencies (ms) of `calls` calls one after another, after a warm-up of 1 in 20
    (at least `min_warm_up`) that is not counted."""
    for _ in range(max(min_warm_up, calls // 20)):
        await one_call()
    latencies = []
    for _ in range(calls):
        start = time.perf_counter()
        await one_call()
        latencies.append((time.perf_counter() - start) * 1000)
    return latencies


def report(
    label: str, rows: list[tuple[str, list[float]]], *, name_width: int, size: int | None = None
) -> None:
    """p50/p99 of each row and their ratios to the first (raw) row's; with `size`, the
    bytes each call carries, the throughput at p50 too."""
    raw_p50, raw_p99 = statistics.median(rows[0][1]), percentile(rows[0][1], 0.99)
    rate_head = "" if size is None else f"{'MiB/s':>9}"
    print(f"\n{label}")
    print(f"  {'':{name_width}}{'p50 ms':>9}{'p99 ms':>9}{rate_head}{'p50/raw':>9}{'p99/raw':>9}")
    for name, samples in rows:
        p50, p99 = statistics.median(samples), percentile(samples, 0.99)
        rate = ""
        if size is not None:  # telemetry rows count whole ms, so p50 may be 0: no rate then
            rate = f"{size / MIB / (p50 / 1000):9.0f}" if p50 > 0 else f"{'-':>9}"
        ratios = f"{p50 / raw_p50:9.1f}{p99 / raw_p99:9.1f}"
        print(f"  {name:{name_width}}{p50:9.2f}{p99:9.2f}{rate}{ratios}")


def dispatch_call(
    client: ControlClient,
    action: str,
    args: Mapping[str, object],
    blob: bytes,
    expect: int,
    inside: list[float] | None = None,
) -> OneCall:
    """One Dispatch of `action` (surface.name) as agent `bench`, checked for an OK result
    with an `expect`-byte blob; `inside` collects the worker's own duration_ms. Sent as a
    caller using ControlClient sends it: the request serialized for each call, its blob
    joined to it in one copy (`client.dispatch_bytes`)."""
    surface, _, name = action.rpartition(".")
    fields = dict(
        agent_id="bench", surface=surface, action=name, args_json=json.dumps(args), blob=blob
    )

    async def one() -> None:
        reply = await client.dispatch(**fields)
        if reply.result.status != pb.ActionResult.OK:
            raise RuntimeError(reply.result.error.message)
        if len(reply.result.blob) != expect:
            raise RuntimeError("the result blob has the wrong size")
        if inside is not None:
            inside.append(float(reply.result.invocation.duration_ms))

    return one


Judged = Literal["value", "ratio", "added"]


@dataclass(frozen=True)
class Goal:
    """One goal of issue 12 and how this run did: `value` (in `unit`) beside the raw
    `baseline` from the same run (None: the goal has no baseline). The goal `limit`
    holds for the value itself, for its ratio to the baseline, or for what it adds to
    the baseline (`on`); `at_least` for rates, at most otherwise."""

    bench: str
    figure: str
    value: float
    unit: str
    baseline: float | None
    baseline_name: str
    limit: float
    on: Judged
    at_least: bool

    @property
    def ratio(self) -> float | None:
        return None if not self.baseline else self.value / self.baseline

    @property
    def judged(self) -> float:
        if self.on == "ratio" and self.ratio is not None:
            return self.ratio
        if self.on == "added" and self.baseline is not None:
            return self.value - self.baseline
        return self.value

    @property
    def met(self) -> bool:
        return self.judged >= self.limit if self.at_least else self.judged <= self.limit

    @property
    def goal_text(self) -> str:
        sign = "≥" if self.at_least else "≤"
        if self.on == "ratio":
            return f"{sign} {self.limit:g}x"
        if self.on == "added":
            return f"{sign} +{self.limit:g}{self.unit}"
        return f"{sign} {self.limit:g}{self.unit}"


def goal(
    figure: str,
    value: float,
    unit: str,
    limit: float,
    *,
    baseline: float | None = None,
    baseline_name: str = "",
    on: Judged = "value",
    at_least: bool = False,
) -> Goal:
    """Print `figure`'s value beside its baseline and goal, met or MISSED, and append
    the row to the file $AGENTWORKER_BENCH_GOALS names, if it names one."""
    if on != "value" and baseline is None:
        raise ValueError(f"{figure}: a goal on the {on} needs a baseline")
    row = Goal(
        bench=Path(sys.argv[0]).stem,
        figure=figure,
        value=value,
        unit=unit,
        baseline=baseline,
        baseline_name=baseline_name,
        limit=limit,
        on=on,
        at_least=at_least,
    )
    beside = ""
    if row.on == "added" and row.baseline is not None:
        beside = f" vs {baseline_name} {row.baseline:.2f}{unit}: {row.judged:+.2f}{unit}"
    elif row.baseline is not None and row.ratio is not None:
        beside = f" vs {baseline_name} {row.baseline:.2f}{unit}: {row.ratio:.2f}x"
    verdict = "met" if row.met else "MISSED"
    print(f"  goal {figure}: {value:.2f}{unit}{beside} (wanted {row.goal_text}) {verdict}")
    target = os.environ.get(GOALS_ENV)
    if target:
        with open(target, "a", encoding="utf-8") as out:
            out.write(json.dumps(asdict(row)) + "\n")
    return row


def read_goals(path: Path) -> list[Goal]:
    """The rows `goal` appended to `path`, in order."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [Goal(**json.loads(line)) for line in lines if line.strip()]
