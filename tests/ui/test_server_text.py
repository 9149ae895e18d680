"""Every text a server chose reaches the person's terminal inert, on every screen of
the TUI: no ESC sequence (a cleared screen, a moved cursor, a title or clipboard
write) and no bidi override reordering what the person reads. The lift
confirmation drew a killed plan's raw id (review5's 04).

What is checked is what the screen draws: Textual's own export of it, every widget
and notice on it, as the terminal would get it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from textual.widgets import DataTable

from tests.ui.rig import MovableClock, Rig, on_screen, silent, until
from ui.app import WorkerApp
from ui.approval import GRACE_S
from ui.screens import ConfirmLiftScreen, GrantsScreen
from worker.config import GrantSection
from worker.core.console import Event, Subscriber

# ESC sequences (clear the screen, home the cursor, set the title), then a bidi
# override reversing the rest ("ACCEPT" read backwards).
EVIL = "build-7\x1b[2J\x1b[H\x1b]0;owned\x1b\\ok\u202eTPECCA"
# A console's reply shown in a notice.
REPLY = "reply\x1b[31m\u202eNO"
# What must never reach the terminal as is: ESC, CSI as one C1 character, RLO.
RAW = ("\x1b", "\x9b", "\u202e")


def _raw_in(drawn: str) -> list[str]:
    return [hex(ord(c)) for c in RAW if c in drawn]


def test_the_lift_confirmation_shows_a_killed_plans_id_inert(tmp_path: Path) -> None:
    """A server could kill its own plan so that it waits in the plans list for the
    person to lift it. A plan id that is not printable is refused where it enters now,
    so such a kill is one kept from an older worker, which took any plan id."""

    async def scenario() -> None:
        rig = Rig(tmp_path, grants=[GrantSection(agent="agent-1", scopes=["workerHost.fs_read"])])
        refused = rig.call("fs_read", '{"path": "a.txt"}', plan=EVIL)
        await rig.result(refused)
        assert rig.code(refused) == "validation_error"
        assert rig.dispatcher.kill_plan(EVIL, "the server's own kill", "server") == 0
        assert rig.dispatcher.state.killed(EVIL) is None
        rig.dispatcher.state.kill_plan(EVIL, "kept from an older worker", "server")
        clock = MovableClock()
        app = WorkerApp(rig.link(), notifier=silent, clock=clock)
        async with app.run_test(size=(120, 30)) as pilot:
            await until(lambda: app.plans and app.plans[0]["state"] == "killed", pilot)
            plans = app.query_one("#plans", DataTable)
            while not plans.has_focus:  # to the plans (past the detail pane)
                await pilot.press("tab")
            await pilot.press("l")
            await until(lambda: isinstance(app.screen, ConfirmLiftScreen), pilot)
            await pilot.pause()
            drawn = app.export_screenshot()
            assert _raw_in(drawn) == []
            assert "build-7\\e[2J\\e[H\\e]0;owned\\e\\ok\\u202eTPECCA" in drawn
            clock.skip(GRACE_S)
            await until(lambda: not app.screen.query_one("#keep").disabled, pilot)
            await pilot.press("n")
            await until(lambda: not isinstance(app.screen, ConfirmLiftScreen), pilot)
            assert rig.dispatcher.state.killed(EVIL) is not None
        rig.close()

    asyncio.run(scenario())


def _call() -> dict[str, Any]:
    return {
        "id": "c1",
        "started_ms": 1_795_000_000_000,
        "agent_id": EVIL,
        "plan_id": EVIL,
        "plan_raw": EVIL,
        "task_id": EVIL,
        "action": EVIL,
        "status": EVIL,
        "duration_ms": 3,
        "args": EVIL,
        "decision": EVIL,
        "result": "",
        "error": EVIL,
        "blob_bytes": 0,
        "telemetry": {
            "scope": EVIL,
            "bytes_in": 1,
            "bytes_out": 2,
            "truncated": False,
            "sandboxed": False,
            "args_digest": "",
        },
    }


class RawLink:
    """A console that forgot to make its texts inert: every text it tells is raw (the
    worker's console makes them inert; the TUI must not rely on it)."""

    def __init__(self) -> None:
        self.commands: list[dict[str, Any]] = []

    async def open(self, on_event: Subscriber) -> Event:
        return {
            "type": "snapshot",
            "worker": {"worker_id": EVIL, "server": EVIL, "mode": EVIL},
            "link": {"state": "fatal", "detail": EVIL, "retry_at_ms": None},
            "calls": [_call()],
            "plans": [
                {
                    "plan_id": EVIL,
                    "raw": EVIL,
                    "state": "killed",
                    "running": 0,
                    "calls": 1,
                    "reason": EVIL,
                }
            ],
            "grants": [
                {
                    "id": 1,
                    "agent": EVIL,
                    "scope": EVIL,
                    "ask": True,
                    "plan": EVIL,
                    "expires_ms": None,
                    "granted_by": EVIL,
                }
            ],
            "prompts": [
                {
                    "id": "p1",
                    "kind": "out_of_scope",
                    "agent_id": EVIL,
                    "plan_id": EVIL,
                    "scopes": [EVIL],
                    "grants": [EVIL + "2"],
                    "reason": EVIL,
                    "preview": EVIL + "\n" + EVIL,
                    "waiting": 1,
                    "created_ms": 1_795_000_000_000,
                    "deadline_ms": 1_795_000_000_000 + 60_000,
                    "choices": ["once", "plan", "agent", "deny", "deny_kill"],
                }
            ],
            "paused": False,
        }

    async def command(self, command: dict[str, Any]) -> dict[str, Any]:
        self.commands.append(command)
        op = command.get("op")
        if op == "grants":
            return {"ok": True, "grants": (await self.open(lambda _e: None))["grants"]}
        if op == "lift":
            return {"ok": False, "confirm": "c-1", "plan": command["plan"]}
        if op in ("confirm_lift", "decide"):
            return {"ok": False, "message": REPLY}
        return {"ok": True, "stopped": 0}

    async def close(self) -> None:
        return None


def test_every_screen_draws_a_servers_texts_inert(tmp_path: Path) -> None:
    """The prompt, the calls with their detail, the plans, the header, the grants, the
    lift confirmation and the notices, each drawn with a raw hostile text in every
    field the server chooses."""

    async def scenario() -> None:
        link = RawLink()
        clock = MovableClock()
        app = WorkerApp(link, notifier=silent, clock=clock)
        app.NOTIFICATION_TIMEOUT = 3600  # the notices stay until looked at, however slow
        seen: dict[str, str] = {}
        async with app.run_test(size=(160, 48), notifications=True) as pilot:
            await until(lambda: on_screen(app) is not None, pilot)
            seen["prompt"] = app.export_screenshot()
            clock.skip(GRACE_S)
            await until(lambda: on_screen(app) is not None and on_screen(app).armed, pilot)
            await pilot.press("d")  # answered; the console's reply (raw) is a notice
            await until(lambda: on_screen(app) is None and len(app.screen_stack) == 1, pilot)
            await until(lambda: bool(app.screen.query("Toast")), pilot)
            await pilot.pause()
            seen["calls, plans, header, notice"] = app.export_screenshot()
            await pilot.press("g")
            await until(lambda: isinstance(app.screen, GrantsScreen), pilot)
            await until(lambda: app.screen.query_one(DataTable).row_count == 1, pilot)
            await pilot.pause()
            seen["grants"] = app.export_screenshot()
            await pilot.press("escape")
            await until(lambda: len(app.screen_stack) == 1, pilot)
            await pilot.press("l")  # on the call: its plan
            await until(lambda: isinstance(app.screen, ConfirmLiftScreen), pilot)
            await pilot.pause()
            seen["lift"] = app.export_screenshot()
            clock.skip(GRACE_S)
            await until(lambda: not app.screen.query_one("#lift").disabled, pilot)
            app.clear_notifications()
            await until(lambda: not app.screen.query("Toast"), pilot)
            await pilot.press("y")
            await until(lambda: bool(app.screen.query("Toast")), pilot)
            await pilot.pause()
            seen["lift's notice"] = app.export_screenshot()
        assert {"op": "lift", "plan": EVIL} in link.commands  # the raw id, to the worker
        assert {name: _raw_in(drawn) for name, drawn in seen.items()} == {name: [] for name in seen}
        for name, drawn in seen.items():
            assert "build-7\\e[2J" in drawn, name
        for name in ("calls, plans, header, notice", "lift's notice"):
            assert "reply\\e[31m\\u202eNO" in seen[name], name

    asyncio.run(scenario())
