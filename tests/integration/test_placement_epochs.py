"""A placement token proves one creation of a plan (worker.hub.epochs): a worker once
given plan P cannot claim a new plan P made after P was torn down (review26, the
neighbour of H5). A real hub in this loop, hand-driven sandbox worker streams."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

from tests.support.hub_inproc import DrivenHub, HandWorker, driven_hub, hand_hello
from worker.wire.proto import agentworker_pb2 as pb

ACTIONS = ["workbenchHost.fs_stat", "workbenchHost.teardown"]


def sandbox_hello(worker_id: str, plans: list[pb.HeldPlan] | None = None) -> pb.Hello:
    return hand_hello(
        worker_id,
        surfaces=["workbenchHost"],
        actions=ACTIONS,
        max_concurrency=4,
        plans=plans or [],
    )


def stat(plan: str) -> pb.DispatchRequest:
    return pb.DispatchRequest(
        correlation_id=uuid.uuid4().hex,
        agent_id="tester",
        plan_id=plan,
        surface="workbenchHost",
        action="fs_stat",
        args_json='{"path": "."}',
    )


def ok(correlation_id: str, answer: dict[str, object]) -> pb.WorkerMessage:
    return pb.WorkerMessage(
        result=pb.ActionResult(
            correlation_id=correlation_id,
            status=pb.ActionResult.OK,
            result_json=json.dumps(answer),
        )
    )


async def served_call(hub: DrivenHub, worker: HandWorker, plan: str) -> pb.ActionRequest:
    """A call of `plan`, answered by `worker` (it must be where the hub sends it)."""
    reply = asyncio.ensure_future(hub.caller.outcome(stat(plan)))
    count = len(worker.received.get("request", []))
    request: pb.ActionRequest = (await worker.until("request", count + 1))[-1]
    worker.send(ok(request.correlation_id, {"who": worker.worker_id}))
    assert await reply == "ok"
    return request


async def torn_down(hub: DrivenHub, worker: HandWorker, plan: str) -> None:
    reply = asyncio.ensure_future(
        hub.caller.stub.Teardown(
            pb.TeardownRequest(plan_id=plan), metadata=hub.caller.metadata, timeout=60
        )
    )
    teardown: pb.Teardown = (await worker.until("teardown"))[-1]
    worker.send(ok(teardown.correlation_id, {"plan_id": plan, "removed": True}))
    assert (await reply).result.status == pb.ActionResult.OK


def held(plan: str, token: str) -> pb.HeldPlan:
    return pb.HeldPlan(
        plan_id=plan, last_used_unix_ms=int(time.time() * 1000), placement_token=token
    )


def test_a_torn_down_plans_token_claims_no_new_plan_of_its_id(tmp_path: Path) -> None:
    """Plan P is placed on worker old-1, which keeps P's token; P is torn down. old-1
    says Hello again (same id, same key) claiming P with that token before a new P's
    first call: the claim is ignored, and the new P is placed by the hub (before: the
    token proved P for ever, and the new P's calls went to old-1)."""

    async def go() -> None:
        async with driven_hub(tmp_path / "hub") as hub:
            key = uuid.uuid4().hex
            old = await hub.welcomed(hello=sandbox_hello("old-1"), key=key)
            token = (await served_call(hub, old, "deploy")).placement_token
            assert token
            await torn_down(hub, old, "deploy")
            await hub.gone(old)
            assert "deploy" not in hub.hub.placements.by_plan
            back = await hub.welcomed(
                hello=sandbox_hello("old-1", [held("deploy", token)]), key=key
            )
            assert "deploy" not in hub.hub.placements.by_plan
            await hub.gone(back)
            fresh = await hub.welcomed(hello=sandbox_hello("fresh-1"))
            request = await served_call(hub, fresh, "deploy")
            assert request.placement_token != token

    asyncio.run(go())


def test_a_token_still_proves_its_plan_to_a_hub_that_lost_its_record(tmp_path: Path) -> None:
    """What tokens are for stays: with the hub's record of P gone (hub.db lost; here its
    placement removed) and no teardown, the worker's claim with P's token places P back
    on it, and the calls after bring the same token."""

    async def go() -> None:
        async with driven_hub(tmp_path / "hub") as hub:
            key = uuid.uuid4().hex
            first = await hub.welcomed(hello=sandbox_hello("w-1"), key=key)
            token = (await served_call(hub, first, "deploy")).placement_token
            await hub.gone(first)
            hub.hub.placements.unplace("deploy")  # the record lost
            back = await hub.welcomed(hello=sandbox_hello("w-1", [held("deploy", token)]), key=key)
            assert hub.hub.placements.by_plan.get("deploy") == "w-1"
            assert (await served_call(hub, back, "deploy")).placement_token == token

    asyncio.run(go())


def test_teardowns_of_plans_never_placed_are_kept_under_a_bound(tmp_path: Path) -> None:
    """review28 L5: a Teardown of a plan id no one used added a `plans_ended` row, kept 30
    days with no bound on the count (2,000 rows in 47 s from one caller). Now those rows
    are kept under a bound of their own, the latest ones; a teardown of a plan placed
    here stays whatever comes after, and its old token still claims nothing."""

    async def go() -> None:
        async with driven_hub(tmp_path / "hub") as hub:
            ended = hub.hub.store.ended_plans
            ended.unplaced_kept = 8
            key = uuid.uuid4().hex
            old = await hub.welcomed(hello=sandbox_hello("old-1"), key=key)
            token = (await served_call(hub, old, "deploy")).placement_token
            await torn_down(hub, old, "deploy")
            await hub.gone(old)
            for n in range(40):  # no sandbox worker connected: each answered at once
                reply = await hub.caller.stub.Teardown(
                    pb.TeardownRequest(plan_id=f"made-up-{n}"),
                    metadata=hub.caller.metadata,
                    timeout=60,
                )
                assert reply.result.status == pb.ActionResult.OK
            kept = [
                plan for (plan,) in hub.hub.store._db.execute("SELECT plan_id FROM plans_ended")
            ]
            assert sorted(kept) == sorted(["deploy", *(f"made-up-{n}" for n in range(32, 40))])
            back = await hub.welcomed(
                hello=sandbox_hello("old-1", [held("deploy", token)]), key=key
            )
            assert "deploy" not in hub.hub.placements.by_plan
            await hub.gone(back)

    asyncio.run(go())
