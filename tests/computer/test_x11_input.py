"""The X11 desktop against a real Xvfb + openbox and the Tk test app: what the
worker sends is what the application receives."""

from __future__ import annotations

import asyncio
import io
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from PIL import Image

from tests.computer import models as m
from tests.computer.conftest import run
from tests.support.desktop import Computer, TkApp
from worker.actions.computer import Desktop
from worker.actions.computer._backend import Guard
from worker.core.pause import PauseSwitch
from worker.errors import WorkerError


def _click(computer: Computer, x: int, y: int, **args: object) -> None:
    run(computer.mouse_click(None, m.MouseClickArgs(x=x, y=y, **args)))  # type: ignore[arg-type]


def _clicked(app: TkApp, widget: str, kind: str = "single", button: int = 1) -> dict:
    return app.wait(
        lambda e: (
            e["event"] == "click"
            and e["widget"] == widget
            and e["kind"] == kind
            and e["button"] == button
        )
    )


def _focus_text(computer: Computer, app: TkApp) -> None:
    _click(computer, *app.centre("text"))
    app.wait(lambda e: e["event"] == "focus" and e["window"] == "text")


# ------------------------------------------------------------------ mouse


def test_a_click_lands_on_the_intended_widget(computer: Computer, app: TkApp) -> None:
    for widget in ("right", "left", "second"):
        _click(computer, *app.centre(widget))
        assert app.wait(lambda e: e["event"] == "click")["widget"] == widget


@pytest.mark.parametrize(("clicks", "kind"), [(2, "double"), (3, "triple")])
def test_double_and_triple_clicks(computer: Computer, app: TkApp, clicks: int, kind: str) -> None:
    _click(computer, *app.centre("left"), clicks=clicks)
    _clicked(app, "left", kind)


def test_right_and_middle_clicks(computer: Computer, app: TkApp) -> None:
    _click(computer, *app.centre("left"), button="right")
    _clicked(app, "left", button=3)
    _click(computer, *app.centre("left"), button="middle")
    _clicked(app, "left", button=2)


def test_a_click_holds_modifiers_and_lets_them_go(computer: Computer, app: TkApp) -> None:
    _click(computer, *app.centre("left"), modifiers=["ctrl", "shift"])
    held = _clicked(app, "left")
    assert held["state"] & 0x4 and held["state"] & 0x1  # Control and Shift masks
    _click(computer, *app.centre("right"))
    assert _clicked(app, "right")["state"] & 0x5 == 0


def test_a_drag_moves_the_slider(computer: Computer, app: TkApp) -> None:
    start, end = app.ready["slider"], app.ready["slider_end"]
    args = m.MouseDragArgs(start=m.Point(x=start[0], y=start[1]), end=m.Point(x=end[0], y=end[1]))
    run(computer.mouse_drag(None, args))
    app.wait(lambda e: e["event"] == "scale" and e["value"] >= 90)


def test_a_scroll_moves_the_list_both_ways(computer: Computer, app: TkApp) -> None:
    x, y = app.centre("listbox")
    run(computer.mouse_scroll(None, m.MouseScrollArgs(x=x, y=y, dy=5)))
    app.wait(lambda e: e["event"] == "yview" and e["first"] > 0)
    run(computer.mouse_scroll(None, m.MouseScrollArgs(x=x, y=y, dy=-5)))
    app.wait(lambda e: e["event"] == "yview" and e["first"] == 0)
    run(computer.mouse_scroll(None, m.MouseScrollArgs(x=x, y=y, dx=3)))
    app.wait(lambda e: e["event"] == "xview" and e["first"] > 0)
    run(computer.mouse_scroll(None, m.MouseScrollArgs(x=x, y=y, dx=-3)))
    app.wait(lambda e: e["event"] == "xview" and e["first"] == 0)


def test_mouse_move_puts_the_pointer_there(computer: Computer, app: TkApp) -> None:
    run(computer.mouse_move(None, m.MouseMoveArgs(x=321, y=123, duration_ms=50)))
    where = run(computer.cursor_position(None, m.CursorPositionArgs())).result
    assert (where.x, where.y, where.monitor) == (321, 123, 0)


def test_a_point_off_every_monitor_is_out_of_bounds(computer: Computer, app: TkApp) -> None:
    with pytest.raises(WorkerError) as caught:
        _click(computer, 5000, 100)
    assert caught.value.code == "out_of_bounds"


# ------------------------------------------------------------------ keyboard


@pytest.mark.parametrize(
    "text",
    [
        "Hello, World! 0123456789 ~`!@#$%^&*()_+-={}[]|\\:;\"'<>,.?/",
        "Crème brûlée, naïve café — Ærøskøbing, Straße, Łódź, ñandú",
        "你好\uff0c世界。東京は晴れ。한국어 テキスト",  # \uff0c: the full-width comma
        "line one\nline two\n\tindented\nlast",
    ],
    ids=["ascii", "accented", "cjk", "newlines-and-tabs"],
)
def test_key_type_arrives_exactly(computer: Computer, app: TkApp, text: str) -> None:
    _focus_text(computer, app)
    typed = run(computer.key_type(None, m.KeyTypeArgs(text=text))).result
    assert typed.characters == len(text)
    app.wait_text(text)


def test_long_text_with_many_foreign_characters_arrives_exactly(
    computer: Computer, app: TkApp
) -> None:
    """More distinct off-layout characters than the keymap has spare keycodes, over
    several chunks: keycodes are borrowed, reused and the text still arrives whole."""
    text = "".join(chr(0x4E00 + i) for i in range(60)) + " " + "abc" * 60
    _focus_text(computer, app)
    run(computer.key_type(None, m.KeyTypeArgs(text=text)))
    app.wait_text(text, timeout=30)


def test_key_combo_ctrl_a_selects_everything(computer: Computer, app: TkApp) -> None:
    _focus_text(computer, app)
    run(computer.key_type(None, m.KeyTypeArgs(text="select me")))
    app.wait_text("select me")
    done = run(computer.key_combo(None, m.KeyComboArgs(keys="ctrl+a"))).result
    assert done.keys == ["ctrl", "a"]
    app.wait(lambda e: e["event"] == "combo" and e["name"] == "ctrl+a")
    app.wait(lambda e: e["event"] == "selection" and e["value"] == "select me")


def test_key_combo_shift_arrows_extend_the_selection(computer: Computer, app: TkApp) -> None:
    _focus_text(computer, app)
    run(computer.key_type(None, m.KeyTypeArgs(text="hello")))
    app.wait_text("hello")
    run(computer.key_combo(None, m.KeyComboArgs(keys=["shift", "left"])))
    run(computer.key_combo(None, m.KeyComboArgs(keys="Shift+ArrowLeft")))
    app.wait(lambda e: e["event"] == "selection" and e["value"] == "lo")


def test_an_unknown_key_name_lists_close_matches(computer: Computer, app: TkApp) -> None:
    with pytest.raises(WorkerError) as caught:
        run(computer.key_combo(None, m.KeyComboArgs(keys="ctrl+escap")))
    assert caught.value.code == "unknown_key"
    assert "esc" in caught.value.details["close_matches"]
    assert "escape" in caught.value.message


def test_a_cancelled_combo_still_releases_its_keys(computer: Computer, app: TkApp) -> None:
    _focus_text(computer, app)

    async def cancel_while_held() -> None:
        args = m.KeyComboArgs(keys=["ctrl", "shift"], hold_ms=30_000)
        task = asyncio.create_task(computer.key_combo(None, args))
        await asyncio.to_thread(
            app.wait, lambda e: e["event"] == "key" and e["keysym"].startswith("Shift")
        )
        task.cancel()
        with pytest.raises(WorkerError) as caught:  # the keys were pressed: review10 15
            await task
        assert caught.value.code == "outcome_unknown", caught.value
        assert "the keys were pressed" in caught.value.message

    run(cancel_while_held())
    app.wait(lambda e: e == {"event": "key", "kind": "KeyRelease", "keysym": "Shift_L"})
    app.wait(lambda e: e == {"event": "key", "kind": "KeyRelease", "keysym": "Control_L"})


async def _slow_move_under_way(computer: Computer) -> asyncio.Task[Any]:
    """A 30 s move, started and seen to move the pointer."""
    args = m.MouseMoveArgs(x=1500, y=800, duration_ms=30_000)
    task = asyncio.create_task(computer.mouse_move(None, args))
    start = (await computer.cursor_position(None, m.CursorPositionArgs())).result
    while True:  # until the pointer is on its way
        now = (await computer.cursor_position(None, m.CursorPositionArgs())).result
        if (now.x, now.y) != (start.x, start.y):
            return task
        await asyncio.sleep(0.01)


def test_a_pause_stops_a_running_move_at_its_next_step(
    computer: Computer, app: TkApp, pause: PauseSwitch
) -> None:
    async def pause_while_moving() -> WorkerError:
        task = await _slow_move_under_way(computer)
        pause.stop("stop pressed in a test", "test")
        with pytest.raises(WorkerError) as caught:
            await task
        return caught.value

    error = run(pause_while_moving())
    assert error.code == "paused"
    assert "stop pressed in a test" in error.message


def test_while_the_person_is_asked_input_stops_and_waits_for_their_answer(
    computer: Computer, desktop: Desktop, app: TkApp
) -> None:
    """The prompt may be on this desktop (the TUI's terminal): a key or a click the agent
    makes while the person is asked could answer it for them."""

    async def asked_while_moving() -> tuple[WorkerError, tuple[int, int]]:
        running = await _slow_move_under_way(computer)
        desktop.hold("the person is asked in a test")
        with pytest.raises(WorkerError) as caught:
            await running
        waiting = asyncio.create_task(computer.mouse_move(None, m.MouseMoveArgs(x=40, y=30)))
        while desktop.input_waiting == 0:  # until it waits for the answer
            await asyncio.sleep(0)
        held = (await computer.cursor_position(None, m.CursorPositionArgs())).result
        assert not waiting.done() and (held.x, held.y) != (40, 30)
        desktop.hold(None)
        await waiting
        moved = (await computer.cursor_position(None, m.CursorPositionArgs())).result
        return caught.value, (moved.x, moved.y)

    error, moved = run(asked_while_moving())
    assert error.code == "paused" and "the person is asked in a test" in error.message
    assert moved == (40, 30)


def test_a_screenshot_under_way_as_the_person_is_asked_is_taken_again_after_the_answer(
    computer: Computer, desktop: Desktop, app: TkApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prompt may be drawn on this desktop while the image is read: that image is
    thrown away, and the screenshot taken again once the person has answered."""

    async def asked_while_grabbing() -> tuple[int, int, bool]:
        loop = asyncio.get_running_loop()
        backend = await desktop.query(lambda b: b)
        real, grabs = backend.grab, []

        async def ask() -> None:
            desktop.hold("the person is asked in a test")

        def grab(rect: Any) -> Any:  # the real grab, a prompt opening as the first begins
            grabs.append(rect)
            if len(grabs) == 1:
                asyncio.run_coroutine_threadsafe(ask(), loop).result(10)
            return real(rect)

        monkeypatch.setattr(backend, "grab", grab)
        shot = asyncio.create_task(computer.screenshot(None, m.ScreenshotArgs()))
        while desktop.shots_waiting == 0 and not shot.done():  # until it waits, or ends
            await asyncio.sleep(0)
        taken_before = len(grabs)
        waited = not shot.done()
        desktop.hold(None)
        outcome = await shot
        assert outcome.blob.startswith(b"\x89PNG")
        return taken_before, len(grabs), waited

    before, after, waited = run(asked_while_grabbing())
    assert (before, after, waited) == (1, 2, True)


# ------------------------------------------------------------------ screenshots


def _decode(blob: bytes) -> Image.Image:
    return Image.open(io.BytesIO(blob)).convert("RGB")


def _colours(image: Image.Image) -> set[tuple[int, int, int]]:
    return {colour for _count, colour in image.getcolors(maxcolors=1 << 24) or []}


def test_a_screenshot_shows_the_known_coloured_regions(computer: Computer, app: TkApp) -> None:
    shot = run(computer.screenshot(None, m.ScreenshotArgs()))
    assert shot.blob.startswith(b"\x89PNG\r\n\x1a\n")
    assert shot.result.bytes == len(shot.blob)
    image = _decode(shot.blob)
    assert image.size == (shot.result.width, shot.result.height) == (1600, 900)
    for name, colour in (("red", (255, 0, 0)), ("green", (0, 255, 0)), ("blue", (0, 0, 255))):
        x, y, w, h = app.widget(name)
        assert image.getpixel((x + 2, y + 2)) == colour
        assert image.getpixel((x + w - 3, y + h - 3)) == colour


def test_a_region_screenshot_is_exactly_that_region(computer: Computer, app: TkApp) -> None:
    x, y, w, h = app.widget("red")
    region = m.RegionArg(x=x, y=y, width=w, height=h)
    shot = run(computer.screenshot(None, m.ScreenshotArgs(region=region)))
    assert (shot.result.origin.x, shot.result.origin.y) == (x, y)
    assert _colours(_decode(shot.blob)) == {(255, 0, 0)}
    jpeg = run(
        computer.screenshot(None, m.ScreenshotArgs(region=region, format="jpeg", quality=90))
    )
    assert jpeg.blob.startswith(b"\xff\xd8") and jpeg.result.format == "jpeg"
    r, g, b = _decode(jpeg.blob).getpixel((w // 2, h // 2))
    assert r > 240 and g < 15 and b < 15


def test_a_downscaled_screenshot_clicks_the_right_widget(computer: Computer, app: TkApp) -> None:
    shot = run(computer.screenshot(None, m.ScreenshotArgs(max_width=640))).result
    assert (shot.width, shot.height, shot.scale) == (640, 360, 0.4)
    x, y = app.centre("right")
    _click(computer, int(x * shot.scale), int(y * shot.scale), screenshot_id=shot.screenshot_id)
    _clicked(app, "right")
    where = run(
        computer.cursor_position(None, m.CursorPositionArgs(screenshot_id=shot.screenshot_id))
    )
    assert where.result.in_screenshot is not None
    assert abs(where.result.x - x) <= 3 and abs(where.result.y - y) <= 3


def test_an_unknown_screenshot_id_is_refused(computer: Computer, app: TkApp) -> None:
    with pytest.raises(WorkerError) as caught:
        _click(computer, 10, 10, screenshot_id="0123456789ab")
    assert caught.value.code == "out_of_bounds"
    assert "take a new screenshot" in caught.value.message


def test_the_cursor_is_drawn_on_request(computer: Computer, app: TkApp) -> None:
    x, y, w, h = app.widget("red")
    run(computer.mouse_move(None, m.MouseMoveArgs(x=x + w // 2, y=y + h // 2)))
    region = m.RegionArg(x=x, y=y, width=w, height=h)
    plain = _decode(run(computer.screenshot(None, m.ScreenshotArgs(region=region))).blob)
    drawn = _decode(
        run(computer.screenshot(None, m.ScreenshotArgs(region=region, cursor=True))).blob
    )
    assert _colours(plain) == {(255, 0, 0)}
    assert _colours(drawn) != {(255, 0, 0)}


# ------------------------------------------------------------------ windows


TITLE, SECOND_TITLE = "agentworker test app", "agentworker second window"  # tk_app's


def _windows_once(computer: Computer, holds: Callable[[list[Any]], bool]) -> list[Any]:
    """window_list once the window manager's lists satisfy `holds`: Tk reports a window
    mapped (and a focus change) before openbox has updated _NET_CLIENT_LIST (and
    _NET_ACTIVE_WINDOW), so each read waits for the manager, never a fixed time."""
    deadline = time.monotonic() + 10
    while True:
        windows = run(computer.window_list(None, m.WindowListArgs())).result.windows
        if holds(windows) or time.monotonic() > deadline:
            return list(windows)
        time.sleep(0.02)


def _managed(computer: Computer) -> None:
    """Both test windows are in the window manager's list."""
    _windows_once(computer, lambda ws: {TITLE, SECOND_TITLE} <= {w.title for w in ws})


def test_window_list_shows_both_windows_and_focus_switches(computer: Computer, app: TkApp) -> None:
    windows = _windows_once(computer, lambda ws: {TITLE, SECOND_TITLE} <= {w.title for w in ws})
    titles = {w.title: w for w in windows}
    main, second = titles["agentworker test app"], titles["agentworker second window"]
    assert main.app == "Agentworkertest" and second.monitor == 0
    assert main.pid == second.pid == app.ready["pid"]
    focused = run(computer.window_focus(None, m.WindowFocusArgs(title="second window"))).result
    assert focused.focused and focused.window.id == second.id
    app.wait(lambda e: e["event"] == "focus" and e["window"] == "second")
    back = run(computer.window_focus(None, m.WindowFocusArgs(id=main.id))).result
    assert back.focused
    app.wait(lambda e: e["event"] == "focus" and e["window"] == "main")
    now = _windows_once(computer, lambda ws: [w.title for w in ws if w.focused] == [TITLE])
    assert [w.title for w in now if w.focused] == ["agentworker test app"]


def test_an_ambiguous_title_lists_the_candidates(computer: Computer, app: TkApp) -> None:
    _managed(computer)
    with pytest.raises(WorkerError) as caught:
        run(computer.window_focus(None, m.WindowFocusArgs(title="agentworker")))
    assert caught.value.code == "validation_error"
    titles = {c["title"] for c in caught.value.details["candidates"]}
    assert titles == {"agentworker test app", "agentworker second window"}


def test_a_drag_stopped_after_its_press_answers_outcome_unknown(
    computer: Computer, desktop: Desktop, app: TkApp
) -> None:
    """A drag stopped by a prompt after its press answered `paused`, which is retryable:
    a server retrying it dragged again (review8 finding 10)."""
    start, end = app.ready["slider"], app.ready["slider_end"]
    args = m.MouseDragArgs(
        start=m.Point(x=start[0], y=start[1]), end=m.Point(x=end[0], y=end[1]), duration_ms=5000
    )

    async def prompted_while_dragging() -> WorkerError:
        drag = asyncio.create_task(computer.mouse_drag(None, args))
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(
            None, lambda: app.wait(lambda e: e["event"] == "scale" and e["value"] > 5, 20)
        )
        desktop.hold("the person is asked in a test")
        try:
            with pytest.raises(WorkerError) as caught:
                await drag
        finally:
            desktop.hold(None)
        return caught.value

    error = run(prompted_while_dragging())
    assert error.code == "outcome_unknown", error
    assert error.message.startswith(f"stopped part way, after the drag pressed at ({start[0]}, ")
    assert "(input stopped: the person is asked in a test" in error.message
    assert error.details == {"stopped": "paused"}


@pytest.mark.parametrize("effect", ["", "3 of the 9 characters were typed"])
def test_a_sequence_stopped_answers_paused_until_it_has_had_an_effect(
    desktop: Desktop, pause: PauseSwitch, effect: str
) -> None:
    """Whatever the sequence (a key_type between its chunks, a combo holding its keys),
    once its guard notes an effect a retry would repeat, being stopped answers
    `outcome_unknown` naming it; before that, `paused` (retryable: nothing was done)."""
    under_way = threading.Event()

    def sequence(_backend: object, guard: Guard) -> None:
        if effect:
            guard.did(effect)
        under_way.set()
        guard.wait(60)

    async def stopped() -> WorkerError:
        running = asyncio.create_task(desktop.act(sequence))
        await asyncio.get_running_loop().run_in_executor(None, under_way.wait, 20)
        pause.stop("stop pressed in a test", "test")
        with pytest.raises(WorkerError) as caught:
            await running
        return caught.value

    error = run(stopped())
    if not effect:
        assert error.code == "paused" and error.retryable
    else:
        assert error.code == "outcome_unknown" and not error.retryable, error
        assert "stop pressed in a test" in error.message and effect in error.message
        assert error.details == {"stopped": "paused"}


@pytest.mark.parametrize("how", ["before its effect", "after its effect", "at its end"])
def test_a_sequence_whose_call_is_cancelled_answers_as_a_stop_does(
    desktop: Desktop, pause: PauseSwitch, how: str
) -> None:
    """The pipeline stops a call by cancelling its task (`agentworker pause` from another
    process, a kill, the deadline). That too answers `outcome_unknown` once the action
    had an effect, or ran to its end as the stop came (review10 finding 15: `paused`,
    retryable, after 2,432 characters were typed); before any effect the cancel goes
    on, and the pipeline answers the stop's reason."""
    under_way, stopping = threading.Event(), threading.Event()

    def sequence(_backend: object, guard: Guard) -> None:
        if how == "after its effect":
            guard.did("3 of the 9 characters were typed")
        under_way.set()
        if how == "at its end":
            stopping.wait(60)  # the last step, which no stop breaks off
        else:
            guard.wait(60)

    async def cancelled() -> WorkerError | None:
        running = asyncio.create_task(desktop.act(sequence))
        await asyncio.get_running_loop().run_in_executor(None, under_way.wait, 20)
        pause.stop("stop pressed in a test", "test")
        running.cancel()
        stopping.set()
        try:
            await running
        except asyncio.CancelledError:
            return None
        except WorkerError as error:
            return error
        raise AssertionError("a cancelled sequence answered as if it had not been")

    error = run(cancelled())
    if how == "before its effect":
        assert error is None
        return
    assert error is not None and error.code == "outcome_unknown" and not error.retryable, error
    assert "stop pressed in a test" in error.message and error.details == {"stopped": "paused"}
    said = "3 of the 9 characters were typed" if how == "after its effect" else "ran to its end"
    assert said in error.message, error.message
