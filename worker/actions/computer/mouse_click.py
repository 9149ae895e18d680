"""workerComputer.mouse_click: left, right or middle, one to three times, with
modifiers held (and always let go)."""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import Field, model_validator

from worker.actions.computer import _desktop
from worker.actions.computer._backend import Backend, Guard
from worker.actions.computer._paths import modifiers
from worker.actions.computer._shared import (
    POINTER_CODES,
    SURFACE,
    ButtonName,
    Coord,
    InputResult,
    Modifiers,
    ShotId,
    pastes,
)
from worker.core.registry import ActionSpec, Args, Context, Outcome
from worker.errors import ErrorCode


class MouseClickArgs(Args):
    x: Coord | None = None  # both or neither: neither clicks where the pointer is
    y: Coord | None = None
    screenshot_id: ShotId | None = None
    button: ButtonName = "left"
    clicks: Annotated[int, Field(ge=1, le=3)] = 1
    modifiers: Modifiers = []

    @model_validator(mode="after")
    def _both(self) -> MouseClickArgs:
        if (self.x is None) != (self.y is None):
            raise ValueError("give both x and y, or neither")
        return self


async def mouse_click(ctx: Context, args: MouseClickArgs) -> Outcome[InputResult]:
    desktop = _desktop.of(ctx)
    hold = modifiers(args.modifiers)

    def job(backend: Backend, guard: Guard) -> InputResult:
        if args.x is None or args.y is None:
            x, y = backend.cursor_position()
        else:
            x, y = desktop.physical(backend.layout(), args.x, args.y, args.screenshot_id)
        desktop.refuse_own_window(backend, x, y, "mouse_click")
        backend.click(guard, x, y, args.button, args.clicks, hold)
        return InputResult(x=x, y=y)

    return Outcome(await desktop.act(job, "mouse_click"))


SPEC: Final = ActionSpec(
    surface=SURFACE,
    name="mouse_click",
    args=MouseClickArgs,
    result=InputResult,
    handler=mouse_click,
    summary="click left/right/middle 1-3 times, holding modifiers (middle pastes the "
    "selection: it needs workerComputer.key_type too)",
    codes=POINTER_CODES | {ErrorCode.PERMISSION_DENIED},
    also_needs=lambda args: pastes(args.button),
)
