"""Scope checks: the worker trusts its own grants, never the server's view.

A grant is (agent, scope pattern, plan or any, expiry, who granted). Grants come
only from the local person: the config file, the CLI, or an approval prompt. The
server can ask (a ScopeRequest, or an out-of-scope call) but never grant.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from typing import Final, Protocol

from worker.core.redaction import secrets_in_text
from worker.errors import WorkerError

# Approvals of allowlist `ask` rules are kept as grants under this prefix, out of
# reach of scope patterns such as `workerHost.*` or `*`: granting a scope never
# answers an ask rule, and an ask approval never grants a scope.
ASK_PREFIX: Final = "ask:"
# The most (agent, scope, plan) a Scopes keeps as admitted by the config's grants
# (`Scopes.allowed`): forgotten all at once past it (plan ids are the server's to make).
ADMITTED_KEPT: Final = 4096
# An ask's name shows this much of its program and of its folder (its digest binds all).
ASK_LABEL_CHARS: Final = 60
# An ask's name starts with its surface and ends with the digest of its whole command
# and folder (ask_name); a grant kept for it is the name as a pattern that matches only
# itself (fnmatch's specials escaped as `[*]`), which leaves both ends as they were.
_ASK_BOUND: Final = re.compile(r"ask:([A-Za-z]+)\.exec .*\(sha256 ([0-9a-f]{64})\)", re.S)


def ask_name(
    surface: str,
    program: str,
    args: int | None,
    cwd: str,
    digest: str,
    *,
    stdin: int | None = None,
) -> str:
    """An allowlist ask's name (without ASK_PREFIX), kept at rest in grants, audit rows,
    refusals and logs: `<surface>.exec <program> (<n> args) in <folder> (sha256 <hex>)`,
    the digest binding the whole command, folder and stdin (exec_cmd.ask_about); a call
    with a stdin of `stdin` bytes says so: `(<n> args, <m> bytes of stdin)`. No argument
    is in it: masking argv there leaked each password the masking did not know
    (review14 finding 01). `args` None: a count not known (a grant renamed from an
    ask's earlier name, ledger._renamed_ask). The program is the one the allowlist
    resolved, a secret-looking text in it masked all the same."""
    if len(program) > ASK_LABEL_CHARS:
        program = os.path.basename(program)
    shown = secrets_in_text(program)
    if len(shown) > ASK_LABEL_CHARS:
        shown = shown[: ASK_LABEL_CHARS - 1] + "…"
    place = cwd if len(cwd) <= ASK_LABEL_CHARS else "…" + cwd[-(ASK_LABEL_CHARS - 1) :]
    count = "args not kept" if args is None else "1 arg" if args == 1 else f"{args} args"
    if stdin is not None:
        count += f", {stdin:,} bytes of stdin"
    return f"{surface}.exec {_one_line(shown)} ({count}) in {_one_line(place)} (sha256 {digest})"


def ask_binding(scope: str) -> tuple[str, str] | None:
    """What binds an ask's name (or a grant's pattern kept for it): its surface and
    the digest of its command and folder; None for a scope, or an ask of another shape.
    Grants for asks match on this, so a grant kept under an earlier name of the same
    ask (its argv masked in it, before review14) answers it still."""
    found = _ASK_BOUND.fullmatch(scope)
    return None if found is None else (found.group(1), found.group(2))


def _one_line(text: str) -> str:
    return text.replace("\n", "\\n").replace("\r", "\\r")


@dataclass(frozen=True)
class Grant:
    agent: str  # an agent id or a pattern such as "*"
    scope: str  # a pattern over "surface.action", e.g. "workerHost.fs_*"
    plan: str = "*"
    expires: datetime | None = None
    granted_by: str = "config"

    def admits(self, agent: str, scope: str, plan: str, now: datetime) -> bool:
        if self.expires is not None and _aware(self.expires) <= now:
            return False
        return (
            fnmatchcase(agent, self.agent)
            and _scope_admits(self.scope, scope)
            and fnmatchcase(plan, self.plan)
        )


def _scope_admits(pattern: str, scope: str) -> bool:
    """A grant's scope pattern against a call's scope; an ask's against an ask's by
    what binds them (ask_binding): the name's middle is for people, the digest is the
    command."""
    if pattern.startswith(ASK_PREFIX) and scope.startswith(ASK_PREFIX):
        bound, asked = ask_binding(pattern), ask_binding(scope)
        if bound is not None and asked is not None:
            return bound == asked
    return fnmatchcase(scope, pattern)


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


@dataclass(frozen=True)
class ApprovalRequest:
    correlation_id: str
    agent_id: str
    plan_id: str
    scope: str  # the scope, or ASK_PREFIX + what an allowlist rule asks about
    preview: str  # the whole call as the prompt shows it (worker.core.prompt_text)
    reason: str = ""
    # The call's blob, as the parts it came in: asks share a prompt only when their
    # blobs are the same too.
    blob: Sequence[bytes | memoryview] = ()


class Approver(Protocol):
    """Asks the person. Returns the grant they gave, or None for a denial."""

    async def ask(self, request: ApprovalRequest) -> Grant | None: ...


class Scopes:
    """The grants in force: static ones from the config plus live ones from a source."""

    def __init__(
        self,
        static: Iterable[Grant],
        live: Callable[[], Iterable[Grant]] = lambda: (),
        approver: Approver | None = None,
    ) -> None:
        self._static = tuple(static)
        self._live = live
        self.approver = approver
        # (agent, scope, plan) a config grant that never expires admits: a call's look
        # costs one lookup, not the time and a pattern match per grant. Only these: the
        # config's grants change only by `replace_static` (which forgets them), while the
        # live ones change under the worker (grant, revoke, an approval) and are looked
        # at each time, and an expiring one admits until its moment.
        self._admitted: set[tuple[str, str, str]] = set()

    def replace_static(self, static: Iterable[Grant]) -> None:
        """The config's grants, read again (SIGHUP); calls after this see only these."""
        self._static = tuple(static)
        self._admitted = set()

    def allowed(self, agent: str, scope: str, plan: str) -> bool:
        if scope.startswith(ASK_PREFIX):  # only an approval of that very ask answers it
            now = datetime.now(UTC)
            return any(
                g.scope.startswith(ASK_PREFIX) and g.admits(agent, scope, plan, now)
                for g in self._live()
            )
        key = (agent, scope, plan)
        if key in self._admitted:
            return True
        now = datetime.now(UTC)
        # The config's grants first: the live ones are read only when those fall short.
        # (A grant kept for an ask starts with ASK_PREFIX: it never matches a scope.)
        for grant in self._static:
            if grant.admits(agent, scope, plan, now):
                if grant.expires is None:
                    if len(self._admitted) >= ADMITTED_KEPT:
                        self._admitted = set()
                    self._admitted.add(key)
                return True
        return any(g.admits(agent, scope, plan, now) for g in self._live())

    async def require(self, request: ApprovalRequest) -> str:
        """Pass when granted (asking the person if one can be asked); else raise.

        Returns how the call was admitted, for its telemetry row: "granted" (a grant
        in force), or "approved (by)" with who approved and how (the approver's grant,
        e.g. "ui:once", "ui:plan").
        """
        if self.allowed(request.agent_id, request.scope, request.plan_id):
            return "granted"
        if self.approver is None:
            raise scope_required(request)
        grant = await self.approver.ask(request)
        if grant is None:
            raise WorkerError(
                "scope_denied",
                f"the person denied {request.scope} for agent {request.agent_id!r}.",
                {"scope": request.scope},
            )
        return f"approved ({grant.granted_by})"


def scope_required(request: ApprovalRequest) -> WorkerError:
    """The refusal of a call outside the grants when no one can be asked."""
    return WorkerError(
        "scope_required",
        f"agent {request.agent_id!r} has no grant for {request.scope} "
        f"(plan {request.plan_id!r}). The person running the worker can grant it: "
        f"`agentworker grant {request.scope} --agent {request.agent_id or '*'}`, a "
        "[[grant]] table in config.toml, or approve it in `agentworker ui` (attached "
        "while the call waits).",
        {"scope": request.scope, "agent_id": request.agent_id, "plan_id": request.plan_id},
    )
