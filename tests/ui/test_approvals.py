"""Approval prompts, driven with the keyboard as a person would (Textual's Pilot),
against a real dispatcher, broker and console."""

from __future__ import annotations

import asyncio
import html
import json
import logging
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from textual import events
from textual.containers import VerticalScroll
from textual.pilot import Pilot
from textual.widgets import Button, Static

from tests.ui.rig import MovableClock, Rig, answerable, on_screen, silent, until
from ui.app import WorkerApp
from ui.approval import GRACE_S, ApprovalModal
from worker.core.connection import SCOPE_REQUEST_EXPIRED
from worker.wire.proto import agentworker_pb2 as pb


def _app(rig: Rig) -> WorkerApp:
    return WorkerApp(rig.link(), notifier=silent, clock=MovableClock())


def on_the_tui(
    tmp_path: Path,
    scenario: Callable[[Rig, WorkerApp, Pilot[None]], Awaitable[None]],
    *,
    size: tuple[int, int] = (100, 30),
    **rig_options: Any,
) -> None:
    """`scenario` driving the TUI of a fresh rig (closed after, whatever happened)."""

    async def go() -> None:
        rig = Rig(tmp_path, **rig_options)
        try:
            app = _app(rig)
            async with app.run_test(size=size) as pilot:
                await scenario(rig, app, pilot)
        finally:
            rig.close()

    asyncio.run(go())


def _modal(app: WorkerApp) -> ApprovalModal | None:
    return app.screen if isinstance(app.screen, ApprovalModal) else None


def _ask(rig: Rig, **request: object) -> asyncio.Future[pb.ScopeDecision]:
    """A server's ScopeRequest to the rig's broker (id "r", agent "planner", plan "p"
    unless said), answered when the person decides."""
    broker = rig.console.broker
    assert broker is not None
    fields: dict[str, object] = {"request_id": "r", "agent_id": "planner", "plan_id": "p"}
    return asyncio.ensure_future(broker.scope_request(pb.ScopeRequest(**{**fields, **request})))


def test_approve_once_runs_the_call_and_the_next_one_prompts_again(tmp_path: Path) -> None:
    async def scenario(rig: Rig, app: WorkerApp, pilot: Pilot[None]) -> None:
        first = rig.call("fs_read", '{"path": "a.txt"}')
        await answerable(app, pilot)
        await pilot.press("o")
        assert (await rig.result(first)).status == 1, rig.results[first]
        assert "once" in rig.results[first].invocation.decision
        second = rig.call("fs_read", '{"path": "b.txt"}')
        await answerable(app, pilot)
        assert second not in rig.results
        await pilot.press("d")
        assert rig.code(await _code(rig, second)) == "scope_denied"

    on_the_tui(tmp_path, scenario)


async def _code(rig: Rig, cid: str) -> str:
    await rig.result(cid)
    return cid


def test_for_this_plan_lets_the_plan_run_and_another_plan_is_asked(tmp_path: Path) -> None:
    async def scenario(rig: Rig, app: WorkerApp, pilot: Pilot[None]) -> None:
        first = rig.call("fs_list", '{"path": "."}', plan="plan-a")
        await answerable(app, pilot)
        await pilot.press("p")
        await rig.result(first)
        assert rig.code(first) == "ok"
        # Read-only file scopes come together "for this plan".
        later = [rig.call("fs_read", f'{{"path": "{n}.txt"}}') for n in "abc"]
        later.append(rig.call("fs_stat", '{"path": "a.txt"}'))
        for cid in later:
            await rig.result(cid)
            assert rig.code(cid) == "ok"
        assert _modal(app) is None
        other = rig.call("fs_read", '{"path": "a.txt"}', plan="plan-b")
        await answerable(app, pilot)
        modal = _modal(app)
        assert modal is not None and modal.prompt["plan_id"] == "plan-b"
        await pilot.press("escape")
        await rig.result(other)
        assert rig.code(other) == "scope_denied"
        assert "approval_granted" in rig.audits() and "approval_denied" in rig.audits()

    on_the_tui(tmp_path, scenario)


def test_deny_answers_scope_denied(tmp_path: Path) -> None:
    async def scenario(rig: Rig, app: WorkerApp, pilot: Pilot[None]) -> None:
        cid = rig.call("fs_write", '{"path": "new.txt", "mode": "create"}')
        await answerable(app, pilot)
        assert app.focused is not None and app.focused.id == "deny"
        await pilot.press("enter")  # focus starts on Deny
        await rig.result(cid)
        assert rig.code(cid) == "scope_denied"
        assert not (rig.workspace / "new.txt").exists()

    on_the_tui(tmp_path, scenario)


def test_a_prompt_nobody_answers_is_a_denial(tmp_path: Path) -> None:
    async def scenario(rig: Rig, app: WorkerApp, pilot: Pilot[None]) -> None:
        cid = rig.call("fs_read", '{"path": "a.txt"}')
        await until(lambda: _modal(app) is not None, pilot)
        await rig.result(cid)
        assert rig.code(cid) == "scope_denied"
        await until(lambda: _modal(app) is None, pilot)
        assert "approval_timeout" in rig.audits()

    on_the_tui(tmp_path, scenario, timeout_s=1)


def test_deny_and_kill_refuses_the_plan_afterwards(tmp_path: Path) -> None:
    async def scenario(rig: Rig, app: WorkerApp, pilot: Pilot[None]) -> None:
        cid = rig.call("fs_read", '{"path": "a.txt"}', plan="doomed")
        await answerable(app, pilot)
        await pilot.press("x")
        await rig.result(cid)
        assert rig.code(cid) in ("scope_denied", "plan_killed")
        after = rig.call("fs_read", '{"path": "a.txt"}', plan="doomed")
        await rig.result(after)
        assert rig.code(after) == "plan_killed"
        assert _modal(app) is None

    on_the_tui(tmp_path, scenario)


def test_prompts_queue_and_identical_calls_share_one(tmp_path: Path) -> None:
    async def scenario(rig: Rig, app: WorkerApp, pilot: Pilot[None]) -> None:
        same = [rig.call("fs_read", '{"path": "a.txt"}') for _ in range(3)]
        other = rig.call("fs_write", '{"path": "x.txt", "mode": "create"}')
        await until(lambda: _modal(app) is not None and len(app.prompts) == 2, pilot)
        await answerable(app, pilot)
        modal = _modal(app)
        assert modal is not None and modal.prompt["waiting"] == 3 and modal.more == 1
        first = modal.prompt_id
        await pilot.press("o")
        for cid in same:
            await rig.result(cid)
            assert rig.code(cid) == "ok"
        await until(lambda: (m := _modal(app)) is not None and m.prompt_id != first, pilot)
        await answerable(app, pilot)
        await pilot.press("d")
        await rig.result(other)
        assert rig.code(other) == "scope_denied"

    on_the_tui(tmp_path, scenario)


def test_a_preview_with_escape_sequences_is_shown_inert(tmp_path: Path) -> None:
    async def scenario() -> None:
        rig = Rig(tmp_path)
        app = _app(rig)
        # (An agent id with escapes is refused where it enters now: validation_error.)
        hostile_agent = "evil\x1b[2J\x1b[H\x1b[32mAPPROVED\x1b[0m\u202e"
        refused = rig.call("fs_read", '{"path": "a.txt"}', agent=hostile_agent)
        await rig.result(refused)
        assert rig.code(refused) == "validation_error"
        async with app.run_test(size=(100, 30)) as pilot:
            args = '{"path": "a\\u001b[2J\\u001b[32mAPPROVED\u202etxt.exe\u0085"}'
            cid = rig.call("fs_read", args, agent="agent-1")
            await answerable(app, pilot)
            modal = _modal(app)
            assert modal is not None
            shown = "".join(
                widget.render_line(y).text
                for widget in modal.query(Static)
                for y in range(widget.size.height)
            )
            assert "\x1b" not in shown and "\u202e" not in shown and "\u0085" not in shown
            assert "\\e[2J" in shown and "\\u202e" in shown
            await pilot.press("d")
            await rig.result(cid)
        rig.close()

    asyncio.run(scenario())


def test_the_prompt_shows_the_whole_call_in_a_box_that_scrolls(tmp_path: Path) -> None:
    async def scenario() -> None:
        rig = Rig(tmp_path)
        app = _app(rig)
        path = "notes/" + "a" * 240 + "/../../.git/hooks/pre-commit"
        body = "".join(f"echo line {n}\n" for n in range(200)).encode()
        async with app.run_test(size=(100, 30)) as pilot:
            cid = rig.call("fs_write", json.dumps({"path": path}), blob=body)
            await answerable(app, pilot)
            modal = _modal(app)
            assert modal is not None
            shown = str(modal.query_one("#preview", Static).render())
            assert path in shown and "│ echo line 70" in shown, shown
            assert "echo line 199" not in shown  # the blob: its first 1 KiB
            assert f"resolves to: {rig.workspace / '.git/hooks/pre-commit'}" in shown
            box = modal.query_one("#preview-box", VerticalScroll)
            await until(lambda: box.max_scroll_y > 0, pilot)  # laid out, taller than the box
            await pilot.press("end")
            assert box.scroll_y == box.max_scroll_y
            await pilot.press("home")
            assert box.scroll_y == 0
            assert app.focused is not None and app.focused.id == "deny"
            await pilot.press("d")
            await rig.result(cid)
            assert rig.code(cid) == "scope_denied"
        rig.close()

    asyncio.run(scenario())


def test_the_preview_keeps_its_line_breaks_and_the_agents_stay_escaped(tmp_path: Path) -> None:
    """Through the console, as the TUI gets it: the worker's line breaks are lines, the
    agent's (inside its JSON) stay `\\n` (review25 G6: every break drew as `\\n`)."""

    async def scenario(rig: Rig, app: WorkerApp, pilot: Pilot[None]) -> None:
        cid = rig.call("fs_write", json.dumps({"path": "a\nb.txt"}), blob=b"one\ntwo\n")
        await answerable(app, pilot)
        modal = _modal(app)
        assert modal is not None
        preview = modal.query_one("#preview", Static)
        drawn = [preview.render_line(y).text.rstrip() for y in range(preview.size.height)]
        assert any(line.endswith("│ one") for line in drawn), drawn
        assert any(line.endswith("│ two") for line in drawn), drawn
        text = "".join(drawn)  # a long line wraps where the folder's name makes it
        assert text.count("\\n") == text.count("a\\nb") >= 1, drawn  # the agent's only
        await pilot.press("d")
        await rig.result(cid)

    on_the_tui(tmp_path, scenario, size=(100, 40))


def test_a_key_pressed_as_the_next_prompt_replaces_the_last_answers_nothing(
    tmp_path: Path,
) -> None:
    """The server's Cancel ends the prompt on screen and the next one comes on at once:
    keys pressed then (meant for the last) answer nothing until the grace has passed
    on the app's clock; the change shows, and focus then starts on Deny."""

    async def scenario() -> None:
        rig = Rig(tmp_path)
        clock = MovableClock()
        app = WorkerApp(rig.link(), notifier=silent, clock=clock)
        async with app.run_test(size=(100, 30)) as pilot:
            first = rig.call("fs_read", '{"path": "a.txt"}')
            modal = await answerable(app, pilot)
            shown_first = modal.prompt_id
            second = rig.call("fs_write", '{"path": "notes.txt", "mode": "create"}')
            await until(lambda: len(app.prompts) == 2, pilot)
            rig.dispatcher.cancel(first, "by the server")
            await until(lambda: on_screen(app) and modal.prompt_id != shown_first, pilot)
            assert "fs_write" in modal.prompt["scopes"][0]
            shown_second = modal.prompt_id
            assert not modal.armed and modal.query_one("#dialog").has_class("fresh")
            assert all(button.disabled for button in modal.query(Button))
            await pilot.press("p")  # meant for the first prompt
            assert app.screen is modal
            await pilot.click(modal.query_one("#plan", Button))
            assert app.screen is modal
            await pilot.press("enter")
            assert app.screen is modal and modal.prompt_id == shown_second in app.prompts
            clock.skip(GRACE_S)
            await until(lambda: modal.armed, pilot)
            assert not modal.query_one("#dialog").has_class("fresh")
            assert app.focused is not None and app.focused.id == "deny"
            await pilot.press("enter")
            await rig.result(second)
            assert rig.code(second) == "scope_denied"
            assert rig.dispatcher.state.grants() == []  # "p" granted nothing
            await rig.result(first)
            assert rig.code(first) == "cancelled"
        rig.close()

    asyncio.run(scenario())


def test_a_prompt_that_shows_it_takes_answers_takes_a_key_whatever_the_clock_does(
    tmp_path: Path,
) -> None:
    """The grace is measured on the app's clock, the wall clock (a prompt's deadline is
    a unix time). Once the prompt shows that it takes answers (buttons on, "Denied by
    itself in …"), a key answers it even if that clock then steps back (NTP, a VM
    resumed): `d` rang the bell instead, and the call waited out its deadline."""

    async def scenario() -> None:
        rig = Rig(tmp_path)
        clock = MovableClock()
        app = WorkerApp(rig.link(), notifier=silent, clock=clock)
        async with app.run_test(size=(100, 30)) as pilot:
            cid = rig.call("fs_write", '{"path": "new.txt", "mode": "create"}')
            modal = await answerable(app, pilot)
            assert str(modal.query_one("#countdown", Static).content).startswith(
                "Denied by itself in"
            )
            clock.skip(-2 * GRACE_S)  # the wall clock steps back
            await pilot.press("d")
            await rig.result(cid, timeout_s=10)
            assert rig.code(cid) == "scope_denied"
        rig.close()

    asyncio.run(scenario())


def test_an_id_padded_with_spaces_stays_on_its_row_and_forges_none(tmp_path: Path) -> None:
    """An agent id padded to wrap at the dialog's width drew rows of its own choosing
    ("Wants workerHost.fs_stat", "Why read one file") above the real ones."""

    async def scenario() -> None:
        rig = Rig(tmp_path)
        app = _app(rig)
        pad = " " * 74
        agent = f"planner{pad}Wants      workerHost.fs_stat{pad}Why        read one file"
        async with app.run_test(size=(100, 30)) as pilot:
            asked = _ask(rig, agent_id=agent, scopes=["*.*"])
            modal = await answerable(app, pilot)
            facts = modal.query_one("#facts", Static)
            lines = [facts.render_line(y).text.rstrip() for y in range(facts.size.height)]
            assert [line.split()[0] for line in lines] == ["Agent", "Plan", "Wants"], lines
            assert lines[0].startswith("Agent      planner⟨74 spaces⟩Wants") and lines[0][-1] == "…"
            assert lines[2] == "Wants      *.* (EVERY action)"
            await pilot.press("d")
            assert not (await asked).granted
        rig.close()

    asyncio.run(scenario())


def test_an_id_with_letters_outside_ascii_is_marked_and_named(tmp_path: Path) -> None:
    """A Cyrillic small a (U+0430) drawn as a Latin a made "\\u0430lice" pass for alice in the
    prompt: ids are marked where they hold a character outside ASCII, and the first
    few are named ahead of the id."""
    look_alike = "\u0430lic\u0435"  # Cyrillic a and e

    async def scenario(rig: Rig, app: WorkerApp, pilot: Pilot[None]) -> None:
        asked = _ask(rig, agent_id=look_alike, plan_id="plan-a", scopes=["*.*"])
        modal = await answerable(app, pilot)
        facts = modal.query_one("#facts", Static)
        lines = [facts.render_line(y).text.rstrip() for y in range(facts.size.height)]
        assert lines[0] == f"Agent      ⟨not ASCII: U+0430 U+0435⟩ {look_alike}", lines
        assert lines[1] == "Plan       plan-a", lines  # an ASCII id as it is
        marked = [
            segment.text
            for segment in facts.render_line(0)
            if segment.style is not None and segment.style.reverse
        ]
        assert "\u0430" in marked and "\u0435" in marked, marked
        await pilot.press("d")
        assert not (await asked).granted

    on_the_tui(tmp_path, scenario)


def _screen_text(app: WorkerApp) -> str:
    """What the terminal shows, as text (the screenshot's SVG without its markup)."""
    svg = re.sub(r"<[^>]+>", "", app.export_screenshot())
    return html.unescape(svg).replace("\xa0", " ")


@pytest.mark.parametrize("size", [(80, 24), (100, 30), (120, 40)])
def test_a_scope_request_shows_every_scope_it_grants_broadest_first(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    """review10 02: the scopes were drawn on one line cut with an ellipsis, and five
    read-only scopes ahead of `*.*` hid it; "p" granted it. Every scope is on screen
    now, the broadest first and marked, counted in the title (each once)."""
    harmless = ["workerHost.fs_stat", "workerHost.fs_list", "workerHost.fs_read"]

    async def scenario(rig: Rig, app: WorkerApp, pilot: Pilot[None]) -> None:
        asked = _ask(
            rig,
            scopes=[*harmless, *harmless[:2], "workerHost.exec", "*.*"],
            reason="check the sizes of the report files",
        )
        modal = await answerable(app, pilot)
        text = _screen_text(app)
        assert "The agent asks for scopes: 5 scopes, 1 of them a pattern" in text, text
        assert "*.* (EVERY action)" in text, text
        for scope in (*harmless, "workerHost.exec"):
            assert scope in text, (scope, text)
        facts = modal.query_one("#facts", Static)
        wants = " ".join(facts.render_line(y).text for y in range(facts.size.height))
        assert wants.index("*.*") < wants.index("workerHost.exec") < wants.index("fs_stat")
        await pilot.press("p")
        decision = await asked
        assert decision.granted and len(decision.scopes) == 5, decision

    on_the_tui(tmp_path, scenario, size=size)


def test_a_scope_that_types_into_any_window_says_so(tmp_path: Path) -> None:
    """key_type and key_combo reach a terminal as well as an editor: as much as running
    commands, past the exec allowlist (review25). The prompt marks them, and patterns
    that hold them, beside the scopes the person signs."""

    async def scenario(rig: Rig, app: WorkerApp, pilot: Pilot[None]) -> None:
        asked = _ask(
            rig,
            scopes=["workerComputer.key_type", "workerComputer.key_*", "workerComputer.screenshot"],
        )
        modal = await answerable(app, pilot)
        facts = modal.query_one("#facts", Static)
        wants = " ".join(facts.render_line(y).text.strip() for y in range(facts.size.height))
        mark = "(types into any window, a terminal too)"
        assert f"workerComputer.key_type {mark}" in wants, wants
        assert f"workerComputer.key_* (a pattern: many actions) {mark}" in wants, wants
        assert f"workerComputer.screenshot {mark}" not in wants, wants
        await pilot.press("d")
        assert not (await asked).granted

    on_the_tui(tmp_path, scenario, size=(120, 40))


def test_a_prompt_the_terminal_cuts_takes_no_approval(tmp_path: Path) -> None:
    """32 long scopes cannot all show in 80x24: "p" is not taken (the prompt says to
    enlarge the terminal), a denial is, and once it all shows "p" is taken."""
    scopes = [
        f"workerHost.fs_{'x' * 60}{chr(ord('a') + n // 26)}{chr(ord('a') + n % 26)}"
        for n in range(32)
    ]

    async def scenario(rig: Rig, app: WorkerApp, pilot: Pilot[None]) -> None:
        asked = _ask(rig, scopes=scopes)
        modal = await answerable(app, pilot)
        await pilot.press("p")
        await until(
            lambda: "too small" in str(modal.query_one("#countdown", Static).content), pilot
        )
        assert not asked.done() and app.screen is modal
        await pilot.resize_terminal(200, 60)
        await until(lambda: modal._all_shown(), pilot)
        text = _screen_text(app)
        assert all(scope in text for scope in scopes), text
        await pilot.press("p")
        assert (await asked).granted

    on_the_tui(tmp_path, scenario, size=(80, 24))


def test_the_terminal_getting_the_focus_starts_the_grace_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """review10 14: an agent moved the focus to the TUI's terminal while the person
    typed elsewhere, and after the grace their keys answered the prompt. Losing the
    focus holds the prompt, getting it back starts the grace again (the key then is
    not taken, and is logged), and a key in the grace starts it again too: answers
    come only after the keyboard has been quiet for GRACE_S."""

    async def scenario() -> None:
        rig = Rig(tmp_path)
        clock = MovableClock()
        app = WorkerApp(rig.link(), notifier=silent, clock=clock)
        async with app.run_test(size=(100, 30)) as pilot:
            cid = rig.call("fs_write", '{"path": "new.txt", "mode": "create"}')
            modal = await answerable(app, pilot)
            app.post_message(events.AppBlur())
            await until(lambda: not modal.armed, pilot)
            clock.skip(10 * GRACE_S)
            await pilot.press("o")  # the focus is elsewhere: nothing is an answer
            app.post_message(events.AppFocus())
            await until(lambda: modal.answers_from == clock() + GRACE_S, pilot)
            with caplog.at_level(logging.INFO, logger="ui.approval"):
                await pilot.press("o")  # typed on by the person: not taken, logged
            assert "'once' is not taken yet" in caplog.text, caplog.text
            assert not modal.armed and app.screen is modal and cid not in rig.results
            clock.skip(GRACE_S / 2)
            await pilot.press("a")  # still typing: the grace starts again
            clock.skip(GRACE_S / 2)
            await pilot.pause()
            assert not modal.armed and modal.answers_from > clock()
            clock.skip(GRACE_S / 2)
            await until(lambda: modal.armed, pilot)
            assert app.focused is not None and app.focused.id == "deny"
            await pilot.press("d")
            await rig.result(cid)
            assert rig.code(cid) == "scope_denied"
            assert rig.dispatcher.state.grants() == []
        rig.close()

    asyncio.run(scenario())


_APPEND = '{"path": "ledger.txt", "mode": "append"}'
_PAY = b"pay 100 EUR\n"


def test_calls_joining_a_prompt_start_its_grace_again_and_once_runs_what_it_showed(
    tmp_path: Path,
) -> None:
    """review10 11: identical calls joined an armed prompt in place (no new grace), and
    one "o" let through every call waiting when the worker read it, 51 where the prompt
    had said 1. A call joining now starts the grace again, and "o" lets through the
    calls the prompt showed: here 3 of 3, each run once."""

    async def scenario(rig: Rig, app: WorkerApp, pilot: Pilot[None]) -> None:
        first = rig.call("fs_write", _APPEND, blob=_PAY)
        modal = await answerable(app, pilot)
        assert modal.prompt["waiting"] == 1
        joined = [rig.call("fs_write", _APPEND, blob=_PAY) for _ in range(2)]
        await until(lambda: modal.prompt["waiting"] == 3, pilot)
        assert not modal.armed  # read the new count first
        await pilot.press("o")  # in the new grace: not taken
        assert app.screen is modal and not any(c in rig.results for c in [first, *joined])
        await answerable(app, pilot)
        await pilot.press("o")
        for cid in (first, *joined):
            await rig.result(cid)
            assert rig.code(cid) == "ok", rig.results[cid]
        assert (rig.workspace / "ledger.txt").read_text() == "pay 100 EUR\n" * 3

    on_the_tui(tmp_path, scenario)


def test_once_for_the_calls_shown_leaves_later_ones_a_prompt_of_their_own(
    tmp_path: Path,
) -> None:
    """The answer says how many calls the prompt showed ("waiting"): calls that joined
    after it (after the key press) are not let through by it but asked about anew."""

    async def scenario() -> None:
        rig = Rig(tmp_path)
        broker = rig.console.broker
        assert broker is not None
        app = _app(rig)
        async with app.run_test(size=(100, 30)) as pilot:
            calls = [rig.call("fs_write", _APPEND, blob=_PAY) for _ in range(3)]
            await until(lambda: sum(len(p.waiters) for p in broker.pending()) == 3, pilot)
            modal = await answerable(app, pilot)
            shown = modal.prompt_id
            # As the TUI answers for a prompt that showed one call, two joining after.
            reply = await app.link.command(
                {"op": "decide", "prompt_id": shown, "choice": "once", "waiting": 1}
            )
            assert reply["ok"] and reply["granted"], reply
            await rig.result(calls[0])
            assert rig.code(calls[0]) == "ok"
            await until(lambda: (m := on_screen(app)) is not None and m.prompt_id != shown, pilot)
            again = await answerable(app, pilot)
            assert again.prompt["waiting"] == 2 and not any(c in rig.results for c in calls[1:])
            await pilot.press("d")
            for cid in calls[1:]:
                await rig.result(cid)
                assert rig.code(cid) == "scope_denied"
            assert (rig.workspace / "ledger.txt").read_text() == "pay 100 EUR\n"
        rig.close()

    asyncio.run(scenario())


def test_a_scope_request_withdrawn_as_its_stream_ends_says_why(tmp_path: Path) -> None:
    """The worker withdraws a server's ScopeRequest from the person as the stream it
    came on ends: nobody waits for the answer any more (review26). The prompt leaves
    the screen, and a notice says whose request went and why."""

    async def scenario(rig: Rig, app: WorkerApp, pilot: Pilot[None]) -> None:
        asked = _ask(rig, scopes=["workerHost.fs_write"])
        await answerable(app, pilot)
        asked.cancel(SCOPE_REQUEST_EXPIRED)  # as WorkerConnection does at the stream's end
        await until(lambda: _modal(app) is None, pilot)
        notices = [str(n.message) for n in app._notifications]
        assert any(
            "agent planner's scope request went away unanswered (withdrawn: the server's "
            "stream ended" in notice
            for notice in notices
        ), notices
        assert rig.console.broker is not None and rig.console.broker.pending() == []

    on_the_tui(tmp_path, scenario)


def test_agents_take_turns_one_agents_many_prompts_do_not_push_anothers_back(
    tmp_path: Path,
) -> None:
    """Oldest-first showed all of one agent's prompts (up to 16, each up to a minute)
    before another agent's: each agent's prompts come oldest first, agents in turns."""

    async def scenario(rig: Rig, app: WorkerApp, pilot: Pilot[None]) -> None:
        flood = [rig.call("fs_read", f'{{"path": "{n}.txt"}}', agent="flood") for n in "abc"]
        other = rig.call("fs_read", '{"path": "a.txt"}', agent="other")
        await until(lambda: len(app.prompts) == 4, pilot)
        seen = []
        for _ in range(4):
            modal = await answerable(app, pilot)
            seen.append(modal.prompt["agent_id"])
            answered = modal.prompt_id
            await pilot.press("d")
            await until(lambda a=answered: a not in app.prompts, pilot)
            await until(lambda a=answered: (m := _modal(app)) is None or m.prompt_id != a, pilot)
        assert seen == ["flood", "other", "flood", "flood"], seen
        for cid in [*flood, other]:
            await rig.result(cid)
            assert rig.code(cid) == "scope_denied"

    on_the_tui(tmp_path, scenario)


def test_a_prompt_waiting_first_goes_before_later_prompts_of_agent_ids_never_shown(
    tmp_path: Path,
) -> None:
    """An agent id is only what the caller says: "never shown goes first" let a caller
    naming a fresh agent for each prompt stand before another agent's prompt that came
    earlier for as long as it kept one fresh id waiting, until that prompt timed out
    (review29 t1). Prompts that came during the planner's turn still go first (turns);
    the fresh ids that came after it ended queue behind its prompt."""

    async def scenario(rig: Rig, app: WorkerApp, pilot: Pilot[None]) -> None:
        rig.call("fs_read", '{"path": "a.txt"}', agent="planner")
        second = rig.call("fs_read", '{"path": "b.txt"}', agent="planner")
        await until(lambda: len(app.prompts) == 2, pilot)
        modal = await answerable(app, pilot)
        assert modal.prompt["agent_id"] == "planner"
        for n in range(3):  # during the planner's turn, each under an id of its own
            rig.call("fs_read", f'{{"path": "c{n}.txt"}}', agent=f"flood-{n}")
        await until(lambda: len(app.prompts) == 5, pilot)
        seen = []
        for turn in range(6):
            modal = await answerable(app, pilot)
            seen.append(modal.prompt["agent_id"])
            if seen[-1] == "planner" and turn > 0:
                break
            answered = modal.prompt_id
            await pilot.press("d")
            await until(lambda a=answered: a not in app.prompts, pilot)
            await until(lambda a=answered: (m := _modal(app)) is None or m.prompt_id != a, pilot)
            if turn > 0:  # the caller keeps one fresh id waiting: one more per answer
                rig.call("fs_read", f'{{"path": "d{turn}.txt"}}', agent=f"fresh-{turn}")
                await until(
                    lambda t=turn: any(p["agent_id"] == f"fresh-{t}" for p in app.prompts.values()),
                    pilot,
                )
        assert seen == ["planner", "flood-0", "flood-1", "flood-2", "planner"], seen
        assert second not in rig.results  # shown in time, not run out
        await pilot.press("d")
        await rig.result(second)
        assert rig.code(second) == "scope_denied"

    on_the_tui(tmp_path, scenario)


def test_shift_d_twice_denies_every_waiting_prompt_of_the_agent_shown(tmp_path: Path) -> None:
    """One agent's flood is answered in one go: `D` says what it does (and the key line
    offers it), `D` again denies this prompt and its agent's others; another agent's
    prompt is then shown, untouched."""

    async def scenario(rig: Rig, app: WorkerApp, pilot: Pilot[None]) -> None:
        flood = [rig.call("fs_read", f'{{"path": "{n}.txt"}}', agent="flood") for n in "abc"]
        other = rig.call("fs_read", '{"path": "a.txt"}', agent="other")
        await until(lambda: len(app.prompts) == 4, pilot)
        modal = await answerable(app, pilot)
        assert modal.prompt["agent_id"] == "flood"
        title = str(modal.query_one("#title", Static).render())
        assert title.endswith("(3 more waiting, 2 of this agent)"), title
        keys = str(modal.query_one("#countdown", Static).render())
        assert "· d deny · D deny agent's 3 · " in keys, keys
        await pilot.press("D")
        asked = str(modal.query_one("#countdown", Static).render())
        assert asked == (
            "D again denies this prompt and the 2 other(s) of this agent waiting; any other "
            "key keeps them."
        ), asked
        assert len(app.prompts) == 4  # nothing answered yet
        await pilot.press("D")
        for cid in flood:
            await rig.result(cid)
            assert rig.code(cid) == "scope_denied"
        modal = await answerable(app, pilot)
        assert modal.prompt["agent_id"] == "other" and list(app.prompts) == [modal.prompt_id]
        assert other not in rig.results  # still asked
        await pilot.press("d")
        await rig.result(other)

    on_the_tui(tmp_path, scenario)
