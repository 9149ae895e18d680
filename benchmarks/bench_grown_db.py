"""Dispatch of workerHost.fs_stat through `agentworker up` with grown databases, beside
the same with fresh ones, in one run.

Every other benchmark starts from fresh databases; a worker and hub that have served
for a day have not: hub.db keeps each call 24 h, state.db each acked call as long and
an invocation row each 90 days. Here one `up` starts on a home whose hub.db holds
GROWN_ROWS calls (finished, with their answers), whose ledger holds as many acked
calls and whose telemetry as many invocation rows, all of the last hour (nothing is
pruned meanwhile), written through the stores' own APIs where they take many at once
(HubStore.add/flush, Telemetry.record_many) and as the ledger writes them otherwise.
Another `up` starts on a fresh home. The two take turns, round by round, so the
machine's drift weighs on both.

Printed: p50/p99 and calls/s at 1 and at 64 in flight for each, and two goals, the
grown one's p50 and rate beside the fresh one's (its ratio).

    python benchmarks/bench_grown_db.py [--calls 4000] [--rows 300000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import START_WITHIN_S, OneCall, agentworker, connected, goal, loadavg
from benchmarks._common import percentile as pct
from benchmarks.bench_roundtrip import FS_STAT, ROUNDS, Measured, _home, measure, pooled
from tests.support.cluster import wait_for
from worker.clock import now_ms
from worker.core.ledger import State
from worker.core.telemetry import Telemetry
from worker.hub.client import ControlClient
from worker.hub.store import HubStore
from worker.ids import new_id
from worker.wire.proto import agentworker_pb2 as pb

GROWN_ROWS = 300_000
BATCH = 10_000
GROWN_P50_GOAL = 1.25  # x the fresh databases' p50, 1 in flight
GROWN_RATE_GOAL = 0.8  # x the fresh databases' calls/s, 64 in flight


def grow(data_dir: Path, rows: int) -> None:
    """hub.db and state.db as a day of calls leaves them (see the module's docstring)."""
    now = now_ms()
    args = '{"path": "bench.txt"}'
    answer = '{"size": 5, "kind": "file"}'
    store = HubStore(data_dir / "hub.db")
    state = State(data_dir / "state.db", convert=True)
    telemetry = Telemetry(state.connection, convert=True)
    try:
        for start in range(0, rows, BATCH):
            ids = [new_id() for _ in range(min(BATCH, rows - start))]
            for cid in ids:
                request = pb.ActionRequest(
                    correlation_id=cid,
                    plan_id="plan",
                    agent_id="bench",
                    surface="workerHost",
                    action="fs_stat",
                    args_json=args,
                )
                store.add("worker", "digest", request, 0, deadline_ms=now + 60_000, fresh=True)
            store.flush()
            results = [
                pb.ActionResult(correlation_id=cid, status=pb.ActionResult.OK, result_json=answer)
                for cid in ids
            ]
            store.complete_many([(result, None, False, None) for result in results])
            when = [now - random.randrange(3_600_000) for _ in ids]
            with state.batch():
                state.connection.executemany(
                    "INSERT INTO calls (correlation_id, args_digest, plan_id, state, result,"
                    " acked, created_ms, finished_ms, server) VALUES (?, 'digest', 'plan',"
                    " 'DONE', ?, 1, ?, ?, 'bench')",
                    [
                        (r.correlation_id, r.SerializeToString(), ms, ms)
                        for r, ms in zip(results, when, strict=True)
                    ],
                )
            telemetry.record_many(
                [
                    pb.Invocation(
                        correlation_id=cid,
                        plan_id="plan",
                        agent_id="bench",
                        surface="workerHost",
                        action="fs_stat",
                        invocation_id=new_id(),
                        scope="workerHost.fs_stat",
                        decision="allowed",
                        status="ok",
                        started_unix_ms=ms,
                        finished_unix_ms=ms + 1,
                        duration_ms=1,
                        args_digest="digest",
                        args_preview=args,
                    )
                    for cid, ms in zip(ids, when, strict=True)
                ],
                server="bench",
            )
    finally:
        telemetry.flush()
        state.close()
        store.close()


@contextlib.asynccontextmanager
async def up(path: Path, rows: int) -> AsyncIterator[ControlClient]:
    home = _home(path)
    if rows:
        grow(home.path, rows)
    with agentworker(["up"], home):
        wait_for(home.token_file.exists, START_WITHIN_S)
        async with connected(home) as client:
            yield client


def dispatch_one(client: ControlClient) -> OneCall:
    async def one() -> None:
        reply = await client.stub.Dispatch(FS_STAT, metadata=client.metadata)
        if reply.result.status != pb.ActionResult.OK:
            raise RuntimeError(reply.result.error.message)

    return one


async def run(calls: int, rows: int, home: Path) -> None:
    started = time.monotonic()
    async with contextlib.AsyncExitStack() as stack:
        fresh = await stack.enter_async_context(up(home / "fresh", 0))
        grown = await stack.enter_async_context(up(home / "grown", rows))
        print(
            f"grown databases: {rows:,} rows each, made and started in "
            f"{time.monotonic() - started:.0f} s"
        )
        ways = {
            "fresh databases": dispatch_one(fresh),
            f"grown ({rows:,} rows)": dispatch_one(grown),
        }
        for in_flight in (1, 64):
            before = loadavg()
            rounds: dict[str, list[Measured]] = {name: [] for name in ways}
            names = list(ways)
            for turn in range(ROUNDS):
                for name in names[turn % 2 :] + names[: turn % 2]:
                    rounds[name].append(await measure(ways[name], calls // ROUNDS, in_flight))
            pooled_rounds = {name: pooled(r) for name, r in rounds.items()}
            print(
                f"\n{calls} fs_stat Dispatches through `up`, {in_flight} in flight "
                f"({before}; after: {loadavg()})"
            )
            print(f"  {'':28}{'p50 ms':>9}{'p99 ms':>9}{'calls/s':>9}")
            for name, (lat, rate) in pooled_rounds.items():
                print(f"  {name:28}{statistics.median(lat):9.3f}{pct(lat, 0.99):9.3f}{rate:9.0f}")
            (fresh_lat, fresh_rate), (grown_lat, grown_rate) = pooled_rounds.values()
            if in_flight == 1:
                goal(
                    "up, grown databases: p50, 1 in flight",
                    statistics.median(grown_lat),
                    " ms",
                    GROWN_P50_GOAL,
                    baseline=statistics.median(fresh_lat),
                    baseline_name="fresh databases",
                    on="ratio",
                )
            else:
                goal(
                    "up, grown databases: calls/s, 64 in flight",
                    grown_rate,
                    " calls/s",
                    GROWN_RATE_GOAL,
                    baseline=fresh_rate,
                    baseline_name="fresh databases",
                    on="ratio",
                    at_least=True,
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--rows", type=int, default=GROWN_ROWS)
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as home:
        asyncio.run(run(args.calls, args.rows, Path(home)))


if __name__ == "__main__":
    main()
