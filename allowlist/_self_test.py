"""Policies test themselves: every rule's examples are checked when it loads.

A rule may carry `match` and `not_match` command lines. Loading runs each one
through the rule's grammar (a deny entry: through its argument scan) and refuses
the whole policy, naming the rule, when an example disagrees. Examples run
against one pretend shared folder, `/shared`, which is also the working
directory: `src/a.py` is inside it, `/etc/passwd` and `../x` are not.
"""

from __future__ import annotations

import posixpath
import shlex
from pathlib import Path
from typing import Final

from allowlist._grammar import NoMatchError
from allowlist._load import PolicyError, default_text, layer, parse, read_file
from allowlist._policy import Deny, Policy, Rule

EXAMPLE_ROOT: Final = "/shared"


def example_path_check(path: str, write: bool) -> str | None:
    """Inside /shared (the working directory) by text alone; nothing else."""
    full = posixpath.normpath(posixpath.join(EXAMPLE_ROOT, path))
    if full == EXAMPLE_ROOT or full.startswith(EXAMPLE_ROOT + "/"):
        return None
    return f"{path!r} is outside the shared folder {EXAMPLE_ROOT}"


def load_policy(user_file: Path | None = None) -> Policy:
    """The shipped default with `user_file` layered on top, examples checked."""
    files = []
    sources: list[str] = []
    user = None
    include_default = True
    if user_file is not None:
        user, include_default = parse(read_file(user_file), str(user_file))
    if include_default:
        files.append(parse(default_text(), "default policy")[0])
        sources.append("default policy")
    if user is not None:
        files.append(user)
        sources.append(str(user_file))
    policy = layer(*files, sources=tuple(sources))
    verify(policy)
    return policy


def load_text(text: str, source: str = "policy text") -> Policy:
    """A policy from TOML text alone (no default beneath it), examples checked."""
    policy = layer(parse(text, source)[0], sources=(source,))
    verify(policy)
    return policy


def verify(policy: Policy) -> None:
    for rule in policy.rules():
        _verify_rule(rule)
    for deny in policy.denies():
        _verify_deny(deny)


def _verify_rule(rule: Rule) -> None:
    for line, expected in [*((m, True) for m in rule.match), *((n, False) for n in rule.not_match)]:
        args = _args(line, rule.program, rule.source, rule.id)
        try:
            rule.grammar.match(args, example_path_check)
            why = ""
        except NoMatchError as exc:
            why = exc.reason
        if expected and why:
            raise PolicyError(
                f"{rule.source}: rule {rule.id}: example {line!r} should match but does not: {why}"
            )
        if not expected and not why:
            raise PolicyError(
                f"{rule.source}: rule {rule.id}: example {line!r} should not match, but it does"
            )


def _verify_deny(deny: Deny) -> None:
    for line in deny.match:
        if deny.hit(_args(line, deny.program, deny.source, deny.id)) is None:
            raise PolicyError(
                f"{deny.source}: deny {deny.id}: example {line!r} should be forbidden, but none "
                f"of {list(deny.args)} is found in it"
            )
    for line in deny.not_match:
        token = deny.hit(_args(line, deny.program, deny.source, deny.id))
        if token is not None:
            raise PolicyError(
                f"{deny.source}: deny {deny.id}: example {line!r} should pass, but {token!r} "
                "is forbidden"
            )


def _args(line: str, program: str, source: str, rule_id: str) -> list[str]:
    try:
        argv = shlex.split(line)
    except ValueError as exc:
        raise PolicyError(f"{source}: rule {rule_id}: example {line!r}: {exc}") from None
    if not argv or argv[0] != program:
        raise PolicyError(
            f"{source}: rule {rule_id}: example {line!r} must start with the program "
            f"name {program!r}"
        )
    return argv[1:]
