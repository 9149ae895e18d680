"""A KillPlan naming no worker is kept by the hub as one row, whatever the number of
workers it remembers (it was queued for every one: up to 1,024 rows a kill, a made-up
plan's too), and reaches every worker: those connected at once, and each worker away as
it comes back, the plan having run there or not (review12 finding 08: since it was queued
only for those the plan ran on, a worker away that never ran it was never told, and ran
the plan when it came back). A real hub in the test's loop and a real worker process
that never ran the plan; the other workers away are driven by hand."""

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


def _kills(home: Path) -> list[tuple[str, str]]:
    db = sqlite3.connect(home / "hub.db")
    try:
        return sorted(db.execute("SELECT plan_id, worker_id FROM kills").fetchall())
    finally:
        db.close()


def test_a_kill_naming_no_worker_reaches_a_worker_away_that_never_ran_the_plan(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"

    async def go() -> None:
        async with hub_in_process(home) as running:
            metadata = caller_metadata(home)
            channel = own_channel(running.address)
            stub = pb_grpc.ControlServiceStub(channel)
            worker = real_worker(home, running.address)
            live = None
            try:
                (away_id,) = await until_connected(running, worker)
                reply = await stub.Dispatch(
                    probe_request(away_id, "p-other"), metadata=metadata, timeout=60
                )
                assert reply.result.status == pb.ActionResult.OK, reply.result
                await stop_worker(worker)
                # Workers the hub remembers, away, that never ran the plan; one connected.
                hands = []
                for _ in range(AWAY):
                    away = HandWorker(running.address, home)
                    await away.until("welcome")
                    await away.close()
                    hands.append(away.worker_id)
                live = HandWorker(running.address, home)
                await live.until("welcome")
                while set(running.hub.sessions) != {live.worker_id}:
                    await asyncio.sleep(0.02)  # the hub runs in this loop
                assert running.hub.store.known_workers() == AWAY + 2

                kill = pb.KillPlanRequest(plan_id="p-killed", reason="stop")
                told = await stub.KillPlan(kill, metadata=metadata, timeout=60)
                assert list(told.worker_ids) == [live.worker_id]
                assert sorted(told.queued_worker_ids) == sorted([away_id, *hands])
                made_up = pb.KillPlanRequest(plan_id="p-nowhere", reason="stop")
                await stub.KillPlan(made_up, metadata=metadata, timeout=60)
                # One row a kill, however many workers there are.
                assert _kills(home) == [("p-killed", ""), ("p-nowhere", "")]
                kills = await live.until("kill_plan", 2)
                assert [(k.plan_id, k.seq) for k in kills] == [("p-killed", 1), ("p-nowhere", 2)]

                # The worker away, which never ran the plan, is told as it comes back: the
                # plan's calls are refused there, by the hub until the worker confirmed
                # the kill, then by the worker itself.
                worker = real_worker(home, running.address)
                await until_connected(running, worker, 2)
                again = await stub.Dispatch(
                    probe_request(away_id, "p-killed"), metadata=metadata, timeout=60
                )
                assert again.result.error.code == "plan_killed", again.result
                while running.hub.sessions[away_id].kills_through < 2:
                    await asyncio.sleep(0.02)  # the hub runs in this loop
                again = await stub.Dispatch(
                    probe_request(away_id, "p-killed"), metadata=metadata, timeout=60
                )
                assert again.result.error.code == "plan_killed", again.result
                assert "at this hub" not in again.result.error.message, again.result
                # A worker new to the hub is told too, at its first Hello.
                new = HandWorker(running.address, home)
                assert [k.plan_id for k in await new.until("kill_plan", 2)] == [
                    "p-killed",
                    "p-nowhere",
                ]
                await new.close()
            finally:
                if live is not None:
                    await live.close()
                await channel.close()
                await stop_worker(worker)

    asyncio.run(go())
