"""Whether a scope (or pattern) names an action, and the closest one when it does not.

One answer for every place a person writes a scope: `agentworker grant` and config.toml's
`[[grant]]` tables. A typo (`fs_stats`) made a grant that admitted nothing, and the calls
it was meant for were refused `scope_required` with no word of why.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase
from typing import Final

from worker.core.scopes import ASK_PREFIX
from worker.wire.protocol import WORKBENCH_SURFACE

# Scopes a suggestion names only when the name asked holds their action's first word:
# a person granting the mouse (`mouse_*`, `click`) was told "Did you mean
# workerHost.exec?" (review27 I5), the shared prefix outweighing the rest.
_NOT_SUGGESTED_UNASKED: Final = {
    "workerHost.exec": "exec",
    "workerComputer.key_type": "key",
    "workerComputer.key_combo": "key",
}


def scopes() -> list[str]:
    """Every scope an action of this worker asks for, sorted."""
    from worker import actions

    return sorted({spec.scope for spec in actions.specs()})


def no_action_problem(pattern: str, shown: str) -> str | None:
    """Why a grant of `pattern` (written as `shown`) would admit no call, with what it
    likely meant; None when some action asks for a scope it matches."""
    known = scopes()
    if any(fnmatchcase(scope, pattern) for scope in known):
        return None
    if pattern.startswith(f"{WORKBENCH_SURFACE}."):
        return (
            f"{shown} needs no grant: sandbox mode's {WORKBENCH_SURFACE} actions ask for no "
            "scope (each plan reaches only its own workspace)"
        )
    said = f"{shown} names no action, so a grant of it would admit no call."
    close = closest_scope(pattern, known)
    if close:  # the one line a typo needs, not every scope there is
        return f"{said} Did you mean {close}?"
    by_surface: dict[str, list[str]] = {}
    for scope in known:
        surface, _, action = scope.partition(".")
        by_surface.setdefault(surface, []).append(action)
    listed = "; ".join(f"{surface}. {', '.join(a)}" for surface, a in by_surface.items())
    return (
        f"{said} The scopes, by surface: {listed} (e.g. workerHost.fs_stat); patterns such "
        "as workerHost.fs_* or workerComputer.* work too"
    )


def grant_tables_problem(tables: Iterable[Sequence[str]], config_file: object) -> str | None:
    """Why config.toml's [[grant]] tables (each table's scopes) would grant something no
    call asks for, naming the first such scope; None when every one admits a call.
    An allowlist ask (`ask:...`) is kept under its own name and not checked here."""
    for scopes_of_table in tables:
        for scope in scopes_of_table:
            if scope.startswith(ASK_PREFIX):
                continue
            problem = no_action_problem(scope, repr(scope))
            if problem is not None:
                return f"[[grant]] in {config_file}: {problem}"
    return None


def closest_scope(pattern: str, known: list[str]) -> str | None:
    """The scope (or pattern) a mistyped one most likely meant, by its action part
    against every surface's actions: `mouse_*` is workerComputer.mouse_*, whatever
    surface the bare name was given; None rather than a stronger scope than asked."""
    from difflib import get_close_matches  # a few ms of a start, for a typo only

    action = pattern.rpartition(".")[2]
    by_action = {scope.partition(".")[2]: scope for scope in known}
    surfaces = sorted(
        {s.partition(".")[0] for s in known if fnmatchcase(s.partition(".")[2], action)}
    )
    if len(surfaces) == 1:
        return f"{surfaces[0]}.{action}"
    close = get_close_matches(action, list(by_action), n=1)
    if not close:
        return None
    scope = by_action[close[0]]
    word = _NOT_SUGGESTED_UNASKED.get(scope)
    return None if word is not None and word not in action.lower() else scope
