"""An effect-free call's id past every id the ledger holds is new without a lookup (a
hub's ids begin with the time); any other id is looked up as before, so a duplicate is
answered from the ledger whether it is held, written, or from before a restart."""

from __future__ import annotations

from pathlib import Path

from worker.core.ledger import Seen, State

DIGEST = "blake3:" + "cd" * 32


def _lookups(state: State) -> list[str]:
    made: list[str] = []
    state.connection.set_trace_callback(
        lambda sql: made.append(sql) if sql.startswith("SELECT args_digest") else None
    )
    return made


def test_a_new_id_past_the_newest_is_not_looked_up_and_a_known_one_is(tmp_path: Path) -> None:
    state = State(tmp_path / "state.db")
    try:
        state.server = "A"
        made = _lookups(state)
        assert state.begin("0190-b", DIGEST, "p", claim=False).seen is Seen.NEW
        assert made == []  # past every id held: no lookup
        state.hold("0190-b", DIGEST, "p", b"result", b"")
        assert state.begin("0190-b", DIGEST, "p", claim=False).seen is Seen.DONE
        state.ack(["0190-b"])  # written now
        assert state.begin("0190-b", DIGEST, "p", claim=False).seen is Seen.DONE
        assert len(made) == 1  # not past the newest: looked up, found
        assert state.begin("0190-a", DIGEST, "p", claim=False).seen is Seen.NEW
        assert len(made) == 2  # an older id, unknown: looked up all the same
        assert state.begin("0190-c", DIGEST, "p").seen is Seen.NEW  # claimed: written
        assert state.begin("0190-c", DIGEST, "p", claim=False).seen is Seen.RUNNING
    finally:
        state.close()
    again = State(tmp_path / "state.db")  # after a restart: the newest comes from the rows
    try:
        again.server = "A"
        made = _lookups(again)
        assert again.begin("0190-b", DIGEST, "p", claim=False).seen is Seen.DONE
        assert again.begin("0190-c", DIGEST, "p", claim=False).seen is Seen.RUNNING
        assert again.begin("0190-d", DIGEST, "p", claim=False).seen is Seen.NEW
        assert len(made) == 2
    finally:
        again.close()
