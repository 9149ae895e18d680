"""workerComputer.screenshot: one monitor, all of them, or a region, as PNG or JPEG.

The image travels in the result blob; the result says where it came from
(`origin`, `scale`) and names its coordinate space (`screenshot_id`), which the
mouse actions accept. Encoding is the cost: see `_imaging` for the measurements.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import Field, model_validator

from worker.actions.computer import _desktop
from worker.actions.computer._backend import Backend
from worker.actions.computer._geometry import Layout, Rect, ShotSpace, fit
from worker.actions.computer._shared import (
    DESKTOP_CODES,
    SURFACE,
    PointResult,
    RegionArg,
)
from worker.core.registry import ActionSpec, Args, Context, Effect, Outcome, Result
from worker.errors import ErrorCode, WorkerError


class ScreenshotArgs(Args):
    """One monitor (default: the primary), all of them, or a region."""

    monitor: Annotated[int, Field(ge=0, le=64)] | None = None
    all_monitors: bool = False
    region: RegionArg | None = None
    format: Literal["png", "jpeg"] = "png"
    quality: Annotated[int, Field(ge=1, le=100)] = 75  # JPEG only
    max_width: Annotated[int, Field(ge=16, le=100_000)] | None = None
    max_height: Annotated[int, Field(ge=16, le=100_000)] | None = None
    cursor: bool = False

    @model_validator(mode="after")
    def _one_target(self) -> ScreenshotArgs:
        chosen = [self.monitor is not None, self.all_monitors, self.region is not None]
        if sum(chosen) > 1:
            raise ValueError("give at most one of monitor, all_monitors and region")
        return self


class ScreenshotResult(Result):
    screenshot_id: str
    format: str
    width: int  # of the image
    height: int
    scale: float  # image pixels per physical pixel (1.0 unless downscaled)
    origin: PointResult  # the physical top-left of what it shows
    source_width: int  # physical size of what it shows
    source_height: int
    monitor: int | None  # the monitor shown, when it is one
    bytes: int


async def screenshot(ctx: Context, args: ScreenshotArgs) -> Outcome[ScreenshotResult]:
    desktop = _desktop.of(ctx)
    # The layout (and the pointer) asked now on the loop's own line to the display
    # server, in one round trip, where the backend has one: asking the backend in the
    # grab thread took four python-xlib round trips, 0.3-0.8 ms of each screenshot.
    where = await desktop.pointer_on_line()

    def job(backend: Backend) -> tuple[ShotSpace, bytes, int | None]:
        from worker.actions.computer import _imaging  # Pillow loads at the first screenshot

        layout = backend.layout() if where is None else where[2]
        rect, monitor = _target(layout, args)
        grab = backend.grab(rect)
        width, height = fit(rect.width, rect.height, args.max_width, args.max_height)
        if (
            args.format == "png"
            and not args.cursor
            and (width, height) == (rect.width, rect.height)
        ):
            # The common case, encoded in strips from the grab (see _imaging).
            return ShotSpace(rect, width, height, layout), _imaging.png_of_grab(grab), monitor
        image = _imaging.to_image(grab)
        if args.cursor:
            cx, cy = backend.cursor_position() if where is None else where[:2]
            if rect.contains(cx, cy):
                _imaging.draw_cursor(image, backend.cursor_image(), cx - rect.x, cy - rect.y)
        image = _imaging.resize(image, width, height)
        data = _imaging.encode(image, args.format, args.quality)
        return ShotSpace(rect, width, height, layout), data, monitor

    space, data, monitor = await desktop.grab(job)
    result = ScreenshotResult(
        screenshot_id=desktop.remember(space),
        format=args.format,
        width=space.width,
        height=space.height,
        scale=round(space.scale, 6),
        origin=PointResult(x=space.origin.x, y=space.origin.y),
        source_width=space.origin.width,
        source_height=space.origin.height,
        monitor=monitor,
        bytes=len(data),
    )
    return Outcome(result, blob=data)


def _target(layout: Layout, args: ScreenshotArgs) -> tuple[Rect, int | None]:
    if args.region is not None:
        asked = Rect(args.region.x, args.region.y, args.region.width, args.region.height)
        if asked.intersect(layout.bounds) != asked:
            b = layout.bounds
            raise WorkerError(
                "out_of_bounds",
                f"the region {asked.width}x{asked.height} at ({asked.x}, {asked.y}) is not "
                f"inside the desktop ({b.width}x{b.height} at ({b.x}, {b.y}))",
            )
        return asked, layout.monitor_at(asked.x, asked.y)
    if args.all_monitors:
        return layout.bounds, None
    index = layout.primary_index if args.monitor is None else args.monitor
    if index >= len(layout.monitors):
        raise WorkerError(
            "out_of_bounds",
            f"there is no monitor {index}: this desktop has {len(layout.monitors)} "
            "(see display_info)",
        )
    return layout.monitors[index].rect, index


SPEC: Final = ActionSpec(
    surface=SURFACE,
    name="screenshot",
    args=ScreenshotArgs,
    result=ScreenshotResult,
    handler=screenshot,
    effect=Effect.NONE,  # only looks: may run twice, so no claim before it runs
    summary="a monitor, all monitors or a region as PNG (default) or JPEG, maybe downscaled; "
    "the image is the blob, its screenshot_id names its coordinate space",
    codes=DESKTOP_CODES | {ErrorCode.OUT_OF_BOUNDS},
)
