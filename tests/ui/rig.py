"""A real worker inside the test process, for driving the TUI with Pilot.

The dispatcher, approval broker, console and the app are the real ones, wired as
`agentworker up` wires them; only the server is missing: calls are handed to the
dispatcher as the connection would, and what the worker sends back is caught here.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from tests.support.policies import PYTHON3, TOUCH_ASKS, write_policy
from worker import app
from worker.actions.computer import Desktop
from worker.config import (
    Config,
    ExecSection,
    GrantSection,
    Paths,
    RootSection,
    UiSection,
    WorkerSection,
)
from worker.core.approvals import ApprovalBroker
from worker.core.console import Console, LocalLink
from worker.core.pipeline import Dispatcher, Outgoing
from worker.wire.framing import worker_message_of
from worker.wire.proto import agentworker_pb2 as pb


def silent(_title: str, _body: str) -> None:
    """No desktop notifications from tests."""


class Rig:
    def __init__(
        self,
        home: Path,
        *,
        timeout_s: float = 60.0,
        grants: list[GrantSection] | None = None,
        ui_in_process: bool = True,
        desktop: Desktop | None = None,
    ) -> None:
        """With `desktop` (on a test's display), the computer actions drive it and it is
        held while the person is asked, as `up` wires it (app.hold_desktop_while_asking)."""
        self.home = home
        self.workspace = home / "workspace"
        self.workspace.mkdir(parents=True, exist_ok=True)
        for name in ("a.txt", "b.txt", "c.txt"):
            (self.workspace / name).write_text(f"{name}\n")
        # A program that resists dying (the kill tests), and one that asks the person.
        policy = write_policy(home, PYTHON3, TOUCH_ASKS)
        self.paths = Paths(config_dir=home, data_dir=home)
        self.config = Config(
            root=[RootSection(path=self.workspace, mode="rw")],
            grant=grants or [],
            worker=WorkerSection(diagnostics=True),
            exec=ExecSection(policy=policy),
            ui=UiSection(prompt_timeout_s=timeout_s),
        )
        self.dispatcher: Dispatcher = app.build_dispatcher(self.paths, self.config, desktop=desktop)
        self.console: Console = app.build_console(
            self.dispatcher,
            self.config,
            server="127.0.0.1:7421",
            mode="up",
            ui_in_process=ui_in_process,
        )
        if desktop is not None:
            app.hold_desktop_while_asking(self.console, desktop)
        self.sent: list[pb.WorkerMessage] = []
        self.results: dict[str, pb.ActionResult] = {}
        self._arrived: dict[str, asyncio.Event] = {}
        self.dispatcher.outbox.attach(self._emit)
        self._count = 0

    def link(self) -> LocalLink:
        return LocalLink(self.console)

    def _emit(self, out: Outgoing) -> None:
        msg = worker_message_of(out) if isinstance(out, bytes) else out
        self.sent.append(msg)
        if msg.WhichOneof("kind") == "result":
            cid = msg.result.correlation_id
            self.results[cid] = msg.result
            self._event(cid).set()

    def _event(self, cid: str) -> asyncio.Event:
        return self._arrived.setdefault(cid, asyncio.Event())

    def call(
        self,
        action: str = "fs_read",
        args: str = '{"path": "a.txt"}',
        *,
        agent: str = "agent-1",
        plan: str = "plan-a",
        surface: str = "workerHost",
        timeout_ms: int = 0,
        blob: bytes = b"",
    ) -> str:
        """Hand one request to the worker, as the connection does; returns its id."""
        self._count += 1
        cid = f"call-{self._count}"
        self._event(cid)
        self.dispatcher.submit(
            pb.ActionRequest(
                correlation_id=cid,
                agent_id=agent,
                plan_id=plan,
                surface=surface,
                action=action,
                args_json=args,
                timeout_ms=timeout_ms,
                blob=blob,
            )
        )
        return cid

    async def result(self, cid: str, timeout_s: float = 30.0) -> pb.ActionResult:
        async with asyncio.timeout(timeout_s):
            await self._event(cid).wait()
        return self.results[cid]

    def code(self, cid: str) -> str:
        result = self.results[cid]
        return "ok" if result.status == pb.ActionResult.OK else result.error.code

    def audits(self) -> list[str]:
        return [m.audit.kind for m in self.sent if m.WhichOneof("kind") == "audit"]

    def close(self) -> None:
        self.dispatcher.close()


async def prompts_waiting(broker: ApprovalBroker, count: int, within_s: float = 20.0) -> None:
    """Wait until `count` prompts wait in `broker`, woken by the broker's own news."""
    changed = asyncio.Event()

    def told(_kind: str, _body: dict[str, Any]) -> None:
        changed.set()

    broker.listeners.append(told)
    try:
        async with asyncio.timeout(within_s):
            while len(broker.pending()) < count:
                changed.clear()
                await changed.wait()
    finally:
        broker.listeners.remove(told)


class MovableClock:
    """A clock that stands still until the test moves it: give it to WorkerApp, and a
    prompt's grace (ui.approval.GRACE_S) ends when the test says, however slow the
    machine (on the wall clock a loaded machine let it pass before a key came)."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def skip(self, seconds: float) -> None:
        self.now += seconds


async def answerable(app: Any, pilot: Any) -> Any:
    """The approval modal on screen once it takes answers (its grace over: skipped
    on a MovableClock, waited for on any other)."""
    from ui.approval import GRACE_S

    await until(lambda: on_screen(app) is not None, pilot)
    modal = app.screen
    if isinstance(app.clock, MovableClock):
        app.clock.skip(GRACE_S)
    await until(lambda: app.screen is modal and modal.armed, pilot)
    return modal


def on_screen(app: Any) -> Any:
    """The approval modal once its prompt has been painted (None before): the modal is
    reused, and until then it may still be leaving with the last prompt."""
    from ui.approval import ApprovalModal

    screen = app.screen
    return screen if isinstance(screen, ApprovalModal) and screen.painted_at else None


async def until(condition: Any, pilot: Any, within_s: float = 20.0) -> None:
    """Let the app work until `condition()` holds, checking it after each of its turns."""
    async with asyncio.timeout(within_s):
        while not condition():
            await pilot.pause(0.01)
