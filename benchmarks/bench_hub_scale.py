"""One hub with many connected workers: memory per idle worker, and Dispatch p50 to
one of them beside the same figure with that worker alone on the hub; and a KillPlan's
p50, which goes to every worker, beside the same with one worker (no goal: its cost
grows with the workers by design, and this shows how; review16 F8 made it 77 -> 31 ms
of the hub's loop at 1,000).

The workers are simulated in this process (a stream each, over a few channels):
each sends its Hello, and answers every request at once with an OK result, so the
figure is the hub's own cost of holding many streams. The hub is a real
`agentworker hub` process; its RSS is read from /proc through psutil.

    python benchmarks/bench_hub_scale.py [--workers 1000] [--calls 300]

Goals (issue 12): at most 100 KB per idle worker; p50 with many workers within
1.2x of the single-worker p50.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc
import psutil

from benchmarks._common import agentworker, goal, make_home, percentile, timed, wait_for
from worker.hub.client import ControlClient
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.proto import agentworker_pb2_grpc as pb_grpc
from worker.wire.protocol import PROTOCOL_MAX, PROTOCOL_MIN
from worker.wire.transport import worker_metadata

STREAMS_PER_CHANNEL = 100
KB = 1024


class SimulatedWorker:
    """One worker stream that answers every request with an empty OK result."""

    def __init__(self, stub: pb_grpc.WorkerServiceStub, worker_id: str, token: str) -> None:
        self.worker_id = worker_id
        self.welcomed = asyncio.Event()
        self._outbox: asyncio.Queue[pb.WorkerEnvelope] = asyncio.Queue()
        # A key of its own, as a worker has (worker.key): a hub serves none without one.
        metadata = worker_metadata(token, uuid.uuid4().hex)
        self._call = stub.Stream(self._envelopes(), metadata=metadata, wait_for_ready=True)

    async def _envelopes(self):  # type: ignore[no-untyped-def]
        hello = pb.Hello(
            worker_id=self.worker_id,
            instance_id=self.worker_id,
            version="bench",
            protocol_min=PROTOCOL_MIN,
            protocol_max=PROTOCOL_MAX,
            surfaces=["workerDiag"],
            actions=["workerDiag.probe"],
            max_concurrency=8,
        )
        yield pb.WorkerEnvelope(messages=[pb.WorkerMessage(hello=hello)])
        while True:
            yield await self._outbox.get()

    async def serve(self) -> None:
        try:
            async for envelope in self._call:
                answers = []
                for msg in envelope.messages:
                    kind = msg.WhichOneof("kind")
                    if kind == "welcome":
                        self.welcomed.set()
                    elif kind == "request":
                        result = pb.ActionResult(
                            correlation_id=msg.request.correlation_id,
                            status=pb.ActionResult.OK,
                            result_json="{}",
                        )
                        answers.append(pb.WorkerMessage(result=result))
                if answers:
                    self._outbox.put_nowait(pb.WorkerEnvelope(messages=answers))
        except grpc.aio.AioRpcError as exc:
            if not self.welcomed.is_set():
                raise RuntimeError(f"{self.worker_id}: the hub refused the stream: {exc}") from exc

    def cancel(self) -> None:
        self._call.cancel()


async def connect_workers(
    hub: Hub, ids: list[str], channels: list[grpc.aio.Channel]
) -> tuple[list[SimulatedWorker], list[asyncio.Task[None]]]:
    workers, tasks = [], []
    for i, worker_id in enumerate(ids):
        if i % STREAMS_PER_CHANNEL == 0:
            # A connection of its own: channels to one address share one by default, and
            # the hub admits 256 streams of a connection waiting to say Hello at once.
            own = [("grpc.use_local_subchannel_pool", 1)]
            channels.append(grpc.aio.insecure_channel(hub.listen, options=own))
        worker = SimulatedWorker(pb_grpc.WorkerServiceStub(channels[-1]), worker_id, hub.token)
        workers.append(worker)
        tasks.append(asyncio.create_task(worker.serve()))
    welcomed = asyncio.gather(*(w.welcomed.wait() for w in workers))
    await asyncio.wait([welcomed, *tasks], return_when=asyncio.FIRST_COMPLETED)
    for task in tasks:
        if task.done() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
    await welcomed
    return workers, tasks


def kill_of(client: ControlClient, tag: str):  # type: ignore[no-untyped-def]
    """A KillPlan of a new plan each call (a plan killed again is numbered anew too)."""
    made = 0

    async def one() -> None:
        nonlocal made
        made += 1
        await client.stub.KillPlan(
            pb.KillPlanRequest(plan_id=f"{tag}-{made}", reason="bench"), metadata=client.metadata
        )

    return one


def dispatch_to(client: ControlClient, worker_id: str):  # type: ignore[no-untyped-def]
    request = pb.DispatchRequest(
        worker_id=worker_id, agent_id="bench", surface="workerDiag", action="probe", args_json="{}"
    )

    async def one() -> None:
        reply = await client.stub.Dispatch(request, metadata=client.metadata)
        if reply.result.status != pb.ActionResult.OK:
            raise RuntimeError(reply.result.error.message)

    return one


async def measure(
    alone: Hub, crowded: Hub, workers: int, calls: int, rounds: int, kills: int
) -> None:
    """Dispatch p50 to one worker of a hub that holds `workers` streams, beside a second
    hub holding only that one, in alternating rounds so both see the same machine."""
    channels: list[grpc.aio.Channel] = []
    clients = [ControlClient.connect(h.listen, h.token) for h in (alone, crowded)]
    try:
        sims, tasks = await connect_workers(alone, ["sim-0"], channels)
        more, more_tasks = await connect_workers(crowded, ["sim-0"], channels)
        sims, tasks = sims + more, tasks + more_tasks
        rss_one = crowded.process.memory_info().rss
        started = time.perf_counter()
        more, more_tasks = await connect_workers(
            crowded, [f"sim-{i}" for i in range(1, workers)], channels
        )
        connect_s = time.perf_counter() - started
        sims, tasks = sims + more, tasks + more_tasks
        rss_many = crowded.process.memory_info().rss
        per_worker = (rss_many - rss_one) / max(1, workers - 1)

        one: list[float] = []
        many: list[float] = []
        for _ in range(rounds):
            one += await timed(dispatch_to(clients[0], "sim-0"), calls // rounds)
            many += await timed(dispatch_to(clients[1], "sim-0"), calls // rounds)

        kills_one: list[float] = []
        kills_many: list[float] = []
        for turn in range(rounds):
            kills_one += await timed(kill_of(clients[0], f"one-{turn}"), kills // rounds)
            kills_many += await timed(kill_of(clients[1], f"many-{turn}"), kills // rounds)

        p50_one, p50_many = statistics.median(one), statistics.median(many)
        print(
            f"\nhub with {workers} simulated idle workers ({len(one)} calls a row, {rounds} rounds)"
        )
        print(f"  {'':34}{'p50 ms':>9}{'p99 ms':>9}{'p50/raw':>9}")
        for name, samples in (
            ("Dispatch, worker alone (raw)", one),
            (f"Dispatch, 1 of {workers}", many),
        ):
            p50 = statistics.median(samples)
            print(f"  {name:34}{p50:9.2f}{percentile(samples, 0.99):9.2f}{p50 / p50_one:9.2f}")
        kill_p50_one = statistics.median(kills_one)
        for name, samples in (
            ("KillPlan, worker alone (raw)", kills_one),
            (f"KillPlan, to {workers} workers", kills_many),
        ):
            p50 = statistics.median(samples)
            print(f"  {name:34}{p50:9.2f}{percentile(samples, 0.99):9.2f}{p50 / kill_p50_one:9.2f}")
        print(
            f"  {workers - 1} workers new to the hub, {STREAMS_PER_CHANNEL} streams a "
            f"connection, all said Hello at once: all welcomed in {connect_s:.2f} s"
        )
        print(
            f"  hub RSS with 1 worker {rss_one / KB / KB:.1f} MiB, with {workers} "
            f"{rss_many / KB / KB:.1f} MiB: {per_worker / KB:.1f} KB per idle worker"
        )
        goal(f"hub memory per idle worker ({workers} workers)", per_worker / KB, " KB", 100)
        goal(
            f"Dispatch p50 to 1 of {workers} workers",
            p50_many,
            " ms",
            1.2,
            baseline=p50_one,
            baseline_name="worker alone",
            on="ratio",
        )
        for sim in sims:
            sim.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for client in clients:
            await client.close()
        for channel in channels:
            await channel.close()


@dataclass(frozen=True)
class Hub:
    listen: str
    token: str
    process: psutil.Process


@contextlib.contextmanager
def running_hub(path: Path) -> Iterator[Hub]:
    home = make_home(path, mode="ro", scopes=["workerDiag.*"])
    # Its simulated workers are accepted at their first Hello (none waits for `agentworker
    # workers accept`): the hub's work per worker is what is measured.
    with agentworker(["hub", "--accept-new-workers"], home) as proc:
        wait_for(home.token_file.exists, 15)
        yield Hub(home.listen, home.token_file.read_text().strip(), psutil.Process(proc.pid))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--kills", type=int, default=120)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="aw-bench-") as tmp,
        running_hub(Path(tmp, "alone")) as alone,
        running_hub(Path(tmp, "crowded")) as crowded,
    ):
        asyncio.run(measure(alone, crowded, args.workers, args.calls, args.rounds, args.kills))


if __name__ == "__main__":
    main()
