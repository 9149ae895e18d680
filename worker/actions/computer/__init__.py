"""workerComputer: see and drive the desktop (DESIGN.md §4).

One module per action (screenshot, cursor_position, display_info, window_list,
mouse_move, mouse_click, mouse_drag, mouse_scroll, key_type, key_combo,
window_focus), each declaring its SPEC; the private modules hold what they share:
the backend interface and one backend per platform (`_backend`, `_x11`,
`_darwin`, `_win32`), the worker's one `_desktop`, keys, geometry and imaging.

Where there is no desktop (no display, a Wayland session, turned off in config),
`absent` turns the specs into ones that answer `not_supported` with the reason and
the fix whatever the args, and that Hello does not advertise.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from pydantic import ConfigDict

from worker.actions.computer._backend import Availability, detect
from worker.actions.computer._desktop import Desktop, DesktopSettings, build
from worker.actions.computer._shared import SURFACE
from worker.core.registry import Args, Context, Outcome, Registry
from worker.surfaces import COMPUTER_ACTIONS

__all__ = [
    "ACTIONS",
    "SURFACE",
    "Availability",
    "Desktop",
    "DesktopSettings",
    "absent",
    "build",
    "detect",
]

ACTIONS: Final = COMPUTER_ACTIONS  # its names live apart: worker/surfaces.py


class _AnyArgs(Args):
    """What an absent surface accepts: anything, since every call answers `not_supported`."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)


def absent(registry: Registry, availability: Availability) -> Registry:
    """`registry` with the computer actions answering why they cannot run here."""

    def refuse(ctx: Context, args: Args) -> Outcome[Any]:
        raise availability.error()

    return {
        name: (
            dataclasses.replace(spec, args=_AnyArgs, handler=refuse, advertised=False)
            if spec.surface == SURFACE
            else spec
        )
        for name, spec in registry.items()
    }
