"""Whose windows are the person's own line to the worker: the worker's and each
attached UI's process with their ancestors, and the WINDOWID their terminal set."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from worker.actions.computer._own_ui import OwnUi, own_ui
from worker.errors import WorkerError


@pytest.fixture
def chain() -> Iterator[tuple[int, int]]:
    """A shell (the 'terminal') whose child waits (the 'UI'): (shell pid, child pid).
    The child prints its pid once it runs: its environment is readable by then (while
    it execs, /proc shows its new name before its environment, and a UI read then was
    skipped as ended)."""
    ui = "import os, sys; print(os.getpid(), flush=True); sys.stdin.read()"
    shell = subprocess.Popen(
        ["sh", "-c", 'exec 3<&0; "$0" -c "$1" <&3 3<&- & wait', sys.executable, ui],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "WINDOWID": "4242"},
    )
    assert shell.stdin is not None and shell.stdout is not None
    child = int(shell.stdout.readline())
    try:
        yield shell.pid, child
    finally:
        shell.stdin.close()  # the UI reads its end and exits; the shell's wait returns
        shell.wait(60)
        shell.stdout.close()


def test_the_worker_and_its_ancestors_are_its_own() -> None:
    mine = own_ui([])
    assert os.getpid() in mine.pids
    if os.getppid() > 1:
        assert os.getppid() in mine.pids
    assert 1 not in mine.pids and 0 not in mine.pids


def test_an_attached_ui_brings_its_ancestors_and_its_terminals_window(
    chain: tuple[int, int],
) -> None:
    shell, ui = chain
    theirs = own_ui([ui])
    assert {ui, shell, os.getpid()} <= theirs.pids
    assert 4242 in theirs.window_ids
    assert theirs.owns(4242, None) and theirs.owns(1, shell)
    assert shell not in own_ui([]).pids  # a child of the worker is not its own


def test_a_ui_that_ended_is_skipped() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    gone = int(done.stdout)
    assert own_ui([gone]).pids == own_ui([]).pids


def test_refuse_names_the_window_and_says_what_to_do() -> None:
    ui = OwnUi(frozenset({77}), frozenset({9}))
    ui.refuse(10, 78, "mouse_click")  # neither its pid nor its window: nothing raised
    for window, pid in ((9, None), (10, 77)):
        with pytest.raises(WorkerError) as caught:
            ui.refuse(window, pid, "mouse_click")
        assert caught.value.code == "permission_denied"
        assert caught.value.details == {"window": window, "pid": pid}
        assert caught.value.message.startswith("mouse_click: window")
