"""The policy and its one question: may this argument list run, and as what?

A program is named by its bare name and pinned to absolute paths; the caller's
argv[0] must be that bare name, so neither a path (`/tmp/git`, `./git`) nor a
PATH that puts another `git` first can choose what runs. Each program has rules
(a grammar plus a decision: allow, ask or forbidden) and deny entries (arguments
that are forbidden wherever they appear). Every rule that matches has its say and
the strictest wins, so a permissive rule layered on top can never undo a
forbidden one below it.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final, Literal

from allowlist._grammar import (
    OTHER_FORM,
    Grammar,
    NoMatchError,
    PathCheck,
    PathRefusedError,
    Reading,
    token_hits,
)

RuleDecision = Literal["allow", "ask", "forbidden"]
Verdict = Literal["allow", "ask", "forbidden", "not_allowed"]


class Refusal(StrEnum):
    """Why an argument list may not run, in the policy's own words (the worker maps
    each to its error code; this package never speaks the worker's vocabulary)."""

    NOT_ALLOWED = "not_allowed"  # no rule admits it, or the program is not installed
    FORBIDDEN = "forbidden"  # a rule or a deny entry forbids it
    PATH_REFUSED = "path_refused"  # a rule fits, but a path in it lies outside the roots


STRICTNESS: Final[dict[str, int]] = {"allow": 0, "ask": 1, "forbidden": 2}
BARE_NAME: Final = re.compile(r"[A-Za-z0-9_+][A-Za-z0-9_.+-]*")


@dataclass(frozen=True)
class Rule:
    id: str
    program: str
    decision: RuleDecision
    reason: str
    grammar: Grammar
    match: tuple[str, ...] = ()
    not_match: tuple[str, ...] = ()
    source: str = ""
    # Whether the program may open files it finds in folders (grep -r, rg, git diff),
    # not only the paths named in its arguments: True, False, or the flags (and
    # option=value pairs) that make it do so. See Decision.walks.
    walks: bool | frozenset[str] = True

    def walking(self, reading: Reading) -> bool:
        if isinstance(self.walks, bool):
            return self.walks
        given = set(reading.flags) | {f"{name}={value}" for name, value in reading.values}
        return bool(given & self.walks)


@dataclass(frozen=True)
class Deny:
    """Arguments forbidden anywhere in the list, or only before the subcommand."""

    id: str
    program: str
    args: tuple[str, ...]
    reason: str
    where: Literal["anywhere", "before_subcommand"] = "anywhere"
    match: tuple[str, ...] = ()
    not_match: tuple[str, ...] = ()
    source: str = ""

    def hit(self, args: Sequence[str]) -> str | None:
        """The first token (of argv without the program name) this entry forbids."""
        tokens = list(args)
        if self.where == "before_subcommand":
            leading = 0
            while leading < len(tokens) and tokens[leading].startswith("-"):
                leading += 1
            tokens = tokens[:leading]
        for token in tokens:
            if any(token_hits(entry, token) for entry in self.args):
                return token
        return None


@dataclass(frozen=True)
class Program:
    name: str
    paths: tuple[str, ...]
    rules: tuple[Rule, ...] = ()
    denies: tuple[Deny, ...] = ()
    network: bool = False
    # May make unix sockets (socket(AF_UNIX), refused by the filter otherwise): then
    # connect to a named socket in a shared folder, whose service runs outside.
    unix_sockets: bool = False
    env: Mapping[str, str] = field(default_factory=dict)

    def resolve(self) -> str | None:
        """The first pinned path that is an executable regular file, or None."""
        for path in self.paths:
            try:
                st = os.stat(path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and os.access(path, os.X_OK):
                return path
        return None


@dataclass(frozen=True)
class Decision:
    """The answer for one argument list, with enough to explain it to a person."""

    verdict: Verdict
    reason: str
    argv: tuple[str, ...]
    refusal: Refusal | None = None
    program: Program | None = None
    path: str | None = None  # the absolute path that would run
    rule_id: str | None = None
    matched: tuple[str, ...] = ()  # every rule or deny entry that matched
    tried: Mapping[str, str] = field(default_factory=dict)  # rule id -> why it did not match
    # The program may open files it finds by walking folders (a rule that matched says
    # so): `searched` are the path arguments it searches, or "." (the folder it works
    # in) when it names none. The worker checks those folders for hard links.
    walks: bool = False
    searched: tuple[str, ...] = ()

    @property
    def runs(self) -> bool:
        return self.verdict in ("allow", "ask")

    @property
    def near(self) -> dict[str, str]:
        """Why each rule that got past its subcommand words still did not fit."""
        return near_misses(self.tried)


def near_misses(tried: Mapping[str, str]) -> dict[str, str]:
    """The complaints of rules for this form (rules for other subcommands left out)."""
    return {rid: why for rid, why in tried.items() if not why.startswith(OTHER_FORM)}


@dataclass(frozen=True)
class Policy:
    programs: Mapping[str, Program]
    sources: tuple[str, ...] = ()

    def decide(self, argv: Sequence[str], check_path: PathCheck) -> Decision:
        argv = tuple(argv)
        if not argv:
            return _refuse(argv, Refusal.NOT_ALLOWED, "no program was named")
        name, args = argv[0], argv[1:]
        if not BARE_NAME.fullmatch(name):
            return _refuse(
                argv,
                Refusal.NOT_ALLOWED,
                f"{name!r} is not a bare program name. Name the program alone (e.g. `git`, not "
                "`/usr/bin/git` or `./git`): each allowed program runs from the path its policy "
                "pins, never from a path or PATH given by the caller.",
            )
        program = self.programs.get(name)
        if program is None:
            known = ", ".join(sorted(self.programs)) or "none"
            return _refuse(
                argv,
                Refusal.NOT_ALLOWED,
                f"`{name}` is not an allowed program. Allowed programs: {known}.",
            )
        return _decide_program(program, argv, args, check_path)

    def rules(self) -> list[Rule]:
        return [rule for program in self.programs.values() for rule in program.rules]

    def denies(self) -> list[Deny]:
        return [deny for program in self.programs.values() for deny in program.denies]


def _decide_program(
    program: Program, argv: tuple[str, ...], args: tuple[str, ...], check_path: PathCheck
) -> Decision:
    command = shlex.join(argv)
    for deny in program.denies:
        token = deny.hit(args)
        if token is not None:
            return Decision(
                "forbidden",
                f"{token!r} is forbidden for {program.name} ({deny.id}): {deny.reason}",
                argv,
                Refusal.FORBIDDEN,
                program,
                rule_id=deny.id,
                matched=(deny.id,),
            )
    matched: list[Rule] = []
    readings: list[Reading] = []
    tried: dict[str, str] = {}
    paths_refused: list[tuple[Rule, PathRefusedError]] = []
    for rule in program.rules:
        try:
            reading = rule.grammar.match(args, check_path)
        except PathRefusedError as exc:
            paths_refused.append((rule, exc))
            tried[rule.id] = exc.reason
        except NoMatchError as exc:
            tried[rule.id] = exc.reason
        else:
            matched.append(rule)
            readings.append(reading)
    if not matched:
        if paths_refused:
            near, refused = paths_refused[0]
            return Decision(
                "not_allowed",
                f"`{command}` fits rule {near.id}, but a path cannot be used: {refused.reason}",
                argv,
                Refusal.PATH_REFUSED,
                program,
                rule_id=near.id,
                tried=tried,
            )
        return Decision(
            "not_allowed",
            f"no rule allows `{command}`. {_closest(program, tried)}",
            argv,
            Refusal.NOT_ALLOWED,
            program,
            tried=tried,
        )
    winner = max(matched, key=lambda rule: STRICTNESS[rule.decision])
    ids = tuple(rule.id for rule in matched)
    if winner.decision == "forbidden":
        return Decision(
            "forbidden",
            f"`{command}` is forbidden by rule {winner.id}: {winner.reason}",
            argv,
            Refusal.FORBIDDEN,
            program,
            rule_id=winner.id,
            matched=ids,
        )
    resolved = program.resolve()
    if resolved is None:
        return Decision(
            "not_allowed",
            f"{program.name} is allowed but not installed here (looked at "
            f"{', '.join(program.paths)}). The person at this worker can install it or pin its "
            "path in their allowlist file.",
            argv,
            Refusal.NOT_ALLOWED,
            program,
            rule_id=winner.id,
            matched=ids,
        )
    walking = [
        (rule, reading)
        for rule, reading in zip(matched, readings, strict=True)
        if rule.walking(reading)
    ]
    return Decision(
        winner.decision,
        f"rule {winner.id}: {winner.reason}",
        argv,
        None,
        program,
        resolved,
        winner.id,
        ids,
        walks=bool(walking),
        searched=tuple(
            dict.fromkeys(
                path
                for rule, reading in walking
                for path in rule.grammar.path_positionals(reading) or (".",)
            )
        ),
    )


def _closest(program: Program, tried: Mapping[str, str]) -> str:
    """The most useful of the rules' complaints: those that got past the subcommand."""
    near = near_misses(tried)
    if near:
        return "; ".join(f"rule {rid}: {why}" for rid, why in list(near.items())[:4]) + "."
    said = []
    for decision, heading in (
        ("allow", "Allowed forms"),
        ("ask", "Forms the person approves each time"),
        ("forbidden", "Forbidden forms"),
    ):
        forms = sorted(
            {
                " ".join((program.name, *r.grammar.subcommand))
                for r in program.rules
                if r.decision == decision
            }
            - {program.name}
        )
        if forms:
            said.append(f"{heading}: {', '.join(forms[:30])}.")
    return " ".join(said) or f"{program.name} has no rule that fits."


def _refuse(argv: tuple[str, ...], refusal: Refusal, reason: str) -> Decision:
    return Decision("not_allowed", reason, argv, refusal)
