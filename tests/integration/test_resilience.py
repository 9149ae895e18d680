"""Crashes, partitions and refusals: nothing runs twice, nothing hangs, nothing spins."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

import grpc
import pytest

from tests.support.cluster import Cluster, call_in_background, cluster, release, wait_for
from tests.support.tcp_proxy import FreezableProxy
from worker.hub.client import result_to_dict
from worker.wire.proto import agentworker_pb2 as pb


def marks(live: Cluster, name: str) -> int:
    path = live.home / "diag" / f"{name}.marks"
    return path.stat().st_size if path.exists() else 0


def started(live: Cluster, cid: str) -> bool:
    """True once the worker's ledger holds the call (it acked STARTED)."""
    import sqlite3

    db = sqlite3.connect(live.home / "state.db")
    try:
        return (
            db.execute("SELECT 1 FROM calls WHERE correlation_id = ?", (cid,)).fetchone()
            is not None
        )
    finally:
        db.close()


def test_hub_killed_mid_call_does_not_run_the_call_twice(live: Cluster) -> None:
    args = '{"hold": "hk-1", "mark": "hubkill"}'
    pending = call_in_background(live, "workerDiag.probe", args, correlation_id="hk-1")
    wait_for(lambda: started(live, "hk-1"), 10)
    hub = next(p for p in live.procs if p.name == "hub")
    hub.kill()
    pending["thread"].join(10)
    assert pending.get("rpc_error") is grpc.StatusCode.UNAVAILABLE
    release(live.home, "hk-1")
    live.start_hub()
    wait_for(lambda: live.status().connected_workers == 1, 60)
    # The caller retries with the same id: the hub re-sends, the worker answers from its ledger.
    out = live.call("workerDiag.probe", args, correlation_id="hk-1")
    assert out["status"] == "ok", out
    assert out["result"]["marks"] == 1
    assert marks(live, "hubkill") == 1, "the side effect happened exactly once"
    again = live.call("workerDiag.probe", args, correlation_id="hk-1")
    assert again["replayed"] is True and again["result"] == out["result"]
    assert marks(live, "hubkill") == 1


def test_worker_killed_mid_call_reports_outcome_unknown_and_never_reruns(live: Cluster) -> None:
    args = '{"hold": "wk-1", "mark": "workerkill"}'  # never released
    pending = call_in_background(
        live, "workerDiag.probe", args, correlation_id="wk-1", timeout_ms=20000
    )
    wait_for(lambda: marks(live, "workerkill") == 1, 10)
    worker = next(p for p in live.procs if p.name == "worker")
    worker.kill()
    live.start_worker()
    pending["thread"].join(20)
    out = pending["out"]
    assert out["error"]["code"] == "outcome_unknown", out
    assert "will not be run again" in out["error"]["message"]
    retry = live.call("workerDiag.probe", args, correlation_id="wk-1")
    assert retry["error"]["code"] == "outcome_unknown"  # answered from the ledger, not run
    assert marks(live, "workerkill") == 1


def test_callers_sharing_an_id_each_get_the_one_result_though_one_gives_up(
    live: Cluster,
) -> None:
    args = '{"hold": "shared-1", "mark": "shared"}'
    request = pb.DispatchRequest(
        agent_id="tester",
        surface="workerDiag",
        action="probe",
        args_json=args,
        correlation_id="shared-1",
    )

    async def three(client):  # type: ignore[no-untyped-def]
        calls = [client.stub.Dispatch(request, metadata=client.metadata) for _ in range(3)]
        # The probe makes its mark first, then holds: once marked, the call runs.
        await asyncio.to_thread(wait_for, lambda: marks(live, "shared") == 1, 10)
        calls[0].cancel()  # one caller gives up while the call runs
        release(live.home, "shared-1")
        return await asyncio.gather(calls[1], calls[2])

    second, third = (result_to_dict(r) for r in live.run(three))
    assert second["status"] == "ok" and third["status"] == "ok", (second, third)
    assert second["result"] == third["result"]
    assert marks(live, "shared") == 1, "one call ran, for all three callers"


def test_same_id_with_other_args_answers_args_mismatch(live: Cluster) -> None:
    first = live.call("workerDiag.probe", '{"sleep_ms": 1}', correlation_id="mm-1")
    assert first["status"] == "ok"
    second = live.call("workerDiag.probe", '{"sleep_ms": 2}', correlation_id="mm-1")
    assert second["error"]["code"] == "args_mismatch"
    third = live.call("workerDiag.probe", '{"sleep_ms": 1}', correlation_id="mm-1")
    assert third["status"] == "ok" and third["replayed"] is True


def test_oversized_result_answers_result_too_large_and_others_live_on(live: Cluster) -> None:
    async def both(client):  # type: ignore[no-untyped-def]
        big = client.dispatch(
            agent_id="tester",
            surface="workerDiag",
            action="probe",
            args_json='{"blob_repeat": 40}',
            blob=b"x" * (1024 * 1024),
        )
        small = client.dispatch(
            agent_id="tester", surface="workerDiag", action="probe", args_json='{"sleep_ms": 300}'
        )
        return await asyncio.gather(big, small)

    big, small = (result_to_dict(r) for r in live.run(both))
    assert big["error"]["code"] == "result_too_large"
    assert big["error"]["details"]["bytes"] > 40 * 1024 * 1024
    assert "message limit" in big["error"]["message"]
    assert small["status"] == "ok"
    assert live.call("workerDiag.probe")["status"] == "ok", "the stream survived"


def test_frozen_link_is_detected_by_the_servers_silence_and_redialled(tmp_path: Path) -> None:
    with cluster(tmp_path / "home", worker=False, keepalive_s=1.0, ping_timeout_s=1.0) as live:
        proxy = FreezableProxy(int(live.listen.rsplit(":", 1)[1]))
        try:
            token = str(live.home / "hub-workers.token")  # a relay's address: given
            worker = live.start_worker("--server", proxy.address, "--token-file", token)
            assert proxy.accepted == 1
            proxy.freeze()
            # A bound that catches a hang (stretched by the machine's load), not a speed:
            # no bytes and no reset ever come on the frozen link, so only the worker's
            # own watch on the server's silence (three of the hub's 0.5 s heartbeats),
            # or its transport's keepalive, ends it.
            wait_for(lambda: proxy.accepted >= 2, 10, worker)
            lost = LOST_LINE.search(worker.log())
            assert lost is not None, worker.log()
            why = lost[1].lower()
            assert "no word from the server" in why or "keepalive" in why, lost[0]
            # Its new stream goes on a connection of its own, not over the dead one: the
            # frozen link passes nothing, so a call that is answered came over the new.
            wait_for(lambda: live.status().connected_workers == 1, 10)
            assert live.call("workerDiag.probe")["status"] == "ok"
        finally:
            proxy.close()


# The worker's line saying why it left its connection (the first one: the frozen link).
LOST_LINE: Final = re.compile(r"connection to \S+ lost: (.*)")


def test_bad_token_is_fatal_without_a_retry_loop(tmp_path: Path) -> None:
    with cluster(tmp_path / "home", worker=False) as live:
        worker = live.spawn("badtoken", "run", "--token", "not-the-token")
        code = worker.wait(15)
        log = worker.log()
        assert code != 0
        assert log.count("UNAUTHENTICATED") == 1
        # A transient failure before it (a loaded machine) may be retried; the refusal never.
        assert "reconnecting" not in log.split("UNAUTHENTICATED", 1)[1]


def test_control_calls_need_the_token_and_health_does_not(tmp_path: Path) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from worker.hub.client import ControlClient

    with cluster(tmp_path / "home", worker=False) as live:

        async def ask(token: str) -> list[object]:
            client = ControlClient.connect(live.listen, token)
            try:
                answers: list[object] = []
                for call in (
                    client.stub.Status(pb.StatusRequest(), metadata=client.metadata),
                    client.stub.Dispatch(
                        pb.DispatchRequest(agent_id="a", surface="s", action="x"),
                        metadata=client.metadata,
                    ),
                ):
                    try:
                        answers.append(await call)
                    except grpc.aio.AioRpcError as exc:
                        answers.append(exc.code())
                health = health_pb2_grpc.HealthStub(client.channel)
                answers.append((await health.Check(health_pb2.HealthCheckRequest())).status)
                return answers
            finally:
                await client.close()

        status, dispatch, health = asyncio.run(ask("not-the-token"))
        assert status is dispatch is grpc.StatusCode.UNAUTHENTICATED
        assert health == health_pb2.HealthCheckResponse.SERVING
        status, _dispatch, _health = asyncio.run(ask(live.token))
        assert isinstance(status, pb.StatusResponse)


def _peak_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no VmHWM")


def test_a_call_without_the_token_is_refused_before_its_request_is_read(tmp_path: Path) -> None:
    """Eight tokenless 30 MiB Dispatches at once: the hub refuses each unread, so its
    peak memory grows by far less than they sent (it read all 240 MiB before)."""
    size, count = 30 * 1024 * 1024, 8

    async def flood(listen: str) -> list[grpc.StatusCode]:
        options = [("grpc.max_send_message_length", 64 * 1024 * 1024)]
        channels = [grpc.aio.insecure_channel(listen, options=options) for _ in range(count)]
        body = pb.DispatchRequest(worker_id="w", blob=bytes(size)).SerializeToString()
        method = "/agentworker.v1.ControlService/Dispatch"
        calls = [
            ch.unary_unary(method)(body, metadata=(("authorization", "Bearer no"),))
            for ch in channels
        ]
        codes = []
        for call in calls:
            try:
                await call
            except grpc.aio.AioRpcError as exc:
                codes.append(exc.code())
        for channel in channels:
            await channel.close()
        return codes

    with cluster(tmp_path / "home", worker=False) as live:
        hub = live.procs[0].pid
        before = _peak_mib(hub)
        assert asyncio.run(flood(live.listen)) == [grpc.StatusCode.UNAUTHENTICATED] * count
        assert _peak_mib(hub) - before < 120  # 240 MiB when each was read
        assert live.status().connected_workers == 0  # and it still answers


def test_plaintext_to_a_non_loopback_address_is_refused(tmp_path: Path) -> None:
    with cluster(tmp_path / "home", hub=False, worker=False) as live:
        worker = live.spawn("remote", "run", "--server", "agents.example.com:7421", "--token", "t")
        assert worker.wait(15) != 0
        assert "plaintext is allowed only to loopback" in worker.log()


def test_sigterm_drains_running_calls_then_says_goodbye(live: Cluster) -> None:
    pending = call_in_background(
        live, "workerDiag.probe", '{"hold": "dr-1"}', correlation_id="dr-1"
    )
    wait_for(lambda: started(live, "dr-1"), 10)
    worker = next(p for p in live.procs if p.name == "worker")
    worker.signal(signal.SIGTERM)
    wait_for(lambda: "draining" in worker.log(), 10, worker)
    release(live.home, "dr-1")  # the running call finishes within the drain's grace
    pending["thread"].join(15)
    assert pending["out"]["status"] == "ok", pending
    assert worker.wait(15) == 0
    assert "draining" in worker.log()


def test_help_answers_how_to_start(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "worker", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "agentworker up" in out
    for command in ("up", "hub", "run", "call", "workers", "status", "grant", "kill"):
        assert command in out


@pytest.mark.parametrize("flag", ["--json"])
def test_status_and_workers_speak_json(live: Cluster, flag: str) -> None:
    status = subprocess.run(
        [sys.executable, "-m", "worker", "status", flag],
        env=live.env,
        capture_output=True,
        text=True,
    )
    assert json.loads(status.stdout)["state"] == "connected"
    workers = subprocess.run(
        [sys.executable, "-m", "worker", "workers", flag],
        env=live.env,
        capture_output=True,
        text=True,
    )
    listed = json.loads(workers.stdout)
    assert len(listed) == 1 and listed[0]["connected"] is True


def test_a_kill_made_at_the_machine_holds_with_the_hub_down(live: Cluster) -> None:
    """`agentworker kill` records the kill in the worker's own ledger: with no hub to
    pass it on, the running call still stops and the plan's next calls are refused."""
    # Never released. No mark: one is made in a thread, and a kill that came while it
    # ran (a slow fsync under load) is rightly answered outcome_unknown.
    args = '{"hold": "lk-1"}'
    pending = call_in_background(
        live, "workerDiag.probe", args, correlation_id="lk-1", plan_id="p-local"
    )
    wait_for(lambda: started(live, "lk-1"), 10)
    hub = next(p for p in live.procs if p.name == "hub")
    hub.kill()
    pending["thread"].join(10)
    killed = subprocess.run(
        [sys.executable, "-m", "worker", "kill", "p-local", "--reason", "stop that"],
        env=live.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert "the hub was not told" in killed.stdout
    worker = next(p for p in live.procs if p.name == "worker")
    wait_for(lambda: "checking running calls now" in worker.log(), 10, worker)  # nudged
    live.start_hub()
    wait_for(lambda: live.status().connected_workers == 1, 60)
    # The caller asks again with the same id: the worker answers from its ledger.
    out = live.call("workerDiag.probe", args, correlation_id="lk-1", plan_id="p-local")
    assert out["error"]["code"] == "plan_killed", out
    # Stopped by the kill, not by its deadline (that answers `timeout`), whatever the time.
    assert "stop that" in out["error"]["message"]
    fresh = live.call("workerHost.fs_stat", '{"path": "."}', plan_id="p-local")
    assert fresh["error"]["code"] == "plan_killed"


def test_a_kill_for_a_worker_that_is_away_reaches_it_when_it_connects(live: Cluster) -> None:
    """The hub queues a kill for a known worker that is offline, delivers it (once)
    before anything else when the worker connects, then forgets it."""
    assert live.call("workerHost.fs_stat", '{"path": "."}', plan_id="p-away")["status"] == "ok"
    worker = next(p for p in live.procs if p.name == "worker")
    worker.signal(signal.SIGTERM)
    worker.wait(15)
    wait_for(lambda: live.status().connected_workers == 0, 10)

    async def kill(client: Any) -> Any:
        request = pb.KillPlanRequest(plan_id="p-away", reason="while you were out")
        return await client.stub.KillPlan(request, metadata=client.metadata)

    reply = live.run(kill)
    assert list(reply.worker_ids) == []
    assert len(reply.queued_worker_ids) == 1
    live.start_worker()
    out = live.call("workerHost.fs_stat", '{"path": "."}', plan_id="p-away")
    assert out["error"]["code"] == "plan_killed", out
    assert "while you were out" in out["error"]["message"]

    lifted = subprocess.run(
        [sys.executable, "-m", "worker", "lift", "p-away"], env=live.env, capture_output=True
    )
    assert lifted.returncode == 0
    live.procs[-1].signal(signal.SIGTERM)
    live.procs[-1].wait(15)
    wait_for(lambda: live.status().connected_workers == 0, 10)
    live.start_worker()  # a second reconnect: the delivered kill is not sent again
    assert live.call("workerHost.fs_stat", '{"path": "."}', plan_id="p-away")["status"] == "ok"
