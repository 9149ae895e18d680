"""The approval broker: where a call that needs the person waits for their answer.

Four things ask: a server's ScopeRequest (and so the hub's RequestScope), a call
outside the granted scopes, and an allowlist `ask` rule. Each becomes a `Prompt`
that waits for whichever UI is attached — the TUI in this process or
`agentworker ui` over the local socket. A call's prompt shows the call whole
(worker.core.prompt_text); pending asks share one prompt only when they are the same
call, args and blob alike; prompts queue in arrival order and none is dropped while
another is open.

The person's answer is turned into effects here and nowhere else: a grant stored
where the choice grants (for this plan, for this agent for a period), an audit
event, and for "deny and kill" the plan's kill. With no UI attached the worker
behaves as headless: a new ask is refused with `scope_required` at once, and a
prompt whose UI went away is refused so once its timeout passes (should a UI
attach meanwhile, it is shown there). A prompt a UI showed and nobody answered in
time is a denial.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import hashlib
import logging
import re
import shlex
import time
import unicodedata
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from worker import ids
from worker.core import prompt_text
from worker.core.ledger import State
from worker.core.scopes import ASK_PREFIX, ApprovalRequest, Grant, scope_required
from worker.core.telemetry import Telemetry
from worker.errors import WorkerError
from worker.wire.proto import agentworker_pb2 as pb

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S: Final = 60.0
PREVIEW_LIMIT: Final = 2000
REASON_LIMIT: Final = 500
# A server's ScopeRequests waiting for the person at once, at most; more are refused
# at once ("busy"). Each is a question on the person's screen: a server asking more
# than this at a time floods them (and the worker's memory), it does not inform.
MAX_WAITING_SCOPE_REQUESTS: Final = 64
# ... and of one agent's, at most: one agent's flood must not take every place.
MAX_WAITING_PER_AGENT: Final = 16
# One agent's calls that wait for the person (out of its scopes, or an ask rule's), on
# prompts of their own, at most: the person answers about one a second, so one agent's
# flood of distinct calls (a plan each) pushed every other agent's prompt past its
# timeout (review27 I4). Past it a call is answered `busy` at once; one asking what a
# waiting prompt asks joins it, as always.
MAX_PROMPTS_PER_AGENT: Final = 16
# ... and of all agents' calls, at most: the agent a call names is the server's word,
# and a holder of hub.token named a new agent for each call, past every per-agent
# bound (review28 L1). Past it a call is answered `busy` at once, whatever agent it
# names; the prompts waiting stay. Eight agents at their own bound: a person answers
# about one a second, so more than this is a flood they cannot read within a prompt's
# timeout (60 s by default), not questions they can answer.
MAX_PROMPTS_WAITING: Final = 128
# A ScopeRequest naming more scopes than this is refused: no person reads them all.
MAX_SCOPES_ASKED: Final = 32
# A scope longer than this in a ScopeRequest is refused: a prompt shows each scope
# whole (the longest real one, surface and action, is about 30 characters).
MAX_SCOPE_CHARS: Final = 100
# Agent and plan ids longer than this in a ScopeRequest are refused (a grant names
# them whole, so they cannot be cut), as are ids worker.ids.id_problem refuses.
MAX_ID_CHARS: Final = ids.MAX_ID_CHARS

# Approving one of these "for this plan" or "for this agent" grants the others too:
# they read and change nothing, so a person who let an agent list a folder is not
# asked again for each file it reads there (fewer prompts, same safety;
# docs/architecture.md, "Scopes, approvals and the kill switch").
# The prompt names every scope such a choice grants.
READ_ONLY_HOST: Final = ("workerHost.fs_list", "workerHost.fs_read", "workerHost.fs_stat")
FAMILIES: Final = {scope: READ_ONLY_HOST for scope in READ_ONLY_HOST}


class Choice(enum.StrEnum):
    ONCE = "once"
    PLAN = "plan"
    AGENT = "agent"
    DENY = "deny"
    KILL = "deny_kill"


class Kind(enum.StrEnum):
    SCOPE_REQUEST = "scope_request"  # the server asks ahead of its calls
    OUT_OF_SCOPE = "out_of_scope"  # a call arrived without a grant
    ASK_RULE = "ask_rule"  # an allowlist rule wants the person each time


@dataclass(frozen=True)
class Decision:
    choice: Choice
    period_s: float | None = None  # for Choice.AGENT
    by: str = "ui"
    # How many calls the prompt showed waiting when the person answered (`waiting`):
    # "once" lets through that many, the first to ask; None, all that wait.
    calls: int | None = None


# ---------------------------------------------------------------- inert text

# What `inert` escapes: controls (C0, C1), every format character, surrogate, private
# use character (a font's own glyph) and line or paragraph separator (Unicode's
# categories Cf, Cs, Co, Zl, Zp: HIDDEN_CATEGORIES; a unit test holds this list to
# them), and what Unicode calls default-ignorable (drawn as nothing). A shorter hand
# list missed U+E0100 (the variation selectors supplement), U+034F and U+1D173: the
# agent's `python3 check.py` + U+E0100 drew as the reviewed `python3 check.py`
# (review25 G7). As a character class, not a test of each character: a row of 2,000
# CJK characters took 823 us that way, 7 us so. Unassigned code points (Cn): see
# `_unassigned_escaped`.
HIDDEN_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Co", "Zl", "Zp"})
_HIDDEN: Final = (
    "\x00-\x1f\x7f-\x9f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e"
    "\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ud800-\uf8ff\ufeff\ufff9-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U00013438\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0001\U000e0020-\U000e007f\U000f0000-\U000ffffd\U00100000-\U0010fffd"
)
DEFAULT_IGNORABLE: Final = (
    "\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u2065\u3164\ufe00-\ufe0f\uffa0"
    "\ufff0-\ufff8\U000e0000-\U000e0fff"
)
_ESCAPED: Final = re.compile(f"[{_HIDDEN}{DEFAULT_IGNORABLE}]")
_NAMED: Final = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\x1b": "\\e"}


def inert(text: str, limit: int | None = PREVIEW_LIMIT, left_out: int = 0) -> str:
    """`text` as something safe to put on a terminal: every control, escape, bidi
    and invisible character shown as a visible escape (`\\e`, `\\n`, `\\u202e`), so
    nothing an agent sends can move the cursor, recolour, clear or spoof the screen
    or a line of the prompt. Cut at `limit` characters (with a note counting them and
    the `left_out` characters already cut off its end); None: whole."""
    if limit is None:
        return _unassigned_escaped(_ESCAPED.sub(_escape, text))
    more = max(0, len(text) - limit) + left_out
    shown = _unassigned_escaped(_ESCAPED.sub(_escape, text[:limit]))
    return shown + (f" … (+{more:,} chars)" if more else "")


def _unassigned_escaped(text: str) -> str:
    """`text` with every code point this Python's Unicode leaves unassigned (category
    Cn) escaped too: a terminal with a newer Unicode may draw one as nothing. Only
    text that `isprintable` (C speed) doubts is walked: after `_ESCAPED`, that is
    text with a space other than " " (kept) or an unassigned code point."""
    if text.isprintable():
        return text
    return "".join(
        _escape_char(char) if unicodedata.category(char) == "Cn" else char for char in text
    )


def _kept(text: str, limit: int) -> tuple[str, int]:
    """`text` cut to what a prompt can show, and how many characters were cut."""
    return text[:limit], max(0, len(text) - limit)


def _escape(match: re.Match[str]) -> str:
    return _escape_char(match.group())


def _escape_char(char: str) -> str:
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return (
        f"\\x{code:02x}"
        if code < 0x100
        else f"\\u{code:04x}"
        if code < 0x10000
        else f"\\U{code:08x}"
    )


# ---------------------------------------------------------------- prompts

# A scope the server may ask for: surface.action, wildcards allowed (as the CLI takes).
_SCOPE: Final = re.compile(r"[A-Za-z*]+\.[A-Za-z_*?]+")


@dataclass
class Prompt:
    """One question to the person; several identical waiting asks share it.

    Fields hold what the asker sent; `to_dict` is what a UI shows (all of it inert).
    A call's prompt shows the call whole (`preview`, worker.core.prompt_text); asks
    share a prompt only when their calls are the same, blob included (`identity`).
    A ScopeRequest's preview is the server's own words, shown cut.
    """

    id: str
    kind: Kind
    agent_id: str
    plan_id: str
    scopes: tuple[str, ...]
    reason: str
    preview: str
    created_ms: int
    deadline_ms: int
    identity: str = ""  # the call's args and blob (prompt_text.identity); "" for a scope request
    # Characters of a ScopeRequest's reason and preview cut off on arrival (a prompt
    # shows REASON_LIMIT and PREVIEW_LIMIT of them: the rest is never kept).
    left_out: tuple[int, int] = (0, 0)
    correlation_ids: list[str] = field(default_factory=list)
    shown: bool = False  # a UI was attached while it waited
    waiters: list[asyncio.Future[Resolution]] = field(default_factory=list, repr=False)

    @property
    def key(self) -> tuple[str, ...]:
        return (
            self.kind,
            self.agent_id,
            self.plan_id,
            *self.scopes,
            self.reason,
            self.preview,
            self.identity,
        )

    @property
    def grants(self) -> tuple[str, ...]:
        """What "for this plan" / "for this agent" grants (scope families included)."""
        return granted_by_choice(self.scopes) if self.kind is not Kind.ASK_RULE else self.scopes

    def choices(self) -> tuple[Choice, ...]:
        if self.kind is Kind.SCOPE_REQUEST:  # no call of its own to let through once
            return (Choice.PLAN, Choice.AGENT, Choice.DENY, Choice.KILL)
        return (Choice.ONCE, Choice.PLAN, Choice.AGENT, Choice.DENY, Choice.KILL)

    def view(self) -> str:
        """The preview as a UI shows it. A call's is whole (its size was checked before
        it was asked about), its line breaks its own (prompt_text), each line inert; a
        ScopeRequest's is the server's words, on one line and cut."""
        if self.kind is Kind.SCOPE_REQUEST:
            return inert(self.preview, PREVIEW_LIMIT, self.left_out[1])
        return "\n".join(inert(line, None) for line in self.preview.split("\n"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": str(self.kind),
            "agent_id": inert(self.agent_id, 200),
            # The agent whole, for a UI to group its prompts by: the id above is cut and
            # escaped, and two agents' ids may read alike.
            "agent_key": hashlib.sha256(self.agent_id.encode("utf-8", "surrogatepass")).hexdigest()[
                :32
            ],
            "plan_id": inert(self.plan_id, 200),
            "scopes": [inert(s.removeprefix(ASK_PREFIX), 300) for s in self.scopes],
            "reason": inert(self.reason, REASON_LIMIT, self.left_out[0]),
            "preview": self.view(),
            "waiting": max(1, len(self.waiters)),
            "created_ms": self.created_ms,
            "deadline_ms": self.deadline_ms,
            "grants": [inert(s.removeprefix(ASK_PREFIX), 300) for s in self.grants],
            "choices": [str(c) for c in self.choices()],
        }


@dataclass(frozen=True)
class Resolution:
    """How a prompt ended: the grant given (None for a refusal), and why."""

    grant: Grant | None
    choice: Choice | None  # None: nobody chose (a timeout, a withdrawal, covered)
    reason: str
    headless: bool = False  # refused because no UI was there to ask

    def admit(self, what: str) -> Grant:
        """The grant, or the refusal as the call's error."""
        if self.grant is not None:
            return self.grant
        if self.headless:
            raise WorkerError(
                "scope_required",
                f"{what} needs the approval of the person at this worker, and no one was "
                "there to ask (no UI attached: run `agentworker ui` on that machine, or grant "
                f"it ahead: agentworker grant {shlex.quote(what)} --agent AGENT --plan PLAN)",
                {"needs_approval": what},
            )
        raise WorkerError(
            "scope_denied", f"the person denied {what} ({self.reason})", {"denied": what}
        )


Listener = Callable[[str, dict[str, Any]], None]


class ApprovalBroker:
    """The `Approver` of a worker a person can be asked at (see the module summary)."""

    def __init__(
        self,
        state: State,
        telemetry: Telemetry,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        always_attached: bool = False,
    ) -> None:
        self.state = state
        self.telemetry = telemetry
        self.timeout_s = timeout_s
        # The TUI in this process is attached for the worker's whole life.
        self.always_attached = always_attached
        self.attached = 0  # UIs attached over the local socket
        self._prompts: dict[str, Prompt] = {}  # in arrival order
        self._by_key: dict[tuple[str, ...], Prompt] = {}  # the same, by what they ask
        # ScopeRequests waiting for an answer (see scope_request), in all and by agent
        self._scope_requests = 0
        self._scope_requests_of: collections.Counter[str] = collections.Counter()
        self._prompts_of: collections.Counter[str] = collections.Counter()  # open, by agent
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self.listeners: list[Listener] = []
        # Set by the assembly once the dispatcher exists (it owns kills and the wire).
        self.kill: Callable[[str, str, str], object] = lambda _plan, _reason, _by: None
        self.emit_audit: Callable[[pb.AuditEvent], None] = lambda _event: None
        # Told the id of each call that starts to wait on a prompt (the server may tell
        # its caller, who may be the person asked: `agentworker call` says so).
        self.on_waiting: Callable[[str], None] = lambda _correlation_id: None

    # ------------------------------------------------------------- asking

    @property
    def can_ask(self) -> bool:
        return self.always_attached or self.attached > 0

    def pending(self) -> list[Prompt]:
        return list(self._prompts.values())

    def waiting(self) -> int:
        """How many prompts wait (without listing them)."""
        return len(self._prompts)

    async def ask(self, request: ApprovalRequest) -> Grant | None:
        """The pipeline's question (the Approver protocol): the grant given, None for
        a denial; WorkerError(scope_required) when no one could be asked."""
        kind = Kind.ASK_RULE if request.scope.startswith(ASK_PREFIX) else Kind.OUT_OF_SCOPE
        same_call = ""
        if self.can_ask:
            # As Prompt.view counts it; escaping only lengthens a text, so one already
            # too long is not escaped first (a 0.9 MiB ask held the loop 190-347 ms
            # walking its characters: review26).
            shown = len(request.preview)
            if shown <= prompt_text.SHOW_LIMIT:
                shown = len(inert(request.preview, None))
            if shown > prompt_text.SHOW_LIMIT:
                raise too_long_to_show(request, kind, shown)
            same_call = await prompt_text.identity(request.preview, request.blob)
        resolution = await self.request(
            kind,
            agent_id=request.agent_id,
            plan_id=request.plan_id,
            scopes=(request.scope,),
            reason=request.reason,
            preview=request.preview,
            correlation_id=request.correlation_id,
            identity=same_call,
            bounded=True,
        )
        if resolution.headless and kind is Kind.OUT_OF_SCOPE:
            raise scope_required(request)
        if resolution.headless:
            resolution.admit(request.scope.removeprefix(ASK_PREFIX))
        return resolution.grant

    async def scope_request(self, request: pb.ScopeRequest) -> pb.ScopeDecision:
        """A server's ScopeRequest, answered as the ScopeDecision that goes back."""
        # Each scope once (a prompt lists each once; review10 02 padded the list with
        # repeats), in the order asked.
        scopes = tuple(dict.fromkeys(request.scopes[:MAX_SCOPES_ASKED]))
        refusal = _not_askable(request)
        if refusal is not None:
            resolution = Resolution(None, None, refusal)
        elif self.can_ask and self._scope_requests >= MAX_WAITING_SCOPE_REQUESTS:
            resolution = Resolution(
                None,
                None,
                f"busy: {self._scope_requests} scope requests already wait for the person at "
                "this worker (the most it keeps); ask again once they are answered",
            )
        elif self.can_ask and self._scope_requests_of[request.agent_id] >= MAX_WAITING_PER_AGENT:
            resolution = Resolution(
                None,
                None,
                f"busy: {MAX_WAITING_PER_AGENT} scope requests of agent "
                f"{inert(request.agent_id, 200)!r} already wait for the person at this worker "
                "(the most it keeps for one agent); ask again once they are answered",
            )
        else:
            reason, reason_cut = _kept(request.reason, REASON_LIMIT)
            preview, preview_cut = _kept(request.preview, PREVIEW_LIMIT)
            self._scope_requests += 1
            self._scope_requests_of[request.agent_id] += 1
            try:
                resolution = await self.request(
                    Kind.SCOPE_REQUEST,
                    agent_id=request.agent_id,
                    plan_id=request.plan_id,
                    scopes=scopes,
                    reason=reason,
                    preview=preview,
                    left_out=(reason_cut, preview_cut),
                )
            finally:
                self._scope_requests -= 1
                self._scope_requests_of[request.agent_id] -= 1
                if not self._scope_requests_of[request.agent_id]:
                    del self._scope_requests_of[request.agent_id]
        if resolution.headless:
            reason = (
                "no one could be asked (no UI attached at the worker); grants are made "
                "there: `agentworker ui`, `agentworker grant` or config.toml"
            )
        else:
            reason = resolution.reason
        return pb.ScopeDecision(
            request_id=request.request_id,
            granted=resolution.grant is not None,
            scopes=scopes,
            reason=reason,
        )

    async def request(
        self,
        kind: Kind,
        *,
        agent_id: str,
        plan_id: str,
        scopes: tuple[str, ...],
        reason: str = "",
        preview: str = "",
        correlation_id: str = "",
        identity: str = "",
        left_out: tuple[int, int] = (0, 0),
        bounded: bool = False,
    ) -> Resolution:
        """Wait for the person's answer to one question (shared with identical ones).
        `bounded`: WorkerError(busy) rather than a new prompt past the agent's
        MAX_PROMPTS_PER_AGENT (a call's question; a ScopeRequest has bounds of its own)."""
        if not self.can_ask:
            return Resolution(None, None, "no UI attached", headless=True)
        waiter: asyncio.Future[Resolution] = asyncio.get_running_loop().create_future()
        prompt = self._open(
            kind,
            agent_id,
            plan_id,
            scopes,
            reason,
            preview,
            correlation_id,
            identity,
            left_out,
            waiter,
            bounded,
        )
        if correlation_id:
            self.on_waiting(correlation_id)
        try:
            return await waiter
        except asyncio.CancelledError as stopped:
            # The call went away (its deadline, a cancel, a kill), or the server's
            # request did (its stream ended: the cancel says so): stop asking for it,
            # on the prompt it waits on now ("once" for fewer calls moves the others
            # to a prompt of their own, `_rest`).
            why = str(stopped.args[0]) if stopped.args else "the call ended"
            prompt = next((p for p in self._prompts.values() if waiter in p.waiters), prompt)
            with contextlib.suppress(ValueError):
                prompt.waiters.remove(waiter)
            with contextlib.suppress(ValueError):
                prompt.correlation_ids.remove(correlation_id)
            if not prompt.waiters and prompt.id in self._prompts:
                self._close(prompt, Resolution(None, None, f"withdrawn: {why}"))
            elif prompt.id in self._prompts:
                self._tell("prompt", prompt.to_dict())
            raise

    def _open(
        self,
        kind: Kind,
        agent_id: str,
        plan_id: str,
        scopes: tuple[str, ...],
        reason: str,
        preview: str,
        correlation_id: str,
        identity: str,
        left_out: tuple[int, int],
        waiter: asyncio.Future[Resolution],
        bounded: bool = False,
    ) -> Prompt:
        now = _now_ms()
        fresh = Prompt(
            id=uuid.uuid4().hex[:12],
            kind=kind,
            agent_id=agent_id,
            plan_id=plan_id,
            scopes=scopes,
            reason=reason,
            preview=preview,
            created_ms=now,
            deadline_ms=now + int(self.timeout_s * 1000),
            identity=identity,
            shown=self.can_ask,
            left_out=left_out,
        )
        key = (*fresh.key, str(left_out))
        prompt = self._by_key.get(key)
        if prompt is not None:  # the same question waits already: one answer for both
            prompt.waiters.append(waiter)
            if correlation_id:
                prompt.correlation_ids.append(correlation_id)
            self._tell("prompt", prompt.to_dict())
            return prompt
        if bounded and self._prompts_of[agent_id] >= MAX_PROMPTS_PER_AGENT:
            raise WorkerError(
                "busy",
                f"{MAX_PROMPTS_PER_AGENT} questions of agent {inert(agent_id, 200)!r} already "
                "wait for the person at this worker (the most kept for one agent, so that "
                "other agents' questions are seen too); ask again once they are answered",
                {"waiting_for_person": MAX_PROMPTS_PER_AGENT},
            )
        if bounded and self._calls_asking() >= MAX_PROMPTS_WAITING:
            raise WorkerError(
                "busy",
                f"{MAX_PROMPTS_WAITING} questions of calls already wait for the person at "
                "this worker (the most kept at once, whichever agents they name); ask again "
                "once they are answered",
                {"waiting_for_person": MAX_PROMPTS_WAITING},
            )
        fresh.waiters.append(waiter)
        if correlation_id:
            fresh.correlation_ids.append(correlation_id)
        self._prompts[fresh.id] = fresh
        self._prompts_of[agent_id] += 1
        self._by_key[key] = fresh
        loop = asyncio.get_running_loop()
        self._timers[fresh.id] = loop.call_later(self.timeout_s, self._expire, fresh.id)
        self._tell("prompt", fresh.to_dict())
        return fresh

    def _calls_asking(self) -> int:
        """Prompts of calls waiting (a ScopeRequest's are counted apart)."""
        return sum(p.kind is not Kind.SCOPE_REQUEST for p in self._prompts.values())

    def _expire(self, prompt_id: str) -> None:
        prompt = self._prompts.get(prompt_id)
        if prompt is None:
            return
        if self.can_ask:
            resolution = Resolution(None, None, f"no answer within {self.timeout_s:g} s")
            self._audit(prompt, "approval_timeout", {"timeout_s": self.timeout_s})
        else:  # the UI that was asked went away: as headless
            resolution = Resolution(None, None, "no UI attached", headless=True)
        self._close(prompt, resolution)

    # ------------------------------------------------------------- answering

    def attach(self) -> list[Prompt]:
        """A UI attached: it is shown every waiting prompt."""
        self.attached += 1
        for prompt in self._prompts.values():
            prompt.shown = True
        return self.pending()

    def detach(self) -> None:
        self.attached = max(0, self.attached - 1)

    def decide(self, prompt_id: str, decision: Decision) -> Resolution | None:
        """The person's answer; None when the prompt is no longer waiting."""
        prompt = self._prompts.get(prompt_id)
        if prompt is None:
            return None
        if decision.choice not in prompt.choices():
            raise WorkerError(
                "validation_error", f"{decision.choice} is not a choice for this prompt"
            )
        by = f"{decision.by}:{decision.choice}"
        if decision.choice in (Choice.DENY, Choice.KILL):
            resolution = Resolution(None, decision.choice, "denied by the person")
            self._audit(prompt, "approval_denied", {"choice": str(decision.choice)})
            self._close(prompt, resolution)
            if decision.choice is Choice.KILL:
                reason = "denied and killed by the person at this worker"
                self.kill(prompt.plan_id, reason, decision.by)
            return resolution
        rest = None
        if decision.choice is Choice.ONCE and decision.calls is not None:
            rest = self._split(prompt, max(1, decision.calls))
        agent, plan = _literal(prompt.agent_id), _literal(prompt.plan_id)
        scope = (
            prompt.scopes[0] if prompt.kind is Kind.SCOPE_REQUEST else _literal(prompt.scopes[0])
        )
        expires: datetime | None = None
        grant_ids: list[int] = []
        if decision.choice is Choice.ONCE:  # this call only: nothing is stored
            grant = Grant(agent=agent, scope=scope, plan=plan, granted_by=by)
        else:
            plan_pattern = plan if decision.choice is Choice.PLAN else "*"
            if decision.choice is Choice.AGENT:
                expires = datetime.now(UTC) + timedelta(seconds=decision.period_s or 3600.0)
            for granted in prompt.grants:
                pattern = granted if prompt.kind is Kind.SCOPE_REQUEST else _literal(granted)
                grant_ids.append(self.state.add_grant(agent, pattern, plan_pattern, expires, by))
            grant = Grant(agent, scope, plan_pattern, expires, by)
        resolution = Resolution(grant, decision.choice, f"approved: {decision.choice}")
        self._audit(
            prompt,
            "approval_granted",
            {
                "choice": str(decision.choice),
                "granted": list(prompt.grants if grant_ids else prompt.scopes),
                "plan": grant.plan,
                "expires": expires.isoformat() if expires else None,
                "grant_ids": grant_ids,
            },
        )
        self._close(prompt, resolution)
        if rest is not None:
            self._reopen(rest)
        if grant_ids:
            self._settle_covered()
        return resolution

    def _split(self, prompt: Prompt, calls: int) -> Prompt | None:
        """ "Once" for the `calls` the person saw: the calls that joined after those
        leave `prompt` for a prompt of their own (`_reopen`), which the person sees
        and answers anew. Before, one "o" on a prompt that showed one call let through
        51 identical appends, 10 of them sent after the key (review10 finding 11)."""
        if len(prompt.waiters) <= calls:
            return None
        now = _now_ms()
        rest = replace(
            prompt,
            id=uuid.uuid4().hex[:12],
            created_ms=now,
            deadline_ms=now + int(self.timeout_s * 1000),
            waiters=prompt.waiters[calls:],
            correlation_ids=prompt.correlation_ids[calls:],
        )
        del prompt.waiters[calls:]
        del prompt.correlation_ids[calls:]
        return rest

    def _reopen(self, rest: Prompt) -> None:
        """The calls "once" did not cover ask again, on a prompt of their own."""
        live = [w for w in rest.waiters if not w.done()]
        if not live:
            return
        rest.waiters = live
        key = (*rest.key, str(rest.left_out))
        self._prompts[rest.id] = rest
        self._prompts_of[rest.agent_id] += 1
        self._by_key[key] = rest
        loop = asyncio.get_running_loop()
        self._timers[rest.id] = loop.call_later(self.timeout_s, self._expire, rest.id)
        self._tell("prompt", rest.to_dict())

    def _settle_covered(self) -> None:
        """Waiting prompts that the grants just made now cover need no answer of their own.

        As `Scopes.allowed` rules: an allowlist ask is answered only by an approval of
        that very ask, never by a scope grant (`*Host.*` or `*.*` match `ask:…` as
        patterns, and the person never saw the command)."""
        now = datetime.now(UTC)
        grants = [
            Grant(g.agent, g.scope, g.plan, g.expires, g.granted_by) for g in self.state.grants()
        ]

        def cover(prompt: Prompt, scope: str) -> Grant | None:
            ask = scope.startswith(ASK_PREFIX)
            return next(
                (
                    g
                    for g in grants
                    if g.scope.startswith(ASK_PREFIX) == ask
                    and g.admits(prompt.agent_id, scope, prompt.plan_id, now)
                ),
                None,
            )

        for prompt in list(self._prompts.values()):
            covering = [cover(prompt, s) for s in prompt.scopes]
            first = covering[0]
            if first is not None and all(covering):
                self._close(prompt, Resolution(first, None, "covered by a grant just made"))

    def _close(self, prompt: Prompt, resolution: Resolution) -> None:
        if self._prompts.pop(prompt.id, None) is not None:
            self._prompts_of[prompt.agent_id] -= 1
            if not self._prompts_of[prompt.agent_id]:
                del self._prompts_of[prompt.agent_id]
        key = (*prompt.key, str(prompt.left_out))
        if self._by_key.get(key) is prompt:
            del self._by_key[key]
        timer = self._timers.pop(prompt.id, None)
        if timer is not None:
            timer.cancel()
        for waiter in prompt.waiters:
            if not waiter.done():
                waiter.set_result(resolution)
        self._tell(
            "prompt_closed",
            {
                "id": prompt.id,
                "granted": resolution.grant is not None,
                "choice": str(resolution.choice) if resolution.choice else None,
                "reason": resolution.reason,
            },
        )

    def close_all(self, reason: str) -> None:
        """The worker is stopping: every waiting ask is refused."""
        for prompt in list(self._prompts.values()):
            self._close(prompt, Resolution(None, None, reason, headless=True))

    # ------------------------------------------------------------- telling

    def _tell(self, kind: str, body: dict[str, Any]) -> None:
        for listener in list(self.listeners):
            try:
                listener(kind, body)
            except Exception:
                log.exception("a prompt listener failed")

    def _audit(self, prompt: Prompt, kind: str, detail: dict[str, Any]) -> None:
        event = self.telemetry.audit(
            kind,
            correlation_id=prompt.correlation_ids[0] if prompt.correlation_ids else "",
            plan_id=prompt.plan_id,
            agent_id=prompt.agent_id,
            detail={
                "prompt": str(prompt.kind),
                "scopes": list(prompt.scopes),
                "calls": list(prompt.correlation_ids),
                **detail,
            },
        )
        self.emit_audit(event)


def too_long_to_show(request: ApprovalRequest, kind: Kind, shown: int) -> WorkerError:
    """The refusal of a call too long for a prompt: it is not asked about cut."""
    what = request.scope.removeprefix(ASK_PREFIX)
    if kind is Kind.ASK_RULE:
        hint = "an allowlist rule asks the person about it each time: send a shorter call"
    else:
        hint = (
            f"grant it ahead (`agentworker grant {request.scope} --agent "
            f"{request.agent_id or '*'}`) or send a shorter call"
        )
    limit = prompt_text.SHOW_LIMIT
    return WorkerError(
        "scope_required",
        f"{what} needs the approval of the person at this worker, and this call is too "
        f"long to show them ({shown:,} characters; a prompt shows at most {limit:,} and "
        f"never a cut call): {hint}",
        {"needs_approval": what, "shown_chars": shown, "show_limit": limit},
    )


def _not_askable(request: pb.ScopeRequest) -> str | None:
    """Why a ScopeRequest is refused without asking anyone, or None."""
    scopes = request.scopes
    if not scopes:
        return "no scopes asked"
    if len(scopes) > MAX_SCOPES_ASKED:
        return f"{len(scopes)} scopes asked at once; at most {MAX_SCOPES_ASKED} per request"
    bad = [s for s in scopes if not _SCOPE.fullmatch(s)]
    if bad:
        return f"not scopes: {', '.join(inert(repr(s), 100) for s in bad[:5])}"
    long = [s for s in scopes if len(s) > MAX_SCOPE_CHARS]
    if long:
        return f"a scope longer than {MAX_SCOPE_CHARS} characters: {inert(long[0], 100)}"
    for name in ("agent_id", "plan_id"):
        problem = ids.id_problem(name, getattr(request, name))
        if problem is not None:
            return problem[1]
    return None


def granted_by_choice(scopes: tuple[str, ...]) -> tuple[str, ...]:
    """What "for this plan" / "for this agent" grants for these scopes."""
    out: dict[str, None] = {}
    for scope in scopes:
        for granted in FAMILIES.get(scope, (scope,)):
            out[granted] = None
    return tuple(out)


def _literal(value: str) -> str:
    """A value as a grant pattern that matches only itself (fnmatch's specials escaped):
    an agent that calls itself `*` gets a grant for `*` the name, not for every agent."""
    return re.sub(r"([*?\[])", r"[\1]", value)


def _now_ms() -> int:
    return int(time.time() * 1000)
