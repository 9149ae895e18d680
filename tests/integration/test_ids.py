"""Ids (correlation, plan, agent, owner, task) are at most 256 printable characters,
and a surface's or action's name at most 64 ASCII letters, digits, `_`, `.` and `-`,
refused `validation_error` where they enter: at the hub from a caller, and at the
worker from a server that does not check them (a scripted hub). They were kept and
shown as they came, escapes, bidi overrides and line breaks included (the TUI made
them inert on screen only)."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import grpc
import pytest

from tests.integration.test_stream_rules import error_code, play
from tests.support.cluster import Cluster, cluster
from tests.support.scripted_hub import ScriptedHub
from worker.core.approvals import ApprovalBroker
from worker.core.connection import WorkerConnection
from worker.hub.client import ControlClient
from worker.ids import MAX_ID_CHARS
from worker.wire.proto import agentworker_pb2 as pb

IDS = ("correlation_id", "plan_id", "agent_id", "owner_user_id", "task_id")
# Not printable: an escape sequence, a bidi override, a line break, NUL, a line
# separator, a zero-width space, C1's CSI, a private-use character.
BAD = ["a\x1b[2J", "a\u202eb", "a\nb", "a\x00", "a\u2028", "a\u200b", "a\x9b", "a\ue000"]
# Printable, taken as before (a hub's own ids are 32 hex digits; a server's are its own).
GOOD = ["plan 7: étape ✓ (retry)", "字-1", "agent/\u03b1@host:42", "x" * MAX_ID_CHARS]


def _said(value: str) -> str:
    return f"U+{next(ord(c) for c in value if not c.isprintable()):04X}"


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    with cluster(tmp_path_factory.mktemp("ids") / "home") as c:
        yield c  # type: ignore[misc]


@pytest.mark.parametrize("field", IDS)
def test_the_hub_refuses_a_call_with_an_id_that_is_not_printable(live: Cluster, field: str) -> None:
    for n, value in enumerate(BAD):
        ids = {"correlation_id": f"hub-{field}-{n}", field: value}
        out = live.call("workerHost.fs_stat", '{"path": "."}', **ids)
        assert out["error"]["code"] == "validation_error", (value, out)
        message = out["error"]["message"]
        assert message.startswith(f"the call's {field} has a character that is not printable")
        assert _said(value) in message and message.endswith("nothing was sent")
        assert value not in message, "the id itself is not echoed"
        [error] = out["error"]["details"]["errors"]
        assert (error["loc"], error["type"]) == ([field], "not_printable")
    with contextlib.closing(sqlite3.connect(live.home / "hub.db")) as db:
        stored = db.execute("SELECT count(*) FROM calls WHERE correlation_id LIKE 'hub-%'")
        assert stored.fetchone() == (0,), "refused before it was stored"
    too_long = live.call("workerHost.fs_stat", '{"path": "."}', **{field: "x" * 257})
    assert too_long["error"]["details"]["errors"][0]["type"] == "too_long"


# Not a surface's or action's name: as above, and a space, a slash, a letter of another script.
BAD_NAMES = [*BAD, "fs read", "fs/read", "fs_r\u0435ad"]


def test_the_hub_refuses_a_call_naming_an_action_or_surface_no_name_has(live: Cluster) -> None:
    """An unknown action was answered `unknown_action` and kept under its name, escapes
    and all, in telemetry and the console's call rows (review8 finding 03)."""
    for n, value in enumerate(BAD_NAMES):
        for field, action in (("action", f"workerHost.{value}"), ("surface", f"{value}.fs_stat")):
            out = live.call(action, '{"path": "."}', correlation_id=f"name-{field}-{n}")
            assert out["error"]["code"] == "validation_error", (value, out)
            message = out["error"]["message"]
            assert message.startswith(f"the call's {field} has U+"), message
            assert "which no surface or action name has" in message and value not in message
    with contextlib.closing(sqlite3.connect(live.home / "hub.db")) as db:
        stored = db.execute("SELECT count(*) FROM calls WHERE correlation_id LIKE 'name-%'")
        assert stored.fetchone() == (0,), "refused before it was stored"
    unknown = live.call("workerHost.no_such-action.v2", "{}")  # a name, unknown
    assert unknown["error"]["code"] == "unknown_action", unknown


def test_printable_ids_of_any_script_still_go_through(live: Cluster) -> None:
    for n, value in enumerate(GOOD):
        for field in IDS:
            ids = {field: value} if field != "correlation_id" else {field: f"{n}-{value}"[:256]}
            out = live.call("workerHost.fs_stat", '{"path": "."}', **ids)
            # (An agent of another name has no grant: taken, and asked for its scope.)
            code = out["error"]["code"] if out["status"] == "error" else "ok"
            assert code == ("scope_required" if field == "agent_id" else "ok"), (field, out)


def test_the_hub_refuses_a_kill_teardown_or_scope_request_naming_such_an_id(
    live: Cluster,
) -> None:
    async def kill(client: ControlClient) -> grpc.aio.AioRpcError:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.stub.KillPlan(
                pb.KillPlanRequest(plan_id="p\x1b[2J"), metadata=client.metadata, timeout=30
            )
        return caught.value

    refused = live.run(kill)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (refused.details() or "").startswith(
        "the kill's plan_id has a character that is not printable, U+001B at position 1"
    )

    async def ask(client: ControlClient) -> pb.ScopeDecision:
        request = pb.RequestScopeRequest(agent_id="a\u202e", scopes=["workerHost.fs_read"])
        return await client.stub.RequestScope(request, metadata=client.metadata, timeout=30)

    decision = live.run(ask)
    assert not decision.granted
    assert decision.reason.startswith(
        "validation_error: the scope request's agent_id has a character that is not printable"
    )

    async def teardown(client: ControlClient) -> pb.DispatchResponse:
        request = pb.TeardownRequest(plan_id="p\n")
        return await client.stub.Teardown(request, metadata=client.metadata, timeout=30)

    torn = live.run(teardown)
    assert torn.result.error.code == "validation_error", torn
    assert "plan_id has a character that is not printable, U+000A" in torn.result.error.message


def test_the_worker_refuses_such_ids_from_a_server_that_sends_them(tmp_path: Path) -> None:
    """A server is not trusted to check them: the worker refuses each unclaimed."""

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        for field in IDS[1:]:
            for n, value in enumerate(BAD):
                cid = f"{field}-{n}"
                hub.request(cid, "{}", **{field: value})
                result = await hub.next("result")
                assert result.correlation_id == cid
                assert error_code(result) == "validation_error", result
                message = result.error.message
                assert message.startswith(f"a request's {field} has a character that is not")
                assert _said(value) in message and value not in message
        for field in ("surface", "action"):
            for n, value in enumerate(BAD_NAMES):
                hub.request(f"{field}-{n}", "{}", **{field: value})
                result = await hub.next("result")
                assert error_code(result) == "validation_error", result
                assert result.error.message.startswith(f"a request's {field} has U+")
                assert value not in result.error.message
        hub.request("ok-1", "{}", plan_id=GOOD[0], task_id=GOOD[1])
        assert error_code(await hub.next("result")) == "ok"
        # A kill of such a plan is ignored (no call of it can run), and a scope request
        # naming such an agent is refused without asking anyone.
        hub.send(kill_plan=pb.KillPlan(plan_id="p\x1b", reason="r"))
        broker = ApprovalBroker(link.dispatcher.state, link.dispatcher.telemetry)
        link.answer_scopes = broker.scope_request
        asked = pb.ScopeRequest(request_id="s1", agent_id="a\n", scopes=["workerHost.fs_read"])
        hub.send(scope_request=asked)
        decision = await hub.next("scope_decision")
        assert (decision.request_id, decision.granted) == ("s1", False)
        assert decision.reason.startswith("agent_id has a character that is not printable")
        assert link.dispatcher.state.killed_plans() == []
        broker.close_all("the test ends")

    play(tmp_path, scenario)
