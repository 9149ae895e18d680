"""cursor_position and screenshot ask the X server from the event loop (worker.actions.
computer._x11_line): the same answer as python-xlib's, asked afresh each time, and
bounded when the server hangs."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from Xlib import X
from Xlib import display as xdisplay

from tests.computer import models as m
from tests.computer.conftest import run
from tests.support.desktop import Computer, XServer, start_xvfb
from worker.actions.computer import Desktop, DesktopSettings, _x11, _x11_line, detect
from worker.errors import WorkerError


def _moved_by_another_client(server: XServer, points: list[tuple[int, int]]) -> Iterator[None]:
    """Moves the pointer to each point from a connection of its own (XTEST, synced:
    the server has done it before this yields)."""
    other = xdisplay.Display(server.display)
    try:
        for x, y in points:
            other.xtest_fake_input(X.MotionNotify, x=x, y=y)
            other.sync()
            yield
    finally:
        other.close()


def test_each_answer_is_the_pointer_now_and_matches_xlib(
    xserver: XServer, desktop: Desktop, computer: Computer
) -> None:
    points = [(10, 20), (1599, 899), (800, 450), (11, 21)]

    async def follow() -> list[tuple[int, int, int | None]]:
        seen = []
        for _ in _moved_by_another_client(xserver, points):
            where = (await computer.cursor_position(None, m.CursorPositionArgs())).result
            seen.append((where.x, where.y, where.monitor))
            x, y, layout = await desktop.pointer()
            xlib = await desktop.query(lambda b: (*b.cursor_position(), b.layout()))
            assert (x, y, layout) == xlib
        return seen

    assert run(follow()) == [(x, y, 0) for x, y in points]


@pytest.mark.parametrize("line", [True, False], ids=["on the line", "without a line"])
def test_a_screenshots_space_is_the_layout_input_sees(
    xserver: XServer,
    desktop: Desktop,
    computer: Computer,
    monkeypatch: pytest.MonkeyPatch,
    line: bool,
) -> None:
    """The layout a screenshot names comes from the loop's line (or, on a backend with
    none, from the backend in the grab thread) and is the one input actions compare it
    with: its id maps points, and a pointer drawn is where the pointer is."""
    if not line:
        monkeypatch.setattr(_x11.X11Backend, "pointer_line", lambda _self: None)

    async def shots() -> None:
        for _ in _moved_by_another_client(xserver, [(805, 455)]):
            region = m.RegionArg(x=800, y=450, width=40, height=40)
            args = m.ScreenshotArgs(region=region, format="jpeg", max_width=20, cursor=True)
            shot = (await computer.screenshot(None, args)).result
            assert (shot.width, shot.height, shot.scale, shot.monitor) == (20, 20, 0.5, 0)
            assert (shot.origin.x, shot.origin.y) == (800, 450)
            layout = await desktop.query(lambda b: b.layout())
            space = desktop.space(shot.screenshot_id, layout)  # not stale
            assert space.to_physical(10, 10) == (821, 471)  # the centre of its pixel
            asked = m.CursorPositionArgs(screenshot_id=shot.screenshot_id)
            where = (await computer.cursor_position(None, asked)).result
            assert where.in_screenshot is not None
            assert (where.in_screenshot.x, where.in_screenshot.y) == (2, 2)
        assert (desktop._line is False) is not line  # the path taken

    run(shots())


def test_calls_at_once_each_get_an_answer(desktop: Desktop) -> None:
    async def together() -> list[tuple[int, int]]:
        answers = await asyncio.gather(*(desktop.pointer() for _ in range(16)))
        return [(x, y) for x, y, _layout in answers]

    first, *rest = run(together())
    assert rest == [first] * 15


@pytest.fixture
def own_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[XServer, Desktop]]:
    server = start_xvfb(640, 480, window_manager=False)
    monkeypatch.setenv("DISPLAY", server.display)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    desktop = Desktop(detect(), None, DesktopSettings(stop_hotkey="", takeover=False))
    try:
        yield server, desktop
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        desktop.close()
        server.stop()


def test_a_hung_x_server_answers_timeout_and_the_loop_runs_on(
    own_server: tuple[XServer, Desktop], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, desktop = own_server
    monkeypatch.setattr(_x11_line, "BOUND_S", 0.3)

    async def hung() -> tuple[WorkerError, int]:
        await desktop.pointer()  # the line is open
        os.kill(server.proc.pid, signal.SIGSTOP)
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        ticking = asyncio.create_task(tick())
        try:
            with pytest.raises(WorkerError) as caught:
                await desktop.pointer()
        finally:
            ticking.cancel()
        return caught.value, ticks

    error, ticks = run(hung())
    assert error.code == "timeout" and "did not answer within 0.3 s" in error.message
    assert ticks > 100  # the loop went on while the query waited
    os.kill(server.proc.pid, signal.SIGCONT)
    x, y, layout = run(desktop.pointer())  # a new line
    assert layout.monitor_at(x, y) == 0


def test_a_screenshot_of_a_hung_x_server_answers_timeout(
    own_server: tuple[XServer, Desktop], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A screenshot asks the layout on the line first: bounded, as cursor_position is,
    where python-xlib in the grab thread would wait on the server for ever."""
    server, desktop = own_server
    monkeypatch.setattr(_x11_line, "BOUND_S", 0.3)
    with Computer.on(desktop, tmp_path) as computer:
        assert run(computer.screenshot(None, m.ScreenshotArgs())).result.width == 640
        os.kill(server.proc.pid, signal.SIGSTOP)
        with pytest.raises(WorkerError) as caught:
            run(computer.screenshot(None, m.ScreenshotArgs()))
        assert caught.value.code == "timeout"
        os.kill(server.proc.pid, signal.SIGCONT)
        shot = run(computer.screenshot(None, m.ScreenshotArgs(format="jpeg")))  # a new line
        assert (shot.result.width, shot.result.height) == (640, 480)
        assert shot.blob.startswith(b"\xff\xd8")


def test_a_query_cancelled_midway_leaves_no_reply_for_the_next(
    own_server: tuple[XServer, Desktop],
) -> None:
    server, desktop = own_server

    async def cancelled() -> None:
        await desktop.pointer()
        os.kill(server.proc.pid, signal.SIGSTOP)
        asking = asyncio.create_task(desktop.pointer())
        await asyncio.sleep(0)  # it has sent its requests
        await asyncio.sleep(0)
        asking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asking
        os.kill(server.proc.pid, signal.SIGCONT)

    run(cancelled())
    for _ in _moved_by_another_client(server, [(100, 200)]):
        x, y, _layout = run(desktop.pointer())
        assert (x, y) == (100, 200)
