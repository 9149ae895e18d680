"""A call's whole trip: caller → hub → worker stream → pipeline → back, for real."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3

from tests.support.cluster import Cluster, wait_for
from worker.wire.proto import agentworker_pb2 as pb


def test_fs_stat_round_trip_returns_typed_result_and_telemetry(live: Cluster) -> None:
    (live.workspace / "notes.txt").write_text("hello")
    out = live.call("workerHost.fs_stat", '{"path": "notes.txt"}', plan_id="p1", task_id="t1")
    assert out["status"] == "ok", out
    assert out["result"]["type"] == "file"
    assert out["result"]["size"] == 5
    invocation = out["invocation"]
    assert invocation["status"] == "ok"
    assert invocation["scope"] == "workerHost.fs_stat"
    assert invocation["plan_id"] == "p1" and invocation["task_id"] == "t1"
    assert invocation["decision"] == "granted"

    def rows() -> list[tuple[str, str, str]]:  # written just after the result leaves
        with contextlib.closing(sqlite3.connect(live.home / "state.db")) as db:
            return db.execute(
                "SELECT kind, status, action FROM invocations WHERE correlation_id = ?",
                (out["correlation_id"],),
            ).fetchall()

    wait_for(lambda: rows() != [], 5)
    assert rows() == [("v1:worker:invocation", "ok", "fs_stat")]


def test_thousand_concurrent_calls_each_answered_once_within_the_limit(live: Cluster) -> None:
    async def burst(client):  # type: ignore[no-untyped-def]
        calls = [
            client.dispatch(
                correlation_id=f"burst-{i}",
                agent_id="tester",
                surface="workerDiag",
                action="probe",
                args_json='{"sleep_ms": 5}',
            )
            for i in range(1000)
        ]
        return await asyncio.gather(*calls)

    responses: list[pb.DispatchResponse] = live.run(burst)
    ids = [r.result.correlation_id for r in responses]
    assert sorted(ids) == sorted(f"burst-{i}" for i in range(1000))
    assert all(r.result.status == pb.ActionResult.OK for r in responses)
    assert not any(r.result.replayed for r in responses)
    in_flight = [json.loads(r.result.result_json)["in_flight"] for r in responses]
    assert max(in_flight) <= 8
    assert max(in_flight) == 8, "the burst should have filled every slot"

    def executed() -> tuple[int, int]:
        with contextlib.closing(sqlite3.connect(live.home / "state.db")) as db:
            row = db.execute(
                "SELECT COUNT(*), COUNT(DISTINCT correlation_id) FROM invocations"
                " WHERE action = 'probe'"
            ).fetchone()
        return int(row[0]), int(row[1])

    # Rows are written just after their results leave: wait for the last ones.
    wait_for(lambda: executed()[0] >= 1000, 10)
    assert executed() == (1000, 1000)


def test_unknown_action_names_what_the_worker_offers(live: Cluster) -> None:
    out = live.call("workerHost.format_disk")
    assert out["error"]["code"] == "unknown_action"
    assert "workerHost.fs_stat" in out["error"]["message"]


def test_call_without_grant_answers_scope_required_with_how_to_grant(live: Cluster) -> None:
    out = live.call("workerHost.fs_stat", '{"path": "."}', agent_id="stranger")
    assert out["error"]["code"] == "scope_required"
    assert "agentworker grant workerHost.fs_stat" in out["error"]["message"]
    assert out["invocation"]["decision"] == "denied"


def test_refusals_are_logged_too_with_secrets_redacted(live: Cluster) -> None:
    out = live.call("workerHost.fs_stat", '{"path": ".", "api_key": "sekrit-value"}')
    assert out["error"]["code"] == "validation_error"

    def row() -> tuple[str, str, str] | None:
        with contextlib.closing(sqlite3.connect(live.home / "state.db")) as db:
            found: tuple[str, str, str] | None = db.execute(
                "SELECT status, error_code, args_preview FROM invocations WHERE correlation_id = ?",
                (out["correlation_id"],),
            ).fetchone()
        return found

    wait_for(lambda: row() is not None, 10)  # written just after the result left
    status, code, preview = row() or ("", "", "")
    assert (status, code) == ("error", "validation_error")
    assert "sekrit" not in preview and '"api_key": "***"' in preview
    assert "sekrit" not in out["invocation"]["args_preview"]


def test_scope_refusal_writes_an_audit_event(live: Cluster) -> None:
    out = live.call("workerHost.fs_stat", '{"path": "."}', agent_id="stranger")
    db = sqlite3.connect(live.home / "state.db")
    kinds = db.execute(
        "SELECT kind FROM audit_events WHERE correlation_id = ?", (out["correlation_id"],)
    ).fetchall()
    assert kinds == [("scope_required",)]


def test_a_result_is_stored_by_the_hub_then_acked_and_the_worker_lets_go(live: Cluster) -> None:
    """The caller has its answer at once; the hub stores it a moment later and only
    then acks, after which the worker's ledger marks it acked (no re-send needed)."""
    out = live.call("workerHost.fs_stat", '{"path": "."}', correlation_id="stored-1")
    assert out["status"] == "ok"

    def hub_state() -> str | None:
        with contextlib.closing(sqlite3.connect(live.home / "hub.db")) as db:
            row = db.execute("SELECT state FROM calls WHERE correlation_id = 'stored-1'").fetchone()
        return None if row is None else str(row[0])

    def worker_acked() -> bool:
        with contextlib.closing(sqlite3.connect(live.home / "state.db")) as db:
            row = db.execute("SELECT acked FROM calls WHERE correlation_id = 'stored-1'").fetchone()
        return bool(row and row[0] == 1)

    wait_for(lambda: hub_state() == "DONE" and worker_acked(), 5)
    again = live.call("workerHost.fs_stat", '{"path": "."}', correlation_id="stored-1")
    assert again["replayed"] is True and again["result"] == out["result"]
