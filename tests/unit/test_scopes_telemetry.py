from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from worker.config import RETENTION_VAR, Paths, load
from worker.core.ledger import Seen, State, Unacked, now_ms
from worker.core.scopes import ApprovalRequest, Grant, Scopes
from worker.core.telemetry import DAY_MS, Telemetry
from worker.errors import WorkerError
from worker.wire.proto import agentworker_pb2 as pb

NOW = datetime.now(UTC)


@pytest.mark.parametrize(
    ("grant", "scope", "admitted"),
    [
        (Grant("*", "workerHost.*"), "workerHost.fs_stat", True),
        (Grant("*", "workerHost.fs_*"), "workerHost.exec", False),
        (Grant("planner", "workerHost.fs_stat"), "workerHost.fs_stat", True),
        (Grant("other", "workerHost.fs_stat"), "workerHost.fs_stat", False),
        (Grant("*", "workerHost.fs_stat", plan="p2"), "workerHost.fs_stat", False),
        (
            Grant("*", "workerHost.*", expires=NOW - timedelta(seconds=1)),
            "workerHost.fs_stat",
            False,
        ),
        (Grant("*", "workerComputer.*"), "workerHost.fs_stat", False),
    ],
)
def test_grant_matching(grant: Grant, scope: str, admitted: bool) -> None:
    assert grant.admits("planner", scope, "p1", NOW) is admitted


def test_headless_scopes_never_prompt() -> None:
    scopes = Scopes([Grant("*", "workerHost.fs_stat")])
    request = ApprovalRequest("c1", "planner", "p1", "workerHost.exec", "{}")
    with pytest.raises(WorkerError) as err:
        asyncio.run(scopes.require(request))
    assert err.value.code == "scope_required"


def test_telemetry_prunes_rows_past_retention(tmp_path: Path) -> None:
    state = State(tmp_path / "t.db")
    telemetry = Telemetry(state.connection, retention_days=90)
    old = now_ms() - 91 * DAY_MS
    telemetry.record(pb.Invocation(invocation_id="old", correlation_id="a", started_unix_ms=old))
    telemetry.record(
        pb.Invocation(invocation_id="new", correlation_id="b", started_unix_ms=now_ms())
    )
    assert telemetry.prune() == 1
    assert [r["invocation_id"] for r in telemetry.rows()] == ["new"]


def test_retention_comes_from_the_environment_and_nonsense_is_ignored(tmp_path: Path) -> None:
    paths = Paths(config_dir=tmp_path, data_dir=tmp_path)
    assert load(paths, environ={}).telemetry.retention_days == 90
    assert load(paths, environ={RETENTION_VAR: "7"}).telemetry.retention_days == 7
    for nonsense in ("nonsense", "0", "-3", "1.5"):
        assert load(paths, environ={RETENTION_VAR: nonsense}).telemetry.retention_days == 90


def test_ledger_forgets_acked_results_after_the_ttl(tmp_path: Path) -> None:
    state = State(tmp_path / "s.db", ttl_s=-1)  # any finished row is past it at once
    assert state.begin("a", "d", "p").seen is Seen.NEW
    state.finish("a", b"result")
    assert state.unacked_results() == [Unacked("a", b"result", b"")]
    assert state.prune() == 0, "unacked results are kept whatever their age"
    state.ack(["a"])
    assert state.prune() == 1
    assert state.begin("a", "d", "p").seen is Seen.NEW


def test_held_effect_free_results_past_the_cap_go_to_the_ledger_oldest_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that never acks cannot grow the worker's memory: past HELD_BYTES the
    oldest held results are written like any unacked result, and still answered."""
    from worker.core import ledger

    monkeypatch.setattr(ledger, "HELD_BYTES", 1000)
    state = State(tmp_path / "s.db")
    for i in range(5):
        state.hold(f"c{i}", f"d{i}", "p", b"r" * 10, bytes([i]) * 300)
    assert [u.correlation_id for u in state.unacked_results()] == [f"c{i}" for i in range(5)]
    assert state._held_bytes <= 1000
    with contextlib.closing(sqlite3.connect(tmp_path / "s.db")) as db:
        written = [cid for (cid,) in db.execute("SELECT correlation_id FROM calls ORDER BY 1")]
    assert written and written[0] == "c0" and "c4" not in written
    begun = state.begin("c0", "d0", "p", claim=False)
    assert begun.seen is Seen.DONE and begun.blob == b"\0" * 300
    assert state.begin("c0", "other", "p", claim=False).seen is Seen.MISMATCH
    state.ack([f"c{i}" for i in range(5)])
    assert state.unacked_results() == [] and state._held_bytes == 0
    gone = state.begin("c4", "d4", "p", claim=False)
    assert gone.seen is Seen.DONE and gone.blob_gone and gone.blob_bytes == 300
    state.close()


def test_held_results_are_written_when_the_ledger_closes(tmp_path: Path) -> None:
    state = State(tmp_path / "s.db")
    state.hold("h1", "d", "p", b"result", b"blob")
    state.close()
    reopened = State(tmp_path / "s.db")
    assert reopened.unacked_results() == [Unacked("h1", b"result", b"blob", 4)]
    assert reopened.begin("h1", "d", "p", claim=False).seen is Seen.DONE
    reopened.close()
