"""A hub killed (SIGKILL) in the middle of a burst of calls in flight.

The hub answers a caller as soon as a result arrives and commits its rows in groups
a moment later; the worker keeps each result until the hub acks it after that
commit. So a hub killed at any moment of a burst may lose its own rows, but never
a result a caller was given: after its restart, every call retried with its id
answers what it answered before, and no call ran twice.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import grpc

from tests.support.cluster import Cluster, cluster, wait_for
from worker.hub.client import ControlClient, result_to_dict

CALLS = 48


def args_of(i: int) -> str:
    # Spread over half a second, so the kill lands with some answered and some running.
    return json.dumps({"mark": f"burst-{i}", "sleep_ms": 10 * i})


def marks(live: Cluster, i: int) -> int:
    path = live.home / "diag" / f"burst-{i}.marks"
    return path.stat().st_size if path.exists() else 0


async def dispatch_all(live: Cluster, outcomes: dict[int, Any]) -> None:
    """All the calls at once; each outcome lands in `outcomes` as it comes."""
    client = ControlClient.connect(live.listen, live.token)

    async def one(i: int) -> None:
        try:
            response = await client.dispatch(
                agent_id="tester",
                surface="workerDiag",
                action="probe",
                args_json=args_of(i),
                correlation_id=f"burst-{i}",
                timeout_ms=20000,
            )
            outcomes[i] = result_to_dict(response)
        except grpc.aio.AioRpcError as exc:
            outcomes[i] = exc.code()

    try:
        await asyncio.gather(*(one(i) for i in range(CALLS)))
    finally:
        await client.close()


def test_a_hub_killed_mid_burst_loses_no_answer_and_runs_nothing_twice(tmp_path: Path) -> None:
    with cluster(tmp_path / "home", max_concurrency=CALLS) as live:
        outcomes: dict[int, Any] = {}
        burst = threading.Thread(target=asyncio.run, args=(dispatch_all(live, outcomes),))
        burst.start()
        answered = lambda: sum(isinstance(o, dict) for o in outcomes.values())  # noqa: E731
        wait_for(lambda: answered() >= CALLS // 4, 20)
        hub = next(p for p in live.procs if p.name == "hub")
        hub.kill()
        burst.join(30)
        before = {i: o for i, o in outcomes.items() if isinstance(o, dict)}
        assert CALLS // 4 <= len(before) < CALLS, "the kill came mid-burst"
        assert all(o["status"] == "ok" for o in before.values()), before
        cut_off = [o for i, o in outcomes.items() if i not in before]
        assert len(outcomes) == CALLS and all(o is grpc.StatusCode.UNAVAILABLE for o in cut_off)

        live.start_hub()
        wait_for(lambda: live.status().connected_workers == 1, 60)
        retries: dict[int, Any] = {}
        asyncio.run(dispatch_all(live, retries))  # each with its id again
        for i, retry in retries.items():
            assert isinstance(retry, dict) and retry["status"] == "ok", (i, retry)
            assert retry["result"]["marks"] == 1, (i, retry)
            if i in before:
                assert retry["result"] == before[i]["result"], "an answer given was lost"
            assert marks(live, i) == 1, f"call {i} ran {marks(live, i)} times"
