"""`agentworker ui` attached to a worker that runs elsewhere (a service, say), over
the local socket: real hub and worker subprocesses, the TUI driven with Pilot."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import Cluster, cluster
from tests.ui.rig import MovableClock, Rig, answerable, silent, until
from ui.app import WorkerApp
from ui.approval import ApprovalModal
from worker.config import GrantSection, Paths
from worker.core import console_socket
from worker.core.console_socket import ConsoleServer, NoWorkerError, SocketLink
from worker.hub.client import ControlClient
from worker.wire.proto import agentworker_pb2 as pb


@pytest.fixture
def live(tmp_path: Path) -> Cluster:  # type: ignore[misc]
    with cluster(tmp_path / "home") as c:
        yield c


def _socket(live: Cluster) -> Path:
    return Paths(config_dir=live.home, data_dir=live.home).ui_socket


def test_the_socket_is_open_to_its_user_only(live: Cluster) -> None:
    path = _socket(live)
    assert stat.S_ISSOCK(path.stat().st_mode)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) & 0o022 == 0
    assert path.stat().st_uid == os.getuid()


def test_request_scope_is_approved_in_an_attached_ui_and_the_call_then_runs(
    live: Cluster,
) -> None:
    async def scenario() -> None:
        app = WorkerApp(SocketLink(_socket(live)), notifier=silent, clock=MovableClock())
        client = ControlClient.connect(live.listen, live.token)
        try:
            async with app.run_test(size=(100, 30)) as pilot:
                await until(lambda: bool(app.worker_info), pilot)
                asked = asyncio.ensure_future(
                    client.stub.RequestScope(
                        pb.RequestScopeRequest(
                            agent_id="planner",
                            plan_id="plan-7",
                            scopes=["workerHost.fs_write"],
                            reason="write the report",
                            preview="fs_write report.md",
                            timeout_ms=30_000,
                        ),
                        metadata=client.metadata,
                    )
                )
                modal = await answerable(app, pilot)
                assert isinstance(modal, ApprovalModal)
                assert modal.prompt["reason"] == "write the report"
                assert "once" not in modal.prompt["choices"]
                await pilot.press("p")
                decision = await asyncio.wait_for(asked, 20)
                assert decision.granted and list(decision.scopes) == ["workerHost.fs_write"]
                response = await client.dispatch(
                    agent_id="planner",
                    plan_id="plan-7",
                    surface="workerHost",
                    action="fs_write",
                    args_json='{"path": "report.md", "mode": "create"}',
                    blob=b"# report\n",
                )
                assert response.result.status == pb.ActionResult.OK, response.result.error
                assert (live.workspace / "report.md").read_bytes() == b"# report\n"
                await until(
                    lambda: any(c["plan_id"] == "plan-7" for c in app.calls.values()), pilot
                )
        finally:
            await client.close()

    asyncio.run(scenario())


def test_with_no_ui_attached_a_call_is_refused_at_once_as_headless(live: Cluster) -> None:
    out = live.call("workerHost.fs_stat", '{"path": "."}', agent_id="stranger")
    assert out["error"]["code"] == "scope_required"
    assert "agentworker ui" in out["error"]["message"]


def test_a_call_waits_for_an_attached_ui_and_a_denial_reaches_the_caller(live: Cluster) -> None:
    async def scenario() -> None:
        app = WorkerApp(SocketLink(_socket(live)), notifier=silent, clock=MovableClock())
        client = ControlClient.connect(live.listen, live.token)
        try:
            async with app.run_test(size=(100, 30)) as pilot:
                await until(lambda: bool(app.worker_info), pilot)
                call = asyncio.create_task(
                    client.dispatch(
                        agent_id="stranger",
                        plan_id="p",
                        surface="workerHost",
                        action="fs_stat",
                        args_json='{"path": "."}',
                    )
                )
                await answerable(app, pilot)
                await pilot.press("d")
                response = await asyncio.wait_for(call, 20)
                assert response.result.error.code == "scope_denied"
        finally:
            await client.close()

    asyncio.run(scenario())


def test_attaching_with_no_worker_running_says_so(tmp_path: Path) -> None:
    async def scenario() -> None:
        link = SocketLink(tmp_path / "ui.sock")
        with pytest.raises(NoWorkerError, match="no worker is running"):
            await link.open(lambda _event: None)

    asyncio.run(scenario())


def test_pause_and_resume_from_the_command_line(live: Cluster) -> None:
    assert live.cli("pause", "--reason", "lunch").returncode == 0
    out = live.call("workerHost.fs_stat", '{"path": "."}')
    assert out["error"]["code"] == "paused" and "lunch" in out["error"]["message"]
    resumed = live.cli("resume")
    assert resumed.returncode == 0 and "lunch" in resumed.stdout
    assert live.call("workerHost.fs_stat", '{"path": "."}')["status"] == "ok"


def test_hostile_lines_on_the_socket_end_that_session_only(live: Cluster) -> None:
    """JSON nested past the parser's depth, or not JSON at all, on the local socket ends
    that one connection; the worker goes on serving calls and other UIs."""
    import socket as sockets

    deep = b"[" * 20_000 + b"\n"  # within the line limit, past the parser's recursion
    for line in (deep, b'{"op": "attach"}\n' + deep, b"\xff\n"):
        with sockets.socket(sockets.AF_UNIX) as conn:
            conn.connect(str(_socket(live)))
            conn.sendall(line)
            conn.shutdown(sockets.SHUT_WR)
            while conn.recv(65536):  # the worker closes it: read to the end
                pass
    out = live.call("workerHost.fs_stat", '{"path": "."}')
    assert out["status"] == "ok", out

    async def attach() -> None:
        link = SocketLink(_socket(live))
        snapshot = await link.open(lambda event: None)
        assert snapshot.get("type") == "snapshot", snapshot
        await link.close()

    asyncio.run(attach())
    worker = next(p for p in live.procs if p.name == "worker")
    assert "Traceback" not in worker.log(), worker.log()[-3000:]


def test_a_ui_attaches_while_many_prompts_showing_whole_calls_wait(live: Cluster) -> None:
    """The snapshot sent every waiting prompt on one line, and a UI reads at most
    1 MiB a line: some 64 prompts that show whole calls kept any UI from attaching
    (their calls were denied at their timeout). It comes in pages now."""

    count = 72
    # About 15,500 characters shown each, under the 16,384 a prompt shows whole.
    headers = {f"X-Filler-{j}": "h" * 500 for j in range(30)}

    async def scenario() -> None:
        waiting: set[str] = set()
        all_waiting = asyncio.Event()

        def told(event: dict[str, object]) -> None:
            if event.get("type") == "prompt":
                waiting.add(str(event["prompt"]["id"]))  # type: ignore[index]
                if len(waiting) == count:
                    all_waiting.set()

        holder = SocketLink(_socket(live))  # attached, so the calls wait for a person
        await holder.open(told)
        client = ControlClient.connect(live.listen, live.token)
        try:
            calls = [
                asyncio.create_task(
                    client.dispatch(
                        # Eight agents: one agent's calls wait on at most
                        # MAX_PROMPTS_PER_AGENT prompts (the rest answer busy).
                        agent_id=f"stranger-{i % 8}",
                        plan_id="p",
                        surface="workerHost",
                        action="http_fetch",
                        args_json=json.dumps(
                            {"url": f"http://127.0.0.1:9/{i}", "headers": headers}
                        ),
                    )
                )
                for i in range(count)
            ]
            await asyncio.wait_for(all_waiting.wait(), 60)
            late = SocketLink(_socket(live))
            snapshot = await late.open(lambda _event: None)
            prompts = snapshot["prompts"]
            assert {p["id"] for p in prompts} == waiting
            assert all("h" * 500 in p["preview"] for p in prompts)  # whole, not cut
            for prompt in prompts:
                reply = await late.command(
                    {"op": "decide", "prompt_id": prompt["id"], "choice": "deny"}
                )
                assert reply["ok"], reply
            for response in await asyncio.wait_for(asyncio.gather(*calls), 60):
                assert response.result.error.code == "scope_denied", response.result
            await late.close()
            await holder.close()
        finally:
            await client.close()

    asyncio.run(scenario())


def test_calls_reach_a_ui_together_with_each_row_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each call's start and end, and each plan they touched, went to a UI as a line
    of its own: four lines a call for a busy worker to encode and write, and for the
    TUI's process to wake for. They go together now, each row once as it last was,
    ahead of any other event (here a command's reply) so the order holds."""
    monkeypatch.setattr(console_socket, "CHANGES_EVERY_S", 60.0)  # only the reply sends them

    async def scenario() -> None:
        rig = Rig(tmp_path, grants=[GrantSection(agent="agent-1", scopes=["workerHost.fs_read"])])
        server = ConsoleServer(rig.console, rig.paths.ui_socket)
        await server.start()
        told: list[dict[str, Any]] = []
        link = SocketLink(rig.paths.ui_socket)
        await link.open(told.append)
        burst = [rig.call("fs_read", '{"path": "a.txt"}', plan=f"plan-{i % 2}") for i in range(6)]
        for cid in burst:
            await rig.result(cid)
        assert told == []
        assert (await link.command({"op": "grants"}))["ok"]
        assert [event["type"] for event in told] == ["changes"], told
        rows = {row["id"]: row for row in told[0]["calls"]}
        assert sorted(rows) == sorted(burst) and len(told[0]["calls"]) == len(burst)
        assert {row["status"] for row in rows.values()} == {"ok"}
        plans = {plan["raw"]: plan["plan"] for plan in told[0]["plans"]}
        assert sorted(plans) == ["plan-0", "plan-1"] and len(told[0]["plans"]) == 2
        assert plans["plan-0"]["calls"] == 3 and plans["plan-0"]["state"] == "idle"
        await link.close()
        await server.stop()
        rig.close()

    asyncio.run(scenario())


def test_many_calls_changed_together_reach_a_ui_in_lines_it_can_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The calls that changed together went as one line, and a UI reads at most
    1 MiB a line (MAX_LINE): a few dozen calls with long non-ASCII args, finished
    within one wait, made a line it could not read, and the UI was cut off. They come
    in pages now, as the snapshot does, every row in one of them."""
    monkeypatch.setattr(console_socket, "CHANGES_EVERY_S", 60.0)  # only the reply sends them

    async def scenario() -> None:
        rig = Rig(tmp_path, grants=[GrantSection(agent="agent-1", scopes=["workerHost.fs_read"])])
        server = ConsoleServer(rig.console, rig.paths.ui_socket)
        await server.start()
        told: list[dict[str, Any]] = []
        link = SocketLink(rig.paths.ui_socket)
        await link.open(told.append)
        path = "\U0001f600" * 2000  # 12 bytes each on the line (ensure_ascii)
        burst = [
            rig.call("fs_read", json.dumps({"path": path}, ensure_ascii=False)) for _ in range(64)
        ]
        for cid in burst:
            await rig.result(cid)
        assert (await link.command({"op": "grants"}))["ok"]
        assert {event["type"] for event in told} == {"changes"}, [e["type"] for e in told]
        lines = [console_socket.encode(event) for event in told]
        assert sum(map(len, lines)) > console_socket.MAX_LINE  # one line would not do
        assert max(map(len, lines)) <= console_socket.SNAPSHOT_PAGE
        rows = [row for event in told for row in event["calls"]]
        assert sorted(row["id"] for row in rows) == sorted(burst)
        assert all(path[:1900] in row["args"] and row["status"] != "running" for row in rows)
        assert [plan["raw"] for event in told for plan in event["plans"]] == ["plan-a"]
        assert not link.closed.is_set()
        await link.close()
        await server.stop()
        rig.close()

    asyncio.run(scenario())
