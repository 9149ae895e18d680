"""The names of the computer surface's actions, apart from the surface itself.

`agentworker call screenshot` (a bare name) asks whose action it is; answering
from here loads no action, no pydantic and no desktop library. The surface's
package re-exports the set, and its test holds it to the modules it serves.
"""

from __future__ import annotations

from typing import Final

COMPUTER_ACTIONS: Final = frozenset(
    {
        "screenshot",
        "cursor_position",
        "display_info",
        "window_list",
        "mouse_move",
        "mouse_click",
        "mouse_drag",
        "mouse_scroll",
        "key_type",
        "key_combo",
        "window_focus",
    }
)
