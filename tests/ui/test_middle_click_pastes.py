"""A middle click pastes the selection where the pointer is: typing, so it needs the
typing scope (review26). An agent granted only the mouse dragged over text it had put
on screen (a page it opened), then middle-clicked in a terminal: the selection was
typed there, a trailing newline ran it, and key_type's scope was never asked for.

A real worker (the rig: dispatcher, broker, console, the TUI driven with Pilot) on a
real desktop (Xvfb with openbox, the Tk app's text box standing for the terminal)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from textual.pilot import Pilot
from textual.widgets import Static

from tests.support.desktop import TkApp, XServer, tk_app
from tests.ui.rig import MovableClock, Rig, answerable, silent
from ui.app import WorkerApp
from ui.approval import TYPING_MARK
from worker.actions.computer import Desktop
from worker.config import GrantSection
from worker.wire.proto import agentworker_pb2 as pb

TYPIST = GrantSection(agent="typist", scopes=["workerComputer.*"])
MOUSER = GrantSection(agent="mouser", scopes=["workerComputer.mouse_*"])
SELECTED = "echo pasted"


def on_the_tui(
    xserver: XServer,
    desktop: Desktop,
    home: Path,
    scenario: Callable[[Rig, WorkerApp, Pilot[None], TkApp], Awaitable[None]],
) -> None:
    async def go(app_on_screen: TkApp) -> None:
        rig = Rig(home, grants=[TYPIST, MOUSER], desktop=desktop)
        try:
            tui = WorkerApp(rig.link(), notifier=silent, clock=MovableClock())
            async with tui.run_test(size=(120, 40)) as pilot:
                await scenario(rig, tui, pilot, app_on_screen)
        finally:
            rig.close()

    with tk_app(xserver) as app_on_screen:
        asyncio.run(go(app_on_screen))


async def _ok(rig: Rig, cid: str) -> None:
    result = await rig.result(cid)
    assert result.status == pb.ActionResult.OK, result.error.message


async def _seen(app: TkApp, match: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The Tk app's next event that matches, waited for off the loop (the TUI runs on it)."""
    return await asyncio.to_thread(app.wait, match)


def _click(x: int, y: int, button: str) -> str:
    return json.dumps({"x": x, "y": y, "button": button})


def _prompt_text(tui: WorkerApp) -> str:
    facts = tui.screen.query_one("#facts", Static)
    return " ".join(facts.render_line(y).text.strip() for y in range(facts.size.height))


def test_a_middle_click_asks_for_the_typing_scope_and_says_it_pastes(
    xserver: XServer, desktop: Desktop, tmp_path: Path
) -> None:
    async def scenario(rig: Rig, tui: WorkerApp, pilot: Pilot[None], app: TkApp) -> None:
        x, y = app.centre("text")
        # The selection: text put in the box and selected (it owns PRIMARY).
        await _ok(
            rig,
            rig.call("mouse_click", _click(x, y, "left"), agent="typist", surface="workerComputer"),
        )
        await _ok(
            rig,
            rig.call(
                "key_type", json.dumps({"text": SELECTED}), agent="typist", surface="workerComputer"
            ),
        )
        await asyncio.to_thread(app.wait_text, SELECTED)
        await _ok(
            rig,
            rig.call("key_combo", '{"keys": "ctrl+a"}', agent="typist", surface="workerComputer"),
        )
        await _seen(app, lambda e: e["event"] == "selection" and e["value"] == SELECTED)
        # A left click needs no more than the mouse.
        lx, ly = app.centre("left")
        await _ok(
            rig,
            rig.call(
                "mouse_click", _click(lx, ly, "left"), agent="mouser", surface="workerComputer"
            ),
        )
        await _seen(app, lambda e: e["event"] == "click" and e["widget"] == "left")

        # A middle click, and a middle drag, ask for key_type, saying why: denied, nothing pasted.
        drag = json.dumps(
            {"start": {"x": x, "y": y}, "end": {"x": x + 5, "y": y}, "button": "middle"}
        )
        for action, args in (("mouse_click", _click(x, y, "middle")), ("mouse_drag", drag)):
            refused = rig.call(action, args, agent="mouser", surface="workerComputer")
            modal = await answerable(tui, pilot)
            assert modal.prompt["scopes"] == ["workerComputer.key_type"], modal.prompt
            shown = _prompt_text(tui)
            assert f"workerComputer.key_type ({TYPING_MARK})" in shown, shown
            assert "pastes the selection into any window, a terminal too" in shown, shown
            await pilot.press("d")
            denied = await rig.result(refused)
            assert rig.code(refused) == "scope_denied", denied
            assert "pastes the selection" in denied.error.message, denied.error.message

        # Approved once: it pastes (the box holds the selection twice, not three times:
        # the denied ones pasted nothing).
        pasted = rig.call(
            "mouse_click", _click(x, y, "middle"), agent="mouser", surface="workerComputer"
        )
        await answerable(tui, pilot)
        await pilot.press("o")
        await _ok(rig, pasted)
        text = await _seen(app, lambda e: e["event"] == "text" and SELECTED in e["value"])
        assert text["value"].count(SELECTED) == 2, text

    on_the_tui(xserver, desktop, tmp_path, scenario)
