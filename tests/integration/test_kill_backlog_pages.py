"""The hub sends a worker its backlog of kills a page at a time, the next once the
worker confirmed the page: a stream that says Hello and never confirms holds one page
of it, not the whole backlog (review14 finding 06: every Hello queued up to 1,000 kills,
4 MiB, and 200 Hellos that never read held 839 MiB of the hub's memory). A kill made
meanwhile comes in its turn, after the backlog, and a real worker still records every
kill. Reasons are kept in UTF-8 bytes.

A real hub (worker.app.start_hub) in the test's loop; a worker stream the test drives
(HandWorker), and a real worker process, over loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.support.hub_inproc import (
    HandWorker,
    caller_metadata,
    driven_hub,
    hub_in_process,
    own_channel,
    probe_request,
)
from worker.hub.server import KILL_PAGE, KILL_PAGE_BYTES
from worker.hub.store import KILL_REASON_BYTES
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.proto import agentworker_pb2_grpc as pb_grpc

KILLS = 150
REASON = "\N{GRINNING FACE}" * 1000  # 4,000 bytes: kept as 512


def plan(n: int) -> str:
    return f"{n:05d}-" + "p" * 194


async def kill_all(stub: pb_grpc.ControlServiceStub, home: Path) -> None:
    for n in range(KILLS):
        await stub.KillPlan(
            pb.KillPlanRequest(plan_id=plan(n), reason=REASON),
            metadata=caller_metadata(home),
            timeout=60,
        )


async def until_sent_before(hand: HandWorker, stub: pb_grpc.ControlServiceStub, home: Path) -> int:
    """How many kills the hub had queued to `hand` before a call sent now: the call goes
    behind them (its request is the barrier)."""
    asked = len(hand.received.get("request", []))
    call = asyncio.ensure_future(
        stub.Dispatch(probe_request(hand.worker_id), metadata=caller_metadata(home), timeout=120)
    )
    await hand.until("request", asked + 1)
    call.cancel()
    return len(hand.received.get("kill_plan", []))


def test_the_kill_backlog_goes_a_page_at_a_time_as_the_worker_confirms(tmp_path: Path) -> None:
    home = tmp_path / "hub"

    async def go() -> None:
        async with hub_in_process(home) as running:
            channel = own_channel(running.address)
            stub = pb_grpc.ControlServiceStub(channel)
            await kill_all(stub, home)
            hand = HandWorker(running.address, home)
            try:
                await hand.until("welcome")
                first = await until_sent_before(hand, stub, home)
                kills = hand.received["kill_plan"]
                size = sum(len(k.plan_id.encode()) + len(k.reason.encode()) for k in kills)
                assert 0 < first <= KILL_PAGE and size <= KILL_PAGE_BYTES, (first, size)
                assert all(len(k.reason.encode()) == KILL_REASON_BYTES for k in kills)
                # Unconfirmed: nothing more came, for as long as it does not confirm.
                hand.send(pb.WorkerMessage(heartbeat=pb.Heartbeat(kills_through=0)))
                assert await until_sent_before(hand, stub, home) == first
                # A kill made now comes in its turn, after the backlog.
                await stub.KillPlan(
                    pb.KillPlanRequest(plan_id="late", reason="now"),
                    metadata=caller_metadata(home),
                    timeout=60,
                )
                while (got := len(hand.received["kill_plan"])) < KILLS + 1:
                    last = hand.received["kill_plan"][-1].seq
                    hand.send(pb.WorkerMessage(heartbeat=pb.Heartbeat(kills_through=last)))
                    await hand.until("kill_plan", got + 1)
                seqs = [k.seq for k in hand.received["kill_plan"]]
                assert seqs == sorted(seqs) and len(set(seqs)) == KILLS + 1
                assert hand.received["kill_plan"][-1].plan_id == "late"
            finally:
                await hand.close()
                await channel.close()

    asyncio.run(go())


def test_a_real_worker_records_a_backlog_of_many_pages(tmp_path: Path) -> None:
    home = tmp_path / "hub"

    async def go() -> None:
        async with driven_hub(home) as hub:
            await kill_all(hub.caller.stub, home)
            await hub.real_worker()
            (worker_id,) = hub.sessions
            await hub.until_confirmed(worker_id)
            for n in (0, KILLS - 1):
                code = await hub.caller.outcome(probe_request(worker_id, plan(n)))
                assert code.startswith("plan_killed") and "at this hub" not in code, code

    asyncio.run(go())
