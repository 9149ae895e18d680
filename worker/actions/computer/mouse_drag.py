"""workerComputer.mouse_drag: press, move through the points, release — the
button is released even when the drag is stopped half-way."""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import Field, model_validator

from worker.actions.computer import _desktop
from worker.actions.computer._backend import Backend, Guard
from worker.actions.computer._paths import DRAG_STEPS, line, modifiers
from worker.actions.computer._shared import (
    POINTER_CODES,
    SURFACE,
    ButtonName,
    DurationMs,
    InputResult,
    Modifiers,
    Point,
    ShotId,
    pastes,
)
from worker.core.registry import ActionSpec, Args, Context, Outcome
from worker.errors import ErrorCode


class MouseDragArgs(Args):
    """From `start` to `end`, or along `path` (at least two points)."""

    start: Point | None = None
    end: Point | None = None
    path: Annotated[list[Point], Field(min_length=2, max_length=1000)] | None = None
    screenshot_id: ShotId | None = None
    button: ButtonName = "left"
    duration_ms: DurationMs = 0
    modifiers: Modifiers = []

    @model_validator(mode="after")
    def _one_form(self) -> MouseDragArgs:
        pair = self.start is not None and self.end is not None
        if pair == (self.path is not None) or (self.start is None) != (self.end is None):
            raise ValueError("give start and end, or a path")
        return self

    @property
    def points(self) -> list[Point]:
        if self.path is not None:
            return list(self.path)
        assert self.start is not None and self.end is not None
        return [self.start, self.end]


async def mouse_drag(ctx: Context, args: MouseDragArgs) -> Outcome[InputResult]:
    desktop = _desktop.of(ctx)
    hold = modifiers(args.modifiers)

    def job(backend: Backend, guard: Guard) -> InputResult:
        layout = backend.layout()
        corners = [desktop.physical(layout, p.x, p.y, args.screenshot_id) for p in args.points]
        if args.duration_ms:
            path = line(corners, max(len(corners), args.duration_ms // 10))
            step_s = args.duration_ms / 1000 / max(1, len(path) - 1)
        else:
            path, step_s = line(corners, max(DRAG_STEPS, len(corners))), 0.0
        for end in (path[0], path[-1]):  # where it presses, and where it drops
            desktop.refuse_own_window(backend, *end, "mouse_drag")
        backend.drag(guard, path, args.button, step_s, hold)
        return InputResult(x=path[-1][0], y=path[-1][1])

    return Outcome(await desktop.act(job, "mouse_drag"))


SPEC: Final = ActionSpec(
    surface=SURFACE,
    name="mouse_drag",
    args=MouseDragArgs,
    result=InputResult,
    handler=mouse_drag,
    summary="press, move through the points (start/end or a path), release (the "
    "middle button pastes: it needs workerComputer.key_type too)",
    codes=POINTER_CODES | {ErrorCode.PERMISSION_DENIED},
    also_needs=lambda args: pastes(args.button),
)
