"""As a person would, in a real terminal: `agentworker up` in tmux, a call from
another shell, approved with the keyboard; then `agentworker ui` attached to a
headless worker. tmux's send-keys types, capture-pane reads the screen."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import free_port
from worker.config import Paths

AGENTWORKER = str(Path(sys.executable).parent / "agentworker")

# The prompt's last line once it takes keys (its grace, ui.approval.GRACE_S, over).
ANSWERABLE = "Denied by itself in"


class Terminal:
    """One tmux server of our own, with one window running a command."""

    def __init__(self, env: dict[str, str]) -> None:
        self.socket = f"aw-{uuid.uuid4().hex[:10]}"
        self.env = env

    def tmux(self, *argv: str) -> str:
        done = subprocess.run(
            ["tmux", "-L", self.socket, *argv],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        return done.stdout

    def start(self, command: list[str], size: tuple[int, int] = (100, 30)) -> None:
        self.tmux(
            "new-session",
            "-d",
            "-s",
            "main",
            "-x",
            str(size[0]),
            "-y",
            str(size[1]),
            " ".join(command),
        )
        self.tmux("set-option", "-t", "main", "remain-on-exit", "on")

    def screen(self) -> str:
        return self.tmux("capture-pane", "-t", "main", "-p")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "main", *keys)

    def wait_for(self, text: str, within_s: float = 30.0) -> str:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            screen = self.screen()
            if text in screen:
                return screen
            time.sleep(0.05)
        raise AssertionError(f"{text!r} never appeared; the screen:\n{self.screen()}")

    def exited(self, within_s: float = 30.0) -> bool:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if self.tmux("display-message", "-p", "-t", "main", "#{pane_dead}").strip() == "1":
                return True
            time.sleep(0.05)
        return False

    def close(self) -> None:
        self.tmux("kill-server")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTWORKER_", "TMUX"))}
    clean["AGENTWORKER_HOME"] = str(tmp_path / "home")
    clean["AGENTWORKER_LISTEN"] = f"127.0.0.1:{free_port()}"
    clean["TERM"] = "xterm-256color"
    clean.pop("DISPLAY", None)  # no desktop notifications from tests
    clean.pop("WAYLAND_DISPLAY", None)
    return clean


@pytest.fixture
def terminal(env: dict[str, str]) -> Iterator[Terminal]:
    term = Terminal(env)
    yield term
    term.close()


def _call(env: dict[str, str], *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [AGENTWORKER, "call", *argv], env=env, stdout=subprocess.PIPE, text=True
    )


def test_up_on_a_terminal_shows_the_tui_and_a_prompt_is_approved_by_keyboard(
    terminal: Terminal, env: dict[str, str]
) -> None:
    terminal.start([AGENTWORKER, "up"])
    terminal.wait_for("● ready")
    call = _call(env, "fs_stat", '{"path": "."}', "--agent", "planner", "--plan", "demo")
    screen = terminal.wait_for("A call outside the agent's grants")
    assert "planner" in screen and "workerHost.fs_stat" in screen
    terminal.wait_for(ANSWERABLE)
    terminal.keys("p")  # for this plan
    out, _ = call.communicate(timeout=30)
    assert json.loads(out)["status"] == "ok"
    assert json.loads(out)["invocation"]["decision"] == "approved (ui:plan)"
    terminal.wait_for(" ok ")
    again = _call(env, "fs_list", '{"path": "."}', "--agent", "planner", "--plan", "demo")
    out, _ = again.communicate(timeout=30)
    assert json.loads(out)["status"] == "ok"  # fs_list came with the plan's read scopes
    terminal.keys("q")
    assert terminal.exited(), terminal.screen()


def test_ui_attaches_to_a_headless_worker_and_approves_from_the_keyboard(
    terminal: Terminal, env: dict[str, str], tmp_path: Path
) -> None:
    log = (tmp_path / "up.log").open("w")
    worker = subprocess.Popen(
        [AGENTWORKER, "up", "--headless"], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        home = Path(env["AGENTWORKER_HOME"])
        socket_ready = Paths(config_dir=home, data_dir=home).ui_socket
        deadline = time.monotonic() + 30
        while not socket_ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        terminal.start([AGENTWORKER, "ui"])
        terminal.wait_for("● ready")
        call = _call(env, "fs_stat", '{"path": "."}', "--agent", "planner")
        terminal.wait_for("A call outside the agent's grants")
        terminal.wait_for(ANSWERABLE)
        terminal.keys("o")  # once
        out, _ = call.communicate(timeout=30)
        assert json.loads(out)["status"] == "ok"
        terminal.keys("q")
        assert terminal.exited()
        assert worker.poll() is None, "quitting `agentworker ui` leaves the worker running"
    finally:
        worker.terminate()
        worker.wait(30)
        log.close()


def test_a_closed_terminal_stops_up_and_reload_still_reads_the_config(
    terminal: Terminal, env: dict[str, str]
) -> None:
    """SIGHUP is `agentworker reload` while the terminal is there; once it hangs up (the
    window closed) the worker stops instead of blocking on a screen nobody reads."""
    import psutil

    from worker.cli.reload import running_worker

    terminal.start([AGENTWORKER, "up"])
    terminal.wait_for("● ready")
    home = Path(env["AGENTWORKER_HOME"])
    paths = Paths(config_dir=home, data_dir=home)
    pid = running_worker(paths)
    assert pid is not None
    reload = subprocess.run(
        [AGENTWORKER, "reload"], env=env, capture_output=True, text=True, timeout=30
    )
    assert reload.returncode == 0, reload.stderr
    log = paths.data_dir / "agentworker.log"
    deadline = time.monotonic() + 30
    while "reloaded" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "reloaded" in log.read_text()
    worker = psutil.Process(pid)
    assert worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE

    terminal.close()  # tmux hangs up the pane's terminal
    try:
        worker.wait(timeout=60)
    except psutil.TimeoutExpired:
        worker.kill()  # a wedged worker ignores SIGTERM: do not leave it behind
        raise
    assert "the terminal hung up: stopping" in log.read_text()
    assert "draining" in log.read_text()
