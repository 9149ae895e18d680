"""The kill and lift keys act on the plan the person picked, driven with Pilot against
a real worker in the test process: never on another plan whose id looks alike on
screen (review5's 05), nor on the plan of a call that came while the person picked
(review5's 08)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from textual.widgets import DataTable

import ui.app
import worker.core.console
from tests.ui.rig import MovableClock, Rig, silent, until
from ui.app import WorkerApp
from ui.approval import GRACE_S
from ui.screens import ConfirmLiftScreen
from worker.config import GrantSection


def _killed(rig: Rig, plan: str) -> bool:
    return rig.dispatcher.state.killed(plan) is not None


LOOK_ALIKES = [
    # The same first 200 characters and the same length: the same "(+6 chars)" note.
    pytest.param("x" * 200 + "-decoy", "x" * 200 + "-real!", id="cut-alike"),
    # (A real ESC was shown as the two characters \e, as a backslash and an e are: a
    # plan id with one is refused where it enters now, validation_error.)
]


@pytest.mark.parametrize(("decoy", "real"), LOOK_ALIKES)
def test_the_kill_and_lift_keys_on_a_call_act_on_its_own_plan(
    tmp_path: Path, decoy: str, real: str
) -> None:
    """A hostile server runs a decoy plan first (first in the plans list) and its real
    work under an id that displays alike: k on the real plan's call killed the decoy,
    and l lifted the decoy's kill."""

    async def scenario() -> None:
        rig = Rig(tmp_path, grants=[GrantSection(agent="agent-1", scopes=["workerHost.fs_read"])])
        clock = MovableClock()
        app = WorkerApp(rig.link(), notifier=silent, clock=clock)
        async with app.run_test(size=(120, 30)) as pilot:
            await rig.result(rig.call("fs_read", '{"path": "a.txt"}', plan=decoy))
            work = rig.call("fs_read", '{"path": "a.txt"}', plan=real)
            await rig.result(work)
            await until(lambda: app._selected_call() == work and len(app.plans) == 2, pilot)
            assert app.calls[work]["plan_id"] == app.plans[0]["plan_id"]  # alike on screen
            await pilot.press("k")  # on the real plan's call, the newest
            await until(lambda: _killed(rig, real) or _killed(rig, decoy), pilot)
            assert (_killed(rig, real), _killed(rig, decoy)) == (True, False)
            later = rig.call("fs_read", '{"path": "a.txt"}', plan=real)
            await rig.result(later)
            assert rig.code(later) == "plan_killed"
            rig.dispatcher.kill_plan(decoy, "the server's own kill", "server")
            await until(lambda: [p["state"] for p in app.plans] == ["killed"] * 2, pilot)
            assert app._selected_call() == later
            await pilot.press("l")  # on the real plan's last call
            await until(lambda: isinstance(app.screen, ConfirmLiftScreen), pilot)
            clock.skip(GRACE_S)
            await until(lambda: not app.screen.query_one("#lift").disabled, pilot)
            await pilot.press("y")
            await until(lambda: not _killed(rig, real) or not _killed(rig, decoy), pilot)
            assert (_killed(rig, real), _killed(rig, decoy)) == (False, True)
        rig.close()

    asyncio.run(scenario())


BAD, DECOY = "plan-bad", "plan-decoy"


async def _one_by_one(rig: Rig, *plans: str) -> list[str]:
    """A call of each plan, each answered before the next: drawn in this order (calls
    told together are drawn in the order they last changed)."""
    calls = []
    for plan in plans:
        calls.append(rig.call("fs_read", '{"path": "a.txt"}', plan=plan))
        await rig.result(calls[-1])
    return calls


def _notices(app: WorkerApp) -> str:
    return " ".join(
        toast.render_line(y).text
        for toast in app.screen.query("Toast")
        for y in range(toast.size.height)
    )


@pytest.mark.parametrize("how", ["key", "click"])
def test_moving_the_cursor_stops_following_and_k_kills_the_plan_picked(
    tmp_path: Path, how: str
) -> None:
    """A decoy plan keeps calling: the person picks the bad plan's call and presses k,
    and a decoy call drawn in between took the cursor (following the newest call),
    so k killed the decoy. Picking a row by hand ends following, says so, and the
    notice names the plan killed."""

    async def scenario() -> None:
        rig = Rig(tmp_path, grants=[GrantSection(agent="agent-1", scopes=["workerHost.fs_read"])])
        app = WorkerApp(rig.link(), notifier=silent, clock=MovableClock())
        app.NOTIFICATION_TIMEOUT = 3600  # the notice stays until looked at, however slow
        async with app.run_test(size=(120, 30), notifications=True) as pilot:
            calls = await _one_by_one(rig, DECOY, BAD)
            table = app.query_one("#calls", DataTable)
            await until(lambda: app._selected_call() == calls[1], pilot)  # followed
            if how == "key":
                await pilot.press("up", "down")  # off the bad call and back onto it
            else:
                await pilot.click("#calls", offset=(2, 2))  # its row (the header is row 0)
            await until(lambda: app._selected_call() == calls[1], pilot)
            assert not app.follow
            assert "not following new calls: f follows" in str(app._header.render())
            decoy = rig.call("fs_read", '{"path": "a.txt"}', plan=DECOY)  # it calls on
            await rig.result(decoy)
            await until(lambda: table.row_count == 3, pilot)
            assert app._selected_call() == calls[1]
            await pilot.press("k")
            await until(lambda: _killed(rig, BAD) or _killed(rig, DECOY), pilot)
            assert (_killed(rig, BAD), _killed(rig, DECOY)) == (True, False)
            await until(lambda: "plan plan-bad killed" in _notices(app), pilot)
            await pilot.press("f")  # following again: to the newest call, and the next
            assert app.follow and app._selected_call() == decoy
            later = rig.call("fs_read", '{"path": "a.txt"}', plan=DECOY)
            await rig.result(later)
            await until(lambda: app._selected_call() == later, pilot)
        rig.close()

    asyncio.run(scenario())


def test_the_call_picked_stays_under_the_cursor_as_older_calls_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the calls the TUI keeps, the oldest go: removing a row above the one picked
    left the cursor where it was, on the next call, and the call picked going took
    the cursor to another. It stays, and the cursor on it."""
    monkeypatch.setattr(ui.app, "RECENT_CALLS", 3)

    async def scenario() -> None:
        rig = Rig(tmp_path, grants=[GrantSection(agent="agent-1", scopes=["workerHost.fs_read"])])
        app = WorkerApp(rig.link(), notifier=silent, clock=MovableClock())
        async with app.run_test(size=(120, 30)) as pilot:
            calls = await _one_by_one(rig, BAD, DECOY)
            await until(lambda: app._selected_call() == calls[1], pilot)
            await pilot.press("up")  # the bad plan's call, the oldest
            await until(lambda: app._selected_call() == calls[0], pilot)
            for _ in range(4):  # the decoy calls on, past what is kept
                await rig.result(rig.call("fs_read", '{"path": "a.txt"}', plan=DECOY))
            table = app.query_one("#calls", DataTable)
            await until(lambda: calls[1] not in table.rows and table.row_count == 3, pilot)
            assert app._selected_call() == calls[0] and len(app.calls) == 3
            await pilot.press("k")
            await until(lambda: _killed(rig, BAD) or _killed(rig, DECOY), pilot)
            assert (_killed(rig, BAD), _killed(rig, DECOY)) == (True, False)
        rig.close()

    asyncio.run(scenario())


def test_the_plan_picked_stays_under_the_cursor_as_others_leave_the_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan above the one picked leaving the plans list (the worker lists the most
    recently called) moved the next plan up under the cursor."""
    monkeypatch.setattr(worker.core.console, "RECENT_PLANS", 3)

    async def scenario() -> None:
        rig = Rig(tmp_path, grants=[GrantSection(agent="agent-1", scopes=["workerHost.fs_read"])])
        app = WorkerApp(rig.link(), notifier=silent, clock=MovableClock())
        async with app.run_test(size=(120, 30)) as pilot:
            for plan in (DECOY, BAD, "plan-next"):
                await rig.result(rig.call("fs_read", '{"path": "a.txt"}', plan=plan))
            plans = app.query_one("#plans", DataTable)
            await until(lambda: plans.row_count == 3, pilot)
            while not plans.has_focus:  # to the plans (past the detail pane)
                await pilot.press("tab")
            await pilot.press("down")
            await until(lambda: app._selected_plan() == BAD, pilot)
            await rig.result(rig.call("fs_read", '{"path": "a.txt"}', plan="plan-other"))
            # The decoy, least recently called, leaves the list; the new plan comes last.
            listed = [BAD, "plan-next", "plan-other"]
            await until(lambda: [p["raw"] for p in app.plans] == listed, pilot)
            assert app._selected_plan() == BAD
            await pilot.press("k")
            await until(lambda: any(_killed(rig, plan) for plan in listed), pilot)
            assert [_killed(rig, plan) for plan in listed] == [True, False, False]
        rig.close()

    asyncio.run(scenario())
