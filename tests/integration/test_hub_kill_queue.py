"""A KillPlan naming no worker reaches every connected worker at once, and is queued
for those away that the plan ran on (a call of it sent there, or its workspace placed
there), not for every worker the hub remembers (it was: up to 1,024 rows a kill, a
made-up plan's too). A real hub in the test's loop and a real worker process that ran
the plan; the workers that never ran it are driven by hand."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from tests.support.hub_inproc import (
    HandWorker,
    caller_metadata,
    hub_in_process,
    own_channel,
    probe_request,
    real_worker,
    stop_worker,
    until_connected,
)
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.proto import agentworker_pb2_grpc as pb_grpc

AWAY = 40


def _queued(home: Path) -> list[tuple[str, str]]:
    db = sqlite3.connect(home / "hub.db")
    try:
        return sorted(db.execute("SELECT worker_id, plan_id FROM queued_kills").fetchall())
    finally:
        db.close()


def test_a_kill_naming_no_worker_is_queued_only_where_the_plan_ran(tmp_path: Path) -> None:
    home = tmp_path / "home"

    async def go() -> None:
        async with hub_in_process(home) as running:
            metadata = caller_metadata(home)
            channel = own_channel(running.address)
            stub = pb_grpc.ControlServiceStub(channel)
            worker = real_worker(home, running.address)
            live = None
            try:
                (ran_on,) = await until_connected(running, worker)
                reply = await stub.Dispatch(
                    probe_request(ran_on, "p-ran"), metadata=metadata, timeout=60
                )
                assert reply.result.status == pb.ActionResult.OK, reply.result
                await stop_worker(worker)
                # Workers the hub remembers, away, that never ran the plan; one connected.
                for _ in range(AWAY):
                    away = HandWorker(running.address, home)
                    await away.until("welcome")
                    await away.close()
                live = HandWorker(running.address, home)
                await live.until("welcome")
                while set(running.hub.sessions) != {live.worker_id}:
                    await asyncio.sleep(0.02)  # the hub runs in this loop
                assert running.hub.store.known_workers() == AWAY + 2

                kill = pb.KillPlanRequest(plan_id="p-ran", reason="stop")
                told = await stub.KillPlan(kill, metadata=metadata, timeout=60)
                assert list(told.worker_ids) == [live.worker_id]
                assert list(told.queued_worker_ids) == [ran_on]
                # A plan that ran nowhere: the connected worker is told, no one queued.
                made_up = pb.KillPlanRequest(plan_id="p-nowhere", reason="stop")
                told = await stub.KillPlan(made_up, metadata=metadata, timeout=60)
                assert list(told.worker_ids) == [live.worker_id]
                assert not told.queued_worker_ids
                assert _queued(home) == [(ran_on, "p-ran")]
                kills = await live.until("kill_plan", 2)
                assert [k.plan_id for k in kills] == ["p-ran", "p-nowhere"]

                # The worker the plan ran on is told as it comes back: the plan's next
                # call is refused there.
                worker = real_worker(home, running.address)
                await until_connected(running, worker, 2)
                again = await stub.Dispatch(
                    probe_request(ran_on, "p-ran"), metadata=metadata, timeout=60
                )
                assert again.result.error.code == "plan_killed", again.result
                assert _queued(home) == []
            finally:
                if live is not None:
                    await live.close()
                await channel.close()
                await stop_worker(worker)

    asyncio.run(go())
