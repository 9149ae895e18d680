"""workerComputer.display_info: the monitors and the display server."""

from __future__ import annotations

from typing import Final

from worker.actions.computer import _desktop
from worker.actions.computer._shared import DESKTOP_CODES, SURFACE, RectResult
from worker.core.registry import ActionSpec, Args, Context, Effect, Outcome, Result


class DisplayInfoArgs(Args):
    pass


class MonitorResult(Result):
    index: int  # what screenshot's `monitor` takes
    name: str
    x: int
    y: int
    width: int
    height: int
    scale: float
    primary: bool


class DisplayInfoResult(Result):
    display_server: str
    monitors: list[MonitorResult]
    bounds: RectResult


async def display_info(ctx: Context, args: DisplayInfoArgs) -> Outcome[DisplayInfoResult]:
    layout = await _desktop.of(ctx).query(lambda backend: backend.layout())
    bounds = layout.bounds
    monitors = [
        MonitorResult(
            index=i,
            name=m.name,
            x=m.rect.x,
            y=m.rect.y,
            width=m.rect.width,
            height=m.rect.height,
            scale=m.scale,
            primary=m.primary,
        )
        for i, m in enumerate(layout.monitors)
    ]
    return Outcome(
        DisplayInfoResult(
            display_server=layout.server,
            monitors=monitors,
            bounds=RectResult(x=bounds.x, y=bounds.y, width=bounds.width, height=bounds.height),
        )
    )


SPEC: Final = ActionSpec(
    surface=SURFACE,
    name="display_info",
    args=DisplayInfoArgs,
    result=DisplayInfoResult,
    handler=display_info,
    effect=Effect.NONE,  # only looks: may run twice, so no claim before it runs
    summary="the monitors (origin, size, scale, primary) and the display server",
    codes=DESKTOP_CODES,
)
