"""macOS (Quartz), through pynput and mss. Needs the Accessibility and Screen
Recording permissions for the program that runs the worker."""

from __future__ import annotations

from worker.actions.computer._pynput import PynputBackend


class DarwinBackend(PynputBackend):
    server = "quartz"
