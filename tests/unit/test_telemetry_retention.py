"""Telemetry past retention is pruned — rows, audit events and recorded calls — on
the worker's start and daily after, and the count is logged."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from worker import app
from worker.clock import now_ms
from worker.config import Config, Paths, TelemetrySection
from worker.core.ledger import State
from worker.core.telemetry import DAY_MS, Telemetry
from worker.wire.proto import agentworker_pb2 as pb


def _fill(telemetry: Telemetry, age_days: float, cid: str) -> None:
    """An invocation row, an audit event and a recorded call, `age_days` old."""
    at = now_ms() - int(age_days * DAY_MS)
    telemetry.record(pb.Invocation(invocation_id=cid, correlation_id=cid, started_unix_ms=at))
    telemetry.audit("kill", correlation_id=cid)
    telemetry._db.execute("UPDATE audit_events SET unix_ms = ? WHERE correlation_id = ?", (at, cid))
    telemetry.recordings.keep_later(
        pb.ActionRequest(correlation_id=cid, plan_id="p"), b"", "{}", b""
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
        assert list(telemetry.recordings.calls("p")) == ["new"]
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
    refused ones, each an audit event) by the million cannot fill the disk in 90 days."""
    state = State(tmp_path / "state.db")
    try:
        telemetry = Telemetry(state.connection, max_rows=3)
        for i in range(5):
            _fill(telemetry, 0, f"c{i}")
        assert telemetry.cap_rows() == 4  # two of each kind
        kept = [row["correlation_id"] for row in telemetry.rows(limit=10)]
        assert sorted(kept) == ["c2", "c3", "c4"]
        assert [row["correlation_id"] for row in telemetry.audit_rows("c1")] == []
        assert len(telemetry.audit_rows("c2")) == 1
        assert telemetry.cap_rows() == 0
    finally:
        state.close()
