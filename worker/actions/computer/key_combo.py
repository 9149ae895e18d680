"""workerComputer.key_combo: press keys together, hold, release them all.

Names come from the one table in `_keys` (ctrl+shift+left, cmd+a, f5...); an
unknown name answers `unknown_key` with the closest ones. Every key pressed is
released, even when the call fails or is cancelled while it holds them.

Some combinations are the person's, not an agent's: the emergency-stop hotkey (an
injected press trips the worker's own grab like a real one: every plan of every agent
paused, on the record as the person's act; review10 finding 10), and X's session keys
(ctrl+alt+backspace ends the session where zapping is on, ctrl+alt+f1..f12 leaves it
for a text console). Any combo holding all the keys of one answers `validation_error`.
"""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import Field, StringConstraints

from worker.actions.computer import _desktop
from worker.actions.computer._backend import Backend, Guard
from worker.actions.computer._keys import Press, parse_combo
from worker.actions.computer._shared import DESKTOP_CODES, SURFACE, DurationMs, KeyName
from worker.core.registry import ActionSpec, Args, Context, Outcome, Result
from worker.errors import ErrorCode, WorkerError

Combo = Annotated[str, StringConstraints(min_length=1, max_length=200)]


class KeyComboArgs(Args):
    keys: Combo | Annotated[list[KeyName], Field(min_length=1, max_length=8)]
    hold_ms: DurationMs = 0


class KeyComboResult(Result):
    keys: list[str]  # canonical names, in pressing order


# A character that is one of these keys when pressed (an escape typed as "\x1b").
_CHAR_KEYS: Final = {"\x1b": "esc", "\x08": "backspace", "\x7f": "delete", "\t": "tab"}
SESSION_KEYS: Final = ("backspace", *(f"f{n}" for n in range(1, 13)))  # with ctrl+alt


def _names(keys: list[Press]) -> frozenset[str]:
    return frozenset(
        press.key.name if press.key else _CHAR_KEYS.get(press.char, press.char.lower())
        for press in keys
    )


def refuse_reserved(keys: list[Press], stop_hotkey: str) -> None:
    """validation_error if `keys` hold the stop hotkey's keys or a session key's."""
    names = _names(keys)
    try:
        stop = _names(parse_combo(stop_hotkey)) if stop_hotkey else None
    except WorkerError:  # not a combo: the desktop logged that it listens for none
        stop = None
    if stop is not None and stop <= names:
        raise WorkerError(
            "validation_error",
            f"{stop_hotkey} is the person's emergency-stop hotkey, which an agent may not "
            "press; to stop, end the call or the plan",
            {"keys": sorted(names), "reserved": "the emergency-stop hotkey"},
        )
    for key in SESSION_KEYS:
        if {"ctrl", "alt", key} <= names:
            raise WorkerError(
                "validation_error",
                f"ctrl+alt+{key} ends or leaves the person's desktop session (X's zap or console "
                "switch); an agent may not press it",
                {"keys": sorted(names), "reserved": "a session key"},
            )


async def key_combo(ctx: Context, args: KeyComboArgs) -> Outcome[KeyComboResult]:
    keys = parse_combo(args.keys)
    desktop = _desktop.of(ctx)
    refuse_reserved(keys, desktop.settings.stop_hotkey)
    hold_s = args.hold_ms / 1000

    def job(backend: Backend, guard: Guard) -> None:
        desktop.refuse_own_focus(backend, "key_combo")
        backend.combo(guard, keys, hold_s)

    await desktop.act(job, "key_combo")
    return Outcome(KeyComboResult(keys=[k.label for k in keys]))


SPEC: Final = ActionSpec(
    surface=SURFACE,
    name="key_combo",
    args=KeyComboArgs,
    result=KeyComboResult,
    handler=key_combo,
    summary="press keys together (ctrl+shift+left), hold, then release them all",
    codes=DESKTOP_CODES | {ErrorCode.UNKNOWN_KEY, ErrorCode.PERMISSION_DENIED},
)
