"""Coordinate spaces: negative origins, downscaled screenshots, stale layouts."""

from __future__ import annotations

import pytest

from worker.actions.computer._geometry import Layout, Monitor, Rect, ShotSpace, fit
from worker.errors import WorkerError

# A laptop (primary) with a monitor to its left, lower, and one above it.
LEFT = Monitor(Rect(-2560, 200, 2560, 1440), name="left")
LAPTOP = Monitor(Rect(0, 0, 1920, 1080), primary=True, name="laptop")
ABOVE = Monitor(Rect(0, -1200, 1920, 1200), name="above")
LAYOUT = Layout((LEFT, LAPTOP, ABOVE), "x11")


def test_the_bounds_of_a_layout_with_negative_origins() -> None:
    assert LAYOUT.bounds == Rect(-2560, -1200, 4480, 2840)
    assert LAYOUT.primary_index == 1


def test_points_on_monitors_left_of_and_above_the_primary() -> None:
    assert LAYOUT.monitor_at(-1, 500) == 0
    assert LAYOUT.monitor_at(100, -5) == 2
    assert LAYOUT.monitor_at(1919, 1079) == 1


def test_a_point_in_a_gap_between_monitors_is_out_of_bounds() -> None:
    with pytest.raises(WorkerError) as caught:
        LAYOUT.check_point(-100, 100)  # left of the laptop, above the left monitor
    assert caught.value.code == "out_of_bounds"
    assert "(-2560, 200)" in caught.value.message


def test_a_downscaled_shot_of_a_negative_monitor_maps_back() -> None:
    space = ShotSpace(LEFT.rect, 1280, 720, LAYOUT)
    assert space.scale == 0.5
    assert space.to_physical(0, 0) == (-2560 + 1, 200 + 1)  # the centre of the first pixel pair
    assert space.to_physical(1279, 719) == (-1, 1639)
    assert space.from_physical(-1280, 920) == (640, 360)
    assert space.from_physical(10, 10) is None


def test_a_point_outside_the_image_is_out_of_bounds() -> None:
    space = ShotSpace(LAPTOP.rect, 960, 540, LAYOUT)
    with pytest.raises(WorkerError) as caught:
        space.to_physical(960, 10)
    assert caught.value.code == "out_of_bounds"


@pytest.mark.parametrize(
    ("size", "limits", "expected"),
    [
        ((1920, 1080), (1280, None), (1280, 720)),
        ((1920, 1080), (None, 540), (960, 540)),
        ((1920, 1080), (1000, 1000), (1000, 562)),
        ((800, 600), (1280, 1024), (800, 600)),  # never larger
    ],
)
def test_fit_keeps_the_aspect_ratio(
    size: tuple[int, int], limits: tuple[int | None, int | None], expected: tuple[int, int]
) -> None:
    assert fit(*size, *limits) == expected
