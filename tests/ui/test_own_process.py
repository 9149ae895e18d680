"""The TUI of `agentworker up` in a process of its own (worker/core/tui_process.py,
ui/child.py): the real command on a real pseudo-terminal, the worker its parent,
the TUI attached over the worker's real console socket. Every way out leaves no
process behind and the terminal to the shell."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.support.cluster import Cluster, call_in_background, cluster, wait_for
from tests.support.terminal import AGENTWORKER, Terminal, wait_gone

READY = "● ready"
PROMPT = "A call outside the agent's grants"
ANSWERABLE = "Denied by itself in"  # the prompt's last line, once it takes keys


@dataclass
class Up:
    """`agentworker up` on a terminal, and the cluster helpers to call through it."""

    live: Cluster
    terminal: Terminal

    @property
    def worker(self) -> subprocess.Popen[bytes]:
        return self.terminal.proc

    def tui(self) -> psutil.Process:
        (child,) = psutil.Process(self.worker.pid).children()
        assert "ui.child" in " ".join(child.cmdline())
        return child

    @property
    def log_file(self) -> Path:
        return self.live.home / "agentworker.log"


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    with cluster(tmp_path / "home", hub=False, worker=False) as live:
        terminal = Terminal([AGENTWORKER, "up"], live.env)
        try:
            terminal.expect(READY)
            yield Up(live, terminal)
        finally:
            terminal.close()


def _stopped_cleanly(up: Up, *, tui_pid: int) -> None:
    assert up.worker.wait(60) == 0, up.terminal.tail()
    up.terminal.until_closed()
    assert not psutil.pid_exists(tui_pid) or psutil.Process(tui_pid).status() == "zombie"
    assert "Traceback" not in up.terminal.screen, up.terminal.tail()
    assert "Traceback" not in up.log_file.read_text(), up.log_file.read_text()[-3000:]


def _said_the_worker_went_away(terminal: Terminal, log_file: Path) -> None:
    """The last words on the terminal name the log; no traceback anywhere."""
    screen = terminal.screen.replace("\r\n", "")
    said = screen.rfind("the worker went away without stopping")
    assert said >= 0 and str(log_file) in screen[said:], terminal.tail()
    assert "Traceback" not in screen, terminal.tail()


def test_the_tui_runs_beside_the_worker_and_answers_its_prompts(up: Up) -> None:
    """A prompt shows in the TUI's process and its answer reaches the call; quitting
    it (q) stops the worker, which waits for it to leave the terminal."""
    tui = up.tui()
    assert tui.pid != up.worker.pid
    asked = up.terminal.mark()
    call = call_in_background(up.live, "workerHost.fs_stat", '{"path": "."}', agent_id="stranger")
    up.terminal.expect(PROMPT, after=asked)
    up.terminal.expect(ANSWERABLE, after=asked)  # its grace over (ui.approval.GRACE_S)
    up.terminal.type("d")
    call["thread"].join(60)
    assert call["out"]["error"]["code"] == "scope_denied", call
    up.terminal.type("q")
    _stopped_cleanly(up, tui_pid=tui.pid)


def test_a_call_says_on_stderr_once_that_it_waits_for_approval(up: Up) -> None:
    """`agentworker call` waited in silence while the TUI asked about it (its person is
    often the one waiting): it says so on stderr as the prompt opens, once."""
    asked = up.terminal.mark()
    call = subprocess.Popen(
        [AGENTWORKER, "call", "fs_stat", '{"path": "."}', "--agent", "stranger"],
        env=up.live.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        up.terminal.expect(PROMPT, after=asked)
        assert call.stderr is not None
        said = call.stderr.readline()  # while the prompt waits: no answer was given
        assert said == (
            "agentworker: waiting for approval: the worker asks its person about this call. "
            "Answer the prompt in the agentworker TUI (the terminal of `agentworker up`, or "
            "`agentworker ui`); no answer in time is a denial.\n"
        ), said
        assert call.poll() is None
        up.terminal.expect(ANSWERABLE, after=asked)
        up.terminal.type("d")
        out, rest = call.communicate(timeout=60)
        assert json.loads(out)["error"]["code"] == "scope_denied", out
        assert "waiting for approval" not in rest, rest
    finally:
        call.kill()
        call.wait()
    up.terminal.type("q")
    up.worker.wait(60)


def test_before_any_call_the_tui_says_what_to_try(up: Up) -> None:
    """`up`'s ready line suggests commands to try, but the TUI covers the terminal it
    went to: its calls pane says them until a call comes."""
    # (What the steps say, with their paths wrapped in the pane, test_live_view checks.)
    up.terminal.expect("Try, in another terminal:")
    screen = up.terminal.screen
    assert screen.rfind("Try, in another terminal:") > screen.find(READY), up.terminal.tail()
    ran = up.terminal.mark()
    assert up.live.call("workerHost.fs_stat", '{"path": "."}')["status"] == "ok"
    up.terminal.expect("workerHost.fs_stat", after=ran)  # the call's row, its detail
    up.terminal.type("q")
    up.worker.wait(60)


@pytest.mark.parametrize("how", ["the key", "the signal"])
def test_ctrl_c_once_stops_the_worker_and_its_tui(up: Up, how: str) -> None:
    """Ctrl+C as the TUI reads it (a key, the terminal in raw mode), or as a terminal
    not in raw mode delivers it (SIGINT to the whole foreground group)."""
    tui = up.tui()
    if how == "the key":
        up.terminal.type("\x03")
    else:
        os.killpg(up.worker.pid, signal.SIGINT)
    _stopped_cleanly(up, tui_pid=tui.pid)


def test_killing_the_worker_ends_its_tui_which_says_where_the_log_is(up: Up) -> None:
    tui = up.tui()
    up.worker.kill()
    up.worker.wait(60)
    up.terminal.until_closed()  # the TUI, the last to hold the terminal, left it
    wait_gone(tui.pid)  # and it is not left running
    _said_the_worker_went_away(up.terminal, up.log_file)


def test_killing_the_tui_leaves_the_worker_serving_as_with_no_ui(up: Up) -> None:
    """The worker takes the terminal back, says so, and answers calls: granted ones
    run, one that needs the person is refused as with no UI attached."""
    tui = up.tui()
    told = up.terminal.mark()
    tui.kill()
    up.terminal.expect("the TUI ended unexpectedly (killed by SIGKILL)", after=told)
    assert up.live.call("workerHost.fs_stat", '{"path": "."}')["status"] == "ok"
    refused = up.live.call("workerHost.fs_stat", '{"path": "."}', agent_id="stranger")
    assert refused["error"]["code"] == "scope_required", refused
    up.worker.send_signal(signal.SIGTERM)
    _stopped_cleanly(up, tui_pid=tui.pid)


def test_the_tui_process_exits_non_zero_when_its_worker_is_killed(live: Cluster) -> None:
    """ui.child on its own, against a headless worker: a worker killed under it is
    reported with the log's path, and the status says it (1)."""
    socket = live.home / "ui.sock"
    log_file = live.home / "worker.log"
    child = Terminal([sys.executable, "-P", "-m", "ui.child", str(socket), str(log_file)], live.env)
    try:
        child.expect(READY)
        worker = next(p for p in live.procs if p.name == "worker")
        worker.kill()
        assert child.proc.wait(60) == 1, child.tail()
        child.until_closed()
        _said_the_worker_went_away(child, log_file)
    finally:
        child.close()


def test_after_q_the_terminal_says_a_drain_waits_and_ctrl_c_stops_it(tmp_path: Path) -> None:
    """q closes the TUI while a call runs: the worker then gave it drain_grace_s with
    nothing on the terminal but where the log was, and Ctrl-C there did nothing."""
    with cluster(tmp_path / "home", hub=False, worker=False, drain_grace_s=600) as live:
        terminal = Terminal([AGENTWORKER, "up"], live.env)
        try:
            terminal.expect(READY)
            args = '{"mark": "begun", "hold": "never"}'
            call = call_in_background(live, "workerDiag.probe", args, agent_id="tester")
            marks = live.home / "diag" / "begun.marks"
            wait_for(marks.exists, 60)  # the call runs
            quit_at = terminal.mark()
            terminal.type("q")
            terminal.expect(
                "stopping: 1 running call(s) get up to 600 s to finish; Ctrl-C", after=quit_at
            )
            terminal.proc.send_signal(signal.SIGINT)
            terminal.expect("stopping 1 running call(s) now", after=quit_at)
            assert terminal.proc.wait(60) == 0, terminal.tail()
            call["thread"].join(60)
            assert call["out"]["error"]["code"] == "cancelled", call
        finally:
            terminal.close()
