"""What a person sees, compared with committed SVG snapshots at 80x24 and 160x48:
the main screen, the approval prompt and the grants screen.

The far side is a scripted console (fixed times, a fixed clock), so the pictures
do not change from run to run; the behaviour behind them is tested with a real
worker in the other modules. `pytest --snapshot-update` rewrites the snapshots.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Input

from tests.ui.rig import on_screen, silent, until
from ui.app import WorkerApp
from ui.approval import GRACE_S
from worker.core.console import Event, Subscriber

NOW = 1_795_000_000.0  # the fixed clock, in seconds
MS = int(NOW * 1000)
SIZES = [(80, 24), (160, 48)]


def _call(i: int, action: str, status: str, plan: str, ms: int | None) -> dict[str, Any]:
    return {
        "id": f"c{i}",
        "started_ms": MS - (20 - i) * 1000,
        "agent_id": "planner",
        "plan_id": plan,
        "task_id": "t-1",
        "action": f"workerHost.{action}",
        "status": status,
        "duration_ms": ms,
        "args": '{"path": "notes/today.md"}',
        "decision": "approved (ui:plan)" if status != "scope_denied" else "denied",
        "result": '{"size": 2048}' if status == "ok" else "",
        "error": "the person denied workerHost.fs_write" if status == "scope_denied" else "",
        "blob_bytes": 0,
        "telemetry": {
            "scope": f"workerHost.{action}",
            "bytes_in": 30,
            "bytes_out": 120,
            "truncated": False,
            "sandboxed": action == "exec",
            "args_digest": "ab12",
        },
    }


CALLS = [
    _call(1, "fs_list", "ok", "plan-report", 3),
    _call(2, "fs_read", "ok", "plan-report", 2),
    _call(3, "fs_read", "ok", "plan-report", 1),
    _call(4, "exec", "ok", "plan-report", 412),
    _call(5, "fs_write", "scope_denied", "plan-report", 5012),
    _call(6, "http_fetch", "plan_killed", "plan-scrape", 0),
    _call(7, "exec", "running", "plan-build", None),
]
PLANS = [
    {
        "plan_id": "plan-report",
        "raw": "plan-report",
        "state": "idle",
        "running": 0,
        "calls": 5,
        "reason": "",
    },
    {
        "plan_id": "plan-scrape",
        "raw": "plan-scrape",
        "state": "killed",
        "running": 0,
        "calls": 1,
        "reason": "killed from the UI (by ui)",
    },
    {
        "plan_id": "plan-build",
        "raw": "plan-build",
        "state": "running",
        "running": 1,
        "calls": 1,
        "reason": "",
    },
]
GRANTS = [
    {
        "id": None,
        "agent": "tester",
        "scope": "workerHost.fs_stat",
        "plan": "*",
        "expires_ms": None,
        "granted_by": "config",
    },
    {
        "id": 4,
        "agent": "planner",
        "scope": "workerHost.fs_read",
        "plan": "plan-report",
        "expires_ms": None,
        "granted_by": "ui:plan",
    },
    {
        "id": 5,
        "agent": "planner",
        "scope": "workerHost.exec",
        "plan": "*",
        "expires_ms": MS + 3_540_000,
        "granted_by": "ui:agent",
    },
    {
        "id": 6,
        "agent": "planner",
        "scope": "workerHost.exec: `git push`",
        "ask": True,
        "plan": "plan-report",
        "expires_ms": None,
        "granted_by": "ui:plan",
    },
]
PROMPT = {
    "id": "p1",
    "kind": "out_of_scope",
    "agent_id": "planner",
    "plan_id": "plan-report",
    "scopes": ["workerHost.fs_write"],
    "reason": "a call outside the agent's grants",
    # What an agent sent, already inert: it shows as text, it does nothing.
    "preview": (
        "args, as the action takes them:\n{\n"
        '  "path": "report.md\\e[2J\\e[32mAPPROVED\\u202e",\n'
        '  "mode": "create",\n  "make_parents": false\n}\n'
        "path resolves to: /home/ada/.local/share/agentworker/workspace/report.md\\e[2J"
        "\\e[32mAPPROVED\\u202e  (in /home/ada/.local/share/agentworker/workspace, "
        "read-write)\nblob (31 bytes):\n│ # Report\n│ \n│ All tests pass."
    ),
    "waiting": 2,
    "created_ms": MS,
    "deadline_ms": MS + 45_000,
    "grants": ["workerHost.fs_write"],
    "choices": ["once", "plan", "agent", "deny", "deny_kill"],
}


class ScriptedLink:
    """A console that says what the test scripted and takes every command."""

    def __init__(self, prompts: list[dict[str, Any]]) -> None:
        self.prompts = prompts

    async def open(self, on_event: Subscriber) -> Event:
        return {
            "type": "snapshot",
            "worker": {"worker_id": "laptop-3f2a", "server": "127.0.0.1:7421", "mode": "up"},
            "link": {"state": "ready", "detail": "", "retry_at_ms": None},
            "calls": CALLS,
            "plans": PLANS,
            "grants": GRANTS,
            "prompts": self.prompts,
            "paused": False,
        }

    async def command(self, command: dict[str, Any]) -> dict[str, Any]:
        if command.get("op") == "grants":
            return {"ok": True, "grants": GRANTS}
        return {"ok": True}

    async def close(self) -> None:
        return None


@pytest.fixture(autouse=True)
def utc() -> Iterator[None]:
    """Times on screen are local: the snapshots are taken in UTC."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if old is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = old
    time.tzset()


class StoppedClock:
    """NOW, until a test moves it on."""

    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def _app(prompts: list[dict[str, Any]] | None = None) -> WorkerApp:
    return WorkerApp(ScriptedLink(prompts or []), clock=StoppedClock(), notifier=silent)


async def _answerable(pilot: Pilot[Any]) -> None:
    """The prompt as it stands once its grace is over (ui.approval.GRACE_S): the
    clock moved on by it, the countdown reads 44 s."""
    app = pilot.app
    assert isinstance(app, WorkerApp) and isinstance(app.clock, StoppedClock)
    await until(lambda: on_screen(app) is not None, pilot)
    app.clock.now = NOW + GRACE_S
    await until(lambda: on_screen(app).armed, pilot)
    await _steady(pilot)


async def _steady(pilot: Pilot[Any]) -> None:
    for field in pilot.app.query(Input):
        field.cursor_blink = False  # no blinking cursor in a snapshot
    await pilot.pause()


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "160x48"])
def test_main_screen(snap_compare: Any, size: tuple[int, int]) -> None:
    assert snap_compare(_app(), terminal_size=size, run_before=_steady)


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "160x48"])
def test_approval_prompt(snap_compare: Any, size: tuple[int, int]) -> None:
    assert snap_compare(_app([PROMPT]), terminal_size=size, run_before=_answerable)


def test_approval_prompt_of_an_agent_with_more_waiting(snap_compare: Any) -> None:
    """The title counts the agent's other prompts and the key line offers `D`."""
    second = {**PROMPT, "id": "p2", "scopes": ["workerHost.fs_read"], "waiting": 1}
    assert snap_compare(_app([PROMPT, second]), terminal_size=(80, 24), run_before=_answerable)


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "160x48"])
def test_grants_screen(snap_compare: Any, size: tuple[int, int]) -> None:
    assert snap_compare(_app(), terminal_size=size, press=["g"], run_before=_steady)
