"""`agentworker telemetry tail -f` follows rows as another process writes them,
filters included, and wakes on the write rather than on a timer."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker.core.ledger import State
from worker.core.telemetry import Telemetry
from worker.core.telemetry_query import ChangeWaiter
from worker.wire.proto import agentworker_pb2 as pb

WAIT_S = 30.0  # generous: only a hang reaches it


def _row(iid: str, plan: str, started: int) -> pb.Invocation:
    return pb.Invocation(
        invocation_id=iid,
        correlation_id=f"c-{iid}",
        plan_id=plan,
        agent_id="a",
        surface="workerHost",
        action="fs_stat",
        status="ok",
        started_unix_ms=started,
    )


@pytest.fixture
def telemetry(tmp_path: Path) -> Iterator[Telemetry]:
    state = State(tmp_path / "state.db")
    yield Telemetry(state.connection)
    state.close()


def test_tail_follow_prints_new_matching_rows_as_they_are_written(
    tmp_path: Path, telemetry: Telemetry
) -> None:
    telemetry.record_many([_row("old-1", "p", 1), _row("old-2", "p", 2), _row("old-q", "q", 3)])
    env = {**os.environ, "AGENTWORKER_HOME": str(tmp_path)}
    argv = ["telemetry", "tail", "-f", "-n", "1", "--plan", "p", "--json"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker", *argv], env=env, stdout=subprocess.PIPE, text=True
    )
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    stdout = proc.stdout
    reader = threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True)
    reader.start()
    try:
        assert json.loads(lines.get(timeout=WAIT_S))["invocation_id"] == "old-2"
        telemetry.record_many([_row("new-q", "q", 4)])  # another plan: filtered out
        telemetry.record(_row("new-1", "p", 5))
        assert json.loads(lines.get(timeout=WAIT_S))["invocation_id"] == "new-1"
        telemetry.record_many([_row("new-2", "p", 6), _row("new-3", "p", 7)])
        got = [json.loads(lines.get(timeout=WAIT_S))["invocation_id"] for _ in range(2)]
        assert got == ["new-2", "new-3"]
    finally:
        proc.terminate()
        proc.wait(10)
        stdout.close()


def test_the_waiter_wakes_on_a_write_to_the_database(tmp_path: Path, telemetry: Telemetry) -> None:
    """Waiting with a long timeout returns at once after a write: it does not poll."""
    with ChangeWaiter(tmp_path / "state.db") as changes:
        done = threading.Event()

        def wait() -> None:
            changes.wait(3600)
            done.set()

        waiter = threading.Thread(target=wait, daemon=True)
        waiter.start()
        telemetry.record(_row("x", "p", 1))
        assert done.wait(WAIT_S), "the waiter slept through the write"
