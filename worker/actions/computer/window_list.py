"""workerComputer.window_list: the top-level windows the window manager knows."""

from __future__ import annotations

from typing import Final

from worker.actions.computer import _desktop
from worker.actions.computer._backend import Backend
from worker.actions.computer._shared import DESKTOP_CODES, SURFACE, WindowResult
from worker.core.registry import ActionSpec, Args, Context, Effect, Outcome, Result


class WindowListArgs(Args):
    pass


class WindowListResult(Result):
    windows: list[WindowResult]


async def window_list(ctx: Context, args: WindowListArgs) -> Outcome[WindowListResult]:
    def job(backend: Backend) -> WindowListResult:
        layout = backend.layout()
        return WindowListResult(
            windows=[_desktop.window_result(w, layout) for w in backend.windows()]
        )

    return Outcome(await _desktop.of(ctx).query(job))


SPEC: Final = ActionSpec(
    surface=SURFACE,
    name="window_list",
    args=WindowListArgs,
    result=WindowListResult,
    handler=window_list,
    effect=Effect.NONE,  # only looks: may run twice, so no claim before it runs
    summary="the top-level windows: id, title, application, pid, geometry, focus, monitor",
    codes=DESKTOP_CODES,
)
