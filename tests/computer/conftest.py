"""One Xvfb with openbox for the whole session; a fresh Tk app and desktop per test."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.support.desktop import Computer, TkApp, XServer, start_xvfb, tk_app
from worker.actions.computer import Desktop, DesktopSettings, detect
from worker.core.pause import PauseSwitch

T = TypeVar("T")


@pytest.fixture(scope="session")
def xserver() -> Iterator[XServer]:
    with start_xvfb(1600, 900) as server:
        yield server


@pytest.fixture
def app(xserver: XServer) -> Iterator[TkApp]:
    with tk_app(xserver) as running:
        yield running


@pytest.fixture
def pause(tmp_path: Path) -> PauseSwitch:
    return PauseSwitch(tmp_path / "pause.json")


@pytest.fixture
def desktop(
    xserver: XServer, pause: PauseSwitch, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Desktop]:
    """The worker's desktop, in this process, on the session's display."""
    for name, value in xserver.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.delenv("XDG_SESSION_TYPE", raising=False)
    held = Desktop(detect(), pause, DesktopSettings(stop_hotkey="", takeover=False))
    try:
        yield held
    finally:
        held.close()


@pytest.fixture
def computer(desktop: Desktop, tmp_path: Path) -> Iterator[Computer]:
    with Computer.on(desktop, tmp_path) as handlers:
        yield handlers


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)
