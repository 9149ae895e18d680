"""workerComputer.key_type: any Unicode text, exactly (newline is Return, tab is Tab)."""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import StringConstraints

from worker.actions.computer import _desktop
from worker.actions.computer._backend import Backend, Guard
from worker.actions.computer._shared import DESKTOP_CODES, SURFACE
from worker.core.registry import ActionSpec, Args, Context, Outcome, Result
from worker.errors import ErrorCode

MAX_CHARS: Final = 100_000


class KeyTypeArgs(Args):
    text: Annotated[str, StringConstraints(min_length=1, max_length=MAX_CHARS)]


class KeyTypeResult(Result):
    characters: int


async def key_type(ctx: Context, args: KeyTypeArgs) -> Outcome[KeyTypeResult]:
    desktop = _desktop.of(ctx)

    def job(backend: Backend, guard: Guard) -> int:
        # Run by the backend's guard.check() before every chunk, the first included: keys
        # typed may move the focus, and the rest must not follow it onto the person's
        # terminal.
        guard.before_step = desktop.focus_check(backend, "key_type", guard)
        return backend.type_text(guard, args.text)

    return Outcome(KeyTypeResult(characters=await desktop.act(job, "key_type")))


SPEC: Final = ActionSpec(
    surface=SURFACE,
    name="key_type",
    args=KeyTypeArgs,
    result=KeyTypeResult,
    handler=key_type,
    summary="type Unicode text exactly (newline is Return, tab is Tab), in chunks",
    codes=DESKTOP_CODES | {ErrorCode.PERMISSION_DENIED},
    caps={"characters": MAX_CHARS},
)
