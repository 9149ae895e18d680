"""Read policy files (TOML) into a Policy, strictly, and layer them.

Every key is checked: an unknown key, a misspelt kind or a relative pinned path
stops the load with a message naming the file and the rule, because a policy that
silently ignores a line is a policy nobody can review. The shipped default comes
first; a person's file is layered on top (more programs, more paths, more rules,
more denials), unless it says `[policy] include_default = false`.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Final, cast

from allowlist._grammar import BASE_KINDS, Grammar, Kind, Slot, Style
from allowlist._policy import BARE_NAME, Deny, Policy, Program, Rule, RuleDecision

DEFAULT_NAME: Final = "default.toml"
_ID: Final = re.compile(r"[A-Za-z0-9_.:-]{1,80}")
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PROGRAM_KEYS: Final = {
    "paths",
    "network",
    "unix_sockets",
    "env",
    "style",
    "flags",
    "options",
    "attached",
    "optional_value",
    "walks",
    "rule",
    "deny",
}
_RULE_KEYS: Final = {
    "id",
    "decision",
    "reason",
    "subcommand",
    "flags",
    "options",
    "positionals",
    "after_double_dash",
    "require",
    "any_args",
    "match",
    "not_match",
    "walks",
}
_DENY_KEYS: Final = {"id", "args", "reason", "where", "match", "not_match"}


class PolicyError(Exception):
    """A policy file that cannot be used; the message names the file and the rule."""


@dataclass
class _Layer:
    """One file's view of a program, before layering."""

    name: str
    paths: list[str] = field(default_factory=list)
    network: bool | None = None
    unix_sockets: bool | None = None
    env: dict[str, str] = field(default_factory=dict)
    rules: list[Rule] = field(default_factory=list)
    denies: list[Deny] = field(default_factory=list)


def default_text() -> str:
    return resources.files("allowlist").joinpath(DEFAULT_NAME).read_text(encoding="utf-8")


def parse(text: str, source: str) -> tuple[list[_Layer], bool]:
    """One file's programs, and whether it asks to keep the shipped default beneath it."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{source}: not valid TOML: {exc}") from None
    _only(data, {"policy", "program"}, source)
    settings = _table(data.get("policy", {}), f"{source}: [policy]")
    _only(settings, {"include_default"}, f"{source}: [policy]")
    include_default = _bool(settings.get("include_default", True), f"{source}: include_default")
    programs = _table(data.get("program", {}), f"{source}: [program]")
    layers = [
        _program(name, _table(raw, f"{source}: [program.{name}]"), source)
        for name, raw in programs.items()
    ]
    return layers, include_default


def layer(*files: list[_Layer], sources: tuple[str, ...]) -> Policy:
    """Programs from several files, later files on top."""
    merged: dict[str, _Layer] = {}
    for layers in files:
        for part in layers:
            into = merged.setdefault(part.name, _Layer(part.name))
            into.paths = [*part.paths, *(p for p in into.paths if p not in part.paths)]
            into.network = part.network if part.network is not None else into.network
            if part.unix_sockets is not None:
                into.unix_sockets = part.unix_sockets
            into.env.update(part.env)
            into.rules.extend(part.rules)
            into.denies.extend(part.denies)
    seen: dict[str, str] = {}
    for part in merged.values():
        items: list[Rule | Deny] = [*part.rules, *part.denies]
        for item in items:
            if item.id in seen:
                raise PolicyError(
                    f"{item.source}: rule id {item.id!r} is used twice (also in {seen[item.id]}); "
                    "give each rule its own id"
                )
            seen[item.id] = item.source
        if not part.paths:
            raise PolicyError(f"program {part.name!r} has no pinned paths: add paths = [...]")
    programs = {
        name: Program(
            name=name,
            paths=tuple(part.paths),
            rules=tuple(part.rules),
            denies=tuple(part.denies),
            network=bool(part.network),
            unix_sockets=bool(part.unix_sockets),
            env=dict(part.env),
        )
        for name, part in sorted(merged.items())
    }
    return Policy(programs=programs, sources=sources)


# ----------------------------------------------------------------- programs


def _program(name: str, raw: dict[str, Any], source: str) -> _Layer:
    where = f"{source}: [program.{name}]"
    if not BARE_NAME.fullmatch(name):
        raise PolicyError(f"{where}: a program is named by its bare name, not {name!r}")
    _only(raw, _PROGRAM_KEYS, where)
    paths = _strings(raw.get("paths", []), f"{where} paths")
    for path in paths:
        if not path.startswith("/") or "/../" in f"{path}/" or "/./" in f"{path}/":
            raise PolicyError(f"{where}: pinned paths must be absolute and plain, not {path!r}")
        if path.rsplit("/", 1)[-1] == "":
            raise PolicyError(f"{where}: {path!r} names a folder, not a program")
    env = _table(raw.get("env", {}), f"{where} env")
    for key, value in env.items():
        if not _ENV_NAME.fullmatch(key) or not isinstance(value, str):
            raise PolicyError(f'{where}: env entries are NAME = "text", not {key!r}')
    style = raw.get("style", "gnu")
    if style not in ("gnu", "options_first", "single_dash", "xxd"):
        raise PolicyError(
            f'{where}: style must be "gnu", "options_first", "single_dash" or "xxd", not {style!r}'
        )
    base_flags = _strings(raw.get("flags", []), f"{where} flags")
    base_options = _strings(raw.get("options", []), f"{where} options")
    attached = frozenset(_strings(raw.get("attached", []), f"{where} attached"))
    optional = frozenset(_strings(raw.get("optional_value", []), f"{where} optional_value"))
    walks = _walks(raw.get("walks", True), f"{where} walks")
    rules = [
        _rule(
            name,
            _table(item, where),
            style,
            base_flags,
            base_options,
            source,
            attached,
            optional,
            walks,
        )
        for item in _tables(raw.get("rule", []), f"{where} rule")
    ]
    denies = [
        _deny(name, _table(item, where), source)
        for item in _tables(raw.get("deny", []), f"{where} deny")
    ]
    network = raw.get("network")
    sockets = raw.get("unix_sockets")
    return _Layer(
        name=name,
        paths=paths,
        network=None if network is None else _bool(network, f"{where} network"),
        unix_sockets=None if sockets is None else _bool(sockets, f"{where} unix_sockets"),
        env=cast(dict[str, str], env),
        rules=rules,
        denies=denies,
    )


def _rule(
    program: str,
    raw: dict[str, Any],
    style: Style,
    base_flags: list[str],
    base_options: list[str],
    source: str,
    attached: frozenset[str] = frozenset(),
    optional: frozenset[str] = frozenset(),
    walks: bool | frozenset[str] = True,
) -> Rule:
    rule_id = _id(raw, f"{source}: a rule of {program}")
    where = f"{source}: rule {rule_id}"
    _only(raw, _RULE_KEYS, where)
    decision = raw.get("decision", "allow")
    if decision not in ("allow", "ask", "forbidden"):
        raise PolicyError(f"{where}: decision must be allow, ask or forbidden, not {decision!r}")
    flags = [*base_flags, *_strings(raw.get("flags", []), f"{where} flags")]
    options = _options(
        [*base_options, *_strings(raw.get("options", []), f"{where} options")], where
    )
    for name in [*flags, *options]:
        _check_option_name(name, style, where)
    both = set(flags) & set(options)
    if both:
        raise PolicyError(f"{where}: {sorted(both)} listed both as flags and as options")
    after = raw.get("after_double_dash")
    grammar = Grammar(
        style=style,
        subcommand=tuple(_strings(raw.get("subcommand", []), f"{where} subcommand")),
        flags=frozenset(flags),
        options=options,
        positionals=_slots(raw.get("positionals", []), where),
        after_double_dash=None if after is None else _slots(after, where),
        require=tuple(
            frozenset(group.split("|")) for group in _strings(raw.get("require", []), where)
        ),
        any_args=_bool(raw.get("any_args", False), f"{where} any_args"),
        attached=attached,
        optional=optional,
    )
    for group in grammar.require:
        missing = group - set(flags) - set(options)
        if missing:
            raise PolicyError(f"{where}: requires {sorted(missing)} but does not list them")
    walking = _walks(raw["walks"], f"{where} walks") if "walks" in raw else walks
    if not isinstance(walking, bool):
        for entry in walking:
            name, has_value, _ = entry.partition("=")
            if name not in (options if has_value else flags):
                raise PolicyError(
                    f"{where}: walks names {entry!r}, which is not one of its "
                    f"{'options' if has_value else 'flags'}"
                )
    return Rule(
        id=rule_id,
        program=program,
        decision=cast(RuleDecision, decision),
        reason=_reason(raw, where),
        grammar=grammar,
        match=tuple(_strings(raw.get("match", []), f"{where} match")),
        not_match=tuple(_strings(raw.get("not_match", []), f"{where} not_match")),
        source=source,
        walks=walking,
    )


def _walks(value: Any, where: str) -> bool | frozenset[str]:
    """true, false, or the flags (and option=value pairs) that make the program walk."""
    if isinstance(value, bool):
        return value
    return frozenset(_strings(value, f"{where} (true, false or a list of flags)"))


def _deny(program: str, raw: dict[str, Any], source: str) -> Deny:
    deny_id = _id(raw, f"{source}: a deny entry of {program}")
    where = f"{source}: deny {deny_id}"
    _only(raw, _DENY_KEYS, where)
    args = _strings(raw.get("args", []), f"{where} args")
    if not args or any(not arg for arg in args):
        raise PolicyError(f"{where}: args must list at least one non-empty argument")
    place = raw.get("where", "anywhere")
    if place not in ("anywhere", "before_subcommand"):
        raise PolicyError(f"{where}: where must be anywhere or before_subcommand, not {place!r}")
    return Deny(
        id=deny_id,
        program=program,
        args=tuple(args),
        reason=_reason(raw, where),
        where=place,
        match=tuple(_strings(raw.get("match", []), f"{where} match")),
        not_match=tuple(_strings(raw.get("not_match", []), f"{where} not_match")),
        source=source,
    )


# ----------------------------------------------------------------- values


def _kind(text: str, where: str) -> Kind:
    if "|" in text:
        words = tuple(text.split("|"))
        if any(not word for word in words):
            raise PolicyError(f"{where}: {text!r} has an empty choice")
        return words
    if text not in BASE_KINDS:
        raise PolicyError(
            f"{where}: unknown kind {text!r}; use {', '.join(sorted(BASE_KINDS))} "
            "or literal choices like a|b"
        )
    return text


def _options(specs: list[str], where: str) -> dict[str, Kind]:
    options: dict[str, Kind] = {}
    for spec in specs:
        name, has_kind, kind = spec.partition("=")
        if not has_kind or not name:
            raise PolicyError(f"{where}: options are written NAME=KIND (e.g. -n=int), not {spec!r}")
        options[name] = _kind(kind, where)
    return options


def _slots(raw: Any, where: str) -> tuple[Slot, ...]:
    slots: list[Slot] = []
    for text in _strings(raw, f"{where} positionals"):
        if text.endswith("..."):
            slot = Slot(_kind(text[:-3], where), "many")
        elif text.endswith("?"):
            slot = Slot(_kind(text[:-1], where), "optional")
        else:
            slot = Slot(_kind(text, where), "one")
        slots.append(slot)
    order = {"one": 0, "optional": 1, "many": 2}
    ranks = [order[slot.repeat] for slot in slots]
    if ranks != sorted(ranks) or ranks.count(2) > 1:
        raise PolicyError(
            f"{where}: positionals go required first, then optional (?), then at most one "
            "repeated (...) last"
        )
    return tuple(slots)


def _check_option_name(name: str, style: Style, where: str) -> None:
    if style == "single_dash":
        if not name or name.isspace():
            raise PolicyError(f"{where}: empty option name")
        return
    short = len(name) == 2 and name[0] == "-" and name[1] != "-"
    long = name.startswith("--") and len(name) > 2 and "=" not in name
    if style == "xxd" and not short:
        raise PolicyError(f"{where}: xxd reads options by two characters: {name!r} is not one")
    if not (short or long):
        raise PolicyError(
            f"{where}: {name!r} is neither a short (-x) nor a long (--name) option; programs "
            'that take single-dash words (like find) need style = "single_dash"'
        )


def _id(raw: dict[str, Any], where: str) -> str:
    value = raw.get("id")
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise PolicyError(f"{where}: needs an id (letters, digits, . _ : -), got {value!r}")
    return value


def _reason(raw: dict[str, Any], where: str) -> str:
    value = raw.get("reason")
    if not isinstance(value, str) or not value.strip():
        raise PolicyError(f"{where}: needs a reason, a sentence saying why")
    return value.strip()


def _only(raw: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise PolicyError(f"{where}: unknown key(s) {unknown}; known: {sorted(allowed)}")


def _table(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise PolicyError(f"{where} must be a table")
    return value


def _tables(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise PolicyError(f"{where} must be an array of tables ([[...]])")
    return value


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise PolicyError(f"{where} must be a list of strings")
    return list(value)


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise PolicyError(f"{where} must be true or false")
    return value


def read_file(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"cannot read the allowlist file {path}: {exc}") from None
