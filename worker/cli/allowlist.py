"""`agentworker allowlist check -- ARGV…` and `agentworker allowlist show`.

Both read the same policy the worker enforces (the shipped default with the
person's allowlist file on top) and judge paths against the same shared folders,
so a person can see in advance what an agent's exec call would get, and why.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from worker.config import Paths

EXIT_ALLOWED: Final = 0
EXIT_REFUSED: Final = 1


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    allowlist = sub.add_parser(
        "allowlist",
        help="explain the exec allowlist: what may run, and why",
        description="Example: agentworker allowlist check -- git log -n 5",
    )
    allowlist.set_defaults(handler=run)
    actions = allowlist.add_subparsers(dest="allowlist_command", required=True, metavar="ACTION")
    check = actions.add_parser(
        "check",
        help="decide an argument list as exec would (rule, reason, resolved path)",
        description="Put `--` before the command: agentworker allowlist check -- git log -n 5",
    )
    check.add_argument("--cwd", help="working directory (default: the first shared folder)")
    check.add_argument("--json", action="store_true", help="machine-readable output")
    check.add_argument("argv", nargs="+", metavar="ARGV")
    show = actions.add_parser("show", help="print the effective policy")
    show.add_argument("--json", action="store_true", help="machine-readable output")


def run(paths: Paths, args: argparse.Namespace) -> int:
    from allowlist import PolicyFile, describe, explain, render
    from worker.actions.host.exec_policy import (
        REFUSAL_CODES,
        path_check,
        policy_for,
        user_policy_file,
    )
    from worker.config import load, roots_of
    from worker.errors import ConfigError, UsageError, WorkerError

    config = load(paths)
    try:
        policy = policy_for(config, paths, PolicyFile())
    except WorkerError as exc:  # the person's allowlist file does not load
        raise ConfigError(exc.message) from exc
    if args.allowlist_command == "show":
        if args.json:
            data = describe(policy)
            found = user_policy_file(config, paths)
            data["user_file"] = str(found) if found else None
            print(json.dumps(data, indent=2))
        else:
            print(render(policy), end="")
        return EXIT_ALLOWED
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    roots = roots_of(config, paths)
    cwd = args.cwd or (str(roots[0].path) if roots else "/")
    if not os.path.isabs(cwd):
        raise UsageError(f"--cwd {cwd!r}: give an absolute path")
    decision = policy.decide(argv, path_check(roots, cwd))
    verdict = REFUSAL_CODES[decision.refusal].value if decision.refusal else decision.verdict
    if args.json:
        print(
            json.dumps(
                {
                    "decision": verdict,
                    "rule": decision.rule_id,
                    "reason": decision.reason,
                    "path": decision.path,
                    "matched": list(decision.matched),
                    "tried": dict(decision.tried),
                },
                indent=2,
            )
        )
    else:
        print(explain(decision, verdict), end="")
    return EXIT_ALLOWED if decision.verdict == "allow" else EXIT_REFUSED
