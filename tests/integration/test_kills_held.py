"""A flood of kills while a worker is away never makes the hub refuse a kill (review16
E1). One worker away pinned the kills the hub keeps for workers to confirm; past
store.KILLS_HELD of them every KillPlan of a plan not killed already was refused
(RESOURCE_EXHAUSTED), for as long as that worker stayed away, while the plan ran. Now
the kill is kept and sent; the oldest kills not confirmed go: those of plans never in use
owe nothing, those of plans in use are kept apart by their plans' digests and sent so
(review16 F4), and past store.KILLS_APART of those each worker that had not confirmed one
is owed a kill of every plan ('*'), sent ahead of its backlog when it comes back, which
stops them all there until the person lifts it.

A real hub (worker.app.start_hub) in the test's loop, with KILLS_HELD made small, and a
real worker process; the worker away is a hand-driven stream (the far side: a co-tenant
that connected once), or the real worker stopped."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cluster import Proc
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
from worker import app
from worker.clock import now_ms
from worker.core.ledger import ALL_PLANS
from worker.hub import store as store_module
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.proto import agentworker_pb2_grpc as pb_grpc
from worker.wire.protocol import DIGEST_KILL_PROTOCOL, plan_digest

HELD = 40  # store.KILLS_HELD for these tests: the flood that passes it stays short


async def _kill(stub: pb_grpc.ControlServiceStub, home: Path, plan: str) -> pb.KillPlanResponse:
    reply: pb.KillPlanResponse = await stub.KillPlan(
        pb.KillPlanRequest(plan_id=plan, reason="stop"), metadata=caller_metadata(home), timeout=60
    )
    return reply


async def _code(stub: pb_grpc.ControlServiceStub, home: Path, worker_id: str, plan: str) -> str:
    reply = await stub.Dispatch(
        probe_request(worker_id, plan), metadata=caller_metadata(home), timeout=120
    )
    return "ok" if reply.result.status == pb.ActionResult.OK else reply.result.error.code


def _killed_at(home: Path, plan: str) -> str | None:
    """Who killed the plan at the worker of `home` (its state.db), or None."""
    with sqlite3.connect(home / "state.db") as db:
        row = db.execute("SELECT killed_by FROM killed_plans WHERE plan_id = ?", (plan,)).fetchone()
    return None if row is None else str(row[0])


async def _until_confirmed(running: app.RunningHub, worker_id: str) -> None:
    """Until the connected worker confirmed every kill the hub keeps for it."""
    last = max(k.seq for k in running.hub.store.kills_after(worker_id, 0))
    while (session := running.hub.sessions.get(worker_id)) is None or (
        session.kills_through < last
    ):
        await asyncio.sleep(0.02)  # the hub runs in this loop


def _kill_rows(hub_home: Path) -> int:
    with sqlite3.connect(hub_home / "hub.db") as db:
        (count,) = db.execute("SELECT count(*) FROM kills").fetchone()
    return int(count)


def test_a_flood_past_kills_held_with_a_worker_away_never_refuses_the_persons_kill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The co-tenant away pins every kill; HELD + 10 kills of made-up plans, then the
    person's kill of the plan running on the connected worker: kept and in force there
    (before: RESOURCE_EXHAUSTED, and the plan's calls ran); hub.db keeps no more than
    HELD kills. The kills that went were of plans never in use: the co-tenant, back, is
    sent the rest, and no kill of every plan (review16 F4, the hub's half: before, a
    flood of KillPlans alone stopped every plan there)."""
    monkeypatch.setattr(store_module, "KILLS_HELD", HELD)
    hub_home = home = tmp_path / "home"

    async def go() -> None:
        async with hub_in_process(hub_home) as running:
            worker = real_worker(home, running.address)
            channel = own_channel(running.address)
            stub = pb_grpc.ControlServiceStub(channel)
            try:
                (worker_id,) = await until_connected(running, worker)
                cotenant = HandWorker(running.address, hub_home)
                await cotenant.until("welcome")
                await cotenant.close()
                while cotenant.worker_id in running.hub.sessions:
                    await asyncio.sleep(0.02)  # the hub runs in this loop
                assert await _code(stub, hub_home, worker_id, "real-plan") == "ok"
                for n in range(HELD):
                    await _kill(stub, hub_home, f"made-up-{n}")
                await _until_confirmed(running, worker_id)  # those that go, it has
                for n in range(HELD, HELD + 10):
                    await _kill(stub, hub_home, f"made-up-{n}")
                told = await _kill(stub, hub_home, "real-plan")
                assert list(told.worker_ids) == [worker_id]
                assert list(told.queued_worker_ids) == [cotenant.worker_id]
                assert await _code(stub, hub_home, worker_id, "real-plan") == "plan_killed"
                assert _kill_rows(hub_home) <= HELD

                owed = running.hub.store.kills_after(cotenant.worker_id, 0)
                assert ALL_PLANS not in [k.plan_id for k in owed]
                back = HandWorker(
                    running.address,
                    hub_home,
                    hello=cotenant.hello,
                    key=cotenant.key,
                )
                try:
                    sent = [k.plan_id for k in await back.until("kill_plan", len(owed))]
                    assert "real-plan" in sent and "made-up-0" not in sent
                    assert ALL_PLANS not in sent
                finally:
                    await back.close()
                # The connected worker had confirmed every kill: it is owed no stop.
                assert _killed_at(home, ALL_PLANS) is None
                assert await _code(stub, hub_home, worker_id, "other-plan") == "ok"
            finally:
                await channel.close()
                await stop_worker(worker)

    asyncio.run(go())


def test_a_persons_kill_dropped_for_a_worker_away_reaches_it_by_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The person's kill owed to the worker away goes from the kills held in a flood of
    kills of plans in use (each made-up plan's call refused for its kill): it is kept
    apart by its plan's digest, and the worker, back, records it so: the killed plan's
    call is refused there, other plans run, and the person lifts it by the plan's id.
    Before, the worker was owed a stop of every plan (review16 F4)."""
    monkeypatch.setattr(store_module, "KILLS_HELD", HELD)
    hub_home = home = tmp_path / "home"

    async def go() -> None:
        async with hub_in_process(hub_home) as running:
            worker = real_worker(home, running.address)
            channel = own_channel(running.address)
            stub = pb_grpc.ControlServiceStub(channel)
            try:
                (worker_id,) = await until_connected(running, worker)
                await _away_then_flooded(running, worker, stub, hub_home, worker_id)
                owed = running.hub.store.kills_after(worker_id, 0)
                assert plan_digest("victim") in [k.plan_digest for k in owed if not k.plan_id]
                assert ALL_PLANS not in [k.plan_id for k in owed]
                assert _kill_rows(hub_home) <= HELD

                worker = real_worker(home, running.address)
                await until_connected(running, worker)
                await _until_confirmed(running, worker_id)  # each recorded, the digest too
                assert _kept_apart_at(home, "victim") and _killed_at(home, ALL_PLANS) is None
                assert await _code(stub, hub_home, worker_id, "victim") == "plan_killed"
                assert await _code(stub, hub_home, worker_id, "never-killed") == "ok"
                await asyncio.to_thread(_lift, home, "victim")
                assert await _code(stub, hub_home, worker_id, "victim") == "ok"
            finally:
                await channel.close()
                await stop_worker(worker)

    asyncio.run(go())


def test_a_kill_of_a_plan_idle_a_day_outlives_a_flood_while_its_worker_is_away(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review19 A6: the worker ran a call of "victim" and went away; a day on, the hub's
    prune forgot the call, and the person's kill counted as of a plan never dispatched:
    HELD + 1 KillPlans of made-up plans (none dispatched) dropped it first, nothing kept
    apart, no stop owed, and the worker back ran the plan. The day passing is the hub's
    own prune with its clock a day on."""
    monkeypatch.setattr(store_module, "KILLS_HELD", HELD)
    hub_home = home = tmp_path / "home"

    async def go() -> None:
        async with hub_in_process(hub_home) as running:
            store = running.hub.store
            worker = real_worker(home, running.address)
            channel = own_channel(running.address)
            stub = pb_grpc.ControlServiceStub(channel)
            try:
                (worker_id,) = await until_connected(running, worker)
                assert await _code(stub, hub_home, worker_id, "victim") == "ok"
                await stop_worker(worker)
                while running.hub.sessions:
                    await asyncio.sleep(0.02)  # the hub runs in this loop
                day_on = now_ms() + store_module.CALLS_KEPT_MS + 3_600_000
                assert await store.prune_off_loop(now=day_on) == 1
                assert (await _kill(stub, hub_home, "victim")).queued_worker_ids
                for n in range(HELD + 1):
                    await _kill(stub, hub_home, f"made-up-{n}")
                worker = real_worker(home, running.address)
                await until_connected(running, worker)
                await _until_confirmed(running, worker_id)
                assert await _code(stub, hub_home, worker_id, "victim") == "plan_killed"
                assert await _code(stub, hub_home, worker_id, "never-killed") == "ok"
            finally:
                await channel.close()
                await stop_worker(worker)

    asyncio.run(go())


async def _away_then_flooded(
    running: app.RunningHub,
    worker: Proc,
    stub: pb_grpc.ControlServiceStub,
    home: Path,
    worker_id: str,
) -> None:
    """The worker ran a call of "victim", went away, and the person killed the plan;
    then HELD + 5 kills of made-up plans, each in use (its call refused for the kill)."""
    assert await _code(stub, home, worker_id, "victim") == "ok"
    await stop_worker(worker)
    while running.hub.sessions:
        await asyncio.sleep(0.02)  # the hub runs in this loop
    assert list((await _kill(stub, home, "victim")).queued_worker_ids) == [worker_id]
    for n in range(HELD + 5):
        await _kill(stub, home, f"in-use-{n}")
        assert await _code(stub, home, worker_id, f"in-use-{n}") == "plan_killed"


def _kept_apart_at(home: Path, plan: str) -> bool:
    """Whether the worker of `home` keeps a kill of the plan apart, by digest."""
    with sqlite3.connect(home / "state.db") as db:
        row = db.execute(
            "SELECT 1 FROM kills_apart WHERE digest = ?", (plan_digest(plan),)
        ).fetchone()
    return row is not None


def test_an_older_worker_is_sent_a_stop_of_every_plan_for_a_kill_kept_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that cannot read a kill by digest (protocol before 4) is sent a kill of
    every plan in its place, numbered as the kill was: it fails closed."""
    monkeypatch.setattr(store_module, "KILLS_HELD", HELD)
    home = tmp_path / "home"

    async def go() -> None:
        async with hub_in_process(home) as running:
            channel = own_channel(running.address)
            stub = pb_grpc.ControlServiceStub(channel)
            old = HandWorker(running.address, home)
            old.hello.protocol_max = DIGEST_KILL_PROTOCOL - 1
            try:
                await old.until("welcome")
                await old.close()
                while old.worker_id in running.hub.sessions:
                    await asyncio.sleep(0.02)  # the hub runs in this loop
                for n in range(HELD + 5):
                    await _kill(stub, home, f"in-use-{n}")
                    assert running.hub.store.killed(f"in-use-{n}", "elsewhere", 0)  # in use
                apart = [
                    k.seq for k in running.hub.store.kills_after(old.worker_id, 0) if not k.plan_id
                ]
                assert apart
                back = HandWorker(running.address, home, hello=old.hello, key=old.key)
                try:
                    sent = await back.until("kill_plan", HELD + 5)
                    stand_ins = [k for k in sent if k.seq in apart]
                    assert [k.plan_id for k in stand_ins] == [ALL_PLANS] * len(apart)
                    assert not any(k.plan_digest for k in sent)
                finally:
                    await back.close()
            finally:
                await channel.close()

    asyncio.run(go())


def test_past_kills_apart_a_worker_away_is_owed_a_stop_of_every_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past KILLS_APART (none here) the person's kill owed to the worker away goes: the
    worker, back, records the hub's kill of every plan ahead of the rest, and the killed
    plan's call is refused, as is any other, until the person lifts '*' there."""
    monkeypatch.setattr(store_module, "KILLS_HELD", HELD)
    monkeypatch.setattr(store_module, "KILLS_APART", 0)
    hub_home = home = tmp_path / "home"

    async def go() -> None:
        async with hub_in_process(hub_home) as running:
            worker = real_worker(home, running.address)
            channel = own_channel(running.address)
            stub = pb_grpc.ControlServiceStub(channel)
            try:
                (worker_id,) = await until_connected(running, worker)
                await _away_then_flooded(running, worker, stub, hub_home, worker_id)
                owed = [k.plan_id for k in running.hub.store.kills_after(worker_id, 0)]
                assert "victim" not in owed and ALL_PLANS in owed
                assert _kill_rows(hub_home) <= HELD + 1

                worker = real_worker(home, running.address)
                await until_connected(running, worker)
                while _killed_at(home, ALL_PLANS) is None:
                    assert worker.running(), worker.log()
                    await asyncio.sleep(0.05)  # the worker records it in its state.db
                assert _killed_at(home, ALL_PLANS) == "server"
                await _until_confirmed(running, worker_id)  # the numbered stop came too
                assert await _code(stub, hub_home, worker_id, "victim") == "plan_killed"
                assert await _code(stub, hub_home, worker_id, "never-killed") == "plan_killed"
                await asyncio.to_thread(_lift_all, home)
                assert await _code(stub, hub_home, worker_id, "never-killed") == "ok"
            finally:
                await channel.close()
                await stop_worker(worker)

    asyncio.run(go())


def _lift_all(home: Path) -> None:
    """The person lifts the stop at the worker (`agentworker lift '*'`)."""
    _lift(home, ALL_PLANS)


def _lift(home: Path, plan: str) -> None:
    """The person lifts a kill at the worker (`agentworker lift PLAN`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTWORKER_")}
    env["AGENTWORKER_HOME"] = str(home)
    done = subprocess.run(
        [sys.executable, "-m", "worker", "lift", plan],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
