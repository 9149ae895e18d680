"""A screenshot waits while the person is asked to approve something (review25,
noticed): the prompt shows another agent's whole ask (an argv with its password, as
the person must see what they approve), maybe on this very desktop, in the TUI's
terminal, and a screenshot taken meanwhile handed it to the agent taking it. Input
actions already waited so; screenshots went on.

A real worker (the rig: dispatcher, broker, console, the TUI driven with Pilot) on a
real desktop (Xvfb with openbox, a Tk window on it)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot

from tests.support.desktop import XServer, tk_app
from tests.ui.rig import MovableClock, Rig, answerable, silent, until
from ui.app import WorkerApp
from worker.actions.computer import Desktop
from worker.config import GrantSection
from worker.core import console as console_module
from worker.wire.proto import agentworker_pb2 as pb

PNG = b"\x89PNG\r\n\x1a\n"


LOOKER = GrantSection(agent="looker", scopes=["workerComputer.screenshot"])


def on_the_tui(
    tmp_path: Path,
    xserver: XServer,
    desktop: Desktop,
    scenario: Callable[[Rig, WorkerApp, Pilot[None]], Awaitable[None]],
) -> None:
    """`scenario` with the rig's worker on `desktop` (agent looker granted screenshots),
    its TUI driven by Pilot, a Tk window on the screen."""

    async def go() -> None:
        rig = Rig(tmp_path, grants=[LOOKER], desktop=desktop)
        try:
            app = WorkerApp(rig.link(), notifier=silent, clock=MovableClock())
            async with app.run_test(size=(100, 30)) as pilot:
                await scenario(rig, app, pilot)
        finally:
            rig.close()

    with tk_app(xserver):
        asyncio.run(go())


def test_a_screenshot_waits_for_the_persons_answer_to_another_agents_ask(
    tmp_path: Path, xserver: XServer, desktop: Desktop
) -> None:
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

    on_the_tui(tmp_path, xserver, desktop, scenario)


def test_a_screenshot_held_by_a_prompt_waits_until_the_ui_has_drawn_it_away(
    tmp_path: Path, xserver: XServer, desktop: Desktop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review26 H9: the hold was let go as the answer came, before the UI (another
    process, then the terminal) had drawn the prompt away, and a screenshot waiting for
    it showed the prompt (4 in 10 runs with a real terminal). The worker now asks each
    attached UI to say once its screen is drawn without it; the screenshot waits for
    that, or for DRAWN_WITHIN_S from a UI that never says."""
    may_say: asyncio.Event | None = None
    real_send = WorkerApp._send_drawn

    def say_when_let(app: WorkerApp, seq: object) -> None:
        async def later() -> None:
            assert may_say is not None
            await may_say.wait()
            real_send(app, seq)

        asyncio.get_running_loop().create_task(later())

    monkeypatch.setattr(WorkerApp, "_send_drawn", say_when_let)

    async def scenario(rig: Rig, app: WorkerApp, pilot: Pilot[None]) -> None:
        nonlocal may_say
        may_say = asyncio.Event()
        asked = rig.call("fs_write", '{"path": "notes.txt", "mode": "create"}', agent="writer")
        await answerable(app, pilot)
        shot = rig.call("screenshot", "{}", agent="looker", surface="workerComputer")
        await until(lambda: desktop.shots_waiting == 1, pilot)
        await pilot.press("d")
        await rig.result(asked)
        assert rig.code(asked) == "scope_denied"
        assert desktop.held(), "let go before the UI drew the prompt away"
        assert shot not in rig.results and desktop.shots_waiting == 1
        may_say.set()
        taken = await rig.result(shot)
        assert taken.status == pb.ActionResult.OK, taken.error.message
        assert not desktop.held()

    on_the_tui(tmp_path, xserver, desktop, scenario)


def test_a_ui_that_never_says_its_screen_is_drawn_holds_screenshots_a_bounded_time(
    tmp_path: Path, xserver: XServer, desktop: Desktop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older UI, or a hung one, never says: the desktop is let go DRAWN_WITHIN_S
    after the prompt closed, not held for good."""
    monkeypatch.setattr(WorkerApp, "_send_drawn", lambda _app, _seq: None)
    monkeypatch.setattr(console_module, "DRAWN_WITHIN_S", 0.05)

    async def scenario(rig: Rig, app: WorkerApp, pilot: Pilot[None]) -> None:
        asked = rig.call("fs_write", '{"path": "notes.txt", "mode": "create"}', agent="writer")
        await answerable(app, pilot)
        shot = rig.call("screenshot", "{}", agent="looker", surface="workerComputer")
        await until(lambda: desktop.shots_waiting == 1, pilot)
        await pilot.press("d")
        taken = await rig.result(shot)
        assert taken.status == pb.ActionResult.OK, taken.error.message
        assert rig.code(asked) == "scope_denied" and not desktop.held()

    on_the_tui(tmp_path, xserver, desktop, scenario)
