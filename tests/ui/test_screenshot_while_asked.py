"""A screenshot waits while the person is asked to approve something (review25,
noticed): the prompt shows another agent's whole ask (an argv with its password, as
the person must see what they approve), maybe on this very desktop, in the TUI's
terminal, and a screenshot taken meanwhile handed it to the agent taking it. Input
actions already waited so; screenshots went on.

A real worker (the rig: dispatcher, broker, console, the TUI driven with Pilot) on a
real desktop (Xvfb with openbox, a Tk window on it)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from textual.pilot import Pilot

from tests.support.desktop import XServer, start_xvfb, tk_app
from tests.ui.rig import MovableClock, Rig, answerable, silent, until
from ui.app import WorkerApp
from worker.actions.computer import Desktop, DesktopSettings, detect
from worker.config import GrantSection
from worker.core.pause import PauseSwitch
from worker.wire.proto import agentworker_pb2 as pb

PNG = b"\x89PNG\r\n\x1a\n"


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


def test_a_screenshot_waits_for_the_persons_answer_to_another_agents_ask(
    tmp_path: Path, xserver: XServer, desktop: Desktop
) -> None:
    looker = GrantSection(agent="looker", scopes=["workerComputer.screenshot"])

    async def scenario(rig: Rig, app: WorkerApp, pilot: Pilot[None]) -> None:
        asked = rig.call("fs_write", '{"path": "notes.txt", "mode": "create"}', agent="writer")
        await answerable(app, pilot)  # the writer's ask is on the screen
        shot = rig.call("screenshot", "{}", agent="looker", surface="workerComputer")
        await until(lambda: desktop.shots_waiting == 1, pilot)
        assert shot not in rig.results, "taken while the prompt showed"
        await pilot.press("d")
        await rig.result(asked)
        assert rig.code(asked) == "scope_denied"
        taken = await rig.result(shot)
        assert taken.status == pb.ActionResult.OK, taken.error.message
        assert taken.blob.startswith(PNG) and desktop.shots_waiting == 0
        # Nobody asked: a screenshot is taken at once.
        again = await rig.result(
            rig.call("screenshot", "{}", agent="looker", surface="workerComputer")
        )
        assert again.status == pb.ActionResult.OK

    async def go() -> None:
        rig = Rig(tmp_path, grants=[looker], desktop=desktop)
        try:
            app = WorkerApp(rig.link(), notifier=silent, clock=MovableClock())
            async with app.run_test(size=(100, 30)) as pilot:
                await scenario(rig, app, pilot)
        finally:
            rig.close()

    with tk_app(xserver):  # a window on the screen
        asyncio.run(go())
