"""A flood of ScopeRequests (review2 finding 06): each is a question on the person's
screen, so the worker keeps at most MAX_WAITING_SCOPE_REQUESTS waiting (and at most
MAX_WAITING_PER_AGENT of one agent's) and answers the rest "busy" at once, keeps only
what a prompt shows of a reason and a preview, and the hub relays at most
SCOPE_REQUESTS_PER_WORKER at a time to one worker (SCOPE_REQUESTS_PER_AGENT of one
agent's)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.integration.test_stream_rules import error_code, play
from tests.integration.test_worker_trust import Rogue
from tests.support.cluster import cluster
from tests.support.scripted_hub import ScriptedHub
from worker.core.approvals import (
    MAX_PROMPTS_PER_AGENT,
    MAX_PROMPTS_WAITING,
    MAX_WAITING_PER_AGENT,
    MAX_WAITING_SCOPE_REQUESTS,
    PREVIEW_LIMIT,
    ApprovalBroker,
    Choice,
    Decision,
)
from worker.core.connection import WorkerConnection
from worker.hub.client import ControlClient
from worker.hub.server import (
    SCOPE_PREVIEW_CHARS,
    SCOPE_REQUESTS_PER_AGENT,
    SCOPE_REQUESTS_PER_WORKER,
)
from worker.wire.proto import agentworker_pb2 as pb

PREVIEW = "p" * (256 * 1024)
EXTRA = 8
AGENTS = 8  # the flood's agents: none of them past its own bound


def test_the_worker_keeps_a_bounded_number_of_scope_requests_cut_to_what_is_shown(
    tmp_path: Path,
) -> None:
    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        state = link.dispatcher
        broker = ApprovalBroker(state.state, state.telemetry, always_attached=True)
        link.answer_scopes = broker.scope_request
        for n in range(MAX_WAITING_SCOPE_REQUESTS + EXTRA):
            asked = pb.ScopeRequest(
                request_id=f"s{n}",
                agent_id=f"flood-{n % AGENTS}",
                plan_id="p",
                scopes=["workerHost.fs_write"],
                reason=f"{n} " + "r" * 10_000,
                preview=PREVIEW,
            )
            hub.send(scope_request=asked)
        # The ones past the bound are answered at once, the others wait for the person.
        busy = [await hub.next("scope_decision") for _ in range(EXTRA)]
        assert {d.request_id for d in busy} == {
            f"s{n}" for n in range(MAX_WAITING_SCOPE_REQUESTS, MAX_WAITING_SCOPE_REQUESTS + EXTRA)
        }
        assert all(not d.granted and d.reason.startswith("busy: ") for d in busy), busy[0]
        prompts = broker.pending()
        assert len(prompts) == broker.waiting() == MAX_WAITING_SCOPE_REQUESTS
        kept = prompts[0]
        assert len(kept.preview) == PREVIEW_LIMIT and len(kept.reason) == 500
        shown = kept.to_dict()
        assert shown["preview"].endswith(f" … (+{len(PREVIEW) - PREVIEW_LIMIT:,} chars)")
        assert shown["reason"].endswith(f" … (+{10_002 - 500:,} chars)")
        hub.request("after", "{}")  # the stream goes on
        assert error_code(await hub.next("result")) == "ok"
        # An answer frees a place: the next request waits again.
        broker.decide(kept.id, Decision(Choice.DENY))
        denied = await hub.next("scope_decision")
        assert denied.request_id == "s0" and not denied.granted
        hub.send(scope_request=pb.ScopeRequest(request_id="again", scopes=["workerHost.fs_read"]))
        hub.request("after-2", "{}")
        assert error_code(await hub.next("result")) == "ok"
        assert broker.waiting() == MAX_WAITING_SCOPE_REQUESTS
        broker.close_all("the test ends")

    play(tmp_path, scenario)


def test_one_agent_cannot_take_every_place_for_scope_requests(tmp_path: Path) -> None:
    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        state = link.dispatcher
        broker = ApprovalBroker(state.state, state.telemetry, always_attached=True)
        link.answer_scopes = broker.scope_request
        for n in range(MAX_WAITING_PER_AGENT + 2):
            asked = pb.ScopeRequest(
                request_id=f"m{n}", agent_id="mallory", plan_id=f"p{n}", scopes=["workerHost.exec"]
            )
            hub.send(scope_request=asked)
        busy = [await hub.next("scope_decision") for _ in range(2)]
        assert {d.request_id for d in busy} == {
            f"m{MAX_WAITING_PER_AGENT}",
            f"m{MAX_WAITING_PER_AGENT + 1}",
        }
        assert all(d.reason.startswith("busy: ") and "'mallory'" in d.reason for d in busy)
        alice = pb.ScopeRequest(request_id="a0", agent_id="alice", scopes=["workerHost.fs_read"])
        hub.send(scope_request=alice)
        hub.request("after", "{}")  # in order: alice's request was taken before this
        assert error_code(await hub.next("result")) == "ok"
        assert broker.waiting() == MAX_WAITING_PER_AGENT + 1, "alice's waits for the person"
        assert {p.agent_id for p in broker.pending()} == {"mallory", "alice"}
        broker.close_all("the test ends")

    play(tmp_path, scenario)


def test_the_hub_relays_a_bounded_number_of_scope_requests_per_worker(tmp_path: Path) -> None:
    with cluster(tmp_path / "hub", worker=False) as live:

        async def scenario() -> None:
            slow = Rogue(live)  # a worker whose person never answers
            await slow.welcomed.wait()
            client = ControlClient.connect(live.listen, live.token)

            def ask(n: int, preview: str = "", agent: str = "") -> Any:
                request = pb.RequestScopeRequest(
                    worker_id=slow.worker_id,
                    agent_id=agent or f"flood-{n % 8}",
                    scopes=["workerHost.fs_write"],
                    reason=f"ask {n}",
                    preview=preview,
                    timeout_ms=60_000,
                )
                return client.stub.RequestScope(request, metadata=client.metadata)

            try:
                large = await asyncio.wait_for(ask(-2, "x" * (SCOPE_PREVIEW_CHARS + 1)), 10)
                assert not large.granted and large.reason.startswith("too_large: "), large
                waiting = [
                    asyncio.ensure_future(ask(n))
                    for n in range(SCOPE_REQUESTS_PER_WORKER - SCOPE_REQUESTS_PER_AGENT - 1)
                ]
                waiting += [
                    asyncio.ensure_future(ask(n, agent="mallory"))
                    for n in range(SCOPE_REQUESTS_PER_AGENT)
                ]
                while len(slow.scope_requests) < len(waiting):
                    slow.asked.clear()
                    await asyncio.wait_for(slow.asked.wait(), 20)
                theirs = await asyncio.wait_for(ask(-3, agent="mallory"), 10)
                assert not theirs.granted and "of agent 'mallory'" in theirs.reason, theirs
                waiting.append(asyncio.ensure_future(ask(-4, agent="alice")))
                while len(slow.scope_requests) < SCOPE_REQUESTS_PER_WORKER:
                    slow.asked.clear()
                    await asyncio.wait_for(slow.asked.wait(), 20)
                over = await asyncio.wait_for(ask(-1, agent="alice"), 10)
                assert not over.granted and over.reason.startswith("busy: "), over
                assert "at worker" in over.reason and "of agent" not in over.reason, over
                assert len(slow.scope_requests) == SCOPE_REQUESTS_PER_WORKER
                for pending in waiting:
                    pending.cancel()
            finally:
                await client.close()
                await slow.close()

        asyncio.run(scenario())


def test_one_agent_cannot_take_every_prompt_with_calls_out_of_its_scopes(tmp_path: Path) -> None:
    """review27 I4: each distinct out-of-scope call (a plan each) opened a prompt of its
    own, one at a time on the person's screen, so one agent's flood pushed another
    agent's prompt past its timeout. Past MAX_PROMPTS_PER_AGENT an agent's call is
    answered `busy` at once; other agents still ask."""

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        state = link.dispatcher
        broker = ApprovalBroker(state.state, state.telemetry, always_attached=True)
        state.scopes.approver = broker
        stat = {"surface": "workerHost", "action": "fs_stat"}
        for n in range(MAX_PROMPTS_PER_AGENT + 2):
            hub.request(f"m{n}", '{"path": "."}', agent_id="mallory", plan_id=f"p{n}", **stat)
        busy = [await hub.next("result") for _ in range(2)]
        assert {r.correlation_id for r in busy} == {
            f"m{MAX_PROMPTS_PER_AGENT}",
            f"m{MAX_PROMPTS_PER_AGENT + 1}",
        }
        assert all(error_code(r) == "busy" and "'mallory'" in r.error.message for r in busy)
        hub.request("a0", '{"path": "."}', agent_id="alice", plan_id="pa", **stat)
        await prompted(broker, lambda: any(p.agent_id == "alice" for p in broker.pending()))
        assert broker.waiting() == MAX_PROMPTS_PER_AGENT + 1
        # An answer frees a place: mallory's next call waits for the person again.
        first = next(p for p in broker.pending() if p.agent_id == "mallory")
        broker.decide(first.id, Decision(Choice.DENY))
        assert error_code(await hub.next("result")) == "scope_denied"
        hub.request("m-again", '{"path": "."}', agent_id="mallory", plan_id="p-again", **stat)
        await prompted(broker, lambda: any(p.plan_id == "p-again" for p in broker.pending()))
        broker.close_all("the test ends")
        for _ in range(MAX_PROMPTS_PER_AGENT + 1):
            assert error_code(await hub.next("result")) != "ok"

    play(tmp_path, scenario)


def test_calls_naming_a_new_agent_each_cannot_take_every_prompt(tmp_path: Path) -> None:
    """review28 L1: the per-agent bound is keyed by the agent the call names, the
    server's word, so a holder of hub.token naming a new agent for each call opened a
    prompt for each, past every bound. Past MAX_PROMPTS_WAITING calls' prompts in all a
    call is answered `busy` at once, whatever agent it names; the prompts waiting stay,
    and an answer frees a place."""

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        state = link.dispatcher
        broker = ApprovalBroker(state.state, state.telemetry, always_attached=True)
        state.scopes.approver = broker
        stat = {"surface": "workerHost", "action": "fs_stat"}
        for n in range(MAX_PROMPTS_WAITING + 2):
            hub.request(f"c{n}", '{"path": "."}', agent_id=f"made-up-{n}", plan_id="p", **stat)
        async with asyncio.timeout(60):  # a hang's bound: they are answered at once
            busy = [await hub.next("result") for _ in range(2)]
        assert {r.correlation_id for r in busy} == {
            f"c{MAX_PROMPTS_WAITING}",
            f"c{MAX_PROMPTS_WAITING + 1}",
        }
        assert all(error_code(r) == "busy" and "whichever agents" in r.error.message for r in busy)
        assert broker.waiting() == MAX_PROMPTS_WAITING
        first = broker.pending()[0]
        broker.decide(first.id, Decision(Choice.DENY))
        assert error_code(await hub.next("result")) == "scope_denied"
        hub.request("alice-1", '{"path": "."}', agent_id="alice", plan_id="pa", **stat)
        await prompted(broker, lambda: any(p.agent_id == "alice" for p in broker.pending()))
        broker.close_all("the test ends")
        for _ in range(MAX_PROMPTS_WAITING):
            assert error_code(await hub.next("result")) != "ok"

    play(tmp_path, scenario)


async def prompted(broker: ApprovalBroker, ready: Any) -> None:
    """Until `ready()` holds, woken by the broker's prompt events."""
    changed = asyncio.Event()
    broker.listeners.append(lambda _kind, _body: changed.set())
    async with asyncio.timeout(10):
        while not ready():
            await changed.wait()
            changed.clear()
