"""A kill of a plan no call of which ever reached the worker stays in force through a
flood of kills of made-up plans, when a call of the plan came to the hub after the kill
(review14 finding 02, variant B). The hub refused that call itself (the worker away, or
not yet sent the kill), so the worker never learned the plan was in use, and
MAX_SERVER_KILLS + 1 made-up kills pruned the kill there; the hub, the kill confirmed,
then let the plan's calls through, and the plan ran. Now the kill tells the worker the
plan is in use (KillPlan.in_use), and a call of a plan whose kill went ahead of it on
the stream goes to the worker, which refuses it itself.

A real `agentworker hub` and `agentworker run` (tests/support/cluster.py)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sqlite3
from pathlib import Path
from typing import Any

import grpc

from tests.support.cluster import Cluster, cluster, wait_for
from worker.core.ledger import ALL_PLANS, MAX_SERVER_KILLS
from worker.wire.proto import agentworker_pb2 as pb


def _kill(plan: str) -> Any:
    async def send(client: Any) -> pb.KillPlanResponse:
        return await client.stub.KillPlan(
            pb.KillPlanRequest(plan_id=plan, reason="stop"), metadata=client.metadata, timeout=60
        )

    return send


def _flood(plans: list[str]) -> Any:
    async def send(client: Any) -> None:
        at_once = asyncio.Semaphore(16)

        async def one(plan: str) -> None:
            async with at_once:
                await _kill(plan)(client)

        await asyncio.gather(*(one(plan) for plan in plans))

    return send


def _killed_at_worker(live: Cluster, plan: str) -> bool:
    with sqlite3.connect(live.home / "state.db") as db:
        row = db.execute("SELECT 1 FROM killed_plans WHERE plan_id = ?", (plan,)).fetchone()
    return row is not None


def _stat(live: Cluster, plan: str) -> str:
    answer = live.call("workerHost.fs_stat", '{"path": "."}', plan_id=plan)
    return str((answer.get("error") or {}).get("code") or answer.get("status"))


def _flood_then_check(live: Cluster, plans: list[str], tag: str) -> None:
    flood = [f"made-up-{tag}-{n:05d}" for n in range(MAX_SERVER_KILLS + 1)]
    live.run(_flood(flood))
    wait_for(lambda: _killed_at_worker(live, flood[-1]), 60)
    for plan in plans:
        assert _killed_at_worker(live, plan), plan
        assert _stat(live, plan) == "plan_killed", plan


def test_a_kill_of_a_plan_first_called_after_it_outlives_a_flood(tmp_path: Path) -> None:
    """The kill went ahead on the worker's stream: the call goes after it, and the
    worker refuses it itself (its plan in use there), confirmed or not."""
    with cluster(tmp_path / "home") as live:
        assert list(live.run(_kill("first-called-after")).worker_ids)
        assert _stat(live, "first-called-after") == "plan_killed"
        _flood_then_check(live, ["first-called-after"], "a")


def _pinned_flood(live: Cluster, tag: str, worker_id: str, *, away: bool) -> None:
    """MAX_SERVER_KILLS + 1 made-up plans, each dispatched once (so "in use" at the hub
    and, the worker connected, at the worker), then killed (review15 finding 01)."""

    async def send(client: Any) -> None:
        at_once = asyncio.Semaphore(16)

        async def one(n: int) -> None:
            plan = f"pinned-{tag}-{n:05d}"
            request = pb.DispatchRequest(
                agent_id="tester",
                surface="workerHost",
                action="fs_stat",
                args_json='{"path": "."}',
                plan_id=plan,
                worker_id=worker_id,
                timeout_ms=60_000,
            )
            async with at_once:
                if away:  # the caller leaves; the hub keeps the call for the worker
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        await client.stub.Dispatch(request, metadata=client.metadata, timeout=0.2)
                else:
                    await client.stub.Dispatch(request, metadata=client.metadata, timeout=120)
                await _kill(plan)(client)

        await asyncio.gather(*(one(n) for n in range(MAX_SERVER_KILLS + 1)))

    live.run(send)


def test_a_kill_owed_to_a_worker_away_outlives_a_flood_of_kills_of_plans_in_use(
    tmp_path: Path,
) -> None:
    """The worker away: the hub never prunes a kill it has not confirmed, so the killed
    plan's call is refused when it is back (review15 finding 01, A: each made-up plan
    dispatched before its kill, born "in use", pushed the person's kill out)."""
    with cluster(tmp_path / "home") as live:
        (worker_id,) = [w.worker_id for w in live.workers()]
        assert _stat(live, "victim") == "ok"
        worker = next(p for p in live.procs if p.name == "worker")
        worker.signal(signal.SIGTERM)
        worker.wait(60)
        wait_for(lambda: live.status().connected_workers == 0, 60)
        assert list(live.run(_kill("victim")).queued_worker_ids) == [worker_id]
        _pinned_flood(live, "away", worker_id, away=True)
        live.start_worker()
        assert _stat(live, "victim") == "plan_killed"
        wait_for(lambda: _killed_at_worker(live, "pinned-away-01000"), 120)
        assert _stat(live, "victim") == "plan_killed"


def test_a_kill_confirmed_by_the_worker_outlives_a_flood_of_kills_of_plans_in_use(
    tmp_path: Path,
) -> None:
    """The worker connected: past MAX_SERVER_KILLS kills of plans in use, the oldest are
    kept apart (ledger.MAX_KILLS_APART), so the person's kill still binds, a kill that
    comes then is not the one pruned, and a plan nobody named still runs. Before, the
    flood stopped every plan of the server, every agent's (review16 F4: 1,001 pairs of
    Dispatch and KillPlan in ~6 s), and before that the person's kill went first and the
    plan ran (review15 finding 01, B and C)."""
    with cluster(tmp_path / "home") as live:
        (worker_id,) = [w.worker_id for w in live.workers()]
        assert _stat(live, "victim") == "ok"
        assert list(live.run(_kill("victim")).worker_ids) == [worker_id]
        assert _stat(live, "victim") == "plan_killed"
        _pinned_flood(live, "here", worker_id, away=False)
        wait_for(lambda: _killed_at_worker(live, "pinned-here-01000"), 60)
        assert not _killed_at_worker(live, "victim")  # pruned: kept apart
        assert _stat(live, "victim") == "plan_killed"
        assert not _killed_at_worker(live, ALL_PLANS)
        assert _stat(live, "innocent") == "ok"
        assert "more kills of plans in use from servers, kept apart" in live.cli("killed").stdout
        assert list(live.run(_kill("fresh")).worker_ids) == [worker_id]
        wait_for(lambda: _killed_at_worker(live, "fresh"), 60)
        assert _stat(live, "fresh") == "plan_killed"
        # The person lifts the kill kept apart: the plan runs again.
        assert live.cli("lift", "victim").returncode == 0
        assert _stat(live, "victim") == "ok"
