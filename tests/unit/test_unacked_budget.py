"""The ledger's count of results the server has not acked (what the worker keeps until
it does): every way a result is kept or let go moves it, it survives a restart, and a
miscount is put right from the database before it refuses anything."""

from __future__ import annotations

from pathlib import Path

from worker.core.ledger import FILE_BLOB_BYTES, HELD_BYTES, Seen, State

DIGEST = "blake3:" + "cd" * 32


def _record(state: State, cid: str, blob: bytes) -> int:
    assert state.begin(cid, DIGEST, "p").seen is Seen.NEW
    state.finish(cid, b"result", blob)
    return len(b"result") + len(blob)


def test_results_count_from_their_record_to_their_ack_and_across_a_restart(
    tmp_path: Path,
) -> None:
    state = State(tmp_path / "state.db")
    small = _record(state, "small", b"s" * 100)
    large = _record(state, "large", b"l" * FILE_BLOB_BYTES)  # kept in a file
    state.hold("held", DIGEST, "p", b"r", b"h" * 10)  # an effect-free result, in memory
    assert state.unacked_bytes == small + large + 11
    state.ack(["large"] * 1200 + ["unknown"])  # repeats and strangers change nothing more
    assert state.unacked_bytes == small + 11
    state.ack(["held"])
    assert state.unacked_bytes == small
    state.close()

    again = State(tmp_path / "state.db")
    assert again.unacked_bytes == small
    again.ack(["small"])
    assert again.unacked_bytes == 0
    again.close()


def test_held_results_spilled_to_the_database_still_count(tmp_path: Path) -> None:
    state = State(tmp_path / "state.db")
    blob = b"b" * (HELD_BYTES // 4)
    for i in range(5):  # past HELD_BYTES: the oldest go to the database
        state.hold(f"h{i}", DIGEST, "p", b"r", blob)
    assert state.unacked_bytes == 5 * (1 + len(blob))
    state.ack([f"h{i}" for i in range(5)])
    assert state.unacked_bytes == 0
    state.close()


def test_the_budget_is_checked_against_the_database_before_it_refuses(tmp_path: Path) -> None:
    state = State(tmp_path / "state.db")
    kept = _record(state, "one", b"x" * 1000)
    assert not state.over_unacked_budget(kept + 1)
    assert state.over_unacked_budget(kept)
    state.connection.execute("UPDATE calls SET acked = 1")  # acked behind the count's back
    state._counted_at = 0.0  # the last count is old enough to be taken again
    assert not state.over_unacked_budget(kept)
    assert state.unacked_bytes == 0
    state.close()
