"""A desktop for the TUI tests that drive one: Xvfb with openbox, one per module, and
the worker's Desktop on it per test (no stop hotkey, no takeover watch)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.desktop import XServer, start_xvfb
from worker.actions.computer import Desktop, DesktopSettings, detect
from worker.core.pause import PauseSwitch


@pytest.fixture(scope="module")
def xserver() -> Iterator[XServer]:
    with start_xvfb(800, 600) as server:
        yield server


@pytest.fixture
def desktop(xserver: XServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Desktop]:
    for name, value in xserver.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.delenv("XDG_SESSION_TYPE", raising=False)
    settings = DesktopSettings(stop_hotkey="", takeover=False)
    held = Desktop(detect(), PauseSwitch(tmp_path / "pause.json"), settings)
    try:
        yield held
    finally:
        held.close()
