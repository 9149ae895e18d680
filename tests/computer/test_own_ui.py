"""The agent may not focus, click, scroll or type into the person's own line to the
worker: the terminal of the worker or of an attached UI (review10 finding 14). Here
the Tk test app stands for that terminal: its pid is given as an attached UI's."""

from __future__ import annotations

import pytest

from tests.computer import models as m
from tests.computer.conftest import run
from tests.computer.test_x11_input import SECOND_TITLE, _focus_text, _managed, _windows_once
from tests.support.desktop import Computer, TkApp
from worker.actions.computer import Desktop
from worker.errors import WorkerError


def _refused(call: object) -> WorkerError:
    with pytest.raises(WorkerError) as caught:
        run(call)  # type: ignore[arg-type]
    assert caught.value.code == "permission_denied", caught.value
    return caught.value


def test_the_ui_terminal_cannot_be_focused_clicked_or_dragged_onto(
    computer: Computer, desktop: Desktop, app: TkApp
) -> None:
    _managed(computer)
    desktop.ui_pids = lambda: {app.proc.pid}
    refused = _refused(computer.window_focus(None, m.WindowFocusArgs(title=SECOND_TITLE)))
    assert "approval UI" in refused.message and refused.details["pid"] == app.proc.pid
    x, y = app.centre("left")
    _refused(computer.mouse_click(None, m.MouseClickArgs(x=x, y=y)))
    # A press on the bare desktop that would drop on the app, and one that starts on it.
    outside = m.Point(x=1500, y=850)
    _refused(computer.mouse_drag(None, m.MouseDragArgs(start=outside, end=m.Point(x=x, y=y))))
    _refused(computer.mouse_drag(None, m.MouseDragArgs(start=m.Point(x=x, y=y), end=outside)))
    # The bare desktop is not the person's terminal: a click there goes through.
    run(computer.mouse_click(None, m.MouseClickArgs(x=outside.x, y=outside.y)))

    desktop.ui_pids = tuple  # the UI went: the same window is any other now
    right = app.centre("right")
    run(computer.mouse_click(None, m.MouseClickArgs(x=right[0], y=right[1])))
    app.wait(lambda e: e["event"] == "click" and e["widget"] == "right")
    # The first click the app ever saw was the one allowed: nothing refused reached it.
    assert [e["widget"] for e in app.seen if e["event"] == "click"] == ["right"]
    focused = run(computer.window_focus(None, m.WindowFocusArgs(title=SECOND_TITLE))).result
    assert focused.focused


def test_a_window_of_another_program_is_not_refused(
    computer: Computer, desktop: Desktop, app: TkApp
) -> None:
    desktop.ui_pids = lambda: {app.proc.pid + 100_000}  # some other UI, not this app
    windows = _windows_once(computer, lambda ws: SECOND_TITLE in {w.title for w in ws})
    second = next(w for w in windows if w.title == SECOND_TITLE)
    assert run(computer.window_focus(None, m.WindowFocusArgs(id=second.id))).result.focused
    x, y = app.centre("left")
    run(computer.mouse_click(None, m.MouseClickArgs(x=x, y=y)))
    app.wait(lambda e: e["event"] == "click" and e["widget"] == "left")


def test_keys_are_not_typed_into_the_ui_terminal_the_person_left_focused(
    computer: Computer, desktop: Desktop, app: TkApp
) -> None:
    """The person answered a prompt and left its terminal focused: the agent's keys
    (say `l` then `y`, lifting a kill) and its wheel there are refused, and none
    reaches the window. Once the focus is elsewhere, typing goes on."""
    _focus_text(computer, app)  # as the person's click would leave it
    desktop.ui_pids = lambda: {app.proc.pid}
    refused = _refused(computer.key_type(None, m.KeyTypeArgs(text="ly")))
    assert "approval UI" in refused.message and refused.details["pid"] == app.proc.pid
    _refused(computer.key_combo(None, m.KeyComboArgs(keys="ctrl+l")))
    x, y = app.centre("listbox")
    _refused(computer.mouse_scroll(None, m.MouseScrollArgs(x=x, y=y, dy=3)))

    desktop.ui_pids = tuple  # the UI went: its window is any other now
    run(computer.key_type(None, m.KeyTypeArgs(text="ok")))
    app.wait_text("ok")  # the first text the app ever saw: nothing refused reached it
    assert not [e for e in app.seen if e["event"] == "wheel"]
