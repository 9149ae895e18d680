"""An in-process replay obeys the person's stop (review10 finding 03), through the real CLI.

`agentworker replay` builds its worker on a folder of its own; the person's
`agentworker kill PLAN` and `agentworker pause` (the stop hotkey and the TUI write
the same pause file) are made in their data folder. Before the fix a killed plan's
steps ran while everything was paused, writing the real workspace. Now: checked
before each step and while one runs, they answer `plan_killed` / `paused`, and the
replay runs no further step and says why.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTWORKER_", "DISPLAY"))}
    env["AGENTWORKER_HOME"] = str(home)
    env["WAYLAND_DISPLAY"] = ""
    return env


def aw(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", *argv],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def replay_of(env: dict[str, str], *lines: dict[str, Any]) -> subprocess.Popen[str]:
    home = Path(env["AGENTWORKER_HOME"])
    (home / "b.txt").write_text("written by a killed plan\n")
    (home / "g.toml").write_text('[[grant]]\nagent = "*"\nscopes = ["workerHost.*"]\n')
    header = {"agentworker_replay": 1, "agent": "a", "plan": "plan-k"}
    script = home / "s.jsonl"
    script.write_text("\n".join(json.dumps(line) for line in (header, *lines)) + "\n")
    argv = ["replay", str(script), "--grants", str(home / "g.toml"), "--json"]
    if (home / "c.toml").exists():
        argv += ["--config", str(home / "c.toml")]
    return subprocess.Popen(
        [sys.executable, "-m", "worker", *argv],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def report_of(run: subprocess.Popen[str]) -> tuple[int, dict[str, Any]]:
    out, err = run.communicate(timeout=300)
    try:
        return run.returncode, json.loads(out)
    except ValueError:
        raise AssertionError(f"no report: {out[-2000:]} {err[-3000:]}") from None


def codes(report: dict[str, Any]) -> list[tuple[str, str | None]]:
    return [
        (step["outcome"], step.get("error_code") or step.get("status")) for step in report["steps"]
    ]


WRITE = {"action": "fs_write", "args": {"path": "ran.txt", "mode": "overwrite"}, "blob": "b.txt"}
STAT = {"action": "fs_stat", "args": {"path": "."}}


def test_a_killed_plans_steps_do_not_run(env: dict[str, str]) -> None:
    assert aw(env, "kill", "plan-k").returncode == 0
    rc, report = report_of(replay_of(env, WRITE, STAT))
    assert rc != 0
    assert codes(report)[0] == ("failed", "plan_killed"), report
    assert report["steps"][1]["outcome"] == "not_run", report
    assert "killed" in report["stopped"], report
    assert not (Path(env["AGENTWORKER_HOME"]) / "workspace" / "ran.txt").exists()


def test_no_step_runs_while_the_machine_is_paused(env: dict[str, str]) -> None:
    assert aw(env, "pause").returncode == 0
    rc, report = report_of(replay_of(env, WRITE, STAT))
    assert rc != 0
    assert codes(report)[0] == ("failed", "paused"), report
    assert report["steps"][1]["outcome"] == "not_run", report
    assert "stopped by the person" in report["stopped"], report
    assert not (Path(env["AGENTWORKER_HOME"]) / "workspace" / "ran.txt").exists()
    assert aw(env, "resume").returncode == 0
    rc, report = report_of(replay_of(env, STAT))
    assert rc == 0 and codes(report) == [("passed", "ok")], report


class Holding:
    """A TCP server that takes one connection and says so, then holds it unanswered
    until the test ends: a step that is running, for as long as the test needs."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.arrived = threading.Event()
        self.release = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            self.arrived.set()
            self.release.wait()

    def close(self) -> None:
        self.release.set()
        self.sock.close()


@pytest.fixture
def holding() -> Iterator[Holding]:
    server = Holding()
    yield server
    server.close()


@pytest.mark.parametrize(("verb", "code"), [("pause", "paused"), ("kill", "plan_killed")])
def test_a_running_step_is_stopped_by_a_pause_or_a_kill(
    env: dict[str, str], holding: Holding, verb: str, code: str
) -> None:
    home = Path(env["AGENTWORKER_HOME"])
    (home / "c.toml").write_text(
        f'[http]\nallow_hosts = ["127.0.0.1:{holding.port}"]\n'
        "connect_timeout_s = 60\nread_timeout_s = 120\ntotal_timeout_s = 120\n"
    )
    fetch = {"action": "http_fetch", "args": {"url": f"http://127.0.0.1:{holding.port}/"}}
    run = replay_of(env, fetch, STAT)
    try:
        assert holding.arrived.wait(120), "the step never reached the server"
        made = aw(env, verb, *(["plan-k"] if verb == "kill" else []))
        assert made.returncode == 0, made
        rc, report = report_of(run)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert rc != 0
    assert codes(report)[0] == ("failed", code), report
    assert report["steps"][1]["outcome"] == "not_run", report
    assert report["stopped"], report
