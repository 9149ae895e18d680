"""`agentworker grant`, `grants` and `revoke`: scopes granted at this machine."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Final

from worker.cli._common import EXIT_FAILED, EXIT_OK, add_served_flags, shown
from worker.cli.plans import local_state

if TYPE_CHECKING:
    from worker.config import Paths
    from worker.core.refused_asks import RefusedAsk

_DURATION: Final = re.compile(r"^(\d+)([smhd])$")
_SCOPE: Final = re.compile(r"[A-Za-z*]+\.[A-Za-z_*?]+")


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    grant = sub.add_parser(
        "grant",
        help="grant a scope to an agent (local only)",
        description="Example: agentworker grant 'workerHost.fs_*' --agent planner --for 8h",
    )
    grant.add_argument(
        "scope",
        help="a scope or pattern, e.g. workerHost.fs_stat, workerHost.*; a bare action name "
        "as `call` takes it (fs_stat, screenshot)",
    )
    grant.add_argument("--agent", default="*", help="agent id or pattern (default: any)")
    grant.add_argument("--plan", default="*", help="plan id or pattern (default: any)")
    grant.add_argument("--for", dest="duration", help="expire after e.g. 30m, 8h, 7d")
    add_served_flags(grant)
    grant.set_defaults(handler=_grant)

    grants = sub.add_parser(
        "grants", help="list grants made with `grant` or in the UI, each with its server"
    )
    grants.add_argument("--json", action="store_true", help="machine-readable output")
    grants.set_defaults(handler=_grants)

    revoke = sub.add_parser("revoke", help="remove a grant made with `grant`")
    revoke.add_argument(
        "grant_id", type=int, help="the grant's number, as `grant` and `grants` show it"
    )
    revoke.set_defaults(handler=_revoke)


def _parse_duration(text: str) -> timedelta:
    from worker.errors import UsageError

    match = _DURATION.match(text.strip())
    if not match:
        raise UsageError(f"--for {text!r}: use a number and s, m, h or d (e.g. 8h)")
    amount, unit = int(match.group(1)), match.group(2)
    return timedelta(**{{"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[unit]: amount})


def _grant(paths: Paths, args: argparse.Namespace) -> int:
    from worker.core.scopes import ASK_PREFIX, ask_binding
    from worker.errors import UsageError

    # Named as `call` names actions: a bare name is workerHost's, or workerComputer's
    # for a computer action (`grant screenshot` granted workerHost.screenshot, which
    # no call ever asks for).
    if "." not in args.scope and _SCOPE.fullmatch(f"workerHost.{args.scope}"):
        from worker.surfaces import COMPUTER_ACTIONS

        surface = "workerComputer" if args.scope in COMPUTER_ACTIONS else "workerHost"
        args.scope = f"{surface}.{args.scope}"
    # An allowlist ask, named as its refusal names it (review19 A8: the refusal said to
    # grant it here, and this refused the name): granted as an approval of it would be,
    # once this worker says it refused that very name (review21 B7), and under it.
    refused = None
    if ask_binding(ASK_PREFIX + args.scope.removeprefix(ASK_PREFIX)) is not None:
        refused = _refused_ask(paths, args.scope, args)
        if refused is None:
            return UsageError.exit_code
        args.scope = ASK_PREFIX + refused.name
    elif not _SCOPE.fullmatch(args.scope):
        raise UsageError(
            f"{args.scope!r} is not a scope: write surface.action, e.g. workerHost.fs_stat "
            "or workerHost.*, or an allowlist ask as its refusal names it ('workerHost.exec "
            "PROGRAM (N args) in FOLDER (sha256 HEX)')",
        )
    else:
        _refuse_a_scope_of_no_action(args.scope)
    from worker.cli._common import server_named
    from worker.core.ledger import NEXT_SERVER

    expires = datetime.now(UTC) + _parse_duration(args.duration) if args.duration else None
    state = local_state(paths)
    try:
        server, how = server_named(paths, args, state.served(), NEXT_SERVER)
        grant_id = state.add_grant(
            args.agent,
            args.scope,
            args.plan,
            expires,
            granted_by=f"cli:{os.getuid()}",
            server=server,
        )
    finally:
        state.close()
    until = f" until {expires.isoformat(timespec='seconds')}" if expires else ""
    print(f"grant {grant_id}: {shown(args.scope)} for agent {args.agent}, plan {args.plan}{until}")
    if refused is not None:
        print("  it lets this run, as the worker here refused it (passwords masked):")
        for line in _lines(refused.shown):
            print(f"    {shown(line)}")
    if _types_anywhere(args.scope):
        print(
            "  it types into any window, a terminal too: the agent can run there whatever "
            "you could type (past the exec allowlist)"
        )
    whose = "the first server" if server == NEXT_SERVER else f"server {shown(server)}"
    print(f"  for {whose} ({how}); it admits no other server's calls")
    return EXIT_OK


def _refuse_a_scope_of_no_action(pattern: str) -> None:
    """A UsageError for a scope or pattern that no action of this worker asks for."""
    from worker.actions.scope_names import no_action_problem
    from worker.errors import UsageError

    problem = no_action_problem(pattern, shown(pattern))
    if problem is not None:
        raise UsageError(problem)


def _types_anywhere(pattern: str) -> bool:
    """Whether a grant of `pattern` lets an agent type (key_type, key_combo): keys reach
    a terminal as well as an editor, which the TUI's prompt marks too (review27 I5)."""
    from fnmatch import fnmatchcase

    typing = ("workerComputer.key_type", "workerComputer.key_combo")
    return any(fnmatchcase(scope, pattern) for scope in typing)


def _lines(text: str) -> list[str]:
    """The lines of what a refused ask showed, broken where its prompt broke them: at
    "\n" only. str.splitlines breaks at U+2028, U+2029, U+0085, \v and \f too, and an
    argument holding one printed a line of the agent's choosing (review23 C18); `shown`
    writes those as escapes."""
    return text.rstrip("\n").split("\n")


def _refused_ask(paths: Paths, label: str, args: argparse.Namespace) -> RefusedAsk | None:
    """The ask this worker refused under the digest `label` names, if `label` is its
    name; else None, once the person is told what the digest is and what to do. The
    name comes through the agent, which could relabel any digest: only this worker's
    record says what it is."""
    from worker.core.refused_asks import KEPT_S, RefusedAsks
    from worker.core.scopes import ASK_PREFIX, ask_binding
    from worker.errors import UsageError

    bound = ask_binding(ASK_PREFIX + label.removeprefix(ASK_PREFIX))
    assert bound is not None
    state = local_state(paths)
    try:
        refused = RefusedAsks(state.connection).find(*bound)
    finally:
        state.close()
    if refused is None:
        raise UsageError(
            f"the worker here refused no allowlist ask with sha256 {bound[1]} in the last "
            f"{KEPT_S // 3600} hours, so nothing here says what command that is (its name "
            "is the words of whoever passed it on). Let the call run once so that the "
            "worker refuses it, then paste the command its refusal gives; or approve it in "
            "`agentworker ui` while the call waits"
        )
    if not refused.named(label):
        command = (
            f"agentworker grant {shlex.quote(refused.name)} --agent {shlex.quote(args.agent)}"
            f" --plan {shlex.quote(args.plan)}"
        )
        what = "".join(f"    {shown(line)}\n" for line in _lines(refused.shown))
        print(
            f"agentworker: '{shown(label)}' is not what the worker here refused under that "
            f"sha256: it refused '{shown(refused.name)}', which is\n{what}Nothing granted. "
            f"If that is what you mean to allow, grant it as:\n  {shown(command)}",
            file=sys.stderr,
        )
        return None
    return refused


def _server_shown(server: str) -> str:
    from worker.core.ledger import NEXT_SERVER, UNRECORDED_SERVER, UNSORTED_SERVER

    if server in (UNRECORDED_SERVER, UNSORTED_SERVER):
        return "none (made before grants were kept per server; grant it again)"
    if server == NEXT_SERVER:
        return "the first one the worker here serves"
    return server


def _grants(paths: Paths, args: argparse.Namespace) -> int:
    rows = [
        {
            "id": g.id,
            "agent": g.agent,
            "scope": g.scope,
            "plan": g.plan,
            "expires": g.expires.isoformat() if g.expires else None,
            "granted_by": g.granted_by,
            "server": g.server,
        }
        for g in local_state(paths).grants(every_server=True)
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
    elif not rows:
        print("no grants made with `agentworker grant` (config.toml may hold more)")
    for r in rows if not args.json else []:
        # A grant made in the UI names the agent and plan as the server sent them.
        print(
            f"{r['id']}: {shown(str(r['scope']))} agent={shown(str(r['agent']))} "
            f"plan={shown(str(r['plan']))} expires={r['expires']} "
            f"server={shown(_server_shown(str(r['server'])))}"
        )
    return EXIT_OK


def _revoke(paths: Paths, args: argparse.Namespace) -> int:
    removed = local_state(paths).revoke_grant(args.grant_id)
    if removed:
        print(f"grant {args.grant_id} revoked")
        return EXIT_OK
    print(f"no grant {args.grant_id} (`agentworker grants` lists them, each by its number)")
    return EXIT_FAILED
