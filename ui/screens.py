"""The grants screen, the confirmation of a lift and the help screen."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, DataTable, Footer, Static

from ui.approval import GRACE_S
from ui.shown import cell_text, plan_shown, server_text, shown

if TYPE_CHECKING:
    from ui.app import WorkerApp


def expiry(expires_ms: int | None, now_s: float) -> str:
    """When a grant ends, as a person reads it: "in 59 min (14:05)", or "never"."""
    if expires_ms is None:
        return "never"
    left = expires_ms / 1000 - now_s
    when = datetime.fromtimestamp(expires_ms / 1000).strftime("%H:%M")
    if left <= 0:
        return "expired"
    if left < 120:
        return f"in {int(left)} s ({when})"
    if left < 2 * 3600:
        return f"in {int(left // 60)} min ({when})"
    if left < 2 * 86400:
        return f"in {int(left // 3600)} h ({when})"
    day = datetime.fromtimestamp(expires_ms / 1000).strftime("%Y-%m-%d %H:%M")
    return f"in {int(left // 86400)} d ({day})"


class GrantsScreen(Screen[None]):
    """Every grant in force, with when it expires; `r` revokes the one selected."""

    DEFAULT_CSS = """
    GrantsScreen #grants-title { height: 1; background: $primary-darken-2; padding: 0 1; }
    GrantsScreen DataTable { height: 1fr; }
    GrantsScreen #grants-note { height: auto; color: $text-muted; padding: 0 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("r,delete", "revoke", "Revoke"),
        Binding("escape,g", "app.pop_screen", "Back"),
    ]

    def compose(self) -> ComposeResult:
        yield Static(Text("Grants in force", style="bold"), id="grants-title")
        yield DataTable(id="grants-table", cursor_type="row", zebra_stripes=True)
        yield Static(
            Text(
                "Grants from config.toml are changed there; the others come from approvals "
                "and `agentworker grant`."
            ),
            id="grants-note",
        )
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for label, key in (
            ("id", "id"),
            ("agent", "agent"),
            ("scope", "scope"),
            ("plan", "plan"),
            ("expires", "expires"),
            ("by", "by"),
        ):
            table.add_column(label, key=key)
        self.show(self.app_state.grants)
        self.run_worker(self.app_state.refresh_grants(), exclusive=True)

    @property
    def app_state(self) -> WorkerApp:
        from ui.app import WorkerApp

        assert isinstance(self.app, WorkerApp)
        return self.app

    def show(self, grants: list[dict[str, Any]]) -> None:
        table = self.query_one(DataTable)
        keep = table.cursor_row
        table.clear()
        now = self.app_state.clock()
        for g in grants:
            key = str(g["id"]) if g.get("id") is not None else f"config-{table.row_count}"
            scope = Text(("ask " if g.get("ask") else "") + shown(g["scope"]))
            table.add_row(
                Text(shown(g["id"]) if g.get("id") is not None else "cfg"),
                cell_text(g["agent"]),
                scope,
                cell_text(g["plan"]),
                Text(expiry(g.get("expires_ms"), now)),
                Text(shown(g["granted_by"])),
                key=key,
            )
        if table.row_count:
            table.move_cursor(row=min(keep, table.row_count - 1))

    async def action_revoke(self) -> None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value or ""
        if not key.isdigit():
            self.notify("a grant from config.toml is changed in that file", severity="warning")
            return
        reply = await self.app_state.link.command({"op": "revoke", "grant_id": int(key)})
        if reply.get("ok"):
            self.notify(f"grant {key} revoked")
        await self.app_state.refresh_grants()


HELP = """\
Keys

  ↑ ↓ / PgUp PgDn    move through the calls (or plans)
  tab                 switch between the calls and the plans
  /                   filter the calls (agent, plan, action, status); esc clears
  f                   follow new calls on / off: the cursor goes to each newest
                      call; moving it (or picking a row) turns following off
  k                   kill the selected plan (the selected call's): its running
                      calls are stopped and every later call refused, until you
                      lift it; the notice names the plan killed
  l                   lift the selected plan's kill (after you confirm it with y;
                      the agent's input waits meanwhile)
  s                   global stop: pause every plan / resume
  g                   grants in force, with expiry; r revokes one
  ?                   this help
  q or ctrl+c         quit (with `agentworker up` or `run`, stops the worker)

In an approval prompt (focus starts on Deny; enter presses the focused button)

  d or esc            deny
  D, then D again     deny this prompt and every other of its agent waiting now
  x                   deny and kill the plan
  o                   allow once: this call only
  p                   allow for this plan (read-only file scopes come together)
  a                   allow for this agent for a period; t changes the period
  (no answer)         denied when the countdown ends

Prompts come oldest first for each agent, and agents take turns: another agent's
prompt waits behind at most one prompt of each other agent waiting.
"""


class ConfirmLiftScreen(ModalScreen[bool]):
    """Lift a plan's kill? Dismissed with True (lift) or False (keep it killed).

    Lifting lets a stopped plan run again, and this screen may be on the desktop the
    agent drives: the worker holds the agent's input while it waits (see
    worker.core.console, CONFIRM_LIFT_S), and like a prompt it takes no key for
    GRACE_S after it comes on, so a key typed before the hold is not the answer.
    Focus starts on "Keep killed"."""

    DEFAULT_CSS = """
    ConfirmLiftScreen { align: center middle; }
    ConfirmLiftScreen #confirm { width: 72; max-width: 100%; height: auto;
        border: thick $warning; background: $surface; padding: 0 1; }
    ConfirmLiftScreen #confirm.fresh { border: thick $accent; }
    ConfirmLiftScreen Horizontal { height: auto; }
    ConfirmLiftScreen Button { margin: 0 1 0 0; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,n", "answer(False)", "Keep killed"),
        Binding("y", "answer(True)", "Lift"),
    ]
    AUTO_FOCUS = "#keep"

    def __init__(self, plan: str, *, clock: Callable[[], float]) -> None:
        super().__init__()
        self.plan = plan  # the plan id whole, as the server sent it: never drawn as is
        self.clock = clock
        self.answers_from = clock() + GRACE_S

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm", classes="fresh"):
            yield Static(Text("Lift the kill?", style="bold"))
            text = Text("Plan ")
            # Whole (wrapped, not cut at the frame): the person reads which plan it is.
            text.append(server_text(plan_shown(self.plan), one_line=False, foreign=True))
            text.append(
                " may run again: its calls will no longer be refused. If you did not "
                "press l, the agent may have typed it: keep the plan killed."
            )
            yield Static(text)
            with Horizontal():
                yield Button("Keep killed (n)", id="keep", variant="primary", disabled=True)
                yield Button("Lift (y)", id="lift", variant="warning", disabled=True)

    def on_mount(self) -> None:
        self.set_timer(GRACE_S, self._arm)

    def _arm(self) -> None:
        if self.clock() < self.answers_from:
            self.set_timer(0.1, self._arm)
            return
        for button in self.query(Button):
            button.disabled = False
        self.query_one("#confirm").set_class(False, "fresh")
        self.set_focus(self.query_one("#keep", Button))

    def action_answer(self, lift: bool) -> None:
        if self.clock() < self.answers_from:
            self.app.bell()
            return
        self.dismiss(lift)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.action_answer(event.button.id == "lift")


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen #help { width: 84; max-width: 100%; height: auto; max-height: 100%;
        border: round $primary; background: $surface; padding: 0 1; overflow-y: auto; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="help"):
            yield Static(Text(HELP))


def now_s() -> float:
    return time.time()
