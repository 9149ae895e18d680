"""`agentworker doctor`: real processes on this machine, with the environment changed
to be the machine being diagnosed (no bubblewrap on PATH, no display, bad files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.cluster import Cluster


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTWORKER_")}
    env["AGENTWORKER_HOME"] = str(home)
    env.update(extra)
    return env


def _doctor(env: dict[str, str], *flags: str) -> tuple[int, dict[str, Any], str]:
    out = subprocess.run(
        [sys.executable, "-m", "worker", "doctor", "--json", *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, json.loads(out.stdout), out.stderr


def _finding(report: dict[str, Any], check: str) -> dict[str, Any]:
    found = [f for f in report["findings"] if f["check"] == check]
    assert len(found) == 1, report["findings"]
    return found[0]


def test_doctor_reports_missing_bubblewrap_and_display_with_fixes(tmp_path: Path) -> None:
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    env = _env(tmp_path / "home", PATH=str(empty_bin))
    for var in ("DISPLAY", "WAYLAND_DISPLAY", "XDG_SESSION_TYPE"):
        env.pop(var, None)
    code, report, _ = _doctor(env, "--offline")
    bwrap = _finding(report, "bubblewrap")
    assert bwrap["status"] == "warn"
    assert "sandbox_unavailable" in bwrap["summary"]
    assert "apt install bubblewrap" in bwrap["fix"]
    display = _finding(report, "display")
    assert display["status"] == "warn"
    assert "DISPLAY is not set" in display["summary"]
    assert "DISPLAY" in display["fix"]
    assert display["details"]["actions"]["screenshot"] is False
    # Both are parts that do not work, not blockers: the rest of the worker runs.
    assert code == 0 and report["ok"] is True and report["blockers"] == 0
    assert report["agentworker"] and _finding(report, "python")["status"] == "ok"


def test_doctor_says_a_display_set_to_nothing_answers(tmp_path: Path) -> None:
    env = _env(tmp_path / "home", DISPLAY=":97")
    env.pop("WAYLAND_DISPLAY", None)
    env.pop("XDG_SESSION_TYPE", None)
    _, report, _ = _doctor(env, "--offline")
    display = _finding(report, "display")
    assert display["status"] == "warn"
    assert "no X server answers" in display["summary"]


def test_doctor_blocks_on_a_token_others_can_read_and_a_broken_config(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "config.toml").write_text("[hub]\nlisten = 7\nnot toml at all [\n")
    token = home / "hub.token"
    token.write_text("ab" * 32)
    token.chmod(0o644)
    code, report, _ = _doctor(_env(home), "--offline")
    assert code == 1 and report["ok"] is False and report["blockers"] == 2
    config = _finding(report, "config")
    assert config["status"] == "blocker" and "not valid TOML" in config["summary"]
    assert str(home / "config.toml") in config["fix"]
    tok = _finding(report, "token file")
    assert tok["status"] == "blocker" and tok["fix"] == f"chmod 600 {token}"


def test_doctor_blocks_on_a_grant_table_the_start_refuses(tmp_path: Path) -> None:
    """A [[grant]] of a scope no action asks for stops the worker's start (exit 4):
    doctor called that config.toml valid."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "config.toml").write_text('[[grant]]\nagent = "me"\nscopes = ["workerHost.fs_stats"]\n')
    code, report, _ = _doctor(_env(home), "--offline")
    assert code == 1 and report["blockers"] == 1
    config = _finding(report, "config")
    assert config["status"] == "blocker", config
    assert "'workerHost.fs_stats' names no action" in config["summary"]
    assert "Did you mean workerHost.fs_stat?" in config["summary"]
    assert str(home / "config.toml") in config["fix"]
    assert _finding(report, "python")["status"] == "ok"  # the other checks still ran


def test_doctor_names_each_root_and_its_mode(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    shared = tmp_path / "shared"
    shared.mkdir()
    (home / "config.toml").write_text(
        f'[[root]]\npath = "{shared}"\nmode = "ro"\n\n'
        f'[[root]]\npath = "{tmp_path / "gone"}"\nmode = "rw"\n'
    )
    code, report, _ = _doctor(_env(home), "--offline")
    roots = [f for f in report["findings"] if f["check"] == "root"]
    assert [(r["status"], r["details"]["mode"]) for r in roots] == [("ok", "ro"), ("warn", "rw")]
    assert "read-only" in roots[0]["summary"]
    assert "does not exist" in roots[1]["summary"] and "create it" in roots[1]["fix"]
    assert code == 0


def test_doctor_finds_a_live_hub_and_says_when_none_answers(live: Cluster) -> None:
    live.start_hub()
    live.start_worker()
    code, report, _ = _doctor(live.env)
    hub = _finding(report, "hub")
    assert hub["status"] == "ok", hub
    assert "connected" in hub["summary"] and hub["details"]["state"] == "connected"
    assert code == 0
    live.stop_all()
    _, report, _ = _doctor(live.env)
    hub = _finding(report, "hub")
    assert hub["status"] == "warn" and "no hub answered" in hub["summary"]
    assert "agentworker up" in hub["fix"]


def test_doctor_prints_each_fix_for_a_person(tmp_path: Path) -> None:
    env = _env(tmp_path / "home", PATH=str(tmp_path))
    env.pop("DISPLAY", None)
    out = subprocess.run(
        [sys.executable, "-m", "worker", "doctor", "--offline"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "fix: install bubblewrap" in out.stdout
    assert "nothing blocks the worker" in out.stdout.splitlines()[-1]


def test_doctor_checks_the_libraries_this_platform_installs(tmp_path: Path) -> None:
    """The list doctor checks (and the one-file build bundles) is the one pyproject.toml
    installs here: an install straight from it has every library, none missing."""
    _, report, _ = _doctor(_env(tmp_path / "home"), "--offline")
    libraries = _finding(report, "libraries")
    assert libraries["status"] == "ok", libraries
    versions = libraries["details"]["versions"]
    assert all(versions.values()), versions
    input_library = "python-xlib" if sys.platform.startswith("linux") else "pynput"
    assert input_library in versions and "pyautogui" not in versions


def test_doctor_warns_of_a_data_folder_others_pass_once_plans_uids_are_off(
    tmp_path: Path,
) -> None:
    """review29b #5: others' search bit on the data folder, set for [sandbox] uids, was
    "owner only" with the setting gone too."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    home.chmod(0o701)
    (home / "config.toml").write_text("")
    _, report, _ = _doctor(_env(home), "--offline")
    folder = _finding(report, "home folder")
    assert folder["status"] == "warn", folder
    assert "[sandbox] uids, which needs that, is off" in folder["summary"]
    assert folder["fix"] == f"chmod 700 {home}"
    (home / "config.toml").write_text('[sandbox]\nuids = "1900000000-1900000999"\n')
    _, report, _ = _doctor(_env(home), "--offline")
    folder = _finding(report, "home folder")
    assert folder["status"] == "ok" and "plans' uids pass through" in folder["summary"], folder
