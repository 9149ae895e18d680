"""workerComputer.mouse_move: put the pointer somewhere, at once or over a duration."""

from __future__ import annotations

from typing import Final

from worker.actions.computer import _desktop
from worker.actions.computer._backend import Backend, Guard
from worker.actions.computer._paths import line
from worker.actions.computer._shared import (
    POINTER_CODES,
    SURFACE,
    Coord,
    DurationMs,
    InputResult,
    ShotId,
)
from worker.core.registry import ActionSpec, Args, Context, Outcome


class MouseMoveArgs(Args):
    x: Coord
    y: Coord
    screenshot_id: ShotId | None = None
    duration_ms: DurationMs = 0


async def mouse_move(ctx: Context, args: MouseMoveArgs) -> Outcome[InputResult]:
    desktop = _desktop.of(ctx)

    def job(backend: Backend, guard: Guard) -> InputResult:
        x, y = desktop.physical(backend.layout(), args.x, args.y, args.screenshot_id)
        if args.duration_ms:
            steps = max(2, args.duration_ms // 10)
            path = line([backend.cursor_position(), (x, y)], steps)
            backend.move(guard, path, args.duration_ms / 1000 / steps)
        else:
            backend.move(guard, [(x, y)], 0.0)
        return InputResult(x=x, y=y)

    return Outcome(await desktop.act(job, "mouse_move"))


SPEC: Final = ActionSpec(
    surface=SURFACE,
    name="mouse_move",
    args=MouseMoveArgs,
    result=InputResult,
    handler=mouse_move,
    summary="move the pointer, at once or over duration_ms",
    codes=POINTER_CODES,
)
