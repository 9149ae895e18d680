"""The policy and its decisions in words, for `agentworker allowlist show` and `check`.

A person granting exec should be able to read what they grant: which programs,
from which paths, in which forms, and why each refusal happens.
"""

from __future__ import annotations

from typing import Any

from allowlist._grammar import Grammar, Kind, Slot
from allowlist._policy import Decision, Policy


def describe(policy: Policy) -> dict[str, Any]:
    """The effective policy as plain data (JSON-ready)."""
    return {
        "sources": list(policy.sources),
        "programs": {
            name: {
                "paths": list(program.paths),
                "resolved": program.resolve(),
                "network": program.network,
                "unix_sockets": program.unix_sockets,
                "env": dict(program.env),
                "rules": [
                    {
                        "id": rule.id,
                        "decision": rule.decision,
                        "reason": rule.reason,
                        "form": form(name, rule.grammar),
                        "source": rule.source,
                    }
                    for rule in program.rules
                ],
                "deny": [
                    {
                        "id": deny.id,
                        "args": list(deny.args),
                        "where": deny.where,
                        "reason": deny.reason,
                        "source": deny.source,
                    }
                    for deny in program.denies
                ],
            }
            for name, program in policy.programs.items()
        },
    }


def render(policy: Policy) -> str:
    data = describe(policy)
    lines = [f"exec allowlist from: {', '.join(data['sources'])}", ""]
    for name, program in data["programs"].items():
        where = program["resolved"] or f"not installed (pinned: {', '.join(program['paths'])})"
        extra = ", network" if program["network"] else ""
        extra += ", unix sockets" if program["unix_sockets"] else ""
        lines.append(f"{name}  →  {where}{extra}")
        for rule in program["rules"]:
            lines.append(f"  {rule['decision']:<9} {rule['id']}: {rule['form']}")
            lines.append(f"  {'':<9} {rule['reason']}")
        for deny in program["deny"]:
            scope = " before the subcommand" if deny["where"] == "before_subcommand" else ""
            lines.append(f"  {'forbidden':<9} {deny['id']}: {' '.join(deny['args'])}{scope}")
            lines.append(f"  {'':<9} {deny['reason']}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def explain(decision: Decision, verdict: str | None = None) -> str:
    """The decision for a person; `verdict` names it (default: the policy's own word)."""
    verdict = verdict or decision.refusal or decision.verdict
    lines = [f"decision: {verdict}"]
    if decision.rule_id:
        lines.append(f"rule: {decision.rule_id}")
    lines.append(f"reason: {decision.reason}")
    if decision.path:
        lines.append(f"runs: {decision.path}")
    if len(decision.matched) > 1:
        lines.append(f"matched: {', '.join(decision.matched)} (the strictest wins)")
    near = decision.near
    if near:
        lines.append("rules that came close:")
        lines.extend(f"  {rule_id}: {why}" for rule_id, why in near.items())
    return "\n".join(lines) + "\n"


def form(program: str, grammar: Grammar) -> str:
    """A usage line: `git log [flags] [-n=int] [opaque...] [-- read_path...]`."""
    words = [program, *grammar.subcommand]
    if grammar.any_args:
        return " ".join([*words, "[anything]"])
    for group in grammar.require:
        words.append("|".join(sorted(group)))
    if grammar.flags:
        words.append(
            f"[{len(grammar.flags)} flags: {' '.join(sorted(grammar.flags)[:12])}"
            f"{' …' if len(grammar.flags) > 12 else ''}]"
        )
    for name, kind in sorted(grammar.options.items()):
        words.append(f"[{name} {_kind(kind)}]")
    words.extend(_slot(slot) for slot in grammar.positionals)
    if grammar.after_double_dash is not None:
        words.append("[--")
        words.extend(_slot(slot) for slot in grammar.after_double_dash)
        words[-1] += "]"
    return " ".join(words)


def _kind(kind: Kind) -> str:
    return "|".join(kind) if isinstance(kind, tuple) else kind.upper()


def _slot(slot: Slot) -> str:
    text = _kind(slot.kind)
    return {"one": text, "optional": f"[{text}]", "many": f"[{text}...]"}[slot.repeat]
