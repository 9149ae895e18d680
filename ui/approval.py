"""The approval prompt: one modal per waiting question, focus starting on Deny.

Everything shown came through the console already inert (worker.approvals.inert),
and goes on screen through ui.shown all the same, as plain `Text`, never parsed as
markup: nothing an agent sends can draw on, recolour or spoof the prompt. A call
is shown whole (its args as the action takes them, paths resolved, the blob's
start) in a box that scrolls (arrow and page keys), never cut or masked: the
person approves what they can read.
A countdown shows when the worker denies on its own; pressing nothing is a denial too.

When a prompt comes on screen (the first, or the next one after the last ended by
its deadline or the server's Cancel), no answer is taken for `GRACE_S`: the buttons
are disabled, the frame changes colour and the line under the call says so, so a key
pressed for the prompt that was there is not taken as the answer to one never read.
The grace is measured on the app's clock (tests move it), and focus then starts on
Deny.
"""

from __future__ import annotations

import fnmatch
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Final

from rich.table import Table
from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.errors import NoWidget
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from ui.shown import id_text, server_text, shown
from worker.core.approvals import READ_ONLY_HOST

log = logging.getLogger(__name__)

# The periods "for this agent" offers, cycled with the period key.
PERIODS: tuple[tuple[str, float], ...] = (
    ("15 min", 900.0),
    ("1 h", 3600.0),
    ("8 h", 8 * 3600.0),
    ("24 h", 24 * 3600.0),
)
DEFAULT_PERIOD = 1

# The facts' label column ("Plan/agent" is the longest label).
LABEL_WIDTH: Final = 10

# After a prompt comes on screen, keys and clicks are not answers for this long.
GRACE_S: Final = 1.0
# While the grace lasts, how often the screen checks whether it has ended.
_GRACE_CHECK_S: Final = 0.1

KIND_TITLES: Final = {
    "scope_request": "The agent asks for scopes",
    "out_of_scope": "A call outside the agent's grants",
    "ask_rule": "A command that needs your approval",
}

# A decision as the console takes it: {"choice": ..., "period_s": ...}
Answer = dict[str, Any]

# The answers that grant or run something: taken only while the prompt shows every
# scope it grants (`_all_shown`); a denial is taken whatever shows.
APPROVALS: Final = frozenset({"once", "plan", "agent"})


def _breadth(scope: str) -> int:
    """0 a pattern over surfaces (`*.*`), 1 a pattern over actions, 2 one action with
    effects, 3 one read-only action: the prompt lists scopes in this order."""
    surface, _, action = scope.partition(".")
    if set("*?") & set(surface):
        return 0
    if set("*?") & set(action):
        return 1
    return 3 if scope in READ_ONLY_HOST else 2


_MARKS: Final = ("a pattern: actions of many surfaces", "a pattern: many actions")
# Keys typed where the focus is reach a terminal as well as an editor: a grant of these
# lets the agent run what a person could type there, past the exec allowlist and every
# host scope (only this worker's own UI is kept from them). The prompt says so.
TYPING: Final = ("workerComputer.key_type", "workerComputer.key_combo")
TYPING_MARK: Final = "types into any window, a terminal too"


def _types(scope: str) -> bool:
    return scope != "*.*" and any(fnmatch.fnmatchcase(action, scope) for action in TYPING)


def scopes_text(scopes: Sequence[str]) -> Text:
    """Every scope a choice grants, each once, the broadest first (patterns marked, `*.*`
    as EVERY action), wrapped over as many lines as it takes and never cut: the list
    is what the person signs (review10 02: five read-only scopes filled the one line
    the row had, and the `*.*` after them was cut off the screen)."""
    text = Text(overflow="fold")
    for n, scope in enumerate(sorted(dict.fromkeys(scopes), key=_breadth)):
        if n:
            text.append(", ")
        breadth = _breadth(scope)
        text.append_text(server_text(scope, one_line=False))
        if breadth < 2:
            mark = "EVERY action" if scope == "*.*" else _MARKS[breadth]
            text.append(f" ({mark})", style="bold reverse")
        if _types(scope):
            text.append(f" ({TYPING_MARK})", style="bold reverse")
    return text


def _counted(scopes: Sequence[str]) -> str:
    count = len(dict.fromkeys(scopes))
    broad = sum(_breadth(s) < 2 for s in dict.fromkeys(scopes))
    counted = f"{count} scope{'s' if count != 1 else ''}"
    if broad:
        counted += f", {broad} of them {'patterns' if broad > 1 else 'a pattern'}"
    return counted


def _waiting(prompt: dict[str, Any]) -> int:
    """How many identical calls wait on `prompt`, as its "Calls" row shows."""
    return max(1, int(prompt.get("waiting", 1)))


class ApprovalModal(ModalScreen[Answer | None]):
    """Dismissed with the person's answer, or None when the prompt went away.

    One instance serves every prompt (`load` before each showing): it is composed
    once, so a prompt reaches the screen without building its widgets again.
    """

    DEFAULT_CSS = """
    ApprovalModal { align: center middle; background: $background; }
    ApprovalModal #dialog {
        width: 96; max-width: 100%; height: 100%;
        border: thick $warning; background: $surface; padding: 0 1;
    }
    ApprovalModal #dialog.fresh { border: thick $accent; }
    ApprovalModal #title { text-style: bold; color: $warning; }
    ApprovalModal #facts { height: auto; }
    ApprovalModal #preview-box {
        height: 1fr; min-height: 3; border: round $primary-darken-1; margin: 0 0;
    }
    ApprovalModal #countdown { color: $text-muted; }
    ApprovalModal #buttons { height: auto; margin-top: 0; }
    ApprovalModal Button { min-width: 0; width: auto; margin: 0 1 0 0; height: 3; }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,d", "choose('deny')", "Deny"),
        Binding("D", "deny_agent", "Deny every prompt of this agent"),
        Binding("x", "choose('deny_kill')", "Deny + kill plan"),
        Binding("o", "choose('once')", "Once"),
        Binding("p", "choose('plan')", "This plan"),
        Binding("a", "choose('agent')", "Agent"),
        Binding("t", "next_period", "Period"),
        Binding("left", "app.focus_previous", show=False),
        Binding("right", "app.focus_next", show=False),
        # The call's box scrolls while the focus stays on the buttons.
        Binding("up", "scroll('scroll_up')", show=False),
        Binding("down", "scroll('scroll_down')", show=False),
        Binding("pageup", "scroll('scroll_page_up')", show=False),
        Binding("pagedown", "scroll('scroll_page_down')", show=False),
        Binding("home", "scroll('scroll_home')", show=False),
        Binding("end", "scroll('scroll_end')", show=False),
    ]
    AUTO_FOCUS = "#deny"

    def __init__(
        self, prompt: dict[str, Any], *, more: int = 0, clock: Callable[[], float]
    ) -> None:
        super().__init__()
        self.prompt = prompt
        self.more = more
        self.also_of_agent = 0  # other prompts of this agent waiting (`D` denies them too)
        self.confirming = False  # `D` pressed once: pressed again, it denies them all
        self.clock = clock
        self.period = DEFAULT_PERIOD
        self.painted_at: float | None = None
        self.answers_from = math.inf  # the clock's time from which keys are answers
        self.armed = False  # the grace is over: the buttons take answers
        self._css_seen: int | None = None  # the app's CSS as this screen last came on
        self._arming = False  # a timer runs `_arm`
        self._due = False  # `_arm`'s last check found the grace over
        self._cut = False  # an approval was refused: the terminal cut the prompt

    @property
    def prompt_id(self) -> str:
        return str(self.prompt["id"])

    def load(self, prompt: dict[str, Any], more: int, also_of_agent: int = 0) -> None:
        """Show `prompt` next (its content goes in once, as the screen comes on), with
        the default period, focus back on Deny."""
        self.prompt, self.more, self.also_of_agent = prompt, more, also_of_agent
        self.confirming = False
        self.period = DEFAULT_PERIOD
        self.painted_at = None

    def _fill(self) -> None:
        self.query_one("#title", Static).update(self._title())
        self.query_one("#facts", Static).update(self._facts())
        self.query_one("#preview", Static).update(self._preview())
        self.query_one("#preview-box", VerticalScroll).scroll_home(animate=False)
        self.query_one("#countdown", Static).update(self._countdown())
        self.query_one("#once", Button).display = "once" in self.prompt.get("choices", ())
        self.query_one("#agent", Button).label = self._agent_label()
        self._hold()

    def _hold(self) -> None:
        """A prompt just came on screen (or the terminal the focus): no answers for
        GRACE_S, and it shows."""
        self.answers_from = self.clock() + GRACE_S
        self.armed = False
        self._due = False
        self._cut = False
        self._held_look()
        self.query_one("#countdown", Static).update(self._countdown())
        if not self._arming:
            self._arming = True
            self.set_timer(_GRACE_CHECK_S, self._arm)

    def focus_came(self) -> None:
        """The terminal got the desktop's focus back (Textual's AppFocus, from the
        terminal's focus reporting): the grace starts again, as for a new prompt. The
        focus may have been moved here by an agent (window_focus, a click) while the
        person typed elsewhere, and their next keys are not meant for this prompt
        (review10 finding 14)."""
        if self.is_current and self.prompt.get("id"):
            log.info("prompt %s: the terminal got the focus; answers wait again", self.prompt_id)
            self._hold()

    def focus_went(self) -> None:
        """The terminal lost the desktop's focus (AppBlur): no answers until it is back
        and the grace after that (`focus_came`) is over."""
        if self.is_current and self.prompt.get("id"):
            self._hold()
            self.answers_from = math.inf

    def on_key(self, event: events.Key) -> None:
        """A key in the grace answers nothing (`action_choose` logs it) and starts the
        grace again: a prompt takes answers only once the keyboard has been quiet for
        GRACE_S, so a person typing on into a terminal the focus was moved to answers
        nothing (review10 finding 14)."""
        if not self.armed and self.answers_from != math.inf and self.prompt.get("id"):
            self.answers_from = max(self.answers_from, self.clock() + GRACE_S)
            self._due = False
        if self.confirming and event.key != "D":  # any other key: no longer asked
            self.confirming = False
            self.query_one("#countdown", Static).update(self._countdown())

    def _held_look(self) -> None:
        """Buttons disabled, the frame recoloured. The screen is composed in this look
        and leaves in it (`leave`), so a prompt coming on screen changes no style of
        its own: each change restyles widgets on the prompt's way to the screen."""
        for button in self.query(Button):
            button.disabled = True
        self.query_one("#dialog").set_class(True, "fresh")

    def leave(self, answer: Answer | None) -> None:
        """Off the screen with `answer` (None: the prompt went away), in the held look."""
        self.armed = False
        self.answers_from = math.inf
        self._held_look()
        self.dismiss(answer)

    def _arm(self) -> None:
        """The grace is over (else look again shortly): answers count, focus on Deny."""
        self._arming = False
        if self.armed or not self.is_current:
            return
        # Armed only at the second check past the grace in a row: keys that waited in
        # the terminal while the TUI did not run (a loaded machine) are read before
        # that check and start the grace again, rather than answer after it.
        due, self._due = self._due, self.clock() >= self.answers_from
        if not (due and self._due):
            self._arming = True
            self.set_timer(_GRACE_CHECK_S, self._arm)
            return
        self.armed = True
        for button in self.query(Button):
            button.disabled = False
        self.query_one("#dialog").set_class(False, "fresh")
        self.query_one("#countdown", Static).update(self._countdown())
        # At once, not as Widget.focus does it (on a later turn): armed means Deny has
        # the focus, and a key read in between went to nothing.
        self.set_focus(self.query_one("#deny", Button))

    def on_screen_resume(self, event: events.ScreenResume) -> None:
        # Textual restyles every widget of a screen as it comes on: a quarter of the
        # TUI's CPU from a prompt's arrival to its paint. This one comes on in the
        # look it left in (`leave`), and a widget changed since was restyled then;
        # only CSS changed meanwhile (a theme) makes it restyle. Textual reads the
        # event after this handler (a subclass's handler comes first).
        css = getattr(self.app, "_css_update_count", None)
        if css is not None and css == self._css_seen:
            event.refresh_styles = False
        self._css_seen = css
        if not self.prompt.get("id"):
            return  # composed ahead of the first prompt, not shown
        self._fill()
        self.call_after_refresh(self._painted)

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="fresh"):
            yield Static(self._title(), id="title")
            yield Static(self._facts(), id="facts")
            with VerticalScroll(id="preview-box"):
                yield Static(self._preview(), id="preview")
            yield Static(self._countdown(), id="countdown")
            with Horizontal(id="buttons"):
                yield Button("Deny", id="deny", variant="primary", disabled=True)
                yield Button("Deny+kill plan", id="deny_kill", variant="error", disabled=True)
                yield Button("Once", id="once", disabled=True)
                yield Button("This plan", id="plan", variant="success", disabled=True)
                yield Button(self._agent_label(), id="agent", variant="warning", disabled=True)

    def on_mount(self) -> None:
        self.set_interval(0.5, self._tick)

    def _painted(self) -> None:
        """For measurements: when the prompt first reached the screen (unix seconds)."""
        self.painted_at = time.time()

    # ------------------------------------------------------------- content

    def _title(self) -> Text:
        title = Text(KIND_TITLES.get(str(self.prompt.get("kind")), "Approval needed"))
        if self.prompt.get("kind") == "scope_request":
            title.append(
                f": {_counted(self.prompt.get('grants') or self.prompt.get('scopes', ()))}"
            )
        if self.more:
            mine = f", {self.also_of_agent} of this agent" if self.also_of_agent else ""
            title.append(f"   ({self.more} more waiting{mine})", style="dim")
        return title

    def _facts(self) -> Table:
        """The prompt's rows. Agent and plan each keep to one line, cut with an
        ellipsis; the scopes (every one, `scopes_text`) and the reason wrap inside
        their own column: nothing a server names can wrap into a line that passes for
        another row (a space-padded agent id drew fake "Wants" and "Why" rows). Runs
        of whitespace are shown counted."""
        p = self.prompt
        table = Table.grid(padding=(0, 1), expand=True)
        table.add_column(width=LABEL_WIDTH, no_wrap=True, style="bold")
        table.add_column(ratio=1)
        rows: list[tuple[str, Text]] = [
            ("Agent", id_text(str(p.get("agent_id") or "(none)"))),
            ("Plan", id_text(str(p.get("plan_id") or "(none)"))),
            ("Wants", scopes_text(p.get("scopes", ()))),
        ]
        grants = [g for g in p.get("grants", ()) if g not in p.get("scopes", ())]
        if grants:
            also = Text("also ").append_text(scopes_text(grants)).append(" (read-only)")
            rows.append(("Plan/agent", also))
        if p.get("reason"):
            rows.append(("Why", server_text(str(p["reason"]), one_line=False)))
        waiting = _waiting(p)
        if waiting > 1:
            rows.append(("Calls", Text(f"{waiting} identical calls wait on this answer")))
        for label, value in rows:
            table.add_row(label, value)
        return table

    def _preview(self) -> Text:
        preview = shown(self.prompt.get("preview") or "", lines=True)
        if self.prompt.get("kind") == "scope_request":
            text = Text("What the server says it will do (its words, not checked):\n", style="dim")
            text.append(preview or "(nothing)")
            return text
        return Text(preview or "(nothing to show)")

    def action_scroll(self, how: str) -> None:
        getattr(self.query_one("#preview-box", VerticalScroll), how)(animate=False)

    def _remaining_s(self) -> int:
        left = (int(self.prompt.get("deadline_ms", 0)) / 1000) - self.clock()
        return max(0, math.ceil(left))

    def _countdown(self) -> Text:
        if not self.armed:
            return Text(
                "A new prompt: read it. Keys wait a moment, so one meant for the last "
                "prompt does not answer this one.",
                style="bold",
            )
        if self._cut and not self._all_shown():
            return Text(
                "The terminal is too small to show all this prompt grants: enlarge it "
                "to approve (d denies).",
                style="bold",
            )
        if self.confirming:
            return Text(
                f"D again denies this prompt and the {self.also_of_agent} other(s) of this "
                "agent waiting; any other key keeps them.",
                style="bold",
            )
        every = f"D deny agent's {self.also_of_agent + 1} · " if self.also_of_agent else ""
        return Text(
            f"Denied by itself in {self._remaining_s()} s · d deny · {every}"
            "x deny+kill · o once · p plan · a agent · t period · ↑↓ scroll",
            style="dim",
        )

    def _agent_label(self) -> str:
        return f"Agent {PERIODS[self.period][0]}"

    def _tick(self) -> None:
        if not self.is_current:
            return
        self.query_one("#countdown", Static).update(self._countdown())

    def update_prompt(self, prompt: dict[str, Any], more: int, also_of_agent: int = 0) -> None:
        """The same prompt changed (more calls wait on it) or the queue behind it moved.
        More calls waiting start the grace again: "once" lets through as many calls as
        the prompt shows (the answer says how many, `action_choose`), so a count that
        grows under the person's finger must be read first (review10 finding 11: one
        "o" on a prompt armed showing 1 call let through 51)."""
        grew = prompt.get("id") == self.prompt.get("id") and _waiting(prompt) > _waiting(
            self.prompt
        )
        self.prompt, self.more, self.also_of_agent = prompt, more, also_of_agent
        self.query_one("#title", Static).update(self._title())
        self.query_one("#facts", Static).update(self._facts())
        self.query_one("#countdown", Static).update(self._countdown())
        if grew and self.is_current and self.answers_from != math.inf:
            log.info(
                "prompt %s: %d calls wait now; answers wait again", self.prompt_id, _waiting(prompt)
            )
            self._hold()

    # ------------------------------------------------------------- answering

    def action_next_period(self) -> None:
        self.period = (self.period + 1) % len(PERIODS)
        self.query_one("#agent", Button).label = self._agent_label()

    def action_choose(self, choice: str) -> None:
        # Answers exactly while the prompt shows that it takes them (`armed`), never
        # by the clock again: the app's clock is the wall clock (deadlines are unix
        # times), and one stepped back after the grace (NTP, a VM resumed) refused
        # keys on a prompt that said "Denied by itself in …", which then waited out its
        # deadline; nor does a key answer a prompt still saying its keys wait.
        if choice in APPROVALS and self.armed and not self._all_shown():
            log.info(
                "prompt %s: %r not taken: the terminal cuts the prompt", self.prompt_id, choice
            )
            self._cut = True  # said until the prompt shows whole (`_countdown`)
            self.query_one("#countdown", Static).update(self._countdown())
            self.app.bell()
            return
        if not self.armed or choice not in self.prompt.get("choices", ()):
            # In the log (the worker's): a key a person says they pressed, not taken.
            why = "offered" if self.armed else "taken yet (its grace)"
            log.info("prompt %s: %r is not %s", self.prompt_id, choice, why)
            self.app.bell()
            return
        # The calls the prompt shows: "once" lets through no more of them.
        answer: Answer = {"choice": choice, "waiting": _waiting(self.prompt)}
        if choice == "agent":
            answer["period_s"] = PERIODS[self.period][1]
        self.leave(answer)

    def action_deny_agent(self) -> None:
        """`D`: this prompt and every other of its agent waiting now, denied, once
        pressed twice (the first press says what the second does). An agent that
        floods the queue is answered in one go; a prompt of it coming later is asked."""
        if not self.armed or "deny" not in self.prompt.get("choices", ()):
            log.info("prompt %s: 'D' is not taken yet (its grace)", self.prompt_id)
            self.app.bell()
            return
        if self.also_of_agent and not self.confirming:
            self.confirming = True
            self.query_one("#countdown", Static).update(self._countdown())
            return
        self.leave({"choice": "deny", "waiting": _waiting(self.prompt), "every_of_agent": True})

    def _all_shown(self) -> bool:
        """Whether the rows naming what an approval grants are on screen whole."""
        dialog, facts = self.query_one("#dialog"), self.query_one("#facts", Static)
        try:
            shown_at = self.find_widget(facts)
        except NoWidget:  # not on screen at all
            return False
        inside = dialog.content_region
        return facts.size.height > 0 and shown_at.region.bottom <= inside.bottom

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        if event.button.id:
            self.action_choose(event.button.id)
