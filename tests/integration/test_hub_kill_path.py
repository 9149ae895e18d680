"""A KillPlan through the hub is read on turns of its own, apart from every other
method's (Status has its own too): callers holding the other methods' turns with
requests that do not come (sent a byte at a time, or never) do not hold it up, nor does
a flood of Status and ListWorkers calls, nor one connection holding its own KillPlans
back. A real hub (worker.app.start_hub) in the test's loop; its read deadlines are made
long, so that only the turns decide; the slow callers are driven by hand, the worker by
hand or a real worker process."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

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
from worker.hub import reads as read_bounds
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.proto import agentworker_pb2_grpc as pb_grpc

CONTROL = "/agentworker.v1.ControlService/"


def test_a_kill_is_not_held_up_by_slow_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(read_bounds, "CONTROL_READ_WITHIN_S", {})
    monkeypatch.setattr(read_bounds, "CONTROL_READ_WITHIN_S_OTHERWISE", 3600.0)
    home = tmp_path / "home"

    async def go() -> None:
        async with hub_in_process(home) as running:
            metadata = caller_metadata(home)
            worker = HandWorker(running.address, home)
            await worker.until("welcome")
            # Two slow callers, each on its connection: a ListWorkers each (every turn of
            # the other methods), and one of them two KillPlans, which arrive later.
            slow = [own_channel(running.address) for _ in range(2)]
            held = [c.stream_stream(CONTROL + "ListWorkers")(metadata=metadata) for c in slow]
            kills = [slow[0].stream_stream(CONTROL + "KillPlan")(metadata=metadata) for _ in "ab"]
            others, kill_turns = running.hub.reads[""], running.hub.reads["KillPlan"]
            while others.held() < others.slots or kill_turns.held() + kill_turns.waiting() < 2:
                await asyncio.sleep(0.01)  # the hub runs in this loop
            assert kill_turns.held() == 1, "one connection holds one of KillPlan's turns"
            # The person's kill, on a connection of its own, reaches the worker.
            person = own_channel(running.address)
            stub = pb_grpc.ControlServiceStub(person)
            kill = pb.KillPlanRequest(plan_id="p-slow", reason="stop")
            told = await stub.KillPlan(kill, metadata=metadata, timeout=60)
            assert list(told.worker_ids) == [worker.worker_id]
            async with asyncio.timeout(60):
                (killed,) = await worker.until("kill_plan")
            assert killed.plan_id == "p-slow"
            status = await stub.Status(pb.StatusRequest(), metadata=metadata, timeout=60)
            assert status.connected_workers == 1
            # The slow ones held their turns all along, and are read in turn.
            assert not any(call.done() for call in [*held, *kills])
            for call in held:
                await call.write(pb.ListWorkersRequest().SerializeToString())
                reply = pb.ListWorkersResponse.FromString(await call.read())
                assert [w.worker_id for w in reply.workers] == [worker.worker_id]
            for plan, call in zip("ab", kills, strict=True):  # whichever holds the turn
                await call.write(pb.KillPlanRequest(plan_id=f"p-{plan}").SerializeToString())
            for call in kills:
                assert pb.KillPlanResponse.FromString(await call.read()).worker_ids
                assert await call.code() == grpc.StatusCode.OK
            await worker.until("kill_plan", 3)
            await worker.close()
            for channel in [*slow, person]:
                await channel.close()

    asyncio.run(go())


def test_a_flood_of_status_and_list_workers_does_not_hold_up_a_kill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review9 finding 05: Status calls whose requests never came held KillPlan's turns
    (they shared them), 5 s a pair, in turn, for as long as more came."""
    monkeypatch.setattr(read_bounds, "CONTROL_READ_WITHIN_S", {})
    monkeypatch.setattr(read_bounds, "CONTROL_READ_WITHIN_S_OTHERWISE", 3600.0)
    home = tmp_path / "home"

    async def go() -> None:
        async with hub_in_process(home) as running:
            worker = real_worker(home, running.address)
            flood = [own_channel(running.address) for _ in range(8)]
            person = own_channel(running.address)
            try:
                (worker_id,) = await until_connected(running, worker)
                metadata = caller_metadata(home)
                # The flood, from 8 connections: 25 Status and 25 ListWorkers calls each
                # whose requests never come (every turn of theirs is held), then 25 Status
                # calls each sent whole, waiting behind them.
                reads = running.hub.reads
                status_turns, other_turns = (
                    reads[read_bounds.CONTROL_READ_KIND["Status"]],
                    reads[""],
                )
                slots = status_turns.slots + other_turns.slots

                async def until_waiting(count: int) -> None:
                    while (
                        status_turns.held() + other_turns.held() < slots
                        or status_turns.waiting() + other_turns.waiting() < count - slots
                    ):
                        await asyncio.sleep(0.01)  # the hub runs in this loop

                stalled = [
                    channel.stream_stream(CONTROL + method)(metadata=metadata)
                    for channel in flood
                    for method in ("Status", "ListWorkers")
                    for _ in range(25)
                ]
                await until_waiting(len(stalled))
                whole = [
                    asyncio.ensure_future(
                        pb_grpc.ControlServiceStub(channel).Status(
                            pb.StatusRequest(), metadata=metadata
                        )
                    )
                    for channel in flood
                    for _ in range(25)
                ]
                calls = len(stalled) + len(whole)
                await until_waiting(calls)
                # The person's kill, on a connection of its own, is answered and reaches
                # the worker while the flood still holds and waits.
                stub = pb_grpc.ControlServiceStub(person)
                kill = pb.KillPlanRequest(plan_id="p-flood", reason="stop")
                told = await stub.KillPlan(kill, metadata=metadata, timeout=60)
                assert list(told.worker_ids) == [worker_id]
                assert status_turns.waiting() + other_turns.waiting() == calls - slots
                assert not any(call.done() for call in [*stalled, *whole])
                call = probe_request(worker_id, "p-flood")
                reply = await stub.Dispatch(call, metadata=metadata, timeout=60)
                assert reply.result.error.code == "plan_killed", reply.result
                for stalled_call in stalled:
                    stalled_call.cancel()
                for waiting in whole:
                    waiting.cancel()
            finally:
                for channel in [*flood, person]:
                    await channel.close()
                await stop_worker(worker)

    asyncio.run(go())
