"""workerComputer.mouse_scroll: wheel clicks, vertical and horizontal, at a point."""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import Field, model_validator

from worker.actions.computer import _desktop
from worker.actions.computer._backend import Backend, Guard
from worker.actions.computer._shared import POINTER_CODES, SURFACE, Coord, InputResult, ShotId
from worker.core.registry import ActionSpec, Args, Context, Outcome
from worker.errors import ErrorCode


class MouseScrollArgs(Args):
    """dy > 0 scrolls down, dy < 0 up; dx > 0 right, dx < 0 left (wheel clicks)."""

    x: Coord | None = None  # both or neither: neither scrolls where the pointer is
    y: Coord | None = None
    screenshot_id: ShotId | None = None
    dx: Annotated[int, Field(ge=-100, le=100)] = 0
    dy: Annotated[int, Field(ge=-100, le=100)] = 0

    @model_validator(mode="after")
    def _something(self) -> MouseScrollArgs:
        if (self.x is None) != (self.y is None):
            raise ValueError("give both x and y, or neither")
        if not self.dx and not self.dy:
            raise ValueError("give dx or dy (wheel clicks)")
        return self


async def mouse_scroll(ctx: Context, args: MouseScrollArgs) -> Outcome[InputResult]:
    desktop = _desktop.of(ctx)

    def job(backend: Backend, guard: Guard) -> InputResult:
        if args.x is None or args.y is None:
            x, y = backend.cursor_position()
        else:
            x, y = desktop.physical(backend.layout(), args.x, args.y, args.screenshot_id)
        desktop.refuse_own_window(backend, x, y, "mouse_scroll")
        backend.scroll(guard, x, y, args.dx, args.dy)
        return InputResult(x=x, y=y)

    return Outcome(await desktop.act(job, "mouse_scroll"))


SPEC: Final = ActionSpec(
    surface=SURFACE,
    name="mouse_scroll",
    args=MouseScrollArgs,
    result=InputResult,
    handler=mouse_scroll,
    summary="wheel clicks, vertical and horizontal, at a point",
    codes=POINTER_CODES | {ErrorCode.PERMISSION_DENIED},
)
