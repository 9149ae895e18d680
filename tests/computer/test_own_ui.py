"""The agent may not focus, click, scroll or type into the person's own line to the
worker: the terminal of the worker or of an attached UI (review10 finding 14). Here
the Tk test app stands for that terminal: its pid is given as an attached UI's."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from Xlib import X
from Xlib.display import Display as XDisplay
from Xlib.protocol import event as xevent
from Xlib.xobject.drawable import Window as XWindow

from tests.computer import models as m
from tests.computer.conftest import run
from tests.computer.test_x11_input import (
    SECOND_TITLE,
    TITLE,
    _focus_text,
    _managed,
    _windows_once,
)
from tests.support.desktop import (
    Computer,
    OtherClient,
    TkApp,
    XServer,
    computer_on,
    start_xvfb,
    tk_app,
    wait_until,
)
from worker.actions.computer import Desktop, _x11
from worker.actions.computer._backend import Guard
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
    _focus_text(computer, app)  # where the window manager's focus of a new window is done
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


# ------------------------------------------------------------------ fail closed


def _closing_after(
    monkeypatch: pytest.MonkeyPatch, cls: type, name: str, other: OtherClient
) -> list[Any]:
    """The X request `cls.name` answers the worker's input thread, and then (once)
    `other`'s window is destroyed before the worker goes on: the X server's real
    answer, then a real X error for what the worker asks next about that window. The
    replies seen are returned (the test checks the worker saw what it meant to)."""
    real = getattr(cls, name)
    seen: list[Any] = []

    def request(self: Any, *args: Any, **kwargs: Any) -> Any:
        reply = real(self, *args, **kwargs)
        if not seen and threading.current_thread().name.startswith("desktop-input"):
            seen.append(reply)
            other.destroy()
        return reply

    monkeypatch.setattr(cls, name, request)
    return seen


def _closing_before(
    monkeypatch: pytest.MonkeyPatch, cls: type, name: str, other: OtherClient
) -> list[int]:
    """The worker's input thread asks `other`'s window (`cls.name`, a request on it),
    and (once) the window closes just before the request reaches the X server: a real
    X error. The windows asked are returned."""
    real = getattr(cls, name)
    seen: list[int] = []

    def request(self: Any, *args: Any, **kwargs: Any) -> Any:
        if (
            not seen
            and self.id == other.id
            and threading.current_thread().name.startswith("desktop-input")
        ):
            seen.append(self.id)
            other.destroy()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, request)
    return seen


def _busy(call: object) -> WorkerError:
    with pytest.raises(WorkerError) as caught:
        run(call)  # type: ignore[arg-type]
    assert caught.value.code == "busy" and caught.value.retryable, caught.value
    assert "nothing was sent" in caught.value.message
    return caught.value


def _pressed(app: TkApp) -> list[str]:
    return [e["keysym"] for e in app.seen if e["event"] == "key" and e["kind"] == "KeyPress"]


def test_keys_wait_when_the_focus_cannot_be_told(
    computer: Computer,
    desktop: Desktop,
    app: TkApp,
    xserver: XServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another program's window holds the focus, and closes just after the X server
    said so: the walk up from it to its application's window meets a real BadWindow.
    Where keys go then is not known (the server gives the focus back to the root, so
    keys go to the window under the pointer: here the person's terminal). Looked at
    again once the window manager has handled it, it is known: the person's terminal,
    refused. With no look left (the focus kept moving), none is typed: `busy`."""
    _focus_text(computer, app)  # where the window manager's focus of a new window is done
    desktop.ui_pids = lambda: {app.proc.pid}
    x, y = app.centre("text")
    run(computer.mouse_move(None, m.MouseMoveArgs(x=x, y=y)))
    calls = [
        lambda: computer.key_type(None, m.KeyTypeArgs(text="ly")),
        lambda: computer.key_combo(None, m.KeyComboArgs(keys="y")),
    ]
    for looks in (_x11.FOCUS_LOOKS, 1):
        for call in calls:
            with OtherClient(xserver, 1400, 780) as other, monkeypatch.context() as patch:
                patch.setattr(_x11, "FOCUS_LOOKS", looks)
                other.focus()
                # The walk up from the focused window to its application's: it closed.
                seen = _closing_before(patch, XWindow, "query_tree", other)
                if looks > 1:
                    refused = _refused(call())
                    assert refused.details["pid"] == app.proc.pid
                else:
                    refused = _busy(call())
                    assert "keyboard focus" in refused.message
                    assert "BadWindow" in refused.message
                assert seen == [other.id]  # the worker did look at that window
                # The closed window's focus fell to the root, and openbox gives it to
                # the window focused before (the app) when it handles that: before the
                # next window takes it, not after (it took it back from that one at 1
                # in 50).
                wait_until(other.focus_off_the_root, 10, what="openbox to give the app the focus")

    desktop.ui_pids = tuple  # the UI went: typing goes on
    _focus_text(computer, app)
    run(computer.key_type(None, m.KeyTypeArgs(text="ok")))
    app.wait_text("ok")  # the first text the app ever saw
    assert not {"l", "y"} & set(_pressed(app))


def test_a_click_waits_when_the_window_at_its_point_cannot_be_told(
    computer: Computer,
    desktop: Desktop,
    app: TkApp,
    xserver: XServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another program's window lies over the person's terminal at the click's point,
    and closes just after the X server named it: the look inside it meets a real
    BadWindow, and a click now would land on the terminal beneath. Nothing is sent:
    `busy`, and the app sees no click, nor wheel."""
    _focus_text(computer, app)  # where the window manager's focus of a new window is done
    desktop.ui_pids = lambda: {app.proc.pid}
    calls = [
        lambda x, y: computer.mouse_click(None, m.MouseClickArgs(x=x, y=y)),
        lambda x, y: computer.mouse_scroll(None, m.MouseScrollArgs(x=x, y=y, dy=3)),
    ]
    for widget, call in zip(("left", "listbox"), calls, strict=True):
        x, y = app.centre(widget)
        with OtherClient(xserver, x - 10, y - 10, 20, 20) as other, monkeypatch.context() as patch:
            seen = _closing_after(patch, XWindow, "translate_coords", other)
            refused = _busy(call(x, y))
            assert f"at ({x}, {y})" in refused.message and "BadWindow" in refused.message
            assert [reply.child.id for reply in seen] == [other.id]  # it saw that window

    desktop.ui_pids = tuple  # the UI went: clicks go on
    x, y = app.centre("right")
    run(computer.mouse_click(None, m.MouseClickArgs(x=x, y=y)))
    app.wait(lambda e: e["event"] == "click" and e["widget"] == "right")
    # The first click the app ever saw was the one allowed; no wheel came before it.
    assert [e["widget"] for e in app.seen if e["event"] == "click"] == ["right"]
    assert not [e for e in app.seen if e["event"] == "wheel"]


def test_keys_go_where_no_window_has_the_focus(computer: Computer, xserver: XServer) -> None:
    """A screen where no window holds the focus (openbox's own, the root, or none)
    takes keys as before: not knowing where keys go is not the same as knowing they
    go to no one's terminal."""
    with OtherClient(xserver, 1400, 780) as other:
        other.focus()
        other.destroy()  # the focus goes back to the root, and openbox takes it from there
    run(computer.key_type(None, m.KeyTypeArgs(text="x")))
    run(computer.key_combo(None, m.KeyComboArgs(keys="shift")))


def test_with_no_window_manager_keys_go_to_the_window_under_the_pointer(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No window manager: the X server's focus is PointerRoot, so keys go to the window
    under the pointer. Over the person's terminal they are refused; over the bare root,
    or with the focus on no window at all, they are typed."""
    with (
        start_xvfb(1600, 900, window_manager=False) as server,
        tk_app(server) as app,
        computer_on(server, monkeypatch, tmp_path) as computer,
        OtherClient(server, 1560, 860, 20, 20) as other,
    ):
        assert other.display.get_input_focus().focus == X.PointerRoot
        desktop = computer.ctx.services.get(Desktop)
        assert desktop is not None
        desktop.ui_pids = lambda: {app.proc.pid}
        x, y = app.centre("text")
        run(computer.mouse_move(None, m.MouseMoveArgs(x=x, y=y)))
        refused = _refused(computer.key_type(None, m.KeyTypeArgs(text="ly")))
        assert refused.details["pid"] == app.proc.pid
        _refused(computer.key_combo(None, m.KeyComboArgs(keys="y")))

        run(computer.mouse_move(None, m.MouseMoveArgs(x=1400, y=700)))  # the bare root
        run(computer.key_type(None, m.KeyTypeArgs(text="x")))
        # Tk puts the focus back on PointerRoot when the pointer leaves its window; once
        # it has, the focus set next stays where this test puts it.
        app.wait(lambda e: e["event"] == "leave")
        other.display.set_input_focus(X.NONE, X.RevertToNone, X.CurrentTime)
        other.display.sync()
        run(computer.mouse_move(None, m.MouseMoveArgs(x=x, y=y)))
        run(computer.key_type(None, m.KeyTypeArgs(text="x")))  # to no window at all
        # The refused keys reached nothing: with the focus back on the pointer's window
        # and the text widget clicked, the first text the app sees is typed now.
        other.display.set_input_focus(X.PointerRoot, X.RevertToPointerRoot, X.CurrentTime)
        other.display.sync()
        desktop.ui_pids = tuple
        _focus_text(computer, app)
        run(computer.key_type(None, m.KeyTypeArgs(text="ok")))
        app.wait_text("ok")
        assert not {"l", "y"} & set(_pressed(app))


# ------------------------------------------------------------------ the window manager


def _editor(computer: Computer, app: TkApp, editor: TkApp) -> m.Point:
    """The person's focus history as review11 07 found it: the UI's terminal (`app`)
    focused a moment ago (answering a prompt, say), then their editor, where they type
    now. The point returned is on the editor's titlebar."""
    _focus_text(computer, app)
    _focus_text(computer, editor)
    windows = _windows_once(
        computer, lambda ws: any(w.pid == editor.proc.pid and w.title == TITLE for w in ws)
    )
    main = next(w for w in windows if w.pid == editor.proc.pid and w.title == TITLE)
    return m.Point(x=main.x + 150, y=main.y - 8)


def _focus_went_back(refused: WorkerError, computer: Computer, editor: TkApp) -> None:
    assert "window manager" in refused.message and refused.details["focus_back"] is True
    editor.wait(lambda e: e["event"] == "focus")  # the editor has the focus again
    run(computer.key_type(None, m.KeyTypeArgs(text="ok")))  # as the person's next keys
    editor.wait_text("ok")


def test_a_click_whose_window_manager_focuses_the_ui_terminal_gives_the_focus_back(
    computer: Computer, desktop: Desktop, app: TkApp, xserver: XServer
) -> None:
    """review11 07: a middle click on the editor's titlebar (openbox: Lower,
    FocusToBottom, Unfocus) lets the focus fall back to the window focused before it,
    the UI's terminal. The click was made; the focus goes back to the editor, and the
    action answers `permission_denied`, saying so."""
    with tk_app(xserver, "--x", "850", "--y", "250", "--second-x", "1300") as editor:
        titlebar = _editor(computer, app, editor)
        desktop.ui_pids = lambda: {app.proc.pid}
        call = computer.mouse_click(
            None, m.MouseClickArgs(x=titlebar.x, y=titlebar.y, button="middle")
        )
        refused = _refused(call)
        assert "mouse_click was done" in refused.message
        assert refused.details["pid"] == app.proc.pid
        _focus_went_back(refused, computer, editor)
    assert not [e for e in app.seen if e["event"] == "text"]  # no key reached the UI's


def test_keys_whose_window_manager_focuses_the_ui_terminal_give_the_focus_back(
    computer: Computer, desktop: Desktop, app: TkApp, xserver: XServer
) -> None:
    """alt+escape typed in the editor, an allowed window (openbox: Lower, FocusToBottom,
    Unfocus, as its titlebar's middle click), gives the focus to the window focused
    before, the UI's terminal; the window manager's switch is undone."""
    with tk_app(xserver, "--x", "850", "--y", "250", "--second-x", "1300") as editor:
        _editor(computer, app, editor)
        desktop.ui_pids = lambda: {app.proc.pid}
        refused = _refused(computer.key_combo(None, m.KeyComboArgs(keys="alt+escape")))
        assert "key_combo was done" in refused.message
        _focus_went_back(refused, computer, editor)
    assert not [e for e in app.seen if e["event"] == "text"]


@pytest.mark.parametrize("moment", ["once_a_chunk_is_typed", "as_the_next_chunk_remaps_keys"])
def test_keys_stop_once_the_focus_moves_to_the_ui_terminal_while_they_are_typed(
    computer: Computer,
    desktop: Desktop,
    app: TkApp,
    xserver: XServer,
    monkeypatch: pytest.MonkeyPatch,
    moment: str,
) -> None:
    """The focus goes to the UI's terminal while key_type types into the editor (here
    another client's click puts it there once the first chunk is typed, or while the
    next chunk's keymap changes, which may wait 50 ms for clients to take it in: review16
    F3; a window the keys closed would let it fall there): the next chunk is not typed,
    the call answers `permission_denied` saying how much was, and the focus goes back
    to the editor."""
    typed_once, focus_moved = threading.Event(), threading.Event()

    def hold() -> None:  # the test moves the focus meanwhile
        if not typed_once.is_set():
            typed_once.set()
            assert focus_moved.wait(60)

    def hook_in() -> None:  # once the editor is set up: it types too
        if moment == "once_a_chunk_is_typed":
            real_did = Guard.did

            def did_then_hold(self: Guard, what: str) -> None:
                real_did(self, what)
                hold()

            monkeypatch.setattr(Guard, "did", did_then_hold)
        else:
            real_ensure = _x11._Keyboard.ensure
            chunks: list[set[int]] = []

            def ensure_then_hold(
                self: Any, keysyms: set[int], used: set[int], guard: Guard
            ) -> None:
                real_ensure(self, keysyms, used, guard)
                chunks.append(keysyms)
                if len(chunks) == 2:  # the second chunk's keys are mapped, not yet typed
                    hold()

            monkeypatch.setattr(_x11._Keyboard, "ensure", ensure_then_hold)

    text = "a" * (3 * _x11.CHUNK)
    with tk_app(xserver, "--x", "850", "--y", "250", "--second-x", "1300") as editor:
        _editor(computer, app, editor)
        desktop.ui_pids = lambda: {app.proc.pid}
        hook_in()
        outcome: list[BaseException | object] = []

        def typing() -> None:
            try:
                outcome.append(run(computer.key_type(None, m.KeyTypeArgs(text=text))))
            except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
                outcome.append(exc)

        typist = threading.Thread(target=typing)
        typist.start()
        try:
            assert typed_once.wait(60)
            while not app.events.empty():  # earlier focus events are not this one
                app.seen.append(app.events.get())
            x, y = app.centre("text")
            xserver.run("xdotool", "mousemove", str(x), str(y), "click", "1")
            app.wait(lambda e: e["event"] == "focus" and e["window"] == "text")
        finally:
            focus_moved.set()
            typist.join(60)
        (refused,) = outcome
        assert isinstance(refused, WorkerError), refused
        assert refused.code == "permission_denied" and refused.details["pid"] == app.proc.pid
        chunk = f"{_x11.CHUNK} of the {len(text):,} characters were typed"
        assert chunk in refused.message and refused.details["done"] == chunk
        editor.wait_text("a" * _x11.CHUNK)
        editor.wait(lambda e: e["event"] == "focus")  # the focus went back to the editor
    assert not [e for e in app.seen if e["event"] == "text"]


def test_keys_stop_once_a_ui_attaches_in_the_window_they_are_typed_into(
    computer: Computer,
    desktop: Desktop,
    app: TkApp,
    xserver: XServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The person attaches a UI (`agentworker ui`) in the very window key_type types
    into, once its first chunk is typed: the next chunk is not typed there, and the
    call answers `permission_denied` saying how much was (review25: the UIs were read
    once per key_type)."""
    attached: set[int] = set()
    real_did = Guard.did

    def did_then_attach(self: Guard, what: str) -> None:
        real_did(self, what)
        attached.add(editor.proc.pid)  # the window's process is now a UI's terminal

    text = "a" * (3 * _x11.CHUNK)
    with tk_app(xserver, "--x", "850", "--y", "250", "--second-x", "1300") as editor:
        _editor(computer, app, editor)
        desktop.ui_pids = lambda: frozenset(attached)
        monkeypatch.setattr(Guard, "did", did_then_attach)
        refused = _refused(computer.key_type(None, m.KeyTypeArgs(text=text)))
        assert refused.details["pid"] == editor.proc.pid
        chunk = f"{_x11.CHUNK} of the {len(text):,} characters were typed"
        assert chunk in refused.message and refused.details["done"] == chunk
        editor.wait_text("a" * _x11.CHUNK)


def test_a_click_that_moves_the_focus_elsewhere_is_left_alone(
    computer: Computer, desktop: Desktop, app: TkApp, xserver: XServer
) -> None:
    """The focus the agent's input moves to another window (its click on the editor),
    or off the UI's terminal the person left focused, stays where it went."""
    with tk_app(xserver, "--x", "850", "--y", "250", "--second-x", "1300") as editor:
        _editor(computer, app, editor)
        _focus_text(computer, app)
        desktop.ui_pids = lambda: {app.proc.pid}
        _focus_text(computer, editor)  # a click: the focus leaves the UI's terminal
        run(computer.key_type(None, m.KeyTypeArgs(text="ok")))
        editor.wait_text("ok")


@contextlib.contextmanager
def _window_manager_held(xserver: XServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """openbox is stopped (SIGSTOP) in the block, as a busy machine may leave it
    unscheduled: once the worker has asked it for its answer after the input
    (_NET_REQUEST_FRAME_EXTENTS), it goes on when the worker next waits on the X server
    or asks it where the focus is, whichever comes first. So it handles the agent's
    input only after the worker either waited for it or looked without it."""
    openbox = xserver.helpers[0]
    with OtherClient(xserver, 1560, 860, 1, 1) as other:
        request = other.display.intern_atom("_NET_REQUEST_FRAME_EXTENTS")
    asked: list[bool] = []
    held = [True]

    def go_on() -> None:
        if asked and held[0]:
            held[0] = False
            os.kill(openbox.pid, signal.SIGCONT)

    real_send = XWindow.send_event

    def send_event(self: Any, event: Any, *args: Any, **kwargs: Any) -> Any:
        sent = real_send(self, event, *args, **kwargs)
        if isinstance(event, xevent.ClientMessage) and event.client_type == request:
            asked.append(True)
        return sent

    real_focus = XDisplay.get_input_focus

    def get_input_focus(self: Any) -> Any:
        reply = real_focus(self)
        go_on()
        return reply

    def wait(*args: Any) -> Any:
        go_on()
        return select.select(*args)

    monkeypatch.setattr(XWindow, "send_event", send_event)
    monkeypatch.setattr(XDisplay, "get_input_focus", get_input_focus)
    monkeypatch.setattr(_x11, "select", SimpleNamespace(select=wait))
    os.kill(openbox.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(openbox.pid, signal.SIGCONT)
        monkeypatch.undo()


def test_the_focus_is_judged_once_a_slow_window_manager_handled_the_keys(
    computer: Computer,
    desktop: Desktop,
    app: TkApp,
    xserver: XServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """openbox handles the agent's alt+escape only after the worker asked it for its
    answer: the worker waits for that answer (not an earlier one's), and then for the
    focus to stop moving, before it looks where the focus is."""
    with tk_app(xserver, "--x", "850", "--y", "250", "--second-x", "1300") as editor:
        _editor(computer, app, editor)
        desktop.ui_pids = lambda: {app.proc.pid}
        with _window_manager_held(xserver, monkeypatch):
            refused = _refused(computer.key_combo(None, m.KeyComboArgs(keys="alt+escape")))
        assert "key_combo was done" in refused.message
        _focus_went_back(refused, computer, editor)
    assert not [e for e in app.seen if e["event"] == "text"]


def test_a_focus_the_window_manager_moves_on_its_own_focus_event_is_seen(
    computer: Computer,
    desktop: Desktop,
    app: TkApp,
    xserver: XServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """alt+space opens the editor's window menu (openbox) and `n` picks its Iconify:
    openbox unmaps the editor, the X server gives the focus to its frame, and only on
    that focus event, queued behind the worker's request, does openbox give the focus
    to the window focused before, the UI's terminal. The worker asks again while the
    focus moves, so it sees that second move too."""
    with tk_app(xserver, "--x", "850", "--y", "250", "--second-x", "1300") as editor:
        _editor(computer, app, editor)
        desktop.ui_pids = lambda: {app.proc.pid}
        run(computer.key_combo(None, m.KeyComboArgs(keys="alt+space")))  # the menu opens
        with _window_manager_held(xserver, monkeypatch):
            refused = _refused(computer.key_combo(None, m.KeyComboArgs(keys="n")))
        assert "key_combo was done" in refused.message
        _focus_went_back(refused, computer, editor)
    assert not [e for e in app.seen if e["event"] == "text"]
