"""A kill goes to every connected worker without waking the idle ones' readers
(review16 F8). A reader waiting for a later-read turn was woken by every message sent
its way but a heartbeat, to look again whether the hub expected an answer; a kill asks
none (its confirmation comes in a heartbeat, read in turns), so each woken reader only
withdrew from the turns' queue and asked again: with 1,000 idle workers a KillPlan
took 77 ms of the hub's loop (31 ms now) and another caller's Status waited 1.1 s.

A real hub (worker.app.start_hub) in the test's loop; the workers are hand-driven
streams (the far side) that said Hello and then nothing, so all but the turns' two
wait for a turn to be read."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.hub_inproc import HandWorker, caller_metadata, hub_in_process, own_channel
from worker.core.ledger import ALL_PLANS
from worker.hub import store as store_module
from worker.hub.reads import LATER_READS_AT_ONCE
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.proto import agentworker_pb2_grpc as pb_grpc

IDLE = 6


def test_a_kill_reaches_every_idle_worker_and_wakes_none_of_their_readers(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"

    async def go() -> None:
        async with hub_in_process(home) as running:
            hub = running.hub
            hub.later_reads.silent_s = 3600.0  # no turn is given up while the test looks
            hands = [HandWorker(running.address, home) for _ in range(IDLE)]
            channel = own_channel(running.address)
            try:
                for hand in hands:
                    await hand.until("welcome")
                turns: dict[str, asyncio.Future[bool]] = {}
                while len(turns) < IDLE - LATER_READS_AT_ONCE:
                    await asyncio.sleep(0.02)  # the hub runs in this loop
                    turns = {w: s.waiting for w, s in hub.sessions.items() if s.waiting}
                reply = await pb_grpc.ControlServiceStub(channel).KillPlan(
                    pb.KillPlanRequest(plan_id="stopped", reason="stop"),
                    metadata=caller_metadata(home),
                    timeout=60,
                )
                assert sorted(reply.worker_ids) == sorted(h.worker_id for h in hands)
                for hand in hands:
                    (kill,) = await hand.until("kill_plan")
                    assert kill.plan_id == "stopped"
                woken = [w for w, turn in turns.items() if turn.done()]
                assert not woken, f"{len(woken)} of {len(turns)} waiting readers woken"
                assert {w: hub.sessions[w].waiting for w in turns} == turns
            finally:
                await channel.close()
                for hand in hands:
                    await hand.close()

    asyncio.run(go())


def test_a_stop_a_kill_made_owed_reaches_a_connected_worker_after_that_kill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connected worker that has not confirmed kills past store.KILLS_HELD is owed a
    kill of every plan, numbered after the kill that made it owed; sent before that
    kill, its seq passed the kill's, and the worker took the kill as recorded before and
    lifted since (review17's report)."""
    monkeypatch.setattr(store_module, "KILLS_HELD", 3)
    monkeypatch.setattr(store_module, "KILLS_APART", 0)  # each kill dropped owes the stop
    home = tmp_path / "home"

    async def go() -> None:
        async with hub_in_process(home) as running:
            worker = HandWorker(running.address, home)  # confirms nothing
            channel = own_channel(running.address)
            stub = pb_grpc.ControlServiceStub(channel)
            try:
                await worker.until("welcome")
                for n in range(6):
                    await stub.KillPlan(
                        pb.KillPlanRequest(plan_id=f"p{n}", reason="stop"),
                        metadata=caller_metadata(home),
                        timeout=60,
                    )
                    # In use (a call refused for the kill; the hub runs in this loop):
                    # the drop of a kill of a plan never in use owes no stop.
                    assert running.hub.store.killed(f"p{n}", "elsewhere", 0)
                kills = await worker.until("kill_plan", 7)  # six, and one stop
                seqs = [k.seq for k in kills]
                assert seqs == sorted(seqs), [(k.plan_id, k.seq) for k in kills]
                assert ALL_PLANS in [k.plan_id for k in kills]
            finally:
                await channel.close()
                await worker.close()

    asyncio.run(go())
