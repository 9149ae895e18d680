"""The computer actions' args models, in one namespace for the tests."""

from worker.actions.computer._shared import Point, RegionArg
from worker.actions.computer.cursor_position import CursorPositionArgs
from worker.actions.computer.display_info import DisplayInfoArgs
from worker.actions.computer.key_combo import KeyComboArgs
from worker.actions.computer.key_type import KeyTypeArgs
from worker.actions.computer.mouse_click import MouseClickArgs
from worker.actions.computer.mouse_drag import MouseDragArgs
from worker.actions.computer.mouse_move import MouseMoveArgs
from worker.actions.computer.mouse_scroll import MouseScrollArgs
from worker.actions.computer.screenshot import ScreenshotArgs
from worker.actions.computer.window_focus import WindowFocusArgs
from worker.actions.computer.window_list import WindowListArgs

__all__ = [
    "CursorPositionArgs",
    "DisplayInfoArgs",
    "KeyComboArgs",
    "KeyTypeArgs",
    "MouseClickArgs",
    "MouseDragArgs",
    "MouseMoveArgs",
    "MouseScrollArgs",
    "Point",
    "RegionArg",
    "ScreenshotArgs",
    "WindowFocusArgs",
    "WindowListArgs",
]
