"""Telemetry past retention is pruned — rows, audit events and recorded calls — on
the worker's start and daily after, and the count is logged."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from tests.support.turns import with_work_beside
from worker import app
from worker.clock import now_ms
from worker.config import Config, Paths, TelemetrySection
from worker.core import results
from worker.core import telemetry as telemetry_module
from worker.core.ledger import State
from worker.core.telemetry import CAPPED_KIND, DAY_MS, ROW_OVERHEAD_BYTES, Telemetry, fair_share
from worker.wire.proto import agentworker_pb2 as pb


def _fill(telemetry: Telemetry, age_days: float, cid: str) -> None:
    """An invocation row, an audit event and a recorded call, `age_days` old."""
    at = now_ms() - int(age_days * DAY_MS)
    telemetry.record(pb.Invocation(invocation_id=cid, correlation_id=cid, started_unix_ms=at))
    telemetry.audit("path_not_allowed", correlation_id=cid)
    telemetry._db.execute("UPDATE audit_events SET unix_ms = ? WHERE correlation_id = ?", (at, cid))
    telemetry.recordings.keep_later(
        "A", pb.ActionRequest(correlation_id=cid, plan_id="p"), b"", "{}", b""
    )
    telemetry.recordings.flush()
    telemetry._db.execute(
        "UPDATE recorded_calls SET unix_ms = ? WHERE correlation_id = ?", (at, cid)
    )


def test_prune_all_forgets_each_kind_past_retention_and_counts_them(tmp_path: Path) -> None:
    state = State(tmp_path / "state.db")
    try:
        telemetry = Telemetry(state.connection, retention_days=7)
        _fill(telemetry, 8, "old")
        _fill(telemetry, 6, "new")
        assert telemetry.prune_all() == (1, 1, 1)
        assert telemetry.prune_all() == (0, 0, 0)
        assert [row["correlation_id"] for row in telemetry.rows()] == ["new"]
        assert list(telemetry.recordings.calls("A", "p")) == ["new"]
    finally:
        state.close()


def test_the_worker_prunes_on_start_and_logs_how_much(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    paths = Paths(config_dir=tmp_path, data_dir=tmp_path)
    dispatcher = app.build_dispatcher(paths, Config(telemetry=TelemetrySection(retention_days=3)))
    _fill(dispatcher.telemetry, 4, "old")

    async def start() -> None:
        housekeeping = asyncio.create_task(app._housekeeping(dispatcher))
        await asyncio.sleep(0)  # one turn: the task runs up to its first wait
        housekeeping.cancel()

    try:
        with caplog.at_level(logging.INFO, logger="agentworker"):
            asyncio.run(start())
    finally:
        dispatcher.close()
    assert (
        "telemetry: pruned 1 invocation rows, 1 audit events and 1 recorded calls older than "
        "3 days" in caplog.messages
    )
    assert app.TELEMETRY_PRUNE_EVERY_S == 86_400


def test_rows_past_the_cap_go_oldest_first_whatever_their_age(tmp_path: Path) -> None:
    """Retention bounds telemetry by age; the cap by size: a server sending calls (or
    refused ones, each an audit event) by the million cannot fill the disk in 90 days.
    An audit kind over the cap keeps its first event and its newest."""
    state = State(tmp_path / "state.db")
    try:
        telemetry = Telemetry(state.connection, max_rows=3)
        for i in range(5):
            _fill(telemetry, 0, f"c{i}")
        assert telemetry.cap_rows() == 4  # two of each table
        kept = [row["correlation_id"] for row in telemetry.rows(limit=10)]
        assert sorted(kept) == ["c2", "c3", "c4"]
        assert [len(telemetry.audit_rows(f"c{i}")) for i in range(5)] == [1, 0, 0, 1, 1]
        assert telemetry.cap_rows() == 0
    finally:
        state.close()


def _audit_log(telemetry: Telemetry) -> list[tuple[str, str, dict[str, object]]]:
    cur = telemetry._db.execute(
        "SELECT kind, correlation_id, detail_json FROM audit_events ORDER BY rowid"
    )
    return [(kind, cid, json.loads(detail)) for kind, cid, detail in cur]


def test_a_flood_of_refusals_erases_neither_the_persons_acts_nor_other_kinds(
    tmp_path: Path,
) -> None:
    """Review2 finding 04: 1,100 refused calls past `max_rows = 1000` erased the
    agent's earlier `cat /etc/shadow` attempt and the person's own kill. The cap now
    takes a flood's rows from its own kind, keeping its first and last with a count,
    and never the person's acts."""
    state = State(tmp_path / "state.db")
    try:
        telemetry = Telemetry(state.connection, max_rows=1000)
        telemetry.audit("path_not_allowed", correlation_id="shadow", agent_id="evil")
        telemetry.audit("kill", plan_id="p-evil", detail={"reason": "no", "by": "cli"})
        telemetry.audit("kill", plan_id="p-x", detail={"reason": "flood", "by": "server"})
        telemetry.audit("lift", plan_id="p-evil", detail={"by": "ui"})
        for i in range(1100):
            telemetry.audit("scope_required", correlation_id=f"f{i}", agent_id="evil")
        assert telemetry.cap_rows() == 102  # 1,102 of the agent's (and server's): 1,000 kept
        log = _audit_log(telemetry)
        kinds = [kind for kind, _, _ in log]
        assert kinds.count("scope_required") == 1000 - 2 and "path_not_allowed" in kinds
        assert [cid for kind, cid, _ in log if kind == "path_not_allowed"] == ["shadow"]
        assert sum(1 for kind, _, d in log if kind == "kill" and d.get("by") == "cli") == 1
        assert "lift" in kinds
        flood = [cid for kind, cid, _ in log if kind == "scope_required"]
        assert flood[0] == "f0" and flood[-1] == "f1099" and "f1" not in flood
        (capped,) = [d for kind, _, d in log if kind == CAPPED_KIND]
        assert capped["kind"] == "scope_required" and capped["removed"] == 102
        # The same flood again takes only its own kind, never the first of it.
        for i in range(1100, 2200):
            telemetry.audit("scope_required", correlation_id=f"f{i}", agent_id="evil")
        telemetry.cap_rows()
        log = _audit_log(telemetry)
        assert [cid for kind, cid, _ in log if kind == "path_not_allowed"] == ["shadow"]
        flood = [cid for kind, cid, _ in log if kind == "scope_required"]
        assert flood[0] == "f0" and flood[-1] == "f2199" and len(flood) == 998
        assert sum(1 for kind, _, d in log if kind == "kill" and d.get("by") == "cli") == 1
    finally:
        state.close()


def test_each_kind_keeps_a_fair_share() -> None:
    assert fair_share([1, 5, 1000], 100) == 94
    assert fair_share([10, 10], 100) == 10
    assert fair_share([500, 500], 100) == 50
    assert fair_share([5000], 1) == 2


def test_large_rows_are_capped_by_bytes_before_their_count(tmp_path: Path) -> None:
    """review25 G1: a million rows of the server's largest (five 256-character ids,
    an error message) took 3.1 GB; each table keeps about `max_table_bytes`."""
    state = State(tmp_path / "state.db")
    try:
        telemetry = Telemetry(state.connection, max_rows=100)
        telemetry.max_table_bytes = 50_000
        big = "x" * 900
        for n in range(60):
            telemetry.record(
                pb.Invocation(invocation_id=f"i{n}", correlation_id=f"c{n}", agent_id=big)
            )
            telemetry.audit("path_not_allowed", correlation_id=f"c{n}", agent_id=big)
        telemetry.cap_rows()
        kept = len(telemetry.rows(limit=1000))
        assert 40 <= kept <= 52, kept  # 50,000 bytes of ~1,000-byte rows, not 100 rows
        assert telemetry.rows(limit=1)[0]["correlation_id"] == "c59"  # the newest stay
        audited = state.connection.execute(
            "SELECT COUNT(*) FROM audit_events WHERE kind = 'path_not_allowed'"
        ).fetchone()[0]
        assert audited <= 52, audited
        small = Telemetry(state.connection, max_rows=100)
        small.max_table_bytes = 50_000
        for n in range(60):
            small.record(pb.Invocation(invocation_id=f"s{n}", correlation_id=f"s{n}"))
        small.cap_rows()
        assert len(small.rows(limit=1000)) == 100  # small rows: the count is the bound
    finally:
        state.close()


def test_a_flood_of_rows_is_capped_as_it_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not only at the hourly housekeeping: 800 refused calls a second wrote 9 GB an hour."""
    monkeypatch.setattr(results, "CAP_EVERY_ROWS", 30)
    state = State(tmp_path / "state.db")
    try:
        telemetry = Telemetry(state.connection, max_rows=10)
        written = results.Results(state, telemetry, results.Outbox())
        for n in range(25):
            telemetry.record_later([pb.Invocation(invocation_id=f"i{n}", correlation_id=f"c{n}")])
        assert written.write_telemetry()
        assert len(telemetry.rows(limit=100)) == 25  # 25 written: not yet due
        for n in range(25, 35):
            telemetry.record_later([pb.Invocation(invocation_id=f"i{n}", correlation_id=f"c{n}")])
        assert written.write_telemetry()
        assert len(telemetry.rows(limit=100)) == 10 and telemetry.written_since_cap == 0
    finally:
        state.close()


def _bytes_kept(telemetry: Telemetry) -> int:
    (kept,) = telemetry._db.execute(
        f"SELECT SUM({telemetry_module._SIZES['invocations']} + {ROW_OVERHEAD_BYTES})"
        " FROM invocations"
    ).fetchone()
    return int(kept)


def test_a_flood_of_large_rows_under_a_tail_of_small_ones_is_capped_by_bytes(
    tmp_path: Path,
) -> None:
    """review25 G1b: sized by the newest rows' average, small rows written last let the
    large ones before them stay (9.2 times the bound); and bytes, not characters."""
    state = State(tmp_path / "state.db")
    try:
        telemetry = Telemetry(state.connection, max_rows=10_000)
        telemetry.max_table_bytes = 100_000
        wide = "\U0001f600" * 250  # 250 characters, 1,000 bytes
        for n in range(400):
            telemetry.record(pb.Invocation(invocation_id=f"b{n}", agent_id=wide))
        for n in range(1000):
            telemetry.record(pb.Invocation(invocation_id=f"s{n}"))
        telemetry.cap_rows()
        assert _bytes_kept(telemetry) <= 100_000
        assert telemetry.rows(limit=1)[0]["invocation_id"] == "s999"
    finally:
        state.close()


def test_the_worker_caps_in_steps_with_other_work_between(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review25 G1c: 254,000 rows removed at once held the event loop 2 s."""
    monkeypatch.setattr(telemetry_module, "WALK_ROWS", 100)
    monkeypatch.setattr(telemetry_module, "DELETE_ROWS", 100)
    state = State(tmp_path / "state.db")
    try:
        telemetry = Telemetry(state.connection, max_rows=100)
        telemetry.record_many([pb.Invocation(invocation_id=f"i{n}") for n in range(1000)])

        gone, turns = with_work_beside(telemetry.cap_rows_in_steps())
        assert gone == 900 and len(telemetry.rows(limit=2000)) == 100
        assert turns >= 9  # nine deletes of 100 (and the walk's one step): a turn after each
    finally:
        state.close()
