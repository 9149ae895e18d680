"""`agentworker replay` in this process: a real worker pipeline built from a config
and a grants profile, real files in a real workspace, the CLI's own output."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from worker.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "docs" / "replay"

CONFIG = """\
[[root]]
path = "{workspace}"
mode = "rw"
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home whose config shares one read-write workspace and grants nothing."""
    home = tmp_path / "home"
    (home / "workspace").mkdir(parents=True)
    (home / "config.toml").write_text(CONFIG.format(workspace=home / "workspace"))
    monkeypatch.setenv("AGENTWORKER_HOME", str(home))
    return home


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    """A copy of the documented example, free to edit."""
    folder = tmp_path / "demo"
    shutil.copytree(DEMO, folder)
    return folder / "demo.jsonl"


def replay(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["replay", *argv])
    return code, capsys.readouterr().out


def replay_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code, out = replay(capsys, *argv, "--json")
    return code, json.loads(out)


def outcomes(report: dict[str, Any]) -> list[tuple[int, str]]:
    return [(step["line"], step["outcome"]) for step in report["steps"]]


def test_the_documented_example_passes(
    home: Path, demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = replay(capsys, str(demo), "--grants", str(demo.parent / "grants.toml"))
    assert code == 0, out
    assert "6 steps: 6 passed" in out
    assert (home / "workspace/replay-demo/greeting.txt").read_text() == "Hello from a replay.\n"


def test_without_the_grants_profile_the_steps_are_refused_and_the_run_fails(
    home: Path, demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = replay_json(capsys, str(demo))
    assert code == 1 and not report["ok"]
    assert {s["error_code"] for s in report["steps"]} == {"scope_required"}
    assert not (home / "workspace/replay-demo").exists()


def test_an_edited_expectation_that_no_longer_holds_fails_with_a_diff(
    home: Path, demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = demo.read_text().replace('"type": "file", "size": 21', '"type": "file", "size": 22')
    demo.write_text(text)
    code, out = replay(capsys, str(demo), "--grants", str(demo.parent / "grants.toml"))
    assert code == 1
    assert "line 5: workerHost.fs_stat: failed" in out
    assert "    result.size\n      - expected: 22\n      + actual:   21" in out
    assert "6 steps: 5 passed, 1 failed" in out


def test_a_malformed_line_is_reported_with_its_line_number_and_the_rest_runs(
    home: Path, demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = demo.read_text().splitlines()
    lines.insert(4, '{"action": "fs_stat", "args": {"path": "x"}, "expext": {}}')  # line 5
    lines.insert(5, "{not json")  # line 6
    demo.write_text("\n".join(lines) + "\n")
    code, report = replay_json(capsys, str(demo), "--grants", str(demo.parent / "grants.toml"))
    assert code == 1
    assert outcomes(report) == [
        (4, "passed"),
        (5, "malformed"),
        (6, "malformed"),
        (7, "passed"),
        (8, "passed"),
        (9, "passed"),
        (11, "passed"),
        (12, "passed"),
    ]
    assert report["steps"][1]["problems"] == ["expext: Extra inputs are not permitted"]
    assert report["steps"][2]["problems"][0].startswith("not valid JSON")


def test_fail_fast_stops_at_the_first_step_that_falls_short(
    home: Path, demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    demo.write_text(demo.read_text().replace('"file", "size": 21', '"file", "size": 0'))  # line 5
    argv = (str(demo), "--grants", str(demo.parent / "grants.toml"), "--fail-fast")
    code, report = replay_json(capsys, *argv)
    assert code == 1
    assert outcomes(report) == [
        (4, "passed"),
        (5, "failed"),
        (6, "not_run"),
        (7, "not_run"),
        (9, "not_run"),
        (10, "not_run"),
    ]


def _invocations(data_dir: Path) -> list[tuple[str, str, str]]:
    with sqlite3.connect(data_dir / "state.db") as db:
        rows = db.execute(
            "SELECT correlation_id, action, status FROM invocations ORDER BY started_unix_ms"
        ).fetchall()
    return [(cid, action, status) for cid, action, status in rows]


def test_every_step_leaves_its_telemetry_row_in_the_data_dir(
    home: Path, demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    argv = (str(demo), "--grants", str(demo.parent / "grants.toml"), "--data-dir", str(data))
    code, report = replay_json(capsys, *argv)
    assert code == 0
    rows = _invocations(data)
    assert [cid for cid, _, _ in rows] == [s["correlation_id"] for s in report["steps"]]
    assert [status for _, _, status in rows] == ["ok"] * 4 + ["error"] * 2


def test_replaying_again_on_the_same_ledger_answers_from_it_without_running_again(
    home: Path, demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """fs_write in create mode would fail a second time; the ledger answers instead."""
    demo.write_text(demo.read_text().replace('"mode": "overwrite"', '"mode": "create"'))
    data = tmp_path / "data"
    argv = (str(demo), "--grants", str(demo.parent / "grants.toml"), "--data-dir", str(data))
    first_code, first = replay_json(capsys, *argv)
    again_code, again = replay_json(capsys, *argv)
    assert first_code == 0
    assert not any(s["replayed"] for s in first["steps"])
    assert all(s["replayed"] for s in again["steps"])
    assert len(_invocations(data)) == 6  # the second run ran nothing
    # The bytes fs_read answered were handed over and not kept: its repeat says so,
    # with its outcome; every other step is answered as the first time.
    assert again_code == 1
    codes = [(s["action"], s.get("error_code")) for s in again["steps"]]
    assert ("workerHost.fs_read", "blob_gone") in codes
    others = [s["outcome"] for s in again["steps"] if s["action"] != "workerHost.fs_read"]
    assert others == ["passed"] * 5
    relabelled_code, relabelled = replay_json(capsys, *argv, "--run", "second")
    assert relabelled_code == 1  # run anew: the file exists now
    assert relabelled["steps"][0]["error_code"] == "already_exists"


def test_dry_run_catches_a_bad_args_field_without_running_anything(
    home: Path, demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    demo.write_text(
        demo.read_text().replace('{"path": "replay-demo/greeting.txt"}', '{"pth": "x"}', 1)
    )
    data = tmp_path / "data"
    argv = (str(demo), "--grants", str(demo.parent / "grants.toml"), "--data-dir", str(data))
    code, report = replay_json(capsys, *argv, "--dry-run")
    assert code == 1
    assert outcomes(report) == [
        (4, "valid"),
        (5, "invalid"),
        (6, "valid"),
        (7, "valid"),
        (9, "valid"),
        (10, "valid"),
    ]
    assert report["steps"][1]["problems"] == [
        "args.path: Field required",
        "args.pth: Extra inputs are not permitted",
    ]
    assert not data.exists()  # no worker was even built
    assert not (home / "workspace/replay-demo").exists()


def test_dry_run_accepts_a_step_that_expects_the_error_it_has(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "s.jsonl"
    script.write_text(
        '{"action": "fs_stat", "args": {}, "expect": {"error_code": "validation_error"}}\n'
        '{"action": "fs_teleport", "expect": {"error_code": "unknown_action"}}\n'
        '{"action": "fs_teleport"}\n'
    )
    code, report = replay_json(capsys, str(script), "--dry-run")
    assert code == 1
    assert outcomes(report) == [(1, "valid"), (2, "valid"), (3, "invalid")]
    assert "no workerHost.fs_teleport" in report["steps"][2]["problems"][0]


def test_the_schema_flag_prints_the_shipped_schema(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = replay(capsys, "--schema")
    assert code == 0
    assert json.loads(out) == json.loads((ROOT / "worker/replay/script.schema.json").read_text())


SANDBOX_SCRIPT = [
    {"agentworker_replay": 1, "agent": "a", "plan": "wb1"},
    {"action": "workbenchHost.fs_write", "args": {"path": "x.txt", "mode": "create"}, "blob": "in"},
    {
        "action": "workbenchHost.exec",
        "args": {"argv": ["cat", "x.txt"]},
        "expect": {"exit_code": 0},
    },
    {
        "action": "workbenchHost.fs_stat",
        "args": {"path": "x.txt"},
        "plan": "wb2",
        "expect": {"error_code": "not_found"},
    },
]


def test_sandbox_mode_runs_each_plan_in_a_workspace_of_its_own(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """workbenchHost.* in process: plan wb2 cannot see what plan wb1 wrote."""
    script = tmp_path / "wb.jsonl"
    script.write_text("".join(json.dumps(line) + "\n" for line in SANDBOX_SCRIPT))
    (tmp_path / "in").write_text("inside\n")
    dry_code, dry = replay_json(capsys, str(script), "--dry-run")
    assert dry_code == 0, dry
    code, report = replay_json(capsys, str(script), "--sandbox")
    assert code == 0, report
    assert report["steps"][1]["blob_sha256"] == hashlib.sha256(b"inside\n").hexdigest()
    assert not (home / "workspace/x.txt").exists()


def test_a_script_in_a_folder_agents_can_write_is_refused_until_the_person_says_so(
    home: Path, demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An agent with fs_write could have added a step naming another agent, whose
    grants the replay would use (review25): the person reads it first."""
    shared = home / "workspace" / "recordings"
    shutil.copytree(demo.parent, shared)
    script, grants = shared / demo.name, str(demo.parent / "grants.toml")
    link = tmp_path / "looks-mine.jsonl"
    link.symlink_to(script)
    for named in (script, link):
        code = main(["replay", str(named), "--grants", grants])
        said = capsys.readouterr().err
        assert code == 2
        assert "a folder agents can write" in said and "--agent-writable-ok" in said, said
        assert not (home / "workspace/replay-demo").exists()
    code, out = replay(capsys, str(script), "--grants", grants, "--dry-run")
    assert code == 0, out
    code, out = replay(capsys, str(script), "--grants", grants, "--agent-writable-ok")
    assert code == 0 and "6 steps: 6 passed" in out, out


def _refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(["replay", *argv])
    said = capsys.readouterr().err
    assert code == 2, said
    assert "a folder agents can write" in said and "--agent-writable-ok" in said, said
    return said


def test_a_config_grants_or_allowlist_in_a_folder_agents_can_write_is_refused(
    home: Path, demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """review26 H1: a --config the agent wrote named a program of its own as exec's
    bwrap; a --grants it wrote grants it all. Each file the replay reads is checked."""
    shared = home / "workspace"
    grants = demo.parent / "grants.toml"
    (shared / "grants.toml").write_bytes(grants.read_bytes())
    said = _refused(capsys, str(demo), "--grants", str(shared / "grants.toml"))
    assert str(shared / "grants.toml") in said
    config = CONFIG.format(workspace=home / "workspace")
    (shared / "config.toml").write_text(config)
    said = _refused(capsys, str(demo), "--config", str(shared / "config.toml"))
    assert str(shared / "config.toml") in said
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "allowlist.toml").symlink_to(shared / "allowlist.toml")
    (shared / "allowlist.toml").write_text("")
    (mine / "config.toml").write_text(config)
    said = _refused(capsys, str(demo), "--config", str(mine / "config.toml"))
    assert "allowlist.toml" in said
    policy = f'{config}\n[exec]\npolicy = "{shared / "allowlist.toml"}"\n'
    (mine / "allowlist.toml").unlink()
    (mine / "config.toml").write_text(policy)
    _refused(capsys, str(demo), "--config", str(mine / "config.toml"))
    (mine / "config.toml").write_text(config)
    code, out = replay(capsys, str(demo), "--config", str(mine / "config.toml"))
    assert code == 1, out  # it ran: the steps want grants this config has not


def test_a_shared_folder_seen_through_a_bind_mount_is_still_refused(
    home: Path, demo: Path, tmp_path: Path
) -> None:
    """review26 H4: the check compared paths, so the shared folder mounted elsewhere
    (here by bubblewrap, as a person's bind mount or another spelling would) passed.
    It compares the folders' identities."""
    shared = home / "workspace"
    shutil.copytree(demo.parent, shared / "recordings")
    _refused_through_a_bind_mount(shared, shared, Path("recordings") / demo.name, demo, tmp_path)
    assert not (home / "workspace/replay-demo").exists()


def test_a_folder_inside_a_shared_one_bind_mounted_elsewhere_is_refused(
    home: Path, demo: Path, tmp_path: Path
) -> None:
    """A bind mount of a folder inside the shared one has an identity of its own, so
    the walk up from the script never met the shared folder's (review26's residual).
    The mount table shows which folder of which file system it is."""
    shared = home / "workspace"
    inside = shared / "deep" / "recordings"
    shutil.copytree(demo.parent, inside)
    _refused_through_a_bind_mount(shared, inside, Path(demo.name), demo, tmp_path)
    assert not (home / "workspace/replay-demo").exists()


def _refused_through_a_bind_mount(
    shared: Path, bound: Path, script: Path, demo: Path, tmp_path: Path
) -> None:
    """`replay` of `script` under `bound`, seen (a real bwrap bind mount) at another
    place, is refused as lying in `shared`."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    argv = ["bwrap", "--dev-bind", "/", "/", "--bind", str(bound), str(elsewhere)]
    argv += [sys.executable, "-m", "worker", "replay", str(elsewhere / script)]
    argv += ["--grants", str(demo.parent / "grants.toml")]
    done = subprocess.run(
        argv, capture_output=True, text=True, cwd=ROOT, env={**os.environ}, timeout=60
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"lies in {shared}" in done.stderr, done.stderr
