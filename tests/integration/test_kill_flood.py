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
import sqlite3
from pathlib import Path
from typing import Any

from tests.support.cluster import Cluster, cluster, wait_for
from worker.core.ledger import MAX_SERVER_KILLS
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
