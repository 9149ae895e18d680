"""A terminal that hangs up under the TUI: Textual's writer thread must outlive it,
or the worker wedges on shutdown (ui/terminal.py). A real pseudo-terminal whose
far side is closed, as tmux's is when a window closes."""

from __future__ import annotations

import os
import pty
from collections.abc import Iterator
from typing import cast

import pytest
from textual.drivers._writer_thread import MAX_QUEUED_WRITES, WriterThread

from tests.ui.rig import silent
from ui.app import WorkerApp
from ui.terminal import HangupSafeDriver, _DroppingWhenGone
from worker.core.console import Link


@pytest.fixture
def hung_up() -> Iterator[int]:
    """The terminal side of a pty whose other side is gone: writes fail with EIO."""
    controller, terminal = pty.openpty()
    os.close(controller)
    yield terminal
    os.close(terminal)


def test_writes_to_a_hung_up_terminal_fail_without_the_wrapper(hung_up: int) -> None:
    with pytest.raises(OSError), open(hung_up, "w", closefd=False) as tty:
        tty.write("x")
        tty.flush()


def test_the_writer_thread_drains_and_stops_after_its_terminal_hung_up(hung_up: int) -> None:
    with open(hung_up, "w", closefd=False) as tty:
        sink = _DroppingWhenGone(tty)
        writer = WriterThread(sink)  # type: ignore[arg-type]
        writer.start()
        for _ in range(MAX_QUEUED_WRITES * 4):  # more than the queue holds
            writer.write("\x1b[?25h" * 100)
        writer.stop()  # put(None) then join: blocks for ever if the thread died
        assert sink.gone
        assert not writer.is_alive()


def test_no_resume_onto_a_hung_up_terminal(hung_up: int) -> None:
    class Resumes(HangupSafeDriver):
        started = 0

        def start_application_mode(self) -> None:
            type(self).started += 1

    driver = Resumes.__new__(Resumes)
    driver.fileno = hung_up
    driver.resume_application_mode()  # the SIGCONT that follows a hang-up
    assert Resumes.started == 0
    terminal_controller, live = pty.openpty()
    try:
        driver.fileno = live
        driver.resume_application_mode()  # back from Ctrl+Z on a live terminal
        assert Resumes.started == 1
    finally:
        os.close(live)
        os.close(terminal_controller)


def test_the_tui_runs_on_the_hangup_safe_driver() -> None:
    app = WorkerApp(cast(Link, None), notifier=silent)
    assert app.driver_class is HangupSafeDriver
