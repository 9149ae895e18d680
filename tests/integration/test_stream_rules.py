"""The worker's stream rules, driven by a scripted hub over real loopback gRPC.

The worker here is the real one (dispatcher, ledger, connection) running in the
test's event loop; only the far side — the hub — follows a script.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import release, write_config
from tests.support.http_server import TestServer
from tests.support.scripted_hub import TOKEN, ScriptedHub
from worker import app
from worker.config import Paths, load
from worker.core import connection
from worker.core.connection import Backoff, FatalConnectionError, Target, WorkerConnection
from worker.core.console import encode
from worker.core.ledger import ALL_PLANS, KEPT_RESULT_BYTES, MAX_SERVER_KILLS
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.protocol import plan_digest

MIB = 1024 * 1024

Scenario = Callable[[ScriptedHub, WorkerConnection], Awaitable[None]]


@contextlib.asynccontextmanager
async def linked(
    home: Path, hub: ScriptedHub, settings: dict[str, Any]
) -> AsyncIterator[WorkerConnection]:
    write_config(home, "127.0.0.1:1", **settings)
    paths = Paths(home, home)
    config = load(paths)
    dispatcher = app.build_dispatcher(paths, config)
    asyncio.get_running_loop().set_default_executor(dispatcher.threads)  # as the app does
    address = await hub.start()
    link = WorkerConnection(
        # One server whatever port each start gives it (as `up`'s hub is): what the
        # ledger keeps for a server (held results, its kills) is there after a restart.
        dispatcher,
        Target(address, TOKEN, key="scripted-hub"),
        heartbeat_s=0.2,
        backoff=Backoff(0.05, 0.2),
    )
    runner = asyncio.create_task(link.run())
    try:
        yield link
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError, FatalConnectionError):
            await runner
        await hub.stop()
        dispatcher.close()


def play(
    home: Path, scenario: Scenario, settings: dict[str, Any] | None = None, **hub_options: Any
) -> None:
    async def go() -> None:
        hub = ScriptedHub(**hub_options)
        async with linked(home, hub, settings or {}) as link:
            await asyncio.wait_for(link.connected.wait(), 10)
            await scenario(hub, link)

    asyncio.run(go())


def error_code(result: pb.ActionResult) -> str:
    return result.error.code if result.HasField("error") else "ok"


def test_duplicate_while_running_then_after_done(tmp_path: Path) -> None:
    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        args = '{"hold": "d1", "mark": "dup"}'
        hub.request("d1", args)
        assert (await hub.next("ack")).kind == pb.ActionAck.STARTED
        hub.request("d1", args)
        assert (await hub.next("ack")).kind == pb.ActionAck.DUPLICATE_RUNNING
        release(tmp_path, "d1")
        first = await hub.next("result")
        assert error_code(first) == "ok" and not first.replayed
        hub.request("d1", args)
        assert (await hub.next("ack")).kind == pb.ActionAck.DUPLICATE_DONE
        again = await hub.next("result")
        assert again.replayed and again.result_json == first.result_json
        assert json.loads(first.result_json)["marks"] == 1

    play(tmp_path, scenario)


def test_worker_refuses_a_reused_id_with_other_args(tmp_path: Path) -> None:
    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        hub.request("m1", '{"sleep_ms": 1}')
        await hub.next("result")
        hub.request("m1", '{"sleep_ms": 2}')
        ack = await hub.next("ack")
        while ack.kind != pb.ActionAck.REJECTED_ARGS_MISMATCH:
            ack = await hub.next("ack")
        assert "different arguments" in ack.message

    play(tmp_path, scenario)


def test_cancel_stops_a_running_call(tmp_path: Path) -> None:
    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        hub.request("c1", '{"sleep_ms": 30000}')
        await hub.next("ack")
        hub.send(cancel=pb.Cancel(correlation_id="c1", reason="the plan changed"))
        result = await hub.next("result", timeout=5)
        assert error_code(result) == "cancelled"
        assert "the plan changed" in result.error.message

    play(tmp_path, scenario)


def test_deadline_answers_timeout(tmp_path: Path) -> None:
    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        hub.request("t1", '{"sleep_ms": 30000}', timeout_ms=200)
        result = await hub.next("result", timeout=5)
        assert error_code(result) == "timeout"
        assert result.error.retryable

    play(tmp_path, scenario)


def test_kill_plan_cancels_running_calls_and_refuses_later_ones_durably(tmp_path: Path) -> None:
    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        hub.request("k1", '{"sleep_ms": 30000}', plan_id="plan-a")
        hub.request("k2", '{"sleep_ms": 10}', plan_id="plan-b")
        await hub.next("ack")
        hub.send(kill_plan=pb.KillPlan(plan_id="plan-a", reason="the person said stop"))
        results = {}
        while len(results) < 2:
            r = await hub.next("result")
            results[r.correlation_id] = r
        assert error_code(results["k1"]) == "plan_killed"
        assert error_code(results["k2"]) == "ok"
        hub.request("k3", "{}", plan_id="plan-a")
        later = await hub.next("result")
        assert error_code(later) == "plan_killed"
        assert "agentworker lift plan-a" in later.error.message

    play(tmp_path, scenario)

    # A new worker on the same data still refuses the plan: the kill survived the restart.
    async def after_restart(hub: ScriptedHub, link: WorkerConnection) -> None:
        hub.request("k4", "{}", plan_id="plan-a")
        assert error_code(await hub.next("result")) == "plan_killed"

    play(tmp_path, after_restart)


def test_a_kill_of_every_plan_stops_the_running_calls_of_every_plan_at_once(
    tmp_path: Path,
) -> None:
    """A server's kill of '*' (the hub's, for kills it dropped) stops every call running,
    whatever its plan, at once; before, only calls of a plan literally named '*' were
    stopped, the others ran on until the periodic check (which this link does not run)."""

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        hub.request("s1", '{"sleep_ms": 60000}', plan_id="plan-a")
        hub.request("s2", '{"sleep_ms": 60000}', plan_id="plan-b")
        hub.request("s0", '{"sleep_ms": 60000}')  # no plan: review18 F2 spared it
        started: set[str] = set()
        while started != {"s0", "s1", "s2"}:
            started.update((await hub.next("ack")).correlation_ids)
        hub.send(kill_plan=pb.KillPlan(plan_id=ALL_PLANS, reason="kills were dropped"))
        results = {}
        while len(results) < 3:
            r = await hub.next("result", timeout=30)
            results[r.correlation_id] = r
        assert [error_code(results[c]) for c in ("s0", "s1", "s2")] == ["plan_killed"] * 3
        assert "kills were dropped" in results["s1"].error.message
        hub.request("s3", "{}", plan_id="plan-c")
        assert error_code(await hub.next("result")) == "plan_killed"

    play(tmp_path, scenario)


def test_a_kill_by_digest_stops_the_plan_and_binds_across_a_restart_until_lifted(
    tmp_path: Path,
) -> None:
    """A hub that no longer keeps a kill's plan id sends it by digest (KillPlan.plan_digest,
    protocol 4; hub store KILLS_APART): the plan's running call is stopped at once, its
    later calls refused, after a restart too, other plans run, and the person lifts it
    by the plan's id. Before, the hub owed the worker a stop of every plan instead
    (review16 F4)."""

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        hub.request("d1", '{"sleep_ms": 60000}', plan_id="plan-a")
        hub.request("d2", '{"sleep_ms": 60000}', plan_id="plan-b")
        started: set[str] = set()
        while started != {"d1", "d2"}:
            started.update((await hub.next("ack")).correlation_ids)
        hub.send(kill_plan=pb.KillPlan(plan_digest=plan_digest("plan-a"), reason="kept apart"))
        first = await hub.next("result", timeout=30)
        assert (first.correlation_id, error_code(first)) == ("d1", "plan_killed")
        assert "kept apart" in first.error.message
        hub.send(cancel=pb.Cancel(correlation_id="d2", reason="done"))
        assert error_code(await hub.next("result", timeout=30)) == "cancelled"
        assert await _codes_after(hub, ["plan-a", "plan-b"]) == {
            "plan-a": "plan_killed",
            "plan-b": "ok",
        }

    play(tmp_path, scenario)

    async def after_restart(hub: ScriptedHub, link: WorkerConnection) -> None:
        async def answer(correlation_id: str) -> str:
            hub.request(correlation_id, "{}", plan_id="plan-a")
            # Results the last session left unacked come again first: not these.
            while (result := await hub.next("result")).correlation_id != correlation_id:
                pass
            return error_code(result)

        assert await answer("restarted") == "plan_killed"
        assert link.dispatcher.state.lift_kill("plan-a")  # as `agentworker lift plan-a`
        assert await answer("lifted") == "ok"

    play(tmp_path, after_restart)


def _send_kills(hub: ScriptedHub, plans: list[str]) -> None:
    """A server's kills of `plans`, in one envelope."""
    kills = [pb.ServerMessage(kill_plan=pb.KillPlan(plan_id=p, reason="x")) for p in plans]
    hub.send_raw(pb.ServerEnvelope(messages=kills).SerializeToString())


async def _codes_after(hub: ScriptedHub, plans: list[str]) -> dict[str, str]:
    """The error code (or ok) of one call of each plan, sent now."""
    for plan in plans:
        hub.request(f"after-{plan}", "{}", plan_id=plan)
    answers: dict[str, str] = {}
    while len(answers) < len(plans):
        result = await hub.next("result")
        answers[result.correlation_id.removeprefix("after-")] = error_code(result)
    return answers


def test_a_servers_kill_flood_is_bounded_and_reaches_a_ui_one_plan_at_a_time(
    tmp_path: Path,
) -> None:
    """A server's kills of made-up plans are pruned, oldest first, past MAX_SERVER_KILLS
    (the person's kills never); a UI is told of each plan that changed, not the list."""

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        dispatcher = link.dispatcher
        console = app.build_console(
            dispatcher, load(Paths(tmp_path, tmp_path)), server="s", mode="t"
        )
        events: list[dict[str, Any]] = []
        snapshot = console.subscribe(events.append, asks=False)
        assert snapshot["plans"] == []
        hub.send(kill_plan=pb.KillPlan(plan_id="both", reason="the server's"))
        hub.request("sync", "{}", plan_id="other")
        assert error_code(await hub.next("result")) == "ok"  # the kill came before
        assert console.handle({"op": "kill", "plan": "mine"})["ok"]
        assert console.handle({"op": "kill", "plan": "both"})["ok"]  # the person's now
        flood = [f"made-up-{i:05d}" for i in range(MAX_SERVER_KILLS + 50)]
        _send_kills(hub, flood)
        answers = await _codes_after(
            hub, ["mine", "both", flood[0], flood[49], flood[50], flood[-1]]
        )
        assert answers == {
            "mine": "plan_killed",
            "both": "plan_killed",
            flood[0]: "ok",  # pruned: the oldest of the server's kills
            flood[49]: "ok",
            flood[50]: "plan_killed",
            flood[-1]: "plan_killed",
        }
        kills = dispatcher.state.kills()
        assert sum(by == "server" for _, _, by, _, _ in kills) == MAX_SERVER_KILLS
        assert {plan for plan, _, by, _, _ in kills if by != "server"} == {"mine", "both"}
        # Each event is one plan's row; a pruned plan is told gone.
        assert all(event["type"] in ("plan", "call") for event in events)
        assert max(len(encode(event)) for event in events) < 4096
        told = {event["raw"]: event["plan"] for event in events if event["type"] == "plan"}
        assert told["mine"]["state"] == told["both"]["state"] == "killed"
        assert told[flood[0]]["state"] == "idle"  # its call ran, after the kill was pruned
        assert told[flood[-1]]["state"] == "killed"
        assert told[flood[1]] is None  # pruned, never called
        assert len(encode(console.snapshot())) < 2 * MIB

    play(tmp_path, scenario)


def test_a_flood_of_kills_of_made_up_plans_keeps_the_kills_of_plans_in_use(
    tmp_path: Path,
) -> None:
    """review14 finding 02, the worker's half: a server's kill of a plan a call of which
    came here (before the kill, or refused after it) stays when that server then kills
    MAX_SERVER_KILLS + 1 made-up plans; the flood prunes its own oldest."""

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        hub.request("ran", "{}", plan_id="in-use")
        assert error_code(await hub.next("result")) == "ok"
        hub.send(kill_plan=pb.KillPlan(plan_id="in-use", reason="the person's, through the hub"))
        hub.send(kill_plan=pb.KillPlan(plan_id="asked", reason="before its first call"))
        hub.request("refused", "{}", plan_id="asked")
        assert error_code(await hub.next("result")) == "plan_killed"
        hub.send(kill_plan=pb.KillPlan(plan_id="never", reason="never called"))
        flood = [f"made-up-{i:05d}" for i in range(MAX_SERVER_KILLS + 1)]
        _send_kills(hub, flood)
        answers = await _codes_after(
            hub, ["in-use", "asked", "never", flood[2], flood[3], flood[-1]]
        )
        assert answers == {
            "in-use": "plan_killed",
            "asked": "plan_killed",
            # 1,004 kills: the four oldest of plans no call came for are pruned
            "never": "ok",
            flood[2]: "ok",
            flood[3]: "plan_killed",
            flood[-1]: "plan_killed",
        }
        kills = link.dispatcher.state.kills()
        assert sum(by == "server" for _, _, by, _, _ in kills) == MAX_SERVER_KILLS

    play(tmp_path, scenario)


def test_unacked_results_are_resent_after_a_reconnect(tmp_path: Path) -> None:
    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        hub.request("u1", "{}")
        first = await hub.next("result")
        hub.hang_up()
        # The worker dials again; its Hello lists the unacked id and the result comes again.
        again = await hub.next("result")
        assert again.correlation_id == "u1" and again.result_json == first.result_json
        assert "u1" in hub.hellos[-1].unacked_ids

    play(tmp_path, scenario, ack_results=False)


def test_protocol_mismatch_is_fatal(tmp_path: Path) -> None:
    async def go() -> None:
        hub = ScriptedHub(protocol=99)
        write_config(tmp_path, "127.0.0.1:1")
        paths = Paths(tmp_path, tmp_path)
        dispatcher = app.build_dispatcher(paths, load(paths))
        address = await hub.start()
        link = WorkerConnection(dispatcher, Target(address, TOKEN), backoff=Backoff(0.05, 0.2))
        with pytest.raises(FatalConnectionError, match="protocol mismatch"):
            await asyncio.wait_for(link.run(), 10)
        await hub.stop()

    asyncio.run(go())


def test_hello_describes_the_worker(tmp_path: Path) -> None:
    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        hello = hub.hellos[0]
        assert hello.worker_id and hello.instance_id
        assert "workerHost.fs_stat" in hello.actions
        assert hello.max_concurrency == 8
        assert (hello.protocol_min, hello.protocol_max) == (1, 4)  # 4: kills by digest

    play(tmp_path, scenario)


def test_a_server_that_goes_quiet_is_redialled(tmp_path: Path) -> None:
    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        assert len(hub.hellos) == 1
        await hub.dials(2, timeout=5)

    play(tmp_path, scenario, heartbeat_ms=200)


def test_a_flood_past_the_accept_limit_answers_busy_and_runs_nothing(tmp_path: Path) -> None:
    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        for i in range(4):
            hub.request(f"f{i}", '{"hold": "flood", "mark": "flood"}')  # never released
        refused = await hub.next("result", timeout=5)
        assert refused.correlation_id == "f3"
        assert error_code(refused) == "busy" and refused.error.retryable
        assert link.dispatcher.state.running_ids() == ["f0", "f1", "f2"]
        # The refused id was never claimed: delivered again later, it runs.
        for cid in ("f0", "f1", "f2"):
            link.dispatcher.cancel(cid, "test over")

    play(tmp_path, scenario, {"max_concurrency": 1, "max_accepted": 3})


def test_past_its_budget_of_unacked_results_the_worker_runs_no_new_call(tmp_path: Path) -> None:
    """A server that never acks makes the worker keep every result on disk; past
    [worker] max_unacked_mib a new call is refused `busy` without running, and runs
    once the server acks."""

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        half = b"x" * (512 * 1024)
        for cid in ("u1", "u2"):
            hub.request(cid, '{"blob_repeat": 1, "mark": "kept"}', blob=half)
            assert error_code(await hub.next("result")) == "ok"
        hub.request("u3", '{"mark": "kept"}')
        refused = await hub.next("result")
        assert refused.correlation_id == "u3" and error_code(refused) == "busy"
        assert refused.error.retryable and "not acknowledged 1 MiB" in refused.error.message
        hub.send(ack=pb.Ack(correlation_ids=["u1", "u2"]))
        hub.request("u3", '{"mark": "kept"}')
        again = await hub.next("result")
        assert error_code(again) == "ok" and json.loads(again.result_json)["marks"] == 3

    play(tmp_path, scenario, {"max_unacked_mib": 1}, ack_results=False)


def test_a_large_effect_free_result_is_not_kept_past_its_ack_and_a_late_duplicate_says_so(
    tmp_path: Path,
) -> None:
    """Past KEPT_RESULT_BYTES an effect-free result is not written at its ack (issue 12:
    an fs_list of 10,000 entries wrote 1.4 MB on the event loop for each ack, for an
    answer only a late duplicate reads). The duplicate is told the call ran and its
    result is gone (`blob_gone`, as for a blob let go), and runs nothing; one with other
    args is still refused."""
    folder = tmp_path / "workspace" / "many"
    folder.mkdir(parents=True)
    for n in range(800):
        (folder / f"entry-{n:04d}-{'x' * 60}.txt").write_text("x")
    listing = json.dumps({"path": "many"})

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        state = link.dispatcher.state
        hub.request("big", listing, surface="workerHost", action="fs_list")
        first = await hub.next("result")
        assert error_code(first) == "ok" and len(first.result_json) > KEPT_RESULT_BYTES
        while not state.is_acked("big"):  # the hub acks each result as it comes
            await asyncio.sleep(0.01)
        kept = state.connection.execute(
            "SELECT result IS NULL, args_digest != '' FROM calls WHERE correlation_id = 'big'"
        ).fetchone()
        assert kept == (1, 1)
        ran = len(link.dispatcher.telemetry.rows("big"))
        hub.request("big", listing, surface="workerHost", action="fs_list")
        again = await hub.next("result")
        assert error_code(again) == "blob_gone" and again.replayed, again
        assert json.loads(again.error.details_json)["status"] == "ok"
        assert "run the call under a new correlation id" in again.error.message
        assert len(link.dispatcher.telemetry.rows("big")) == ran == 1  # nothing ran again
        hub.request("big", json.dumps({"path": "."}), surface="workerHost", action="fs_list")
        while (ack := await hub.next("ack")).kind != pb.ActionAck.REJECTED_ARGS_MISMATCH:
            assert ack.kind in (pb.ActionAck.STARTED, pb.ActionAck.DUPLICATE_DONE)

    play(tmp_path, scenario)


def test_a_late_duplicate_of_a_fetch_kept_masked_says_so_not_ok(tmp_path: Path) -> None:
    """Once acked, an http_fetch's secrets are kept masked in the ledger (review25 G10).
    A duplicate then (a server that lost its record and sends the id again) was answered
    OK from the ledger with `Set-Cookie: ***` as if the site had sent that (review26
    H7): it answers `blob_gone` now, the masked outcome in details, flagged `masked`."""
    with TestServer() as site:
        fetch = json.dumps({"url": site.url("/login-no-body") + "?secret=SECRETz8Qm"})
        allowed = f'[http]\nallow_hosts = ["127.0.0.1:{site.port}"]\n'

        async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
            state = link.dispatcher.state
            hub.request("f1", fetch, surface="workerHost", action="http_fetch")
            first = await hub.next("result")
            assert error_code(first) == "ok", first
            assert dict(json.loads(first.result_json)["headers"])["X-Auth-Token"] == "SECRETz8Qm"
            while not state.is_acked("f1"):  # the hub acks each result as it comes
                await asyncio.sleep(0.01)
            hub.request("f1", fetch, surface="workerHost", action="http_fetch")
            again = await hub.next("result")
            assert error_code(again) == "blob_gone" and again.replayed, again
            details = json.loads(again.error.details_json)
            assert details["masked"] is True and details["status"] == "ok"
            assert dict(details["result"]["headers"])["X-Auth-Token"] == "***"
            assert "masked" in again.error.message
            assert len(link.dispatcher.telemetry.rows("f1")) == 1  # nothing ran again

        play(tmp_path, scenario, {"extra_config": allowed})


def test_calls_waiting_for_a_slot_when_the_budget_fills_do_not_run(tmp_path: Path) -> None:
    """Accepted in one burst before the unacked results reached their budget, calls
    waiting for a slot are refused `busy` when they get it, unrun and unclaimed."""

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        hub.request("big", '{"hold": "big", "blob_repeat": 2}', blob=b"x" * (512 * 1024))
        assert (await hub.next("ack")).kind == pb.ActionAck.STARTED
        for cid in ("w1", "w2", "w3"):
            hub.request(cid, '{"mark": "waited"}')  # accepted, waiting for the one slot
        release(tmp_path, "big")
        answers = {}
        while len(answers) < 4:
            result = await hub.next("result")
            answers[result.correlation_id] = error_code(result)
        assert answers == {"big": "ok", "w1": "busy", "w2": "busy", "w3": "busy"}
        hub.send(ack=pb.Ack(correlation_ids=["big"]))
        hub.request("w1", '{"mark": "waited"}')
        again = await hub.next("result")
        assert error_code(again) == "ok" and json.loads(again.result_json)["marks"] == 1

    play(tmp_path, scenario, {"max_concurrency": 1, "max_unacked_mib": 1}, ack_results=False)


def test_malformed_server_messages_are_answered_not_obeyed(tmp_path: Path) -> None:
    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        hub.request("", "{}")
        refused = await hub.next("result")
        assert error_code(refused) == "validation_error"
        assert "correlation_id" in refused.error.message
        hub.send(kill_plan=pb.KillPlan(plan_id="", reason="kill everything?"))
        hub.request("after-empty-kill", "{}")
        assert error_code(await hub.next("result")) == "ok"
        # Names the worker keeps (ledger, telemetry, audit) come bounded: megabytes of
        # them per request, kept 90 days, would fill the disk with nothing run.
        for field in ("plan_id", "agent_id", "owner_user_id", "task_id", "surface", "action"):
            hub.request(f"long-{field}", "{}", **{field: "p" * 4_000_000})
            refused = await hub.next("result")
            assert error_code(refused) == "validation_error", field
            message = refused.error.message
            assert message.startswith(f"a request's {field} ") and "at most" in message
        hub.send(kill_plan=pb.KillPlan(plan_id="k" * 4_000_000, reason="r"))
        hub.send(kill_plan=pb.KillPlan(plan_id="short", reason="r" * 4_000_000))
        hub.request("after-long-kills", "{}", plan_id="short")
        killed = await hub.next("result")
        assert error_code(killed) == "plan_killed" and len(killed.error.message) < 1200
        assert link.dispatcher.state.killed_plans() == [("short", "r" * 1000)]

    play(tmp_path, scenario)


class Deaf(ScriptedHub):
    """A hub that reads the worker's stream only while `listening`, and acks nothing.
    Its receive window stays gRPC's first one (64 KiB): with BDP probing gRPC grew it
    by megabytes as the worker wrote, and took in unread all the worker wrote (20 MiB
    here at times), so the worker's outbox emptied while the hub did not listen."""

    server_options = (("grpc.http2.bdp_probe", 0),)

    def __init__(self, heartbeat_ms: int = 0) -> None:
        super().__init__(ack_results=False, heartbeat_ms=heartbeat_ms)
        self.listening = asyncio.Event()
        self.listening.set()

    async def _read(self, requests: AsyncIterator[pb.WorkerEnvelope]) -> None:
        async for envelope in requests:
            await self.listening.wait()
            for msg in envelope.messages:
                self.inbox.put_nowait(msg)


async def _until_outbox_full(link: WorkerConnection) -> None:
    async with asyncio.timeout(20):
        while link.outgoing_bytes <= 4 * MIB:  # until the bound is reached
            await asyncio.sleep(0.01)
    assert link.outgoing_bytes < 6 * MIB  # the bound, and one answer past it


def test_a_server_that_asks_and_does_not_read_stalls_its_stream_not_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each duplicate of a finished call brings its whole result again (1 MiB here, for
    a 100-byte request): past the outbox's bound the worker reads no more requests until
    the server has taken what it asked for, so its memory stays bounded, and once the
    server reads again every answer arrives."""
    monkeypatch.setattr(connection, "OUTBOX_HIGH_BYTES", 4 * MIB)
    result_args = '{"blob_repeat": 16}'  # a 1 MiB result from a 64 KiB request blob

    async def go() -> None:
        hub = Deaf()
        async with linked(tmp_path, hub, {}) as link:
            await asyncio.wait_for(link.connected.wait(), 10)
            hub.request("big", result_args, blob=b"z" * (64 * 1024), args_digest="d")
            assert len((await hub.next("result", timeout=30)).blob) == MIB
            hub.listening.clear()
            duplicates = 20
            again = pb.ActionRequest(
                correlation_id="big",
                args_json=result_args,
                attempt=1,
                surface="workerDiag",
                action="probe",
                agent_id="tester",
                args_digest="d",
            )
            # All in one envelope: the worker pauses within it, not only between envelopes.
            one_envelope = [pb.ServerMessage(request=again)] * duplicates
            hub.send_raw(pb.ServerEnvelope(messages=one_envelope).SerializeToString())
            await _until_outbox_full(link)
            hub.listening.set()
            replayed = [await hub.next("result", timeout=30) for _ in range(duplicates)]
            assert {(r.correlation_id, len(r.blob), r.replayed) for r in replayed} == {
                ("big", MIB, True)
            }

    asyncio.run(go())


def test_unacked_results_go_again_after_a_reconnect_no_faster_than_the_server_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a reconnect every unacked result is sent again, its blob read from its
    file as its turn comes: never all of them in memory at once."""
    monkeypatch.setattr(connection, "OUTBOX_HIGH_BYTES", 4 * MIB)
    results = 30

    async def go() -> None:
        hub = Deaf()
        async with linked(tmp_path, hub, {}) as link:
            await asyncio.wait_for(link.connected.wait(), 10)
            for i in range(results):
                hub.request(f"r{i}", '{"blob_repeat": 16}', blob=b"u" * (64 * 1024))
            first = [await hub.next("result", timeout=30) for _ in range(results)]
            assert len({r.correlation_id for r in first}) == results
            hub.listening.clear()
            hub.hang_up()
            await hub.dials(2, timeout=20)
            await _until_outbox_full(link)
            hub.listening.set()
            again = [await hub.next("result", timeout=30) for _ in range(results)]
            assert sorted(r.correlation_id for r in again) == sorted(
                f"r{i}" for i in range(results)
            )
            assert {len(r.blob) for r in again} == {MIB}

    asyncio.run(go())


async def _beat(hub: ScriptedHub) -> None:
    while True:  # a timer by nature: the hub's heartbeat every 50 ms
        hub.send(heartbeat=pb.Heartbeat(unix_ms=0))
        await asyncio.sleep(0.05)


async def _looks(link: WorkerConnection, count: int, *, busy: bool = False) -> None:
    """Until the worker's silence check has looked `count` times more on its stream
    (`busy`: looks that found it not reading)."""
    while (silence := link._silence) is None:
        await asyncio.sleep(0)  # the stream's reader starts: a turn or two
    seen = silence.busy_looks if busy else 0
    while count > 0:
        silence.looked.clear()
        await silence.looked.wait()
        assert not silence.closed, "the stream ended (a new session started)"
        if busy:
            count -= silence.busy_looks - seen
            seen = silence.busy_looks
        else:
            count -= 1


def test_a_server_heartbeating_behind_the_workers_own_backlog_is_not_taken_for_silent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the worker waits for its outbox to drain it reads nothing, so the hub's
    heartbeats wait unread: that must not count as the hub's silence (it would drop an
    honest hub on a slow link, and the resend after each reconnect would fill it again).
    The hub heartbeats from its Welcome on, as a real hub does, and the limit is the
    worker's least (MIN_SILENCE_S, 1 s): hub and worker share this test's loop, which
    at a load of 20-30 stalled 0.5 to 2 s at times (see the next test) and, loaded but
    not stalled, sent a heartbeat 0.7 s late, which a limit of 0.5 s took for silence."""
    monkeypatch.setattr(connection, "OUTBOX_HIGH_BYTES", 4 * MIB)

    async def go() -> None:
        hub = Deaf(heartbeat_ms=50)
        beating = asyncio.create_task(_beat(hub))  # queued until the stream opens
        async with linked(tmp_path, hub, {}) as link:
            await asyncio.wait_for(link.connected.wait(), 10)
            hub.request("big", '{"blob_repeat": 16}', blob=b"z" * (64 * 1024), args_digest="d")
            await hub.next("result", timeout=30)
            hub.listening.clear()
            again = pb.ServerMessage(
                request=pb.ActionRequest(
                    correlation_id="big",
                    args_json='{"blob_repeat": 16}',
                    attempt=1,
                    surface="workerDiag",
                    action="probe",
                    agent_id="tester",
                    args_digest="d",
                )
            )
            hub.send_raw(pb.ServerEnvelope(messages=[again] * 20).SerializeToString())
            await _until_outbox_full(link)
            # Twice the limit's looks, each finding the worker paused, heartbeats unread.
            await _looks(link, 2 * connection.SILENCE_LOOKS, busy=True)
            assert link.sessions_started == 1
            hub.listening.set()
            replayed = [await hub.next("result", timeout=30) for _ in range(20)]
            assert {r.correlation_id for r in replayed} == {"big"}
            assert link.sessions_started == 1
        beating.cancel()

    asyncio.run(go())


def test_a_stall_of_the_workers_own_loop_is_not_taken_for_the_servers_silence(
    tmp_path: Path,
) -> None:
    """The worker's loop held up for twice the silence limit (a loaded machine, a
    thread holding the GIL, a laptop's suspend): nothing is read meanwhile, nor here
    sent, as the hub shares the loop. After it the heartbeats come again and the
    stream stays: the silence is counted in looks, and a late one counts as one look,
    not as the time it missed (a deadline pushed back on each envelope expired first
    thing after the stall, before the heartbeats waiting for the loop were read)."""

    async def go() -> None:
        hub = ScriptedHub(heartbeat_ms=50)  # the limit: MIN_SILENCE_S, 1 s
        beating = asyncio.create_task(_beat(hub))  # queued until the stream opens
        async with linked(tmp_path, hub, {}) as link:
            await asyncio.wait_for(link.connected.wait(), 10)
            await _looks(link, 1)
            time.sleep(2 * connection.MIN_SILENCE_S)  # the stall itself, of the whole loop
            await _looks(link, 2 * connection.SILENCE_LOOKS)
            assert link.sessions_started == 1
        beating.cancel()

    asyncio.run(go())


def test_a_cancel_once_the_thread_work_is_done_does_not_claim_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An fs_write's write runs in a thread; a Cancel handled after that work has
    ended but before its result reached the call's task cannot undo the write: the
    answer is `outcome_unknown`, not `cancelled`. The Cancel is handled from the
    thread's own completion, ahead of its result on the loop."""

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        loop = asyncio.get_running_loop()
        threads = link.dispatcher.threads
        loop.set_default_executor(threads)  # as worker.app does
        finished = threads._finished
        cancel = pb.ServerMessage(cancel=pb.Cancel(correlation_id="w", reason="stop"))

        def finished_then_cancel(cid: str, *args: bool, **kwargs: bool) -> None:
            finished(cid, *args, **kwargs)
            if cid == "w" and not threads.running("w"):  # its last job has ended
                loop.call_soon_threadsafe(link._handle, cancel)

        monkeypatch.setattr(threads, "_finished", finished_then_cancel)
        hub.request(
            "w",
            json.dumps({"path": "w.bin", "mode": "overwrite"}),
            surface="workerHost",
            action="fs_write",
            blob=b"w" * 1000,
            args_digest="blake3:w",
        )
        result = await hub.next("result")
        assert (tmp_path / "workspace" / "w.bin").read_bytes() == b"w" * 1000
        assert error_code(result) == "outcome_unknown", result
        assert result.error.details_json and "cancelled" in result.error.details_json

    play(tmp_path, scenario)
