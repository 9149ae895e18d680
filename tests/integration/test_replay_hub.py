"""Record and replay through a real hub and worker (subprocesses on loopback gRPC):
a recorded session replays on a fresh worker with the same outcomes, a replay in
this process equals the same replay through a hub, and replaying through the same
hub again runs nothing twice."""

from __future__ import annotations

import hashlib
import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import cluster, release, wait_for
from worker.cli.main import main
from worker.hub.client import result_to_dict
from worker.replay.record import stable

CONFIG = """\
[[root]]
path = "{workspace}"
mode = "rw"

[[grant]]
agent = "tester"
scopes = ["workerHost.*", "workerDiag.*"]

[worker]
diagnostics = true
"""


def fresh_home(path: Path) -> Path:
    """A home like the cluster's (same grants) with its own empty workspace."""
    (path / "workspace").mkdir(parents=True)
    (path / "config.toml").write_text(CONFIG.format(workspace=path / "workspace"))
    return path


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def replay_report(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    _, out = run_cli(capsys, "replay", *argv, "--json")
    report: dict[str, Any] = json.loads(out)
    return report


def outcomes(report: dict[str, Any]) -> list[tuple[Any, ...]]:
    """What must be the same wherever a step ran: not ids, times or owners."""
    return [
        (
            s["line"],
            s["outcome"],
            s.get("status"),
            s.get("error_code"),
            s.get("blob_sha256"),
            json.dumps(stable(s.get("result")), sort_keys=True),
        )
        for s in report["steps"]
    ]


def _session(live: Any) -> list[tuple[str, str | None]]:
    """Calls of plan "rec" of many kinds, refusals among them; (status, code) of each."""
    secret = {"url": "http://127.0.0.1:9/", "headers": {"Authorization": "Bearer s3cr3t"}}
    calls: list[tuple[str, dict[str, Any], bytes, dict[str, Any]]] = [
        ("fs_write", {"path": "s/a.txt", "mode": "create", "make_parents": True}, b"hi!\n", {}),
        ("fs_stat", {"path": "s/a.txt"}, b"", {}),
        ("fs_read", {"path": "s/a.txt"}, b"", {}),
        ("fs_list", {"path": "s"}, b"", {}),
        ("exec", {"argv": ["cat"]}, b"from stdin", {}),
        ("fs_stat", {"path": "s/missing"}, b"", {}),
        ("fs_stat", {"pth": "s"}, b"", {}),
        ("http_fetch", secret, b"", {}),
        ("fs_stat", {"path": "s/a.txt"}, b"", {"agent_id": "stranger"}),
    ]
    seen = []
    for action, args, blob, fields in calls:
        request = {
            "agent_id": "tester",
            "plan_id": "rec",
            "surface": "workerHost",
            "action": action,
            "args_json": json.dumps(args),
            "blob": blob,
            **fields,
        }
        out = result_to_dict(live.run(lambda c, r=request: c.dispatch(**r)))
        seen.append((out["status"], out.get("error", {}).get("code")))
    return seen


def test_a_session_recorded_through_a_hub_replays_on_a_fresh_worker_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "recorded"
    with cluster(home, worker=False) as live:
        monkeypatch.setenv("AGENTWORKER_HOME", str(home))
        worker = live.start_worker()
        # The plan of the server the worker serves (a plan id is one server's).
        assert run_cli(capsys, "record", "start", "rec")[0] == 0
        happened = _session(live)
        worker.signal(signal.SIGTERM)  # its last telemetry rows are written as it stops
        assert worker.wait(20) == 0
    assert ("error", "scope_required") in happened and ("error", "url_not_allowed") in happened

    script = tmp_path / "script" / "session.jsonl"
    script.parent.mkdir()
    assert run_cli(capsys, "record", "rec", "-o", str(script))[0] == 0
    text = script.read_text()
    assert "s3cr3t" not in text and '"Authorization": "***"' in text
    assert sorted(p.name for p in (script.parent / "session.blobs").iterdir()) == [
        "step-1.bin",
        "step-5.bin",
    ]

    monkeypatch.setenv("AGENTWORKER_HOME", str(fresh_home(tmp_path / "fresh")))
    report = replay_report(capsys, str(script))
    assert report["ok"], json.dumps(report, indent=2)
    assert [(s["status"], s["error_code"]) for s in report["steps"]] == happened
    assert (tmp_path / "fresh/workspace/s/a.txt").read_bytes() == b"hi!\n"


STEPS: list[dict[str, Any]] = [
    {"agentworker_replay": 1, "agent": "tester", "plan": "same"},
    {
        "action": "fs_write",
        "args": {"path": "d/x.txt", "mode": "create", "make_parents": True},
        "blob": "x.txt",
    },
    {"action": "fs_stat", "args": {"path": "d/x.txt"}, "expect": {"result": {"size": 6}}},
    {
        "action": "fs_read",
        "args": {"path": "d/x.txt", "encoding": "utf-8"},
        "expect": {"result": {"text": "hello\n"}},
    },
    {"action": "fs_list", "args": {"path": "d"}},
    {"action": "exec", "args": {"argv": ["wc", "-c"]}, "blob": "x.txt", "expect": {"exit_code": 0}},
    {
        "action": "fs_write",
        "args": {"path": "d/x.txt", "mode": "create"},
        "blob": "x.txt",
        "expect": {"error_code": "already_exists"},
    },
    {"action": "fs_stat", "args": {"path": "../etc"}, "expect": {"error_code": "path_not_allowed"}},
    {
        "action": "fs_stat",
        "args": {"path": "d"},
        "agent": "stranger",
        "expect": {"error_code": "scope_required"},
    },
    {
        "action": "fs_stat",
        "args": {"path": "d", "bogus": 1},
        "expect": {"error_code": "validation_error"},
    },
    {"action": "workerDiag.probe", "args": {"blob_repeat": 2}, "blob": "x.txt"},
    {"action": "fs_stat", "args": {"path": "d/x.txt"}, "expect": {"result": {"size": 7}}},
]


def test_a_replay_in_process_equals_the_same_replay_through_a_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "same.jsonl"
    script.write_text("".join(json.dumps(step) + "\n" for step in STEPS))
    (tmp_path / "x.txt").write_text("hello\n")

    monkeypatch.setenv("AGENTWORKER_HOME", str(fresh_home(tmp_path / "local")))
    local = replay_report(capsys, str(script))

    with cluster(tmp_path / "hub") as live:
        monkeypatch.setenv("AGENTWORKER_HOME", str(live.home))
        argv = (str(script), "--server", live.listen, "--token", live.token)
        remote = replay_report(capsys, *argv)
        again = replay_report(capsys, *argv)
    # Stopped: every row written. Each step ran once, the second replay none of them.
    ran = _invocations(live.home)
    assert sorted(ran) == sorted(s["correlation_id"] for s in remote["steps"])

    assert outcomes(local) == outcomes(remote)
    assert [s["outcome"] for s in local["steps"]] == ["passed"] * 10 + ["failed"]
    assert local["steps"][-1]["mismatches"][0]["path"] == "result.size"
    assert not any(s["replayed"] for s in remote["steps"])
    # The same script through the same hub: the same ids, answered from the record;
    # a result's blob was handed over once and not kept, so a step that had one is
    # answered `blob_gone` (its outcome in the details) instead of the bytes again.
    assert all(s["replayed"] for s in again["steps"])
    empty = hashlib.sha256(b"").hexdigest()
    had_blob = [s.get("blob_sha256") not in (None, empty) for s in remote["steps"]]
    assert any(had_blob)
    for first, repeat, blob in zip(outcomes(remote), outcomes(again), had_blob, strict=True):
        # A repeat that reaches the hub before it stored the first answer (it stores a
        # moment later) is sent on, and the worker, not yet acked, answers with the bytes.
        gone = repeat[1:4] == ("failed", "error", "blob_gone")
        assert repeat == first or (blob and gone), (first, repeat)


def _invocations(home: Path) -> list[str]:
    """The correlation id of each invocation row the worker wrote."""
    with sqlite3.connect(home / "state.db") as db:
        return [cid for (cid,) in db.execute("SELECT correlation_id FROM invocations")]


def test_a_hub_failing_mid_replay_keeps_the_report_of_the_steps_that_ran(
    tmp_path: Path,
) -> None:
    """review28 L4: a replay through a hub that stopped answering mid-way ended with exit
    3 and the hub's error alone: the steps that had run, and how they went, were lost.
    Now the report shows them, the rest as not run and why, and it still exits 3."""
    steps = [
        {"agentworker_replay": 1, "agent": "tester", "plan": "midway"},
        {"action": "fs_write", "args": {"path": "m.txt", "mode": "create"}, "blob": "x.txt"},
        {"action": "fs_stat", "args": {"path": "m.txt"}, "expect": {"result": {"size": 6}}},
        # Under way as the hub goes: its mark says it started, its hold keeps it there.
        {"action": "workerDiag.probe", "args": {"mark": "midway", "hold": "midway"}},
        {"action": "fs_stat", "args": {"path": "m.txt"}},
    ]
    script = tmp_path / "midway.jsonl"
    script.write_text("".join(json.dumps(step) + "\n" for step in steps))
    (tmp_path / "x.txt").write_text("hello\n")
    with cluster(tmp_path / "hub") as live:
        argv = ["replay", str(script), "--server", live.listen, "--token", live.token, "--json"]
        replay = subprocess.Popen(
            [sys.executable, "-m", "worker", *argv],
            env=live.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(lambda: (live.home / "diag" / "midway.marks").exists(), 60)
            next(p for p in live.procs if p.name == "hub").kill()
            out, err = replay.communicate(timeout=60)
        finally:
            if replay.poll() is None:
                replay.kill()
            release(live.home, "midway")
    assert replay.returncode == 3, (out, err)
    assert "the hub answered UNAVAILABLE" in err and "Traceback" not in err, err
    report = json.loads(out)
    assert [s["outcome"] for s in report["steps"]] == ["passed", "passed", "not_run", "not_run"]
    assert report["stopped"].startswith("step 3 got no answer (the hub answered UNAVAILABLE")
    assert "it may still run on the worker" in report["stopped"]
