"""The kill and lift keys act on the plan the person picked, driven with Pilot against
a real worker in the test process: never on another plan whose id looks alike on
screen (review5's 05)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

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
    # A real ESC is shown as the two characters \e: so is a backslash and an e.
    pytest.param("plan\\e", "plan\x1b", id="escape-alike"),
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
