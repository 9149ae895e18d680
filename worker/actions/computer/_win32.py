"""Windows, through pynput (SendInput) and mss (GDI)."""

from __future__ import annotations

from worker.actions.computer._pynput import PynputBackend


class Win32Backend(PynputBackend):
    server = "win32"
