"""The person's console: what a UI shows of a running worker, and what it may do.

A UI — the TUI in this process or `agentworker ui` over the local socket — sees the
worker through this one object: a snapshot when it attaches, then events (calls
starting and finishing, prompts opening and closing, the link's state, plans and
grants changing), and it acts through `handle` (answer a prompt, kill or lift a
plan, revoke a grant, pause or resume). Everything here is plain JSON-able data,
so the in-process TUI and a socket client take the same path; nothing here imports
a UI toolkit. Every text that came from the server or a file (the config's grants,
the link's error) is made inert before it leaves, by one neutraliser
(approvals.inert): call and plan rows are built inert, and every other event, the
snapshot's other parts and each command's reply pass through `outgoing`. A plan's
id goes whole besides, as the key a UI kills and lifts by (`raw` in a plan's row,
`plan_raw` in a call's), never to be drawn.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import secrets
import time
from collections.abc import Callable, Iterable
from typing import Any, Final, Protocol

from worker.core.approvals import ApprovalBroker, Choice, Decision, inert
from worker.core.connection import LinkState
from worker.core.pipeline import Dispatcher
from worker.core.redaction import (
    args_masked,
    argv_secrets,
    head_masked,
    known_masked,
    secrets_in_text,
)
from worker.core.scopes import ASK_PREFIX, Grant
from worker.errors import WorkerError
from worker.wire.proto import agentworker_pb2 as pb

log = logging.getLogger(__name__)

RECENT_CALLS: Final = 500
# Plans a UI is shown for the calls seen (this run), the most recent; killed plans
# are shown besides (a server's kills are bounded by the ledger, MAX_SERVER_KILLS).
RECENT_PLANS: Final = 500
RESULT_PREVIEW: Final = 2000
# How long the desktop stays held, at most, after the last prompt closed, for the
# attached UIs to say their screens no longer show it (`Console.screens_drawn`).
DRAWN_WITHIN_S: Final = 2.0
# A kill lifted from a UI is lifted only once the person confirms it, on a second
# screen, with the desktop's input held meanwhile: the UI may be on the very desktop
# the agent drives, where a key it types would otherwise lift the kill of its plan.
# A confirmation not given within this long is dropped (and the input let go).
CONFIRM_LIFT_S: Final = 60.0

# The most of the link's detail (the server's or the network's error text) a UI gets.
LINK_DETAIL: Final = 1000
# Keys whose value goes as it is: a raw plan id (a key to act by, never drawn), the
# id of a call (printable: the pipeline refuses others), a UI's own request id, a
# lift's confirmation token.
_KEPT_AS_IS: Final = frozenset({"raw", "plan_raw", "id", "req", "confirm"})
# Keys whose text keeps its line breaks, each line made inert: a prompt's preview, whose
# lines are the worker's own (approvals.Prompt.view: each line inert already; the
# agent's line breaks are escapes in its JSON). Made inert whole, its every line break
# reached the TUI as the two characters `\n`, the call on one folded line (review25 G6).
_LINES: Final = frozenset({"preview"})

Event = dict[str, Any]
Subscriber = Callable[[Event], None]


def outgoing(value: Any) -> Any:
    """`value` (JSON-able) with every text in it inert (approvals.inert, whole: an
    inert text stays as it is; a text of _LINES line by line), but the values of
    _KEPT_AS_IS keys. The one way out to a UI for what is not a call's or a plan's row
    (those are built inert)."""
    if isinstance(value, str):
        return inert(value, None)
    if isinstance(value, dict):
        return {
            k: v if k in _KEPT_AS_IS else _lines_inert(v) if k in _LINES else outgoing(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [outgoing(item) for item in value]
    return value


def _lines_inert(value: Any) -> Any:
    """A text of _LINES: each of its lines inert, its line breaks kept."""
    if not isinstance(value, str):
        return outgoing(value)
    return "\n".join(inert(line, None) for line in value.split("\n"))


def _kept(text: str) -> tuple[str, int]:
    """What a row keeps of a text it shows cut at RESULT_PREVIEW: that much, and its length."""
    return text[:RESULT_PREVIEW], len(text)


def _args_kept(args_json: str) -> tuple[str, int]:
    """What a row keeps of the args before it masks them (`_Seen.masked_args`): whole
    when short, else their head (masked as text then), so 1 MiB of args is never
    parsed for a row; and their length."""
    if len(args_json) <= 4 * RESULT_PREVIEW:
        return args_json, len(args_json)
    return args_json[:RESULT_PREVIEW], len(args_json)


def _masked(kept: tuple[str, int], secrets: tuple[str, ...]) -> tuple[str, int]:
    """What `_kept` kept of a result, with the call's argv passwords and what looks
    secret in text masked (a program may print its argv, a file hold a token)."""
    text, length = kept
    return secrets_in_text(known_masked(text, secrets)), length


def _shown(kept: tuple[str, int]) -> str:
    """`inert(text, RESULT_PREVIEW)` of the text `_kept` kept."""
    text, length = kept
    shown = inert(text, None)
    if length > RESULT_PREVIEW:
        shown += f" … (+{length - RESULT_PREVIEW:,} chars)"
    return shown


# What a call's row shows of its telemetry (its Invocation's fields), in `_Seen.end`'s order.
_TELEMETRY_FIELDS: Final = (
    "scope",
    "bytes_in",
    "bytes_out",
    "truncated",
    "sandboxed",
    "args_digest",
)


class _Seen:
    """A call as the console keeps it, raw (its texts cut to what a row shows), until
    a UI needs its row."""

    __slots__ = (
        "action",
        "agent_id",
        "args",
        "end",
        "id",
        "masked",
        "plan_id",
        "started_ms",
        "task_id",
    )

    def __init__(self, req: pb.ActionRequest, started_ms: int, cid: str, plan: str) -> None:
        self.id = cid
        self.started_ms = started_ms
        self.agent_id = req.agent_id
        self.plan_id = plan
        self.task_id = req.task_id
        self.action = f"{req.surface}.{req.action}"
        # Raw until a UI is told of the call, then masked once (`masked_args`).
        self.args = _args_kept(req.args_json)
        self.masked: tuple[tuple[str, int], tuple[str, ...]] | None = None
        # Once finished: the result's status, duration, decision, result and error
        # texts, blob size and its telemetry's fields.
        self.end: tuple[Any, ...] | None = None

    def finish(self, result: pb.ActionResult, blob_bytes: int) -> None:
        inv = result.invocation
        failed = result.status == pb.ActionResult.ERROR
        self.end = (
            result.error.code if failed else "ok",
            inv.duration_ms,
            inv.decision,
            # As kept at rest (an http_fetch's Set-Cookie masked): masked as text too
            # once a UI is told of it (`row`).
            _kept("" if failed else result.result_json_at_rest or result.result_json),
            blob_bytes,
            _kept(result.error.message if failed else ""),
            # The telemetry's fields (TELEMETRY_FIELDS), made a row's dict when shown.
            (inv.scope, inv.bytes_in, inv.bytes_out, inv.truncated, inv.sandboxed, inv.args_digest),
        )

    def masked_args(self) -> tuple[tuple[str, int], tuple[str, ...]]:
        """The args as a row shows them, masked as a recording keeps them
        (redaction.args_masked), and the passwords their argv holds: a row is drawn on
        a screen other agents' screenshots may read (review26 H6). Made once, when a UI
        is first told of the call (most calls are never shown)."""
        if self.masked is None:
            head, length = self.args
            cut = head_masked(head) if length > len(head) else None
            if cut is not None:  # by its whole members: an argv's flags and values
                shown, secrets = cut
                self.masked = (known_masked(shown, secrets)[:RESULT_PREVIEW], length), secrets
            else:
                shown = args_masked(head)[:RESULT_PREVIEW]
                self.masked = (shown, length), argv_secrets(head)
        return self.masked

    def row(self) -> dict[str, Any]:
        """The call as a UI shows it: plain JSON-able data, every text made inert and
        the args and result masked (the raw plan id besides, as a key)."""
        args, secrets = self.masked_args()
        row: dict[str, Any] = {
            "id": self.id,
            "started_ms": self.started_ms,
            "agent_id": inert(self.agent_id, 200),
            "plan_id": inert(self.plan_id, 200),
            # The plan id whole, as the server sent it: a key, never drawn. A UI's kill
            # and lift act on it (the shown plan_id is cut and escaped: two plans'
            # ids may show alike).
            "plan_raw": self.plan_id,
            "task_id": inert(self.task_id, 200),
            "action": inert(self.action, 200),
            "status": "running",
            "duration_ms": None,
            "args": _shown(args),
        }
        if self.end is not None:
            status, duration_ms, decision, result, blob_bytes, error, telemetry = self.end
            row.update(
                {
                    "status": status,
                    "duration_ms": duration_ms,
                    "decision": inert(decision, 200),
                    "result": _shown(_masked(result, secrets)),
                    "blob_bytes": blob_bytes,
                    "error": _shown(error),
                    "telemetry": dict(zip(_TELEMETRY_FIELDS, telemetry, strict=True)),
                }
            )
        return row


class Console:
    def __init__(
        self,
        dispatcher: Dispatcher,
        broker: ApprovalBroker | None,
        *,
        server: str,
        mode: str,
        static_grants: tuple[Grant, ...] = (),
        first_steps: tuple[str, ...] = (),
    ) -> None:
        self.dispatcher = dispatcher
        self.broker = broker
        self.server = server
        self.mode = mode
        self.static_grants = static_grants
        # Commands to try, shown by a UI while no call came (`up`'s ready line's).
        self.first_steps = first_steps
        self.link = LinkState("connecting", server)
        # The recent calls, kept as they came and made into a UI's rows (every text made
        # inert) only when a UI is told of them: most calls of a worker with no UI
        # attached are never shown, and their rows cost 25-30 us of each call.
        self._calls: collections.OrderedDict[str, _Seen] = collections.OrderedDict()
        # plan -> calls seen (this run), the least recently called first
        self._plans: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._running: dict[str, str] = {}  # call id -> plan, started and not finished
        self._running_plans: collections.Counter[str] = collections.Counter()
        self._subscribers: list[Subscriber] = []
        # Pausing is the global stop's; set by the assembly when there is one.
        self.pause: Callable[[bool, str], None] | None = None
        self.paused: Callable[[], bool] = lambda: False
        # Lifts waiting for the person's confirmation (id -> plan), each dropped by a
        # timer CONFIRM_LIFT_S after it was asked.
        self._lifts: dict[str, str] = {}
        # Told when lifts start or stop waiting (the assembly holds desktop input).
        self.on_confirming: Callable[[], None] = lambda: None
        # The attached UIs that answer prompts, and the redraw they are asked to
        # confirm (`screens_drawn`): (its number, confirmations still due, then, timer).
        self._asking_uis = 0
        self._draws = 0
        self._draw: tuple[int, int, Callable[[], None], asyncio.TimerHandle] | None = None
        dispatcher.watcher = self
        if broker is not None:
            broker.listeners.append(self._on_prompt)

    # ------------------------------------------------------------- subscribers

    def subscribe(self, subscriber: Subscriber, *, asks: bool = True) -> Event:
        """Start telling `subscriber`; returns the snapshot to start from. A UI that
        `asks` (answers prompts) counts as attached for the broker."""
        self._subscribers.append(subscriber)
        if asks:
            self._asking_uis += 1
            if self.broker is not None and not self.broker.always_attached:
                self.broker.attach()
        return self.snapshot()

    def unsubscribe(self, subscriber: Subscriber, *, asks: bool = True) -> None:
        if subscriber in self._subscribers:
            self._subscribers.remove(subscriber)
            if asks:
                self._asking_uis -= 1
                if self.broker is not None and not self.broker.always_attached:
                    self.broker.detach()
                if self._draw is not None:  # a UI gone shows nothing any more
                    self._drawn(self._draw[0])

    def screens_drawn(self, then: Callable[[], None]) -> bool:
        """Ask each attached UI to say once its screen shows what it was told so far
        (a prompt that closed, off it), and call `then` once all have, or DRAWN_WITHIN_S
        from now at the latest (a UI that never says: an older one, or hung). The
        desktop stays held meanwhile: released as a prompt closed, a screenshot showed
        it still drawn (review26 H9). False, and `then` never called, with no UI
        attached. A newer ask replaces one still waiting. On the loop's thread."""
        if self._draw is not None:
            self._draw[3].cancel()
            self._draw = None
        if self._asking_uis <= 0:
            return False
        self._draws += 1
        seq = self._draws
        timer = asyncio.get_running_loop().call_later(DRAWN_WITHIN_S, self._drawn_late, seq)
        self._draw = (seq, self._asking_uis, then, timer)
        # Told after what the UIs are told of the same prompt event (the console's own
        # listener may come after the caller's): the prompt's close reaches them first.
        asyncio.get_running_loop().call_soon(self._tell, {"type": "draw_check", "seq": seq})
        return True

    def _drawn(self, seq: object) -> None:
        """One UI's screen is drawn up to the ask `seq` (or it went)."""
        if self._draw is None or self._draw[0] != seq:
            return
        _seq, due, then, timer = self._draw
        if due > 1:
            self._draw = (seq, due - 1, then, timer)
            return
        timer.cancel()
        self._draw = None
        then()

    def _drawn_late(self, seq: int) -> None:
        if self._draw is None or self._draw[0] != seq:
            return
        log.warning(
            "%d UI(s) did not say within %g s that a closed prompt is off their screen; "
            "the desktop is let go all the same",
            self._draw[1],
            DRAWN_WITHIN_S,
        )
        then = self._draw[2]
        self._draw = None
        then()

    def _tell_plan(self, plan: str) -> None:
        """A UI is told of the one plan that changed (its row, or None: no longer
        listed), never the whole list: with thousands of kills that list was megabytes
        at every call's start and end."""
        if self._subscribers:
            self._tell({"type": "plan", "raw": plan, "plan": self._plan_row(plan)})

    def plans_changed(self, plans: Iterable[str]) -> None:
        for plan in plans:
            self._tell_plan(plan)

    def _tell(self, event: Event) -> None:
        if event.get("type") not in ("call", "plan"):  # their rows are built inert
            event = outgoing(event)
        for subscriber in list(self._subscribers):
            try:
                subscriber(event)
            except Exception:
                log.exception("a console subscriber failed; dropping it")
                self._subscribers.remove(subscriber)

    def snapshot(self) -> Event:
        return {
            "type": "snapshot",
            "worker": outgoing(self.worker_info()),
            "link": outgoing(self._link()),
            "calls": [seen.row() for seen in self._calls.values()],
            "plans": self.plans(),
            "grants": outgoing(self.grants()),
            "prompts": outgoing(
                [p.to_dict() for p in self.broker.pending()] if self.broker else []
            ),
            "paused": self.paused(),
        }

    def worker_info(self) -> dict[str, Any]:
        return {
            "worker_id": inert(self.dispatcher.worker_id, 200),
            "server": inert(self.server, 200),
            "mode": self.mode,
            "prompts": self.broker is not None,
            "first_steps": list(self.first_steps),
        }

    # ------------------------------------------------------------- what happens

    def set_link(self, link: LinkState) -> None:
        self.link = link
        self._tell({"type": "link", "link": self._link()})

    def _link(self) -> dict[str, Any]:
        """The link's state; its detail may be the server's text (a refusal's details)."""
        return {**self.link.to_dict(), "detail": inert(self.link.detail, LINK_DETAIL)}

    def call_started(self, req: pb.ActionRequest) -> None:
        # Each read of a protobuf field makes a new str: read once.
        cid, plan = req.correlation_id, req.plan_id
        seen = _Seen(req, int(time.time() * 1000), cid, plan)
        self._remember(seen)
        self._running[cid] = plan
        self._running_plans[plan] += 1
        self._count_call(plan)
        if self._subscribers:
            self._tell({"type": "call", "call": seen.row()})
            self._tell_plan(plan)

    def call_finished(
        self, req: pb.ActionRequest, result: pb.ActionResult, blob_bytes: int
    ) -> None:
        cid, plan = req.correlation_id, req.plan_id
        seen = self._calls.get(cid)
        if self._running.pop(cid, None) is not None:
            left = self._running_plans[plan] - 1
            if left <= 0:
                del self._running_plans[plan]
            else:
                self._running_plans[plan] = left
        if seen is None:  # started before we watched, or dropped from the recent rows
            seen = _Seen(req, result.invocation.started_unix_ms, cid, plan)
            self._count_call(plan)
        seen.finish(result, blob_bytes)
        self._remember(seen)
        if self._subscribers:
            self._tell({"type": "call", "call": seen.row()})
            self._tell_plan(plan)

    def pause_changed(self) -> None:
        """The global stop was set or lifted (here, by `agentworker pause`, a hotkey)."""
        self._tell({"type": "paused", "paused": self.paused()})

    def _remember(self, seen: _Seen) -> None:
        self._calls[seen.id] = seen
        self._calls.move_to_end(seen.id)
        while len(self._calls) > RECENT_CALLS:
            self._calls.popitem(last=False)

    def _on_prompt(self, kind: str, body: dict[str, Any]) -> None:
        self._tell({"type": kind, "prompt": body})

    def _count_call(self, plan: str) -> None:
        self._plans[plan] = self._plans.get(plan, 0) + 1
        self._plans.move_to_end(plan)
        if len(self._plans) <= RECENT_PLANS:
            return
        # The least recently called plan with no call running leaves the list.
        gone = next((p for p in self._plans if p not in self._running_plans), None)
        if gone is not None:
            del self._plans[gone]
            self._tell_plan(gone)

    def _plan_row(self, plan: str, reason: str | None = None) -> dict[str, Any] | None:
        if reason is None:
            reason = self.dispatcher.state.killed(plan)  # cached, but for kills kept apart
        calls = self._plans.get(plan)
        if reason is None and calls is None:
            return None
        running = self._running_plans.get(plan, 0)
        return {
            "plan_id": inert(plan, 200),
            "raw": plan,
            "state": "killed" if reason is not None else "running" if running else "idle",
            "running": running,
            "calls": calls or 0,
            "reason": inert(reason or "", 300),
        }

    def plans(self) -> list[dict[str, Any]]:
        """Every plan a UI lists: the recent ones, then the killed ones."""
        killed = dict(self.dispatcher.state.killed_plans())
        rows = []
        for plan in dict.fromkeys([*self._plans, *killed]):
            row = self._plan_row(plan, killed.get(plan))
            if row is not None:
                rows.append(row)
        return rows

    def grants(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = [  # the config file's: its text, made inert as well
            {
                "id": None,
                "agent": inert(g.agent, 200),
                "scope": inert(g.scope, 300),
                "plan": inert(g.plan, 200),
                "expires_ms": int(g.expires.timestamp() * 1000) if g.expires else None,
                "granted_by": inert(g.granted_by, 100),
            }
            for g in self.static_grants
        ]
        for g in self.dispatcher.state.grants():
            rows.append(
                {
                    "id": g.id,
                    "agent": inert(g.agent, 200),
                    "scope": inert(g.scope.removeprefix(ASK_PREFIX), 300),
                    "ask": g.scope.startswith(ASK_PREFIX),
                    "plan": inert(g.plan, 200),
                    "expires_ms": int(g.expires.timestamp() * 1000) if g.expires else None,
                    "granted_by": inert(g.granted_by, 100),
                }
            )
        now = time.time() * 1000
        return [r for r in rows if r["expires_ms"] is None or r["expires_ms"] > now]

    # ------------------------------------------------------------- what a UI does

    def handle(self, command: dict[str, Any]) -> dict[str, Any]:
        """One command from a UI; the reply says what happened (or the error), inert."""
        reply: dict[str, Any] = outgoing(self._handle(command))
        return reply

    def _handle(self, command: dict[str, Any]) -> dict[str, Any]:
        op = command.get("op")
        try:
            if op == "decide":
                return self._decide(command)
            if op == "drawn":
                self._drawn(command.get("seq"))
                return {"ok": True}
            if op == "kill":
                plan = _text(command, "plan")
                stopped = self.dispatcher.kill_plan(plan, "killed from the UI", "ui")
                return {"ok": True, "stopped": stopped}
            if op == "lift":
                return self._ask_to_lift(_text(command, "plan"))
            if op == "confirm_lift":
                return self._confirm_lift(_text(command, "confirm"), command.get("yes") is True)
            if op == "revoke":
                grant_id = command.get("grant_id")
                if not isinstance(grant_id, int):
                    raise WorkerError("validation_error", "revoke needs a grant_id")
                removed = self.dispatcher.state.revoke_grant(grant_id)
                if removed:
                    self.dispatcher.telemetry.audit("revoke", detail={"grant_id": grant_id})
                self._tell({"type": "grants", "grants": self.grants()})
                return {"ok": removed}
            if op == "grants":
                return {"ok": True, "grants": self.grants()}
            if op in ("pause", "resume"):
                if self.pause is None:
                    raise WorkerError("not_supported", "this worker has no global stop")
                self.pause(op == "pause", "from the UI")
                self._tell({"type": "paused", "paused": self.paused()})
                return {"ok": True, "paused": self.paused()}
            raise WorkerError("validation_error", f"unknown op {op!r}")
        except WorkerError as exc:
            return {"ok": False, "code": exc.code, "message": exc.message}

    def confirming(self) -> bool:
        """A lift waits for the person's confirmation."""
        return bool(self._lifts)

    def _ask_to_lift(self, plan: str) -> dict[str, Any]:
        """The first step of a lift: nothing is lifted yet; the UI asks the person to
        confirm (`confirm_lift` with the id returned), and input is held meanwhile."""
        if self.dispatcher.state.killed(plan) is None:
            return {"ok": False, "message": "that plan was not killed"}
        confirm = secrets.token_hex(8)
        self._lifts[confirm] = plan
        asyncio.get_running_loop().call_later(CONFIRM_LIFT_S, self._drop_lift, confirm)
        self.on_confirming()
        return {"ok": False, "confirm": confirm, "plan": plan, "within_s": CONFIRM_LIFT_S}

    def _drop_lift(self, confirm: str) -> str | None:
        plan = self._lifts.pop(confirm, None)
        if plan is not None:
            self.on_confirming()
        return plan

    def _confirm_lift(self, confirm: str, yes: bool) -> dict[str, Any]:
        plan = self._drop_lift(confirm)
        if plan is None:
            return {"ok": False, "message": "that confirmation is no longer waiting; press l again"}
        if not yes:
            return {"ok": False, "message": "the kill stays"}
        lifted = self.dispatcher.state.lift_kill(plan)
        if lifted:
            self.dispatcher.telemetry.audit("lift", plan_id=plan, detail={"by": "ui"})
            self._tell_plan(plan)
        return {"ok": lifted}

    def _decide(self, command: dict[str, Any]) -> dict[str, Any]:
        if self.broker is None:
            raise WorkerError("not_supported", "this worker never prompts")
        try:
            choice = Choice(str(command.get("choice")))
        except ValueError:
            raise WorkerError(
                "validation_error", "choice must be one of: " + ", ".join(Choice)
            ) from None
        period = command.get("period_s")
        if period is not None and not (
            isinstance(period, int | float) and 0 < period <= 30 * 86400
        ):
            raise WorkerError(
                "validation_error", "period_s must be a number of seconds (≤ 30 days)"
            )
        calls = command.get("waiting")
        if calls is not None and not (isinstance(calls, int) and not isinstance(calls, bool)):
            raise WorkerError("validation_error", "waiting must be the number of calls shown")
        resolution = self.broker.decide(
            _text(command, "prompt_id"),
            Decision(choice, float(period) if period else None, calls=calls),
        )
        if resolution is None:
            return {"ok": False, "code": "not_found", "message": "that prompt is no longer waiting"}
        if resolution.grant is not None and choice is not Choice.ONCE:
            self._tell({"type": "grants", "grants": self.grants()})
        return {"ok": True, "granted": resolution.grant is not None}


def _text(command: dict[str, Any], key: str) -> str:
    value = command.get(key)
    if not isinstance(value, str):
        raise WorkerError("validation_error", f"{key} must be a string")
    return value


def encode(event: Event) -> bytes:
    """One event or command as a line of the local socket's protocol."""
    return json.dumps(event, ensure_ascii=True, separators=(",", ":")).encode() + b"\n"


class Link(Protocol):
    """How a UI reaches a console: in this process (LocalLink) or over the local
    socket (console_socket.SocketLink). Events arrive on the caller's event loop."""

    async def open(self, on_event: Subscriber) -> Event:
        """Start receiving events; returns the snapshot to start from."""
        ...

    async def command(self, command: dict[str, Any]) -> dict[str, Any]: ...

    async def close(self) -> None: ...


class LocalLink:
    """The TUI in the worker's own process: straight calls, same event loop."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._subscriber: Subscriber | None = None

    async def open(self, on_event: Subscriber) -> Event:
        self._subscriber = on_event
        return self.console.subscribe(on_event)

    async def command(self, command: dict[str, Any]) -> dict[str, Any]:
        return self.console.handle(command)

    async def close(self) -> None:
        if self._subscriber is not None:
            self.console.unsubscribe(self._subscriber)
            self._subscriber = None
