"""workerComputer.window_focus: bring a window to the front, by id or by title.

A title matches exactly, else as a case-insensitive part of one title; more than
one match is an error that lists them — the worker never guesses which was meant.
"""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import Field, StringConstraints, model_validator

from worker.actions.computer import _desktop
from worker.actions.computer._backend import Backend, Guard, Window
from worker.actions.computer._geometry import Layout
from worker.actions.computer._shared import DESKTOP_CODES, SURFACE, WindowResult
from worker.core.registry import ActionSpec, Args, Context, Outcome, Result
from worker.errors import ErrorCode, WorkerError


class WindowFocusArgs(Args):
    """By id (from window_list), or by title: an exact title, else a unique substring."""

    id: Annotated[int, Field(ge=1)] | None = None
    title: Annotated[str, StringConstraints(min_length=1, max_length=1000)] | None = None
    timeout_ms: Annotated[int, Field(ge=0, le=10_000)] = 2000

    @model_validator(mode="after")
    def _one(self) -> WindowFocusArgs:
        if (self.id is None) == (self.title is None):
            raise ValueError("give id or title")
        return self


class WindowFocusResult(Result):
    window: WindowResult
    focused: bool  # the window manager confirmed it within timeout_ms


async def window_focus(ctx: Context, args: WindowFocusArgs) -> Outcome[WindowFocusResult]:
    desktop = _desktop.of(ctx)

    def find(backend: Backend) -> tuple[Window, Layout]:
        return pick(backend.windows(), args), backend.layout()

    window, layout = await desktop.query(find)

    def job(backend: Backend, guard: Guard) -> bool:
        desktop.refuse_own(window, "window_focus")
        guard.did(f"the focus was asked for window {window.id}")  # stopped now: unknown
        return backend.focus(window.id, args.timeout_ms / 1000)

    focused = await desktop.act(job, "window_focus")
    return Outcome(
        WindowFocusResult(window=_desktop.window_result(window, layout), focused=focused)
    )


def pick(windows: list[Window], args: WindowFocusArgs) -> Window:
    if args.id is not None:
        for window in windows:
            if window.id == args.id:
                return window
        raise WorkerError(
            "not_found",
            f"no window {args.id} on the desktop (it may have closed); see window_list",
            {"id": args.id},
        )
    assert args.title is not None
    exact = [w for w in windows if w.title == args.title]
    wanted = args.title.casefold()
    matches = exact or [w for w in windows if wanted in w.title.casefold()]
    if len(matches) == 1:
        return matches[0]
    candidates = [{"id": w.id, "title": w.title, "app": w.app} for w in matches or windows]
    if not matches:
        raise WorkerError(
            "not_found",
            f"no window's title contains {args.title!r}; the windows are listed in details",
            {"candidates": candidates},
        )
    listed = "; ".join(f"{w.id}: {w.title!r}" for w in matches[:10])
    raise WorkerError(
        "validation_error",
        f"{len(matches)} windows match {args.title!r} ({listed}); focus one by its id",
        {"candidates": candidates},
    )


SPEC: Final = ActionSpec(
    surface=SURFACE,
    name="window_focus",
    args=WindowFocusArgs,
    result=WindowFocusResult,
    handler=window_focus,
    summary="bring a window to the front by id or by title (an ambiguous title is an error)",
    codes=DESKTOP_CODES | {ErrorCode.NOT_FOUND, ErrorCode.PERMISSION_DENIED},
)
