"""The person's view of a running worker: calls as they happen, plans, grants, and
the approval prompts, with the kill switch and the global stop one key away.

The app knows the worker only through a `Link` (worker.console): the local socket,
from the TUI's own process that `agentworker up`/`run` start (ui/child.py) or from
`agentworker ui`; the tests also drive it on a console in their own process.
Events arrive as plain dicts and become Textual messages; every text in them was
made inert by the worker, and it is drawn through ui.shown all the same (inert
again, which changes nothing of an inert text), as plain `Text`, never as markup.
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import sys
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, ClassVar, Final

from rich.table import Table
from rich.text import Text
from textual import events, on, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.driver import Driver
from textual.geometry import Region
from textual.message import Message
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.strip import Strip
from textual.widgets import DataTable, Footer, Input, Static

from ui.approval import Answer, ApprovalModal
from ui.first_steps import lines_to_try
from ui.notify import Notifier, desktop_notifier
from ui.prompt_turns import Turns, agent_of, of_agent
from ui.screens import ConfirmLiftScreen, GrantsScreen, HelpScreen
from ui.shown import cell_text, id_text, plan_shown, server_text, shown
from worker.core.console import RECENT_CALLS, Event, Link
from worker.errors import StartupError

log = logging.getLogger(__name__)

# Wide enough to put the detail pane beside the calls instead of under them.
WIDE_COLUMNS = 120
# The detail pane's label column ("telemetry" is the longest label).
DETAIL_LABEL_WIDTH: Final = 9

LINK_MARKS: Final = {
    "connecting": ("◌ connecting", "yellow"),
    "ready": ("● ready", "green"),
    "backoff": ("↻ backing off", "yellow"),
    "fatal": ("✖ fatal", "red"),
    "stopped": ("■ stopped", "red"),
    "detached": ("✖ worker gone", "red"),
}
STATUS_STYLES: Final = {"running": "yellow", "ok": "green"}
# Calls and plans are drawn at most this often; prompts at once. One redraw of the
# calls table takes about 30 ms on a slow machine: drawn at each call's start and
# end, a busy worker would keep the TUI's process drawing, on a core the worker
# needs, and let the events it has not read pile up on the socket (where past
# console_socket.MAX_BACKLOG the worker drops it).
REDRAW_EVERY_S: Final = 0.25
# While calls keep coming, drawing them takes at most this share of one core: after
# a redraw the next waits until the CPU the last cost (its changes, and drawing the
# calls table, as CallsTable counts it) is this share of the time (at most
# REDRAW_AT_MOST_S). A redraw of the calls table costs 70-100 ms of CPU on a loaded 2-core machine
# (Textual's DataTable renders every visible cell again after any change), and at
# four a second the TUI's process spent 2-4 ms of CPU per granted call back to back
# and 20-27 ms per call 100 ms apart, more than the worker serving them.
REDRAW_SHARE: Final = 0.1
REDRAW_AT_MOST_S: Final = 2.0
# While calls keep coming they are drawn in a pause between them: once nothing has
# changed for this long (the worker tells changes every CHANGES_EVERY_S while there
# are any), or REDRAW_AT_MOST_S after the oldest change not yet drawn. A redraw that
# ran while calls were in flight took CPU from the worker serving them (the two
# share the terminal session's scheduling group), and their slowest (p99) showed it.
QUIET_S: Final = 0.15


class CallsTable(DataTable[Any]):
    """The calls, counting the CPU their drawing takes (see REDRAW_SHARE), and telling
    `picked` when the person moves the cursor or picks a row (a key or a click), even
    where it stays: following the newest call ends there (see WorkerApp._picked)."""

    drawing_cpu = 0.0  # seconds of this process's CPU, all told
    picked: Callable[[], None] = staticmethod(lambda: None)

    def render_lines(self, crop: Region) -> list[Strip]:
        began = time.process_time()
        try:
            return super().render_lines(crop)
        finally:
            self.drawing_cpu += time.process_time() - began

    # Each, as the person's: told before the cursor moves, so a redraw in between
    # cannot take it to the newest call.
    def action_cursor_up(self) -> None:
        self.picked()
        super().action_cursor_up()

    def action_cursor_down(self) -> None:
        self.picked()
        super().action_cursor_down()

    def action_page_up(self) -> None:
        self.picked()
        super().action_page_up()

    def action_page_down(self) -> None:
        self.picked()
        super().action_page_down()

    def action_scroll_top(self) -> None:
        self.picked()
        super().action_scroll_top()

    def action_scroll_bottom(self) -> None:
        self.picked()
        super().action_scroll_bottom()

    def action_scroll_home(self) -> None:
        self.picked()
        super().action_scroll_home()

    def action_scroll_end(self) -> None:
        self.picked()
        super().action_scroll_end()

    def action_select_cursor(self) -> None:
        self.picked()
        super().action_select_cursor()

    async def _on_click(self, event: events.Click) -> None:
        # Textual calls each class's handler in turn (this one first), DataTable's too.
        if event.style.meta.get("row", -1) >= 0:  # a row, not the header
            self.picked()


class QuietFooter(Footer):
    """The key bar, rebuilt only when the keys it shows change. Textual's rebuilds its
    dozen widgets whenever its screen's bindings are told to refresh, which a screen
    is each time another is pushed over it or popped off it: each prompt rebuilt the
    hidden calls screen's footer on its way to the screen, and again as it left."""

    _shown: tuple[Any, ...] | None = None

    def bindings_changed(self, screen: Screen[Any]) -> None:
        if screen is not self.app.screen:
            return  # hidden: looked at again when its screen is on top
        shown = tuple(
            (key, on.binding.action, on.binding.description, on.binding.show, on.enabled)
            for key, on in screen.active_bindings.items()
        )
        if shown != self._shown:
            self._shown = shown
            super().bindings_changed(screen)


class ConsoleEvent(Message):
    """Something the worker told us."""

    def __init__(self, event: Event) -> None:
        super().__init__()
        self.event = event


def _clock_text(unix_ms: int | None) -> str:
    if not unix_ms:
        return ""
    return datetime.fromtimestamp(unix_ms / 1000).strftime("%H:%M:%S")


def _duration(ms: int | None) -> str:
    if ms is None:
        return "…"
    return f"{ms} ms" if ms < 10_000 else f"{ms / 1000:.1f} s"


class WorkerApp(App[None]):
    """See the module summary. `clock` and `notifier` are there for tests.
    `quit_stops_worker`: the TUI of `up` or `run` (ui/child.py), which leaves when
    the worker goes, and on a SIGINT, SIGTERM or hang-up as on the person's q."""

    TITLE = "agentworker"
    CSS = """
    #header { height: 1; background: $primary-darken-2; padding: 0 1; }
    #stopped { height: 1; background: $error; color: $text; padding: 0 1; display: none; }
    #stopped.on { display: block; }
    #filter { display: none; height: 3; }
    #filter.on { display: block; }
    #body { height: 1fr; layout: vertical; }
    #calls { height: 1fr; }
    #side { height: auto; }
    #detail-box { height: 7; border-top: solid $primary-darken-1; }
    #plans { height: 6; border-top: solid $primary-darken-1; }
    .wide #body { layout: horizontal; }
    .wide #calls { width: 3fr; height: 1fr; }
    .wide #side { width: 2fr; height: 1fr; border-left: solid $primary-darken-1; }
    .wide #detail-box { height: 1fr; border-top: none; }
    .wide #plans { height: 12; }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", show=False, priority=True),
        Binding("question_mark", "help", "Help"),
        Binding("slash", "filter", "Filter"),
        Binding("k", "kill", "Kill plan"),
        Binding("l", "lift", "Lift"),
        Binding("s", "stop", "Stop all"),
        Binding("g", "grants", "Grants"),
        Binding("f", "follow", "Follow", show=False),
        Binding("tab", "switch_table", "Calls/plans", show=False),
        Binding("escape", "clear_filter", show=False),
    ]

    def __init__(
        self,
        link: Link,
        *,
        clock: Callable[[], float] = time.time,
        notifier: Notifier | None = None,
        quit_stops_worker: bool = False,
    ) -> None:
        super().__init__()
        self.link = link
        self.clock = clock
        self.notifier = notifier if notifier is not None else desktop_notifier()
        self.quit_stops_worker = quit_stops_worker
        self.worker_info: dict[str, Any] = {}
        self.link_state: dict[str, Any] = {"state": "connecting", "detail": ""}
        self.calls: dict[str, dict[str, Any]] = {}
        self.plans: list[dict[str, Any]] = []
        self.grants: list[dict[str, Any]] = []
        self.prompts: dict[str, dict[str, Any]] = {}  # waiting, in arrival order
        self.paused = False
        # The calls' cursor goes to each newest call until the person moves it (or
        # picks a row): from then on it stays on the call they picked (review5's 08).
        self.follow = True
        self._followed: str | None = None  # the call following last put the cursor on
        self.filter_text = ""
        # The one prompt screen (see ApprovalModal), and whether it is showing.
        self._approval = ApprovalModal({"id": ""}, clock=clock)
        # Which agent's prompt is shown next (ui.prompt_turns).
        self._turns = Turns()
        self._modal: ApprovalModal | None = None
        self._closing = False
        self.failure: StartupError | None = None  # why the app could not start
        # The worker's socket closed without the worker saying it stopped.
        self.worker_gone = False
        # Calls and plans told since the last redraw (see REDRAW_EVERY_S).
        self._changed_calls: dict[str, dict[str, Any]] = {}
        # plan -> its row, or None: no longer listed
        self._changed_plans: dict[str, dict[str, Any] | None] = {}
        self._redraw_due = False
        # The earliest the next redraw may come (monotonic clock), and the calls table's
        # drawing CPU as the last one ended (see REDRAW_SHARE).
        self._next_redraw_at = 0.0
        self._drawn_cpu = 0.0
        # When the last change came, and the oldest not drawn (monotonic; see QUIET_S).
        self._changed_at = self._undrawn_since = 0.0
        self._header: Static | None = None  # once mounted (see _alive)
        # Input counts from this time on (monotonic): once the worker has this UI
        # attached (`_take_input_from_now`).
        self._input_from = math.inf
        self._table: CallsTable | None = None

    def get_driver_class(self) -> type[Driver]:
        driver = super().get_driver_class()
        if sys.platform != "win32":
            from textual.drivers.linux_driver import LinuxDriver

            from ui.terminal import HangupSafeDriver

            if driver is LinuxDriver:  # not one TEXTUAL_DRIVER names
                return HangupSafeDriver
        return driver

    # ------------------------------------------------------------- layout

    @property
    def _main(self) -> Screen[Any]:
        """The screen with the calls (a prompt or the grants may be on top of it)."""
        return self.screen_stack[0]

    def compose(self) -> ComposeResult:
        yield Static(id="header")
        yield Static(id="stopped")
        yield Input(placeholder="filter: agent, plan, action or status (esc clears)", id="filter")
        with Horizontal(id="body"):
            yield CallsTable(id="calls", cursor_type="row", zebra_stripes=True)
            with Vertical(id="side"):
                with VerticalScroll(id="detail-box"):
                    yield Static(id="detail")
                yield DataTable(id="plans", cursor_type="row")
        yield QuietFooter()

    async def on_mount(self) -> None:
        self._header = self._main.query_one("#header", Static)
        calls = self._calls_table()
        calls.picked = self._picked
        for label, key in (
            ("time", "time"),
            ("agent", "agent"),
            ("plan", "plan"),
            ("action", "action"),
            ("status", "status"),
            ("duration", "duration"),
        ):
            calls.add_column(label, key=key)
        plans = self._main.query_one("#plans", DataTable)
        for label, key in (
            ("plan", "plan"),
            ("state", "state"),
            ("running", "running"),
            ("calls", "calls"),
        ):
            plans.add_column(label, key=key)
        self._fit(self.size.width)
        if self.quit_stops_worker and sys.platform != "win32":
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                loop.add_signal_handler(sig, self.exit)
        self.install_screen(self._approval, "approval")
        try:
            snapshot = await self.link.open(self._receive)
        except StartupError as exc:
            self.failure = exc
            self.exit()
            return
        self._take_input_from_now()
        # Compose the prompt screen now, not when the first prompt waits on it.
        await self.push_screen("approval")
        self.pop_screen()
        self._apply_snapshot(snapshot)
        self.set_interval(1.0, self._refresh_header)
        calls.focus()

    def _take_input_from_now(self) -> None:
        """The worker has this UI attached: input counts from now. Keys typed into the
        terminal before (while the TUI started, or before it did: Textual reads what
        waits there) are dropped unread, in the terminal and in Textual's queue
        (`on_event`): until the worker knew this UI, key_type could type into its
        terminal like any other, and those keys would act here ("s" resumed a global
        stop) or wait for a prompt (review26)."""
        discard = getattr(self._driver, "discard_typed_ahead", None)
        if discard is not None:
            discard()
        self._input_from = time.monotonic()  # Textual's event clock (textual._time)

    async def on_event(self, event: events.Event) -> None:
        if self._typed_before_attach(event):
            log.info("input typed before this UI attached dropped: %s", type(event).__name__)
            return
        await super().on_event(event)

    def _typed_before_attach(self, event: events.Event) -> bool:
        if not isinstance(event, (events.Key, events.Paste, events.MouseEvent)):
            return False
        if isinstance(event, events.Key) and event.key == "ctrl+c":
            return False  # it quits: a person may press it while the attach hangs
        return not event.is_forwarded and event.time < self._input_from

    def _receive(self, event: Event) -> None:
        self.post_message(ConsoleEvent(event))

    def on_app_focus(self, _event: events.AppFocus) -> None:
        if self._modal is not None:
            self._modal.focus_came()

    def on_app_blur(self, _event: events.AppBlur) -> None:
        if self._modal is not None:
            self._modal.focus_went()

    def on_resize(self, event: Any) -> None:
        self._fit(event.size.width)

    def _fit(self, width: int) -> None:
        self.set_class(width >= WIDE_COLUMNS, "wide")

    # ------------------------------------------------------------- events

    @on(ConsoleEvent)
    def _on_console_event(self, message: ConsoleEvent) -> None:
        if not self._alive():
            return
        event = message.event
        kind = event.get("type")
        if kind in ("call", "plan", "changes"):
            changed = self._changed_calls
            if kind == "call":
                changed.pop(event["call"]["id"], None)  # last changed, last in line
                changed[event["call"]["id"]] = event["call"]
            elif kind == "plan":
                self._changed_plans[str(event["raw"])] = event["plan"]
            else:  # several at once (console_socket.CHANGES_EVERY_S)
                for call in event["calls"]:
                    changed.pop(call["id"], None)
                    changed[call["id"]] = call
                for plan in event["plans"]:
                    self._changed_plans[str(plan["raw"])] = plan["plan"]
            # Only the newest RECENT_CALLS are ever shown: behind a long prompt the
            # changes waiting to be drawn stay that many, not every call meanwhile.
            while len(changed) > RECENT_CALLS:
                del changed[next(iter(changed))]
            self._changed_at = now = time.monotonic()
            if not self._redraw_due:
                self._redraw_due = True
                self._undrawn_since = now
                self.set_timer(max(REDRAW_EVERY_S, self._next_redraw_at - now), self._redraw)
        elif kind == "prompt":
            self._prompt_waiting(event["prompt"])
        elif kind == "prompt_closed":
            self._prompt_closed(str(event["prompt"]["id"]), event["prompt"])
        elif kind == "draw_check":
            self._confirm_drawn(event.get("seq"))
        elif kind == "link":
            self.link_state = event["link"]
            self._refresh_header()
        elif kind == "grants":
            self.grants = event["grants"]
            self._show_grants()
        elif kind == "paused":
            self.paused = bool(event["paused"])
            self._refresh_header()
        elif kind == "detached":
            stopped = self.link_state.get("state") == "stopped"
            self.link_state = {"state": "detached", "detail": "the worker went away"}
            self._refresh_header()
            if self.quit_stops_worker:  # nothing left to show: the terminal is the shell's
                self.worker_gone = not stopped
                self.exit()
        elif kind == "snapshot":
            self._apply_snapshot(event)

    def _redraw(self) -> None:
        """Draw the calls and plans told since the last redraw, each once. Not while a
        prompt covers them: its own way to the screen, and the worker, need the CPU."""
        if self._modal is not None:
            self.set_timer(REDRAW_EVERY_S, self._redraw)
            return
        now = time.monotonic()
        quiet_for = now - self._changed_at
        if quiet_for < QUIET_S and now - self._undrawn_since < REDRAW_AT_MOST_S:
            self.set_timer(QUIET_S - quiet_for, self._redraw)  # calls still coming
            return
        self._redraw_due = False
        changed, self._changed_calls = self._changed_calls, {}
        plans, self._changed_plans = self._changed_plans, {}
        if not self._alive():
            return
        began = time.process_time()
        table = self._calls_table()
        rows = table.row_count
        if self.follow and self._selected_call() not in (None, self._followed):
            self._picked()  # moved by other means than following, and not yet told
        for call in changed.values():
            self._upsert_call(call)
        if self.follow and table.row_count > rows:  # once: each move redraws the detail
            self._follow_to_newest(table)
        for raw, plan in plans.items():
            self._upsert_plan(raw, plan)
        # What the last redraw cost: this one's changes, and drawing the last one's.
        drawn, self._drawn_cpu = table.drawing_cpu - self._drawn_cpu, table.drawing_cpu
        cost = time.process_time() - began + drawn
        self._next_redraw_at = time.monotonic() + min(REDRAW_AT_MOST_S, cost / REDRAW_SHARE)

    def _apply_snapshot(self, snapshot: Event) -> None:
        # The whole state as of now: what waited to be drawn is older.
        self._changed_calls, self._changed_plans = {}, {}
        self.worker_info = snapshot.get("worker", {})
        self.link_state = snapshot.get("link", self.link_state)
        self.paused = bool(snapshot.get("paused"))
        self.calls = {c["id"]: c for c in snapshot.get("calls", [])}
        self.plans = snapshot.get("plans", [])
        self.grants = snapshot.get("grants", [])
        self._refresh_header()
        self._rebuild_calls()
        self._show_plans()
        for prompt in snapshot.get("prompts", []):
            self._prompt_waiting(prompt)

    # ------------------------------------------------------------- header

    def _alive(self) -> bool:
        """False until the app is mounted and once it is shutting down (its widgets are
        gone). Asked at each event: a query of the screen here took most of the TUI's
        time (3 ms a call)."""
        return not self._closing and self._header is not None and self._header.is_attached

    def _refresh_header(self) -> None:
        if not self._alive():
            return
        info = self.worker_info
        state = str(self.link_state.get("state", "connecting"))
        mark, colour = LINK_MARKS.get(state, (shown(state), "yellow"))
        text = Text()
        text.append("agentworker", style="bold")
        text.append(f"  {mark}", style=f"bold {colour}")
        detail = shown(self.link_state.get("detail") or "")
        retry = self.link_state.get("retry_at_ms")
        if state == "backoff" and retry:
            left = max(0.0, int(retry) / 1000 - self.clock())
            text.append(f" (retry in {left:.0f} s: {detail})", style=colour)
        elif state in ("fatal", "detached") and detail:
            text.append(f": {detail}", style=colour)
        text.append(f"  worker {shown(info.get('worker_id', '?'))}")
        text.append(f"  server {shown(info.get('server', '?'))}")
        text.append(f"  mode {shown(info.get('mode', '?'))}")
        if self.prompts:
            text.append(f"  ⚠ {len(self.prompts)} waiting", style="bold yellow")
        if not self.follow:
            text.append("  not following new calls: f follows", style="bold")
        self._main.query_one("#header", Static).update(text)
        banner = self._main.query_one("#stopped", Static)
        banner.set_class(self.paused, "on")
        if self.paused:
            banner.update(
                Text("GLOBAL STOP: every plan is paused. Press s to resume.", style="bold")
            )

    # ------------------------------------------------------------- calls

    def _matches(self, call: dict[str, Any]) -> bool:
        if not self.filter_text:
            return True
        needle = self.filter_text.lower()
        hay = " ".join(
            str(call.get(k, "")) for k in ("agent_id", "plan_id", "action", "status", "id")
        )
        return needle in hay.lower()

    def _cells(self, call: dict[str, Any]) -> list[Text]:
        status = str(call.get("status", ""))
        return [
            Text(_clock_text(call.get("started_ms"))),
            cell_text(call.get("agent_id", "")),
            cell_text(call.get("plan_id", "")),
            Text(shown(call.get("action", ""))),
            Text(shown(status), style=STATUS_STYLES.get(status, "red")),
            Text(_duration(call.get("duration_ms")), justify="right"),
        ]

    def _calls_table(self) -> CallsTable:
        """The calls (asked at each redraw: not looked up in the screen each time)."""
        if self._table is None:
            self._table = self._main.query_one("#calls", CallsTable)
        return self._table

    def _upsert_call(self, call: dict[str, Any]) -> None:
        self.calls[call["id"]] = call
        table = self._calls_table()
        # The call the person picked stays, and the cursor on it: removing a row above
        # it left the cursor where it was, on the next call (a decoy's, under the
        # person's finger), and the oldest call going took the cursor to another.
        picked = None if self.follow else self._selected_call()
        removed = False
        while len(self.calls) > RECENT_CALLS:  # the worker's console keeps as many
            oldest = next(cid for cid in self.calls if cid != picked)
            del self.calls[oldest]
            if oldest in table.rows:
                table.remove_row(oldest)
                removed = True
        if removed and picked is not None:
            _keep_cursor_on(table, picked)
        if not self._matches(call):
            return
        if call["id"] in table.rows:
            for key, cell in zip(
                ("time", "agent", "plan", "action", "status", "duration"),
                self._cells(call),
                strict=True,
            ):
                table.update_cell(call["id"], key, cell)
        else:
            table.add_row(*self._cells(call), key=call["id"])
        if self._selected_call() == call["id"]:
            self._show_detail(call)

    def _rebuild_calls(self) -> None:
        table = self._calls_table()
        picked = None if self.follow else self._selected_call()
        table.clear()
        for call in self.calls.values():
            if self._matches(call):
                table.add_row(*self._cells(call), key=call["id"])
        if self.follow:
            self._follow_to_newest(table)
        elif picked is not None and picked in table.rows:
            _keep_cursor_on(table, picked)
        selected = self.calls.get(self._selected_call() or "")
        if selected is not None:  # the detail is the cursor's call's, however it got there
            self._show_detail(selected)
        else:
            self._main.query_one("#detail", Static).update(self._no_call_yet())

    def _no_call_yet(self) -> Text:
        """The detail pane before any call: under `up`, the commands its ready line
        suggests (that line went to the terminal this screen now covers)."""
        text = Text("No calls yet.", style="dim")
        steps = [str(step) for step in self.worker_info.get("first_steps", ())]
        if steps and not self.calls:
            # One line for the heading and one per command, so that at 80x24 all of
            # them fit the pane whole (first_steps: a wrapped command copies as two).
            text.append(" Try, in another terminal:", style="dim")
            for line in lines_to_try(steps):
                text.append(f"\n  {shown(line)}")
        return text

    def _selected_call(self) -> str | None:
        return _key_under_cursor(self._calls_table())

    def _follow_to_newest(self, table: DataTable[Any]) -> None:
        if table.row_count:
            table.move_cursor(row=table.row_count - 1)
            self._followed = self._selected_call()

    def _picked(self) -> None:
        """The person moved the calls' cursor or picked a row: following ends, so the
        cursor stays on what they picked and `k` kills its plan, not the plan of a
        call that came meanwhile (review5's 08). `f` follows again."""
        if self.follow:
            self.follow = False
            self._refresh_header()

    @on(DataTable.RowHighlighted, "#calls")
    def _call_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if not self._alive():  # told as the app closes: the detail pane is gone
            return
        key = event.row_key.value
        if self.follow and key != self._followed and key == self._selected_call():
            self._picked()  # moved there by other means than following
        call = self.calls.get(key or "")
        if call is not None:
            self._show_detail(call)

    def _show_detail(self, call: dict[str, Any]) -> None:
        """The selected call's rows. Ids, the action, status and decision keep to one
        line each (cut with an ellipsis, whitespace runs shown counted), and args,
        result and error wrap inside their own column, as in the prompt: a space-padded
        agent or plan id wrapped into lines that passed for rows of its choosing."""
        table = Table.grid(padding=(0, 1), expand=True)
        table.add_column(width=DETAIL_LABEL_WIDTH, no_wrap=True, style="bold")
        table.add_column(ratio=1)
        for label, key in (
            ("call", "id"),
            ("agent", "agent_id"),
            ("plan", "plan_id"),
            ("task", "task_id"),
            ("action", "action"),
            ("status", "status"),
            ("decision", "decision"),
        ):
            value = call.get(key)
            if value:
                ids = ("id", "agent_id", "plan_id", "task_id")
                table.add_row(
                    label, id_text(value) if key in ids else server_text(value, one_line=True)
                )
        table.add_row("duration", Text(_duration(call.get("duration_ms"))))
        table.add_row("args", server_text(call.get("args", ""), one_line=False))
        if call.get("error"):
            table.add_row(
                Text("error", style="bold red"), server_text(call["error"], one_line=False)
            )
        elif call.get("result"):
            table.add_row("result", server_text(call["result"], one_line=False))
            if call.get("blob_bytes"):
                table.add_row("", Text(f"+ {call['blob_bytes']:,} bytes of blob"))
        telemetry = call.get("telemetry")
        if telemetry:
            table.add_row(
                "telemetry",
                Text(
                    f"scope {shown(telemetry['scope'])} · in {telemetry['bytes_in']:,} B · "
                    f"out {telemetry['bytes_out']:,} B"
                    + (" · truncated" if telemetry.get("truncated") else "")
                    + (" · sandboxed" if telemetry.get("sandboxed") else "")
                ),
            )
        self._main.query_one("#detail", Static).update(table)

    # ------------------------------------------------------------- plans and grants

    def _show_plans(self) -> None:
        table = self._main.query_one("#plans", DataTable)
        keep, picked = table.cursor_row, _key_under_cursor(table)
        table.clear()
        for plan in self.plans:
            table.add_row(*_plan_cells(plan), key=str(plan["raw"]))
        if picked is not None and picked in table.rows:
            _keep_cursor_on(table, picked)  # the same plan, wherever its row is now
        elif table.row_count:
            table.move_cursor(row=min(keep, table.row_count - 1))

    def _upsert_plan(self, raw: str, plan: dict[str, Any] | None) -> None:
        """One plan's row changed (the worker tells each change, not the whole list)."""
        table = self._main.query_one("#plans", DataTable)
        at = next((i for i, known in enumerate(self.plans) if known["raw"] == raw), None)
        if plan is None:
            if at is not None:
                del self.plans[at]
                picked = _key_under_cursor(table)
                table.remove_row(raw)
                if picked is not None and picked != raw:
                    # A row above it went: the cursor stays on the plan the person
                    # picked, not on the one that moved up under it.
                    _keep_cursor_on(table, picked)
            return
        if at is None:
            self.plans.append(plan)
            table.add_row(*_plan_cells(plan), key=raw)
            return
        self.plans[at] = plan
        for key, cell in zip(("plan", "state", "running", "calls"), _plan_cells(plan), strict=True):
            table.update_cell(raw, key, cell)

    def _show_grants(self) -> None:
        if isinstance(self.screen, GrantsScreen):
            self.screen.show(self.grants)

    async def refresh_grants(self) -> None:
        reply = await self.link.command({"op": "grants"})
        if reply.get("ok"):
            self.grants = reply["grants"]
            self._show_grants()

    # ------------------------------------------------------------- prompts

    def _prompt_waiting(self, prompt: dict[str, Any]) -> None:
        known = prompt["id"] in self.prompts
        self.prompts[prompt["id"]] = prompt
        self._turns.came(str(prompt["id"]))
        if self._modal is not None and self._modal.prompt_id == prompt["id"]:
            self._modal.update_prompt(prompt, len(self.prompts) - 1, self._also_of_agent(prompt))
        elif self._modal is not None:
            shown_now = self._modal.prompt
            self._modal.update_prompt(
                shown_now, len(self.prompts) - 1, self._also_of_agent(shown_now)
            )
        if not known:
            self.bell()
            self.notifier("agentworker", "An agent is waiting for your approval")
        self._next_prompt()
        self._refresh_header()

    def _prompt_closed(self, prompt_id: str, closed: dict[str, Any]) -> None:
        prompt = self.prompts.pop(prompt_id, None)
        reason = str(closed.get("reason") or "")
        withdrawn = reason.startswith("withdrawn: ")  # answered nowhere: say why it went
        if withdrawn and prompt is not None and prompt.get("kind") == "scope_request":
            agent = prompt.get("agent_id", "")
            self._tell(f"agent {agent}'s scope request went away unanswered ({reason})")
        if self._modal is not None and self._modal.prompt_id == prompt_id:
            modal, self._modal = self._modal, None
            modal.leave(None)
        elif self._modal is not None:
            shown_now = self._modal.prompt
            self._modal.update_prompt(
                shown_now, len(self.prompts) - 1, self._also_of_agent(shown_now)
            )
        self._refresh_header()

    def _next_prompt(self) -> None:
        if self._modal is not None or not self.prompts or not self._alive():
            return
        # Agents take turns (ui.prompt_turns): one agent's many prompts do not stand
        # before another's, and a fresh agent id's before none that came earlier.
        prompt = self._turns.next(self.prompts)
        assert prompt is not None
        modal = self._approval
        modal.load(dict(prompt), len(self.prompts) - 1, self._also_of_agent(prompt))
        self._modal = modal
        prompt_id = str(prompt["id"])
        # Installed, so leaving the stack does not unmount it: the next prompt reuses it.
        agent = agent_of(prompt)
        self.push_screen("approval", lambda answer: self._answered(prompt_id, agent, answer))

    def _also_of_agent(self, prompt: Mapping[str, Any]) -> int:
        """How many other prompts of `prompt`'s agent wait (what `D` denies with it)."""
        return len(of_agent(self.prompts.values(), agent_of(prompt))) - 1

    def _answered(self, prompt_id: str, agent: str, answer: Answer | None) -> None:
        self._modal = None
        self._turns.ended(agent)  # a prompt that came during its turn goes before its next
        if answer is not None:
            prompt = self.prompts.pop(prompt_id, None)
            every = answer.pop("every_of_agent", False)
            self._send_decision(prompt_id, answer)
            if every and prompt is not None:
                others = of_agent(self.prompts.values(), agent_of(prompt))
                for other in others:  # the ones waiting now: a later one is asked
                    self.prompts.pop(other, None)
                    self._send_decision(other, {"choice": "deny"})
                self._tell(
                    f"denied {len(others) + 1} prompt(s) of agent "
                    f"{prompt.get('agent_id') or '(none)'}"
                )
        self.call_later(self._next_prompt)
        self._refresh_header()

    def _confirm_drawn(self, seq: object) -> None:
        """The worker holds the desktop until this screen no longer shows a prompt that
        closed (a screenshot would read it): say so once the screen without it is
        drawn, after the prompt's screen has left the stack."""
        showing = self.screen
        if isinstance(showing, ApprovalModal) and showing.prompt_id not in self.prompts:
            self.call_after_refresh(self._confirm_drawn, seq)  # still leaving
            return
        self.call_after_refresh(self._send_drawn, seq)

    @work(group="commands")
    async def _send_drawn(self, seq: object) -> None:
        """This screen shows what the worker told it up to its ask `seq`."""
        await self.link.command({"op": "drawn", "seq": seq})

    @work(group="commands")
    async def _send_decision(self, prompt_id: str, answer: Answer) -> None:
        reply = await self.link.command({"op": "decide", "prompt_id": prompt_id, **answer})
        if not reply.get("ok"):
            self._tell(reply.get("message", "the answer was not taken"), severity="warning")

    # ------------------------------------------------------------- actions

    def _selected_plan(self) -> str | None:
        plans = self._main.query_one("#plans", DataTable)
        if plans.has_focus and plans.row_count:
            return _key_under_cursor(plans)
        call = self.calls.get(self._selected_call() or "")
        # The call's plan id whole, as the worker keys the plan: never matched by the id
        # shown (cut and escaped, two plans' ids may show alike, and k on one call
        # killed the first plan listed whose id looked the same: review5's 05).
        plan = call.get("plan_raw") if call is not None else None
        return plan if isinstance(plan, str) else None

    def _tell(self, message: object, *, severity: SeverityLevel = "information") -> None:
        """A notice with the worker's words in it: through ui.shown, never as markup."""
        self.notify(shown(message), severity=severity, markup=False)

    async def action_kill(self) -> None:
        plan = self._selected_plan()
        if plan is None:
            self.notify("select a call or a plan to kill", severity="warning")
            return
        reply = await self.link.command({"op": "kill", "plan": plan})
        if reply.get("ok"):
            # Named: the person sees which plan the key killed.
            self._tell(
                f"plan {plan_shown(plan)} killed; {reply.get('stopped', 0)} running call(s) stopped"
            )

    async def action_lift(self) -> None:
        plan = self._selected_plan()
        if plan is None:
            return
        asked = await self.link.command({"op": "lift", "plan": plan})
        confirm = asked.get("confirm")
        if not isinstance(confirm, str):
            self._tell(asked.get("message") or "that plan was not killed")
            return

        async def answered(lift: bool | None) -> None:
            reply = await self.link.command({"op": "confirm_lift", "confirm": confirm, "yes": lift})
            lifted = f"the kill of plan {plan_shown(plan)} lifted"
            self._tell(lifted if reply.get("ok") else reply.get("message", ""))

        self.push_screen(ConfirmLiftScreen(plan, clock=self.clock), answered)

    async def action_stop(self) -> None:
        reply = await self.link.command({"op": "resume" if self.paused else "pause"})
        if reply.get("ok"):
            self.paused = bool(reply.get("paused"))
            self._refresh_header()
        else:
            self._tell(reply.get("message", ""), severity="warning")

    def action_grants(self) -> None:
        if not isinstance(self.screen, GrantsScreen):
            self.push_screen(GrantsScreen())

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_follow(self) -> None:
        self.follow = not self.follow
        if self.follow:
            self._follow_to_newest(self._calls_table())
        self._refresh_header()

    def action_switch_table(self) -> None:
        calls = self._main.query_one("#calls", DataTable)
        plans = self._main.query_one("#plans", DataTable)
        (plans if calls.has_focus else calls).focus()

    def action_filter(self) -> None:
        field = self._main.query_one("#filter", Input)
        field.add_class("on")
        field.focus()

    def action_clear_filter(self) -> None:
        field = self._main.query_one("#filter", Input)
        if field.has_class("on"):
            field.value = ""
            field.remove_class("on")
            self.filter_text = ""
            self._rebuild_calls()
            self._main.query_one("#calls", DataTable).focus()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value.strip()
        self._rebuild_calls()

    @on(Input.Submitted, "#filter")
    def _filter_done(self, _event: Input.Submitted) -> None:
        self._main.query_one("#calls", DataTable).focus()

    async def action_quit(self) -> None:
        self.exit()

    async def _on_exit_app(self) -> None:
        self._closing = True
        await super()._on_exit_app()

    async def on_unmount(self) -> None:
        """The app is closing (the person quit, or the worker stops): let go of the link."""
        self._closing = True
        await self.link.close()


def _plan_cells(plan: dict[str, Any]) -> tuple[Text, Text, Text, Text]:
    state = shown(plan["state"])
    style = {"killed": "bold red", "running": "yellow"}.get(state, "")
    label = (
        f"killed: {shown(plan['reason'])}" if state == "killed" and plan.get("reason") else state
    )
    return (
        cell_text(plan["plan_id"]) if plan["plan_id"] else Text("(none)"),
        Text(label, style=style),
        Text(shown(plan["running"]), justify="right"),
        Text(shown(plan["calls"]), justify="right"),
    )


def _key_under_cursor(table: DataTable[Any]) -> str | None:
    if not table.row_count:
        return None
    return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value


def _keep_cursor_on(table: DataTable[Any], key: str) -> None:
    """The cursor back on `key`'s row, where rows removed above it moved it off."""
    row = table.get_row_index(key)
    if table.cursor_row != row:
        table.move_cursor(row=row)
