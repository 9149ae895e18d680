"""The ledger's acked calls (kept `ttl_s` for a late duplicate) take a bounded number of
bytes (review25 G1: 800 refused calls a second kept ~137 GB a day): past it the
oldest acked ones go early, in steps, and nothing unacked or running ever does."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.turns import with_work_beside
from worker import db
from worker.core import results
from worker.core.ledger import Seen, State
from worker.core.telemetry import Telemetry

DIGEST = "blake3:" + "cd" * 32


def _finished(state: State, cid: str, result: bytes) -> None:
    assert state.begin(cid, DIGEST, "p").seen is Seen.NEW
    state.finish(cid, result)


def test_the_oldest_acked_calls_go_past_the_bound_and_nothing_unacked_does(
    tmp_path: Path,
) -> None:
    state = State(tmp_path / "state.db")
    try:
        state.server = "A"
        result = b"r" * 1000
        for n in range(50):
            _finished(state, f"acked-{n:02}", result)
        state.ack([f"acked-{n:02}" for n in range(50)])
        _finished(state, "unacked", result)
        assert state.begin("running", DIGEST, "p").seen is Seen.NEW
        state.max_acked_bytes = 20 * 1200  # about twenty of them
        assert state.acked_since_cap == 50
        forgot = db.at_once(state.cap_acked())
        left = [
            cid
            for (cid,) in state.connection.execute(
                "SELECT correlation_id FROM calls WHERE acked = 1 ORDER BY rowid"
            )
        ]
        assert 15 <= len(left) <= 21 and forgot == 50 - len(left)
        assert left[-1] == "acked-49"  # the newest stay
        assert state.unacked_ids() == ["unacked"] and state.running_ids() == ["running"]
        assert state.acked_since_cap == 0
        assert db.at_once(state.cap_acked()) == 0
        # A duplicate of a forgotten call is new to the ledger (the hub answers it).
        assert state.begin("acked-00", DIGEST, "p").seen is Seen.NEW
    finally:
        state.close()


def test_the_bound_is_applied_in_steps_with_other_work_between(tmp_path: Path) -> None:
    state = State(tmp_path / "state.db")
    try:
        state.server = "A"
        ids = [f"c-{n:05}" for n in range(3000)]
        for cid in ids:
            _finished(state, cid, b"r" * 100)
        state.ack(ids)
        state.max_acked_bytes = 100 * 200

        forgot, turns = with_work_beside(db.in_steps(state.cap_acked()))
        assert forgot >= 2800 and turns >= 2  # deleted a thousand at a time, turns between
    finally:
        state.close()


def test_a_flood_of_acks_applies_the_bound_as_it_comes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not only at the hourly housekeeping: 800 calls a second kept 5.8 GB an hour."""
    monkeypatch.setattr(results, "ACKED_CAP_EVERY", 40)
    state = State(tmp_path / "state.db")
    try:
        state.server = "A"
        state.max_acked_bytes = 10 * 1200
        written = results.Results(state, Telemetry(state.connection), results.Outbox())
        for n in range(50):
            _finished(state, f"c-{n:02}", b"r" * 1000)

        async def main() -> None:
            written.ack([f"c-{n:02}" for n in range(30)])  # 30 of 40: not yet due
            assert written._capping_acked is None
            written.ack([f"c-{n:02}" for n in range(30, 50)])
            capping = written._capping_acked
            assert capping is not None
            await capping

        asyncio.run(main())
        (acked,) = state.connection.execute("SELECT COUNT(*) FROM calls WHERE acked = 1").fetchone()
        assert 5 <= acked <= 11, acked
    finally:
        state.close()
