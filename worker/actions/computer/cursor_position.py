"""workerComputer.cursor_position: where the pointer is, and in a screenshot's space."""

from __future__ import annotations

from typing import Final

from worker.actions.computer import _desktop
from worker.actions.computer._shared import DESKTOP_CODES, SURFACE, PointResult, ShotId
from worker.core.registry import ActionSpec, Args, Context, Effect, Outcome, Result
from worker.errors import ErrorCode


class CursorPositionArgs(Args):
    screenshot_id: ShotId | None = None  # also give the position in this screenshot


class CursorPositionResult(Result):
    x: int
    y: int
    monitor: int | None
    in_screenshot: PointResult | None = None  # None when that screenshot does not show it


async def cursor_position(ctx: Context, args: CursorPositionArgs) -> Outcome[CursorPositionResult]:
    desktop = _desktop.of(ctx)
    x, y, layout = await desktop.pointer()
    in_shot = None
    if args.screenshot_id is not None:
        mapped = desktop.space(args.screenshot_id, layout).from_physical(x, y)
        in_shot = PointResult(x=mapped[0], y=mapped[1]) if mapped else None
    result = CursorPositionResult(x=x, y=y, monitor=layout.monitor_at(x, y), in_screenshot=in_shot)
    return Outcome(result)


SPEC: Final = ActionSpec(
    surface=SURFACE,
    name="cursor_position",
    args=CursorPositionArgs,
    result=CursorPositionResult,
    handler=cursor_position,
    effect=Effect.NONE,  # only looks: may run twice, so no claim before it runs
    summary="where the pointer is (physical, and in a screenshot's space)",
    codes=DESKTOP_CODES | {ErrorCode.OUT_OF_BOUNDS},
)
