"""A window manager that freezes the pointer on a press (a synchronous button grab,
as openbox's click to focus does) and replays the press when it is done: input the
worker sends meanwhile still lands where it was aimed.

Here the window manager is a small X client of the test's own (the far side of the
boundary), on an Xvfb with no other manager, so how long it holds the pointer is
the test's choice rather than openbox's mood."""

from __future__ import annotations

import contextlib
import os
import select
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from Xlib import X
from Xlib import display as xdisplay

from tests.computer import models as m
from tests.computer.conftest import run
from tests.support.desktop import Computer, TkApp, XServer, computer_on, start_xvfb, tk_app
from worker.errors import WorkerError


class FreezingManager:
    """Grabs button 1 on the app's top-level window in synchronous mode: each press
    freezes the pointer until `hold_s` has passed (None: until `let_go`), then the
    press is replayed to the app."""

    def __init__(self, server: XServer, title: str, hold_s: float | None) -> None:
        self.display = xdisplay.Display(server.display)
        self.hold_s = hold_s
        self.pressed = threading.Event()
        self._go = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        window = self.display.create_resource_object("window", _window_titled(server, title))
        window.grab_button(
            1, X.AnyModifier, False, X.ButtonPressMask, X.GrabModeSync, X.GrabModeAsync, 0, 0
        )
        self.display.sync()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        d = self.display
        while True:
            while d.pending_events():
                if d.next_event().type == X.ButtonPress:
                    self.pressed.set()
                    self._go.wait(self.hold_s)
                    d.allow_events(X.ReplayPointer, X.CurrentTime)
                    d.sync()
            ready, _, _ = select.select([d.fileno(), self._wake_r], [], [])
            if self._wake_r in ready:
                return

    def let_go(self) -> None:
        self._go.set()

    def close(self) -> None:
        self.let_go()
        os.write(self._wake_w, b"x")
        self._thread.join(10)
        self.display.close()
        os.close(self._wake_r)
        os.close(self._wake_w)


def _window_titled(server: XServer, title: str) -> int:
    found = server.run("xdotool", "search", "--name", f"^{title}$").split()
    assert len(found) == 1, found
    return int(found[0])


@pytest.fixture(scope="module")
def bare() -> Iterator[XServer]:
    with start_xvfb(1200, 800, window_manager=False) as server:
        yield server


@pytest.fixture
def bare_app(bare: XServer) -> Iterator[TkApp]:
    with tk_app(bare) as running:
        yield running


@pytest.fixture
def computer(bare: XServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Computer]:
    with computer_on(bare, monkeypatch, tmp_path) as handlers:
        yield handlers


@contextlib.contextmanager
def freezing(server: XServer, app: TkApp, hold_s: float | None) -> Iterator[FreezingManager]:
    manager = FreezingManager(server, app.ready["windows"]["main"], hold_s)
    try:
        yield manager
    finally:
        manager.close()


def _slider_drag(app: TkApp) -> m.MouseDragArgs:
    (sx, sy), (ex, ey) = app.ready["slider"], app.ready["slider_end"]
    return m.MouseDragArgs(start=m.Point(x=sx, y=sy), end=m.Point(x=ex, y=ey))


def test_a_drag_waits_out_a_frozen_pointer(
    bare: XServer, bare_app: TkApp, computer: Computer
) -> None:
    # The drag's motions and release queue behind the frozen pointer; under openbox a
    # release sent then was delivered where the press had been in about half of the
    # runs (test_through_the_hub's drag), so the drag waits for the pointer first.
    with freezing(bare, bare_app, hold_s=0.3) as manager:
        run(computer.mouse_drag(None, _slider_drag(bare_app)))
        assert manager.pressed.is_set()
    assert bare_app.wait(lambda e: e["event"] == "scale")["value"] == 100


def test_a_pointer_held_after_the_press_is_no_busy_and_the_button_is_let_go(
    bare: XServer, bare_app: TkApp, computer: Computer
) -> None:
    """The drag pressed, moved and let go by then: `busy` would say nothing was done
    and invite a second drag (review7 finding 09)."""
    with freezing(bare, bare_app, hold_s=None) as manager:
        with pytest.raises(WorkerError) as caught:
            run(computer.mouse_drag(None, _slider_drag(bare_app)))
        assert caught.value.code == "outcome_unknown" and not caught.value.retryable
        assert "another program holds it" in caught.value.message
        assert "the drag pressed at" in caught.value.message
        manager.let_go()
    # The release was sent all the same: once the manager lets go, nothing is held.
    bare_app.wait(lambda e: e["event"] == "scale")
    where = run(computer.cursor_position(None, m.CursorPositionArgs())).result
    end = bare_app.ready["slider_end"]
    assert (where.x, where.y) == (end[0], end[1])
    run(computer.mouse_click(None, m.MouseClickArgs(x=end[0], y=end[1] + 200)))


@contextlib.contextmanager
def confining(server: XServer, size: int) -> Iterator[None]:
    """Another client holds the pointer inside a window of `size` pixels at the top
    left (a grab with confine_to), as a game or a remote-desktop viewer may."""
    d = xdisplay.Display(server.display)
    try:
        screen = d.screen()
        window = screen.root.create_window(
            0, 0, size, size, 0, screen.root_depth, event_mask=X.StructureNotifyMask
        )
        window.map()
        while d.next_event().type != X.MapNotify:
            pass
        mask = X.ButtonPressMask | X.ButtonReleaseMask | X.PointerMotionMask
        status = window.grab_pointer(False, mask, X.GrabModeAsync, X.GrabModeAsync, window, 0, 0)
        assert status == X.GrabSuccess, status
        d.sync()
        yield
    finally:
        d.close()


def test_a_pointer_held_elsewhere_before_the_press_is_busy_and_nothing_is_pressed(
    bare: XServer, bare_app: TkApp, computer: Computer
) -> None:
    (sx, sy), (ex, ey) = bare_app.ready["slider"], bare_app.ready["slider_end"]
    with confining(bare, 20):
        args = m.MouseDragArgs(start=m.Point(x=sx, y=sy), end=m.Point(x=ex, y=ey))
        with pytest.raises(WorkerError) as caught:
            run(computer.mouse_drag(None, args))
    assert caught.value.code == "busy" and caught.value.retryable
    assert "nothing was pressed" in caught.value.message
    run(computer.mouse_drag(None, args))  # once the grab is gone, as the message says
    bare_app.wait(lambda e: e["event"] == "scale" and e["value"] == 100)
