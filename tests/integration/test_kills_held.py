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
import sqlite3
from pathlib import Path

import pytest

from tests.support.hub_inproc import (
    DrivenHub,
    driven_hub,
    lift,
    stop_worker,
)
from worker.clock import now_ms
from worker.core.ledger import ALL_PLANS
from worker.hub import store as store_module
from worker.wire.protocol import DIGEST_KILL_PROTOCOL, plan_digest

HELD = 40  # store.KILLS_HELD for these tests: the flood that passes it stays short


@pytest.fixture(autouse=True)
def _kills_held(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "KILLS_HELD", HELD)


def _killed_at(home: Path, plan: str) -> str | None:
    """Who killed the plan at the worker of `home` (its state.db), or None."""
    with sqlite3.connect(home / "state.db") as db:
        row = db.execute("SELECT killed_by FROM killed_plans WHERE plan_id = ?", (plan,)).fetchone()
    return None if row is None else str(row[0])


def _kill_rows(hub_home: Path) -> int:
    with sqlite3.connect(hub_home / "hub.db") as db:
        (count,) = db.execute("SELECT count(*) FROM kills").fetchone()
    return int(count)


def test_a_flood_past_kills_held_with_a_worker_away_never_refuses_the_persons_kill(
    tmp_path: Path,
) -> None:
    """The co-tenant away pins every kill; HELD + 10 kills of made-up plans, then the
    person's kill of the plan running on the connected worker: kept and in force there
    (before: RESOURCE_EXHAUSTED, and the plan's calls ran); hub.db keeps no more than
    HELD kills. The kills that went were of plans never in use: the co-tenant, back, is
    sent the rest, and no kill of every plan (review16 F4, the hub's half: before, a
    flood of KillPlans alone stopped every plan there)."""
    hub_home = home = tmp_path / "home"

    async def go() -> None:
        async with driven_hub(hub_home) as hub:
            await hub.real_worker()
            (worker_id,) = hub.sessions
            cotenant = await hub.away()
            assert await hub.caller.code(worker_id, "real-plan") == "ok"
            for n in range(HELD):
                await hub.caller.kill(f"made-up-{n}")
            await hub.until_confirmed(worker_id)  # those that go, it has
            for n in range(HELD, HELD + 10):
                await hub.caller.kill(f"made-up-{n}")
            told = await hub.caller.kill("real-plan")
            assert list(told.worker_ids) == [worker_id]
            assert list(told.queued_worker_ids) == [cotenant.worker_id]
            assert await hub.caller.code(worker_id, "real-plan") == "plan_killed"
            assert _kill_rows(hub_home) <= HELD

            owed = hub.store.kills_after(cotenant.worker_id, 0)
            assert ALL_PLANS not in [k.plan_id for k in owed]
            back = hub.back(cotenant)
            sent = [k.plan_id for k in await back.until("kill_plan", len(owed))]
            assert "real-plan" in sent and "made-up-0" not in sent
            assert ALL_PLANS not in sent
            await back.close()
            # The connected worker had confirmed every kill: it is owed no stop.
            assert _killed_at(home, ALL_PLANS) is None
            assert await hub.caller.code(worker_id, "other-plan") == "ok"

    asyncio.run(go())


def test_a_persons_kill_dropped_for_a_worker_away_reaches_it_by_digest(
    tmp_path: Path,
) -> None:
    """The person's kill owed to the worker away goes from the kills held in a flood of
    kills of plans in use (each made-up plan's call refused for its kill): it is kept
    apart by its plan's digest, and the worker, back, records it so: the killed plan's
    call is refused there, other plans run, and the person lifts it by the plan's id.
    Before, the worker was owed a stop of every plan (review16 F4)."""
    hub_home = home = tmp_path / "home"

    async def go() -> None:
        async with driven_hub(hub_home) as hub:
            worker_id = await _away_then_flooded(hub)
            owed = hub.store.kills_after(worker_id, 0)
            assert plan_digest("victim") in [k.plan_digest for k in owed if not k.plan_id]
            assert ALL_PLANS not in [k.plan_id for k in owed]
            assert _kill_rows(hub_home) <= HELD

            await hub.real_worker()
            await hub.until_confirmed(worker_id)  # each recorded, the digest too
            assert _kept_apart_at(home, "victim") and _killed_at(home, ALL_PLANS) is None
            assert await hub.caller.code(worker_id, "victim") == "plan_killed"
            assert await hub.caller.code(worker_id, "never-killed") == "ok"
            await asyncio.to_thread(lift, home, "victim")
            assert await hub.caller.code(worker_id, "victim") == "ok"

    asyncio.run(go())


def test_a_kill_of_a_plan_idle_a_day_outlives_a_flood_while_its_worker_is_away(
    tmp_path: Path,
) -> None:
    """review19 A6: the worker ran a call of "victim" and went away; a day on, the hub's
    prune forgot the call, and the person's kill counted as of a plan never dispatched:
    HELD + 1 KillPlans of made-up plans (none dispatched) dropped it first, nothing kept
    apart, no stop owed, and the worker back ran the plan. The day passing is the hub's
    own prune with its clock a day on."""
    hub_home = tmp_path / "home"

    async def go() -> None:
        async with driven_hub(hub_home) as hub:
            store = hub.store
            worker = await hub.real_worker()
            (worker_id,) = hub.sessions
            assert await hub.caller.code(worker_id, "victim") == "ok"
            await stop_worker(worker)
            await hub.until(lambda: not hub.sessions)
            day_on = now_ms() + store_module.CALLS_KEPT_MS + 3_600_000
            assert await store.prune_off_loop(now=day_on) == 1
            assert (await hub.caller.kill("victim")).queued_worker_ids
            for n in range(HELD + 1):
                await hub.caller.kill(f"made-up-{n}")
            await hub.real_worker()
            await hub.until_confirmed(worker_id)
            assert await hub.caller.code(worker_id, "victim") == "plan_killed"
            assert await hub.caller.code(worker_id, "never-killed") == "ok"

    asyncio.run(go())


async def _away_then_flooded(hub: DrivenHub) -> str:
    """A real worker ran a call of "victim", went away, and the person killed the plan;
    then HELD + 5 kills of made-up plans, each in use (its call refused for the kill).
    The worker's id."""
    worker = await hub.real_worker()
    (worker_id,) = hub.sessions
    assert await hub.caller.code(worker_id, "victim") == "ok"
    await stop_worker(worker)
    await hub.until(lambda: not hub.sessions)
    assert list((await hub.caller.kill("victim")).queued_worker_ids) == [worker_id]
    for n in range(HELD + 5):
        await hub.caller.kill(f"in-use-{n}")
        assert await hub.caller.code(worker_id, f"in-use-{n}") == "plan_killed"
    return worker_id


def _kept_apart_at(home: Path, plan: str) -> bool:
    """Whether the worker of `home` keeps a kill of the plan apart, by digest."""
    with sqlite3.connect(home / "state.db") as db:
        row = db.execute(
            "SELECT 1 FROM kills_apart WHERE digest = ?", (plan_digest(plan),)
        ).fetchone()
    return row is not None


def test_an_older_worker_is_sent_a_stop_of_every_plan_for_a_kill_kept_apart(
    tmp_path: Path,
) -> None:
    """A worker that cannot read a kill by digest (protocol before 4) is sent a kill of
    every plan in its place, numbered as the kill was: it fails closed."""
    home = tmp_path / "home"

    async def go() -> None:
        async with driven_hub(home) as hub:
            old = hub.hand()
            # Its next Hello says so (the first went with the stream as it opened).
            old.hello.protocol_max = DIGEST_KILL_PROTOCOL - 1
            await old.until("welcome")
            await hub.gone(old)
            for n in range(HELD + 5):
                await hub.caller.kill(f"in-use-{n}")
                assert hub.store.killed(f"in-use-{n}", "elsewhere", 0)  # in use
            apart = [k.seq for k in hub.store.kills_after(old.worker_id, 0) if not k.plan_id]
            assert apart
            sent = await hub.back(old).until("kill_plan", HELD + 5)
            stand_ins = [k for k in sent if k.seq in apart]
            assert [k.plan_id for k in stand_ins] == [ALL_PLANS] * len(apart)
            assert not any(k.plan_digest for k in sent)

    asyncio.run(go())


def test_past_kills_apart_a_worker_away_is_owed_a_stop_of_every_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past KILLS_APART (none here) the person's kill owed to the worker away goes: the
    worker, back, records the hub's kill of every plan ahead of the rest, and the killed
    plan's call is refused, as is any other, until the person lifts '*' there."""
    monkeypatch.setattr(store_module, "KILLS_APART", 0)
    hub_home = home = tmp_path / "home"

    async def go() -> None:
        async with driven_hub(hub_home) as hub:
            worker_id = await _away_then_flooded(hub)
            owed = [k.plan_id for k in hub.store.kills_after(worker_id, 0)]
            assert "victim" not in owed and ALL_PLANS in owed
            assert _kill_rows(hub_home) <= HELD + 1

            worker = await hub.real_worker()
            while _killed_at(home, ALL_PLANS) is None:
                assert worker.running(), worker.log()
                await asyncio.sleep(0.05)  # the worker records it in its state.db
            assert _killed_at(home, ALL_PLANS) == "server"
            await hub.until_confirmed(worker_id)  # the numbered stop came too
            assert await hub.caller.code(worker_id, "victim") == "plan_killed"
            assert await hub.caller.code(worker_id, "never-killed") == "plan_killed"
            # The person lifts the stop at the worker (`agentworker lift '*'`).
            await asyncio.to_thread(lift, home, ALL_PLANS)
            assert await hub.caller.code(worker_id, "never-killed") == "ok"

    asyncio.run(go())
