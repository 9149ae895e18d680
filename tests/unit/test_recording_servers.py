"""Recordings by (server, plan) (review12 finding 04a): the same correlation id of two
servers keeps two recorded calls; a state.db from before is converted with nothing
lost; `record` and `record stop` choose the server and say which, or ask.

The worker side across real hubs is tests/integration/test_recordings_per_server.py.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from worker.cli.main import main
from worker.core.ledger import UNRECORDED_SERVER, State
from worker.core.recording import Recordings
from worker.core.telemetry import COLUMNS, Telemetry
from worker.replay.record import record
from worker.wire.proto import agentworker_pb2 as pb


def _request(cid: str, plan: str, path: str) -> pb.ActionRequest:
    return pb.ActionRequest(
        correlation_id=cid,
        plan_id=plan,
        agent_id="rec",
        surface="workerHost",
        action="fs_write",
        args_json=f'{{"path": "{path}"}}',
    )


def test_two_servers_calls_of_one_id_are_kept_apart(tmp_path: Path) -> None:
    """A later server reusing an id (once the ledger forgot the first server's call)
    no longer replaces the recorded call (INSERT OR REPLACE by id alone)."""
    state = State(tmp_path / "state.db")
    try:
        recordings = Recordings(state.connection, recheck_s=0)
        assert recordings.start("A", "P", "me")
        assert recordings.active("A", "P") and not recordings.active("B", "P")
        recordings.keep_later("A", _request("c1", "P", "a.txt"), b"A's", "{}", b"")
        recordings.keep_later("B", _request("c1", "P", "b.txt"), b"B's", "{}", b"")
        recordings.flush()
        mine, theirs = recordings.calls("A", "P"), recordings.calls("B", "P")
        assert mine["c1"].request_blob == b"A's" and '"a.txt"' in str(mine["c1"].args_json)
        assert theirs["c1"].request_blob == b"B's"
        assert recordings.servers("P") == ["A", "B"]
        assert recordings.stop("A", "P") and not recordings.stop("B", "P")
    finally:
        state.close()


OLD_TABLES = f"""
CREATE TABLE invocations (
    kind TEXT NOT NULL DEFAULT 'v1:worker:invocation', {", ".join(COLUMNS)}
);
CREATE TABLE recording_plans (
    plan_id TEXT PRIMARY KEY, started_ms INTEGER NOT NULL, started_by TEXT NOT NULL
);
CREATE TABLE recorded_calls (
    correlation_id TEXT PRIMARY KEY, plan_id TEXT NOT NULL, args_json TEXT,
    redacted INTEGER NOT NULL, request_blob BLOB NOT NULL, result_json TEXT NOT NULL,
    result_blob_sha256 TEXT NOT NULL, unix_ms INTEGER NOT NULL,
    blob_left_out INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX recorded_calls_plan ON recorded_calls (plan_id, unix_ms);
CREATE TABLE audit_events (
    event_id TEXT PRIMARY KEY, correlation_id TEXT, kind TEXT NOT NULL, plan_id TEXT,
    agent_id TEXT, detail_json TEXT, unix_ms INTEGER NOT NULL
);
"""
EMPTY_SHA = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def _old_state_db(path: Path, *, left_out: bool) -> None:
    """A state.db as the worker left it before recordings were kept per server (with
    `left_out` False, from before review10's blob_left_out too): the ledger knows call
    "a1" (server A's, served last); "old1" is older than the ledger."""
    state = State(path)
    state.server = "A"
    state.record_served()
    state.claim("a1", "digest", "P")
    state.close()
    with contextlib.closing(sqlite3.connect(path)) as db:
        tables = OLD_TABLES
        if not left_out:
            tables = tables.replace(",\n    blob_left_out INTEGER NOT NULL DEFAULT 0", "")
            assert "blob_left_out" not in tables
        db.executescript(tables)
        for n, (cid, name) in enumerate((("old1", "old.txt"), ("a1", "a.txt"))):
            db.execute(
                "INSERT INTO invocations (invocation_id, correlation_id, plan_id, agent_id,"
                " surface, action, status, started_unix_ms, finished_unix_ms)"
                " VALUES (?, ?, 'P', 'rec', 'workerHost', 'fs_write', 'ok', ?, ?)",
                (f"i-{cid}", cid, 1000 + n, 1001 + n),
            )
            db.execute(
                "INSERT INTO recorded_calls (correlation_id, plan_id, args_json, redacted,"
                " request_blob, result_json, result_blob_sha256, unix_ms)"
                " VALUES (?, 'P', ?, 0, ?, '{}', ?, ?)",
                (cid, f'{{"path": "{name}"}}', cid.encode(), EMPTY_SHA, 1000 + n),
            )
        db.execute("INSERT INTO recording_plans VALUES ('P', 1, 'cli:0')")
        for cid in ("a1", "old1"):
            db.execute(
                "INSERT INTO audit_events VALUES (?, ?, 'path_not_allowed', 'P', 'rec', '{}', 1)",
                (f"e-{cid}", cid),
            )
        db.commit()


def _counts(path: Path) -> tuple[int, ...]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return tuple(
            db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
            for table in ("invocations", "recorded_calls", "recording_plans", "audit_events")
        )


def _steps(conn: sqlite3.Connection, server: str) -> list[str]:
    return [line for line in record(conn, server, "P", "b").lines[1:] if not line.startswith("#")]


@pytest.mark.parametrize("left_out", [True, False])
def test_a_state_db_from_before_is_converted_with_nothing_lost(
    tmp_path: Path, left_out: bool
) -> None:
    path = tmp_path / "state.db"
    _old_state_db(path, left_out=left_out)

    # A command-line tool does not convert the recorded calls (the worker does, at its
    # start): it reads them as from before, and makes the recorded plan the served one's.
    cli = State(path)
    try:
        conn = cli.connection
        recordings = Telemetry(conn).recordings
        assert [(s, p) for s, p, _, _ in recordings.plans()] == [("A", "P")]
        assert len(_steps(conn, UNRECORDED_SERVER)) == 2 and _steps(conn, "A") == []
    finally:
        cli.close()
    assert _counts(path) == (2, 2, 1, 2)

    for _ in range(2):  # the worker's start; again: nothing more changes
        worker = State(path, convert=True)
        try:
            conn = worker.connection
            telemetry = Telemetry(conn, convert=True)
            assert sorted(conn.execute("SELECT correlation_id, server FROM invocations")) == [
                ("a1", "A"),
                ("old1", UNRECORDED_SERVER),
            ]
            assert sorted(conn.execute("SELECT correlation_id, server FROM audit_events")) == [
                ("a1", "A"),
                ("old1", UNRECORDED_SERVER),
            ]
            kept = conn.execute("SELECT correlation_id, server, request_blob FROM recorded_calls")
            assert sorted(kept) == [("a1", "A", b"a1"), ("old1", UNRECORDED_SERVER, b"old1")]
            (mine,) = _steps(conn, "A")
            (before,) = _steps(conn, UNRECORDED_SERVER)
            assert "a.txt" in mine and "old.txt" in before
            assert telemetry.recordings.active("A", "P")  # recording goes on for A's plan
            assert not telemetry.recordings.active("B", "P")
        finally:
            worker.close()
        assert _counts(path) == (2, 2, 1, 2)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_record_and_stop_choose_the_recorded_server_or_ask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AGENTWORKER_HOME", str(tmp_path))
    state = State(tmp_path / "state.db")
    try:
        state.server = "C"  # the worker here served C last; P was recorded for A and B
        state.record_served()
        recordings = Recordings(state.connection)
        assert recordings.start("A", "P", "me") and recordings.start("B", "P", "me")
    finally:
        state.close()

    code, _, err = _cli(capsys, "record", "stop", "P")
    assert code == 2 and "recorded for several servers: A, B" in err, err
    assert "--server-key KEY" in err
    code, _, err = _cli(capsys, "record", "P")
    assert code == 2 and "recorded for several servers" in err, err

    code, out, _ = _cli(capsys, "record", "stop", "P", "--server-key", "B")
    assert code == 0 and "plan P of server B (named by its key)" in out, out
    code, out, _ = _cli(capsys, "record", "stop", "P")
    assert code == 0 and "server A (the only server with this plan recorded)" in out, out
    code, out, _ = _cli(capsys, "record", "stop", "P")
    assert code == 1 and "of server C was not being recorded" in out, out

    code, out, _ = _cli(capsys, "record", "start", "P")  # the served one, said
    assert code == 0 and "of server C (the server the worker here serves" in out, out
