"""Pointer paths and held modifiers, shared by the mouse actions."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Final

from worker.actions.computer._keys import Press, lookup
from worker.errors import WorkerError

STEP_S: Final = 0.01  # one pointer step per 10 ms of a paced move or drag
DRAG_STEPS: Final = 10  # an unpaced drag still passes through points, as a hand would


def line(corners: Sequence[tuple[int, int]], steps: int) -> list[tuple[int, int]]:
    """Points along the polyline through `corners`, about `steps` of them in all."""
    if len(corners) < 2:
        return list(corners)
    per_leg = max(1, steps // (len(corners) - 1))
    path = [corners[0]]
    for (x0, y0), (x1, y1) in itertools.pairwise(corners):
        for i in range(1, per_leg + 1):
            path.append((round(x0 + (x1 - x0) * i / per_leg), round(y0 + (y1 - y0) * i / per_leg)))
    return path


def modifiers(names: Sequence[str]) -> list[Press]:
    presses = [lookup(name) for name in names]
    for press in presses:
        if press.key is None or not press.key.modifier:
            raise WorkerError(
                "unknown_key",
                f"{press.label!r} is not a modifier; hold ctrl, alt, shift or super "
                "(use key_combo for other keys)",
                {"key": press.label, "close_matches": ["ctrl", "alt", "shift", "super"]},
            )
    return presses
