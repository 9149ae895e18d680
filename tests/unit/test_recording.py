"""Recording a plan for replay: what a recorded call keeps, that other plans keep
nothing, and the script `record` makes of it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from pathlib import Path

import pytest

from worker.config import Config, GrantSection, RootSection
from worker.core.ledger import NO_SERVER, State
from worker.core.recording import PAST_BOUND, Recordings
from worker.core.redaction import args_for_replay
from worker.core.telemetry import Telemetry
from worker.replay import script as fmt
from worker.replay.record import record, stable
from worker.replay.targets import in_process
from worker.wire.proto import agentworker_pb2 as pb

IN_PROCESS = NO_SERVER  # the server of an in-process worker (no connection names one)


def test_args_for_replay_mask_secret_looking_values_and_cut_nothing() -> None:
    long_text = "x" * 500
    args = {"url": "https://a", "headers": {"Authorization": "Bearer t", "X-Api-Key": "k"}}
    kept, masked = args_for_replay(json.dumps({**args, "body": long_text}))
    assert masked
    assert json.loads(kept or "") == {
        "url": "https://a",
        "headers": {"Authorization": "***", "X-Api-Key": "***"},
        "body": long_text,
    }


@pytest.mark.parametrize(
    ("args", "kept"),
    [
        (  # a token in a query (rec7's leftover: keys were the only thing looked at)
            {"url": "https://api.example/v1?access_token=SECRET123&page=2#top"},
            {"url": "https://api.example/v1?access_token=***&page=2#top"},
        ),
        ({"url": "https://ann:pw@example.org/a?b=c"}, {"url": "https://ann:***@example.org/a?b=c"}),
        (
            {"argv": ["curl", "-H", "Authorization: Bearer abcdefghijk", "--password", "hunter2"]},
            {"argv": ["curl", "-H", "Authorization: ***", "--password", "***"]},
        ),
        (
            {
                "argv": [
                    "git",
                    "push",
                    "--token=xyz",
                    "https://hooks.slack.com/services/T0001/B0001/XXXXXXXX",
                ]
            },
            {"argv": ["git", "push", "--token=***", "https://hooks.slack.com/services/***"]},
        ),
        (
            {"text": "the key is ghp_abcdefghijklmnopqrstuvwxyz0123"},
            {"text": "the key is ***"},
        ),
    ],
)
def test_args_for_replay_mask_secrets_inside_strings_and_keep_the_rest(
    args: dict[str, object], kept: dict[str, object]
) -> None:
    replayed, masked = args_for_replay(json.dumps(args))
    assert masked and json.loads(replayed or "") == kept


def test_args_without_secrets_are_kept_as_they_are() -> None:
    url = '{"url": "https://example.org/a%20b?q=1&page=2#frag"}'  # not re-encoded
    assert args_for_replay(url) == (url, False)
    assert args_for_replay('{"path": "token.txt"}') == ('{"path": "token.txt"}', False)
    assert args_for_replay("") == ("{}", False)


def test_args_that_are_not_a_json_object_are_not_kept() -> None:
    assert args_for_replay("[1, 2]") == (None, False)
    assert args_for_replay("{oops") == (None, False)


def test_recording_switched_on_elsewhere_is_seen_at_the_next_check(tmp_path: Path) -> None:
    """The CLI writes from another process: data_version tells the worker's cache."""
    worker = State(tmp_path / "state.db")
    cli = State(tmp_path / "state.db")
    try:
        watching = Recordings(worker.connection, recheck_s=0)
        assert not watching.active("A", "p")
        assert Recordings(cli.connection).start("A", "p", "cli")
        assert watching.active("A", "p")
        assert Recordings(cli.connection).stop("A", "p")
        assert not watching.active("A", "p")
    finally:
        worker.close()
        cli.close()


def test_starting_twice_and_stopping_what_was_not_started_say_so(tmp_path: Path) -> None:
    state = State(tmp_path / "state.db")
    try:
        recordings = Recordings(state.connection)
        assert recordings.start("A", "p", "me") and not recordings.start("A", "p", "me")
        assert [(who, plan) for who, plan, _, _ in recordings.plans()] == [("A", "p")]
        assert recordings.stop("A", "p") and not recordings.stop("A", "p")
    finally:
        state.close()


def _config(workspace: Path) -> Config:
    return Config(
        root=[RootSection(path=workspace, mode="rw")],
        grant=[GrantSection(agent="rec", scopes=["workerHost.fs_*", "workerHost.http_fetch"])],
    )


def _request(cid: str, plan: str, action: str, args: object) -> pb.ActionRequest:
    return pb.ActionRequest(
        correlation_id=cid,
        plan_id=plan,
        agent_id="rec",
        surface="workerHost",
        action=action,
        args_json=json.dumps(args),
    )


def _session(tmp_path: Path) -> Path:
    """Calls of plan "kept" (recorded) and "other" (not) on a worker in this process;
    returns the data dir."""
    data, workspace = tmp_path / "data", tmp_path / "workspace"
    data.mkdir()
    workspace.mkdir()
    state = State(data / "state.db")
    Recordings(state.connection).start(IN_PROCESS, "kept", "test")
    state.close()

    async def calls() -> None:
        async with in_process(_config(workspace), tmp_path, data) as worker:
            write = _request("w1", "kept", "fs_write", {"path": "a.txt", "mode": "create"})
            await worker.call(write, b"hello")
            await worker.call(_request("s1", "kept", "fs_stat", {"path": "a.txt"}), b"")
            await worker.call(_request("r1", "kept", "fs_read", {"path": "a.txt"}), b"")
            secret = {"url": "http://127.0.0.1:9/", "headers": {"Authorization": "Bearer x"}}
            await worker.call(_request("h1", "kept", "http_fetch", secret), b"")
            await worker.call(_request("n1", "kept", "fs_stat", {"path": "none.txt"}), b"")
            await worker.call(_request("o1", "other", "fs_stat", {"path": "a.txt"}), b"")

    asyncio.run(calls())
    return data


def test_a_recorded_plan_keeps_its_calls_and_another_plan_keeps_nothing(tmp_path: Path) -> None:
    data = _session(tmp_path)
    with contextlib.closing(sqlite3.connect(data / "state.db")) as db:
        kept = dict(db.execute("SELECT correlation_id, plan_id FROM recorded_calls").fetchall())
        blob = db.execute(
            "SELECT request_blob FROM recorded_calls WHERE correlation_id = 'w1'"
        ).fetchone()[0]
        invocations = db.execute("SELECT COUNT(*) FROM invocations").fetchone()[0]
    assert kept == {cid: "kept" for cid in ("w1", "s1", "r1", "h1", "n1")}
    assert blob == b"hello"
    assert invocations == 6


def test_record_writes_the_plan_as_a_script_whose_steps_expect_what_happened(
    tmp_path: Path,
) -> None:
    data = _session(tmp_path)
    state = State(data / "state.db")
    try:
        Telemetry(state.connection)
        recorded = record(state.connection, IN_PROCESS, "kept", "s.blobs")
    finally:
        state.close()
    assert recorded.steps == 5 and recorded.without_args == 0 and recorded.redacted == 1
    assert recorded.blobs == {"s.blobs/step-1.bin": b"hello"}
    (tmp_path / "s.blobs").mkdir()
    (tmp_path / "s.blobs/step-1.bin").write_bytes(b"hello")
    script = fmt.parse(recorded.text(), base=tmp_path)
    assert script.malformed == []
    assert script.header.plan == "kept"
    write, stat, read, fetch, missing = script.entries
    assert write.step.action == "fs_write" and write.step.blob == "s.blobs/step-1.bin"
    assert write.expect.result is not None and write.expect.result["created"] is True
    assert stat.expect.result is not None and "mtime" not in stat.expect.result
    assert stat.expect.result["size"] == 5
    assert (
        read.expect.blob_sha256
        == "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
    )
    assert fetch.step.args["headers"] == {"Authorization": "***"}
    assert fetch.expect.error_code == "url_not_allowed"
    assert (missing.expect.status, missing.expect.error_code) == ("error", "not_found")
    assert all(e.agent == "rec" and e.plan == "kept" for e in script.entries)
    assert "Bearer" not in recorded.text()


def test_calls_made_before_recording_became_comments(tmp_path: Path) -> None:
    data = _session(tmp_path)
    state = State(data / "state.db")
    try:
        recorded = record(state.connection, IN_PROCESS, "other", "s.blobs")
    finally:
        state.close()
    assert recorded.steps == 0 and recorded.without_args == 1
    (comment,) = [line for line in recorded.lines if line.startswith("#")]
    assert "workerHost.fs_stat" in comment and "recording was off" in comment
    assert fmt.parse(recorded.text(), base=tmp_path).entries == []


def test_volatile_fields_are_left_out_at_any_depth() -> None:
    result = {"size": 1, "mtime": 2.0, "entries": [{"name": "a", "mtime": 3.0, "owner": "me"}]}
    assert stable(result) == {"size": 1, "entries": [{"name": "a"}]}


def test_with_timing_each_step_waits_as_long_as_the_session_paused(tmp_path: Path) -> None:
    data = _session(tmp_path)
    state = State(data / "state.db")
    try:
        rows = state.connection.execute(
            "SELECT started_unix_ms, finished_unix_ms FROM invocations WHERE plan_id = 'kept'"
            " ORDER BY started_unix_ms, rowid"
        ).fetchall()
        paced = fmt.parse(
            record(state.connection, IN_PROCESS, "kept", "b", timing=True).text(), base=data
        )
        plain = fmt.parse(record(state.connection, IN_PROCESS, "kept", "b").text(), base=data)
    finally:
        state.close()
    gaps = [0] + [max(0, start - end) for (start, _), (_, end) in zip(rows[1:], rows, strict=False)]
    waits = [item.step.wait_ms if isinstance(item, fmt.Entry) else None for item in paced.items]
    assert waits[1:] == gaps[1:]  # the first step (with a blob missing here) is malformed
    assert all(e.step.wait_ms == 0 for e in plain.entries)


def test_a_servers_names_in_a_comment_cannot_start_a_step(tmp_path: Path) -> None:
    """An action name and a correlation id are the server's; a line break in either,
    written raw into a comment, made the rest a step of the script, which `replay` ran.
    (Both are refused on arrival now: rows an older worker let in are made here.)"""
    step = '{"action":"fs_write","args":{"path":"I"}}'
    data, workspace = tmp_path / "data", tmp_path / "workspace"
    data.mkdir()
    workspace.mkdir()

    async def calls() -> None:
        async with in_process(_config(workspace), tmp_path, data) as worker:
            await worker.call(_request("a1", "p", "x", {}), b"")
            await worker.call(_request("a2", "p", "", {}), b"")

    asyncio.run(calls())
    state = State(data / "state.db")
    try:
        # Rows an older worker let in (it now refuses such a name and id on arrival).
        state.connection.execute(
            "UPDATE invocations SET action = ? WHERE correlation_id = 'a1'", (f"x\n{step}\n#",)
        )
        state.connection.execute(
            "UPDATE invocations SET correlation_id = ? WHERE correlation_id = 'a2'",
            (f"c1\u2028{step}\r#",),
        )
        recorded = record(state.connection, IN_PROCESS, "p", "s.blobs")
    finally:
        state.close()
    assert len(recorded.lines) == 3 and all(line.startswith("#") for line in recorded.lines[1:])
    assert fmt.parse(recorded.text(), base=tmp_path).items == ()
    assert "\\n" + step in recorded.text() and "\\u2028" + step in recorded.text()


def test_a_refused_call_keeps_no_blob_and_its_step_says_so(tmp_path: Path) -> None:
    """review10 05: a call refused before it ran (here: an agent with no grant) kept
    its whole request blob while the plan was recorded."""
    data, workspace = tmp_path / "data", tmp_path / "workspace"
    data.mkdir()
    workspace.mkdir()
    state = State(data / "state.db")
    Recordings(state.connection).start(IN_PROCESS, "p", "test")
    state.close()
    blob = b"x" * (1024 * 1024)

    async def calls() -> None:
        async with in_process(_config(workspace), tmp_path, data) as worker:
            refused = _request("w1", "p", "fs_write", {"path": "a.txt", "mode": "create"})
            refused.agent_id = "nobody"
            answer = await worker.call(refused, blob)
            assert answer.error_code == "scope_required", answer

    asyncio.run(calls())
    state = State(data / "state.db")
    try:
        kept, left_out = state.connection.execute(
            "SELECT length(request_blob), blob_left_out FROM recorded_calls"
            " WHERE correlation_id = 'w1'"
        ).fetchone()
        recorded = record(state.connection, IN_PROCESS, "p", "s.blobs")
    finally:
        state.close()
    assert (kept, left_out) == (0, len(blob))
    assert not (workspace / "a.txt").exists()
    assert recorded.steps == 1 and recorded.blobs == {}
    assert f"({len(blob)} bytes) was not kept" in recorded.text()
    (step,) = fmt.parse(recorded.text(), base=tmp_path).entries
    assert step.step.blob is None and step.expect.error_code == "scope_required"


def test_recordings_keep_blobs_up_to_their_bound_and_say_when_it_is_reached(
    tmp_path: Path,
) -> None:
    data, workspace = tmp_path / "data", tmp_path / "workspace"
    data.mkdir()
    workspace.mkdir()
    state = State(data / "state.db")
    Recordings(state.connection).start(IN_PROCESS, "p", "test")
    state.close()

    async def calls() -> None:
        async with in_process(_config(workspace), tmp_path, data) as worker:
            worker.dispatcher.telemetry.recordings.max_blob_bytes = 10
            for n in range(3):
                write = _request(f"w{n}", "p", "fs_write", {"path": f"{n}.txt", "mode": "create"})
                answer = await worker.call(write, b"12345678")
                assert answer.status == "ok", answer

    asyncio.run(calls())
    state = State(data / "state.db")
    try:
        kept = state.connection.execute(
            "SELECT correlation_id, length(request_blob), blob_left_out FROM recorded_calls"
            " ORDER BY correlation_id"
        ).fetchall()
        full = state.connection.execute(
            "SELECT detail_json FROM audit_events WHERE kind = 'recording_full'"
        ).fetchall()
        recorded = record(state.connection, IN_PROCESS, "p", "s.blobs")
    finally:
        state.close()
    assert kept == [("w0", 8, 0), ("w1", 0, 8), ("w2", 0, 8)]
    assert len(full) == 1 and "their bound" in json.loads(full[0][0])["message"]
    assert recorded.steps == 1 and recorded.without_args == 2
    assert recorded.text().count("the recordings reached their bound") == 2


def test_recordings_keep_args_and_results_up_to_their_bound_refused_calls_too(
    tmp_path: Path,
) -> None:
    """review25 G12: each recorded call kept its args whole for 90 days, refused ones
    too (an agent with no grant and 1 MiB of argv: 150 calls, 150 MB)."""
    data, workspace = tmp_path / "data", tmp_path / "workspace"
    data.mkdir()
    workspace.mkdir()
    state = State(data / "state.db")
    Recordings(state.connection).start(IN_PROCESS, "p", "test")
    state.close()
    padding = "x" * 3000

    async def calls() -> None:
        async with in_process(_config(workspace), tmp_path, data) as worker:
            worker.dispatcher.telemetry.recordings.max_text_bytes = 5000
            for n in range(3):
                stat = _request(f"s{n}", "p", "fs_stat", {"path": padding})
                stat.agent_id = "nobody"  # refused: scope_required
                answer = await worker.call(stat, b"")
                assert answer.error_code == "scope_required", answer

    asyncio.run(calls())
    state = State(data / "state.db")
    try:
        kept = state.connection.execute(
            "SELECT correlation_id, args_json IS NOT NULL, redacted FROM recorded_calls"
            " ORDER BY correlation_id"
        ).fetchall()
        full = state.connection.execute(
            "SELECT COUNT(*) FROM audit_events WHERE kind = 'recording_full'"
        ).fetchone()[0]
        recorded = record(state.connection, IN_PROCESS, "p", "s.blobs")
    finally:
        state.close()
    assert kept == [("s0", 1, 0), ("s1", 0, PAST_BOUND), ("s2", 0, PAST_BOUND)]
    assert full == 1
    assert recorded.steps == 1 and recorded.without_args == 2
    assert recorded.text().count("the recordings reached their bound") == 2


def test_the_bound_counts_bytes_and_telemetrys_cap_leaves_recordings_alone(
    tmp_path: Path,
) -> None:
    """review25 G12b: the bound counted characters (four-byte ones kept 4x as much);
    G12c: telemetry's cap took recorded calls with the rows it removed, so an agent's
    flood in another plan erased the person's recording; G12b's rows past the bound
    are bounded by a count of their own."""
    state = State(tmp_path / "state.db")
    try:
        telemetry = Telemetry(state.connection, max_rows=2)
        recordings = telemetry.recordings
        recordings.max_text_bytes = 100
        recordings.max_calls = 3
        emoji = "\U0001f600" * 20  # 20 characters, 80 bytes
        for n in range(4):
            cid = f"c{n}"
            telemetry.record(
                pb.Invocation(invocation_id=cid, correlation_id=cid, started_unix_ms=n)
            )
            recordings.keep_later(
                "A", pb.ActionRequest(correlation_id=cid, plan_id="p"), b"", emoji, b""
            )
            recordings.flush()
        kept = dict(state.connection.execute("SELECT correlation_id, redacted FROM recorded_calls"))
        assert kept == {"c0": 0, "c1": PAST_BOUND, "c2": PAST_BOUND}  # 80 + 80 > 100; c3: none
        assert telemetry.cap_rows() == 2  # c0's and c1's rows
        assert sorted(recordings.calls("A", "p")) == ["c0", "c1", "c2"]
    finally:
        state.close()
