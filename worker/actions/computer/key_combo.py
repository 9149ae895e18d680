"""workerComputer.key_combo: press keys together, hold, release them all.

Names come from the one table in `_keys` (ctrl+shift+left, cmd+a, f5...); an
unknown name answers `unknown_key` with the closest ones. Every key pressed is
released, even when the call fails or is cancelled while it holds them.
"""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import Field, StringConstraints

from worker.actions.computer import _desktop
from worker.actions.computer._keys import parse_combo
from worker.actions.computer._shared import DESKTOP_CODES, SURFACE, DurationMs, KeyName
from worker.core.registry import ActionSpec, Args, Context, Outcome, Result
from worker.errors import ErrorCode

Combo = Annotated[str, StringConstraints(min_length=1, max_length=200)]


class KeyComboArgs(Args):
    keys: Combo | Annotated[list[KeyName], Field(min_length=1, max_length=8)]
    hold_ms: DurationMs = 0


class KeyComboResult(Result):
    keys: list[str]  # canonical names, in pressing order


async def key_combo(ctx: Context, args: KeyComboArgs) -> Outcome[KeyComboResult]:
    keys = parse_combo(args.keys)
    hold_s = args.hold_ms / 1000
    await _desktop.of(ctx).act(lambda backend, guard: backend.combo(guard, keys, hold_s))
    return Outcome(KeyComboResult(keys=[k.label for k in keys]))


SPEC: Final = ActionSpec(
    surface=SURFACE,
    name="key_combo",
    args=KeyComboArgs,
    result=KeyComboResult,
    handler=key_combo,
    summary="press keys together (ctrl+shift+left), hold, then release them all",
    codes=DESKTOP_CODES | {ErrorCode.UNKNOWN_KEY},
)
