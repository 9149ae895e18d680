"""Pieces the workerComputer models share: points, regions, windows, and the codes
most computer actions may answer.

Coordinates are physical desktop pixels, or — with `screenshot_id` — pixels of
that screenshot, mapped back through its origin and scale.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import Field, StringConstraints

from worker.core.registry import Args, Result
from worker.errors import ErrorCode

SURFACE: Final = "workerComputer"

Coord = Annotated[int, Field(ge=-1_000_000, le=1_000_000)]
ShotId = Annotated[str, StringConstraints(min_length=1, max_length=64)]
KeyName = Annotated[str, StringConstraints(min_length=1, max_length=32)]
Modifiers = Annotated[list[KeyName], Field(max_length=8)]
ButtonName = Literal["left", "right", "middle"]
DurationMs = Annotated[int, Field(ge=0, le=60_000)]

# The middle button pastes the primary selection where the pointer is (X11, and most
# terminals elsewhere): text the agent selected (a drag over a page it opened) typed into
# a terminal, where a newline in it runs the line. That is typing, so a middle click or
# drag needs the typing scope too (review26), and its prompt says why.
TYPING_SCOPE: Final = f"{SURFACE}.key_type"
PASTES: Final = (
    "the middle button pastes the selection into any window, a terminal too, as typing "
    f"does: it needs {TYPING_SCOPE} as well"
)


def pastes(button: ButtonName) -> dict[str, str]:
    """The scopes a click or drag with `button` needs beyond its own (ActionSpec.also_needs)."""
    return {TYPING_SCOPE: PASTES} if button == "middle" else {}


# Every computer action: no desktop here (or it is turned off).
DESKTOP_CODES: Final = frozenset({ErrorCode.NOT_SUPPORTED})
# Actions that take coordinates: a point on no monitor, or a stale screenshot_id.
POINTER_CODES: Final = DESKTOP_CODES | {ErrorCode.OUT_OF_BOUNDS, ErrorCode.UNKNOWN_KEY}


class Point(Args):
    x: Coord
    y: Coord


class RegionArg(Args):
    x: Coord
    y: Coord
    width: Annotated[int, Field(gt=0, le=100_000)]
    height: Annotated[int, Field(gt=0, le=100_000)]


class PointResult(Result):
    x: int
    y: int


class RectResult(Result):
    x: int
    y: int
    width: int
    height: int


class InputResult(Result):
    """Where the pointer is after a mouse action (physical)."""

    x: int
    y: int


class WindowResult(Result):
    id: int
    title: str
    app: str
    pid: int | None
    x: int
    y: int
    width: int
    height: int
    focused: bool
    monitor: int | None
