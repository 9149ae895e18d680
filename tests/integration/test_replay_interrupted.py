"""Ctrl-C in the middle of `agentworker replay`, on a real terminal: the run stops,
the steps that ran are reported with the rest as not run, and it exits 130."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
from pathlib import Path

from tests.support.cluster import wait_for
from tests.support.procs import as_a_terminal_starts, marker, processes_with, wait_until_gone
from tests.support.terminal import AGENTWORKER, Terminal

QUICK_STEPS = 50_000  # far more than run before the interrupt lands, even on an idle machine


def home_env(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A person's home with one read-write workspace, and the env that names it."""
    home = tmp_path / "home"
    workspace = home / "workspace"
    workspace.mkdir(parents=True)
    (home / "config.toml").write_text(f'[[root]]\npath = "{workspace}"\nmode = "rw"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTWORKER_")}
    env["AGENTWORKER_HOME"] = str(home)
    return env, workspace


def write_script(folder: Path, steps: list[dict[str, object]]) -> tuple[Path, Path]:
    """The script and a grants profile that lets agent `demo` run its steps, in a
    folder of the person's own (not one agents write)."""
    folder.mkdir()
    script = folder / "script.jsonl"
    header = {"agentworker_replay": 1, "agent": "demo", "plan": "interrupted"}
    script.write_text("".join(json.dumps(line) + "\n" for line in [header, *steps]))
    grants = folder / "grants.toml"
    grants.write_text('[[grant]]\nagent = "demo"\nscopes = ["workerHost.*"]\n')
    return script, grants


def test_ctrl_c_stops_a_run_of_quick_steps_and_reports_what_ran(tmp_path: Path) -> None:
    """fs_stat steps answer without a turn of the event loop: Ctrl-C used to wait
    for the last of them, then the run passed (exit 0)."""
    env, workspace = home_env(tmp_path)
    (workspace / "a.txt").write_text("a")
    quick = {"action": "fs_stat", "args": {"path": "a.txt"}}
    script, grants = write_script(tmp_path / "mine", [quick] * QUICK_STEPS)
    argv = [AGENTWORKER, "replay", str(script), "--grants", str(grants)]
    terminal = Terminal(as_a_terminal_starts(argv), env)
    try:
        terminal.expect(f"/{QUICK_STEPS}")  # the progress bar: steps are running
        terminal.proc.send_signal(signal.SIGINT)
        terminal.until_closed(within_s=60)
        assert terminal.proc.wait(30) == 130
        screen = terminal.screen
        assert "the replay stopped: interrupted (Ctrl-C) at step" in screen, terminal.tail()
        counts = re.search(r"(\d+) steps: (\d+) passed, (\d+) not run", screen)
        assert counts, terminal.tail()
        total, passed, not_run = map(int, counts.groups())
        assert total == QUICK_STEPS
        assert passed + not_run == QUICK_STEPS and not_run > 0
    finally:
        terminal.close()


def test_ctrl_c_during_a_long_step_stops_its_program_and_keeps_its_row(tmp_path: Path) -> None:
    """The step under way is stopped before the worker's stores close: its telemetry
    row says `cancelled` (it was lost, with a closed-database traceback, before)."""
    env, workspace = home_env(tmp_path)
    big = workspace / f"{marker()}.bin"  # the marker finds the program by its argv
    with big.open("wb") as sparse:
        sparse.truncate(1 << 40)  # hashing a TiB of holes outlasts any test
    long_step = {"action": "exec", "args": {"argv": ["sha256sum", big.name], "timeout_s": 600}}
    script, grants = write_script(tmp_path / "mine", [long_step, long_step])
    data = tmp_path / "data"
    argv = ["replay", str(script), "--grants", str(grants), "--json", "--data-dir", str(data)]
    terminal = Terminal(as_a_terminal_starts([AGENTWORKER, *argv]), env)
    try:
        wait_for(lambda: processes_with(big.name), 60)
        terminal.proc.send_signal(signal.SIGINT)
        terminal.until_closed(within_s=60)
        assert terminal.proc.wait(30) == 130
        assert wait_until_gone(big.name) == []
        report = json.loads(terminal.screen[terminal.screen.index("{") :])
        assert [s["outcome"] for s in report["steps"]] == ["not_run", "not_run"]
        assert report["stopped"].startswith("interrupted (Ctrl-C) at step 1: it was stopped")
        assert "Traceback" not in terminal.screen
        with contextlib.closing(sqlite3.connect(data / "state.db")) as db:
            rows = db.execute("SELECT action, error_code FROM invocations").fetchall()
        assert rows == [("exec", "cancelled")]
    finally:
        terminal.close()
