"""Monitor layouts Xvfb cannot make: two monitors side by side (Xephyr with two
screens joined by Xinerama), and a screen whose size changes under a screenshot
(Xephyr resized through RandR)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.computer import models as m
from tests.computer.conftest import run
from tests.support.desktop import Computer, XServer, computer_on, start_xephyr, start_xvfb, tk_app
from worker.errors import WorkerError


@pytest.fixture(scope="module")
def host() -> Iterator[XServer]:
    with start_xvfb(1800, 1400, window_manager=False) as server:
        yield server


@pytest.fixture
def two_monitors(
    host: XServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[tuple[XServer, Computer]]:
    with (
        start_xephyr(host, "640x480", "800x600", xinerama=True) as server,
        computer_on(server, monkeypatch, tmp_path) as computer,
    ):
        yield server, computer


def test_display_info_shows_both_monitors(two_monitors: tuple[XServer, Computer]) -> None:
    _server, computer = two_monitors
    info = run(computer.display_info(None, m.DisplayInfoArgs())).result
    rects = [(mon.x, mon.y, mon.width, mon.height) for mon in info.monitors]
    assert rects == [(0, 0, 640, 480), (640, 0, 800, 600)]
    assert [mon.primary for mon in info.monitors] == [True, False]
    assert (info.bounds.width, info.bounds.height) == (1440, 600)
    run(computer.mouse_move(None, m.MouseMoveArgs(x=700, y=10)))
    where = run(computer.cursor_position(None, m.CursorPositionArgs())).result
    assert (where.x, where.y, where.monitor) == (700, 10, 1)


def test_clicks_on_the_second_monitor_land(two_monitors: tuple[XServer, Computer]) -> None:
    server, computer = two_monitors
    with tk_app(server, "--x", "660", "--y", "10", "--second-x", "20", "--second-y", "20") as app:
        x, y = app.centre("left")
        assert x > 640
        run(computer.mouse_click(None, m.MouseClickArgs(x=x, y=y)))
        assert app.wait(lambda e: e["event"] == "click")["widget"] == "left"

        shot = run(computer.screenshot(None, m.ScreenshotArgs(monitor=1, max_width=400))).result
        assert (shot.origin.x, shot.origin.y, shot.monitor, shot.scale) == (640, 0, 1, 0.5)
        rx, ry = app.centre("right")
        in_shot = m.MouseClickArgs(
            x=(rx - 640) // 2, y=ry // 2, screenshot_id=shot.screenshot_id, clicks=2
        )
        run(computer.mouse_click(None, in_shot))
        app.wait(
            lambda e: e["event"] == "click" and e["widget"] == "right" and e["kind"] == "double"
        )

        second = app.centre("second")  # the other window, on the first monitor
        run(computer.mouse_click(None, m.MouseClickArgs(x=second[0], y=second[1])))
        assert app.wait(lambda e: e["event"] == "click")["widget"] == "second"


def test_a_point_in_the_gap_below_the_smaller_monitor_is_out_of_bounds(
    two_monitors: tuple[XServer, Computer],
) -> None:
    _server, computer = two_monitors
    with pytest.raises(WorkerError) as caught:
        run(computer.mouse_move(None, m.MouseMoveArgs(x=100, y=550)))
    assert caught.value.code == "out_of_bounds"
    whole = run(computer.screenshot(None, m.ScreenshotArgs(all_monitors=True))).result
    assert (whole.width, whole.height, whole.monitor) == (1440, 600, None)


def test_a_screenshot_taken_before_the_layout_changed_is_stale(
    host: XServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with (
        start_xephyr(host, "800x600") as server,
        computer_on(server, monkeypatch, tmp_path) as computer,
    ):
        shot = run(computer.screenshot(None, m.ScreenshotArgs())).result
        run(computer.mouse_move(None, m.MouseMoveArgs(x=5, y=5, screenshot_id=shot.screenshot_id)))
        asked = m.CursorPositionArgs(screenshot_id=shot.screenshot_id)
        assert run(computer.cursor_position(None, asked)).result.in_screenshot is not None
        server.run("xrandr", "-s", "1024x768")
        with pytest.raises(WorkerError) as caught:  # asked afresh: not the old layout
            run(computer.cursor_position(None, asked))
        assert caught.value.details["stale"] is True
        with pytest.raises(WorkerError) as caught:
            args = m.MouseMoveArgs(x=5, y=5, screenshot_id=shot.screenshot_id)
            run(computer.mouse_move(None, args))
        assert caught.value.code == "out_of_bounds"
        assert caught.value.details["stale"] is True
        fresh = run(computer.screenshot(None, m.ScreenshotArgs())).result
        assert (fresh.width, fresh.height) == (1024, 768)
