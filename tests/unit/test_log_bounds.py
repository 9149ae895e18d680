"""The log stays bounded however many calls an agent has refused (review10 finding 12):
the hub counts audit events into a line per (worker, agent, kind) and interval, and
agentworker.log is rotated."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker.cli.serve import LOG_FILES, _log_to_file
from worker.config import Paths
from worker.hub.audit_log import MAX_KEYS, OTHER_AGENTS, AuditLines
from worker.wire.proto import agentworker_pb2 as pb


def _event(agent: str, kind: str = "scope_required") -> pb.AuditEvent:
    return pb.AuditEvent(kind=kind, agent_id=agent, detail_json='{"action": "workerHost.fs_stat"}')


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "worker.hub.audit_log"]


def test_repeated_refusals_are_one_line_then_a_count(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)

    async def go() -> None:
        lines = AuditLines(interval_s=3600)
        for _ in range(3000):
            lines.event("w1", _event("nobody"))
        lines.event("w1", _event("nobody", "url_not_allowed"))
        assert len(_lines(caplog)) == 2  # the first of each kind, whole
        lines.flush()  # the interval ends
        lines.event("w1", _event("nobody"))
        lines.close()

    asyncio.run(go())
    said = _lines(caplog)
    assert "scope_required (agent nobody)" in said[0] and "workerHost.fs_stat" in said[0]
    assert "url_not_allowed" in said[1]
    assert said[2].startswith("audit from w1: 2999 more scope_required of agent nobody")
    assert "scope_required (agent nobody)" in said[3]  # the next interval's first
    assert len(said) == 4


def test_new_agent_ids_buy_no_more_lines(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)

    async def go() -> None:
        lines = AuditLines(interval_s=3600)
        for n in range(1000):
            lines.event("w1", _event(f"agent-{n}"))
        lines.close()

    asyncio.run(go())
    said = _lines(caplog)
    assert len(said) == MAX_KEYS + 1
    assert f"{1000 - MAX_KEYS} more scope_required of agent {OTHER_AGENTS}" in said[-1]


@pytest.fixture
def root_handlers() -> Iterator[None]:
    root = logging.getLogger()
    kept, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    for handler in kept:
        root.addHandler(handler)
    root.setLevel(level)


@pytest.mark.usefixtures("root_handlers")
def test_the_log_file_is_rotated_at_its_bound(tmp_path: Path) -> None:
    paths = Paths(config_dir=tmp_path / "config", data_dir=tmp_path / "data")
    log_file = _log_to_file(paths, max_bytes=10_000)
    logging.getLogger().setLevel(logging.INFO)
    for n in range(2000):  # 2000 lines of ~150 bytes: 30 times the bound
        logging.getLogger("worker.hub.server").info("line %d %s", n, "x" * 100)
    files = sorted(log_file.parent.glob("agentworker.log*"))
    assert 1 < len(files) <= LOG_FILES, files
    assert all(path.stat().st_size <= 10_000 for path in files), files
    assert "line 1999 " in log_file.read_text()
