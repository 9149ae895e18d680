"""The environment a sandboxed program gets: rebuilt from a pass-list, never inherited.

The worker's own environment may hold its bearer token (`AGENTWORKER_TOKEN`) and
whatever secrets the person's shell exports. None of it reaches a child unless it
is named in the pass-list, and even then a name that looks secret, or one that
changes how programs load or parse their arguments (LD_*, GIT_*, POSIXLY_CORRECT,
GREP_OPTIONS, ...), is dropped. A program's own fixed settings (the policy's `env`)
come last: the person wrote those.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Final

SAFE_PATH: Final = "/usr/local/bin:/usr/bin:/bin"
BASE: Final[Mapping[str, str]] = {
    "PATH": SAFE_PATH,
    "HOME": "/tmp",  # noqa: S108 - the sandbox's private, empty tmpfs
    "TMPDIR": "/tmp",  # noqa: S108 - the same
    "TERM": "dumb",
    "LANG": "C.UTF-8",
}
_SECRET: Final = re.compile(
    r"TOKEN|SECRET|PASSW|PASSPHRASE|KEY|AUTH|COOKIE|CREDENTIAL|SESSION|PRIVATE|SIGNATURE|CERT",
    re.IGNORECASE,
)
_BEHAVIOUR_PREFIXES: Final = (
    "AGENTWORKER_",
    "LD_",
    "DYLD_",
    "GIT_",
    "PYTHON",
    "PERL",
    "RUBY",
    "NODE_",
    "BASH_",
    "SSH_",
    "GPG_",
)
_BEHAVIOUR_NAMES: Final = frozenset(
    {
        "ENV",
        "IFS",
        "CDPATH",
        "SHELLOPTS",
        "POSIXLY_CORRECT",
        "GREP_OPTIONS",
        "GREP_COLOR",
        "RIPGREP_CONFIG_PATH",
        "PAGER",
        "EDITOR",
        "VISUAL",
        "BROWSER",
        "PROMPT_COMMAND",
        "PATH",
        "HOME",
        "TMPDIR",
    }
)
_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def refusal(name: str) -> str | None:
    """Why `name` may never be passed to a sandboxed program, or None if it may."""
    if not _NAME.fullmatch(name):
        return "is not a valid variable name"
    if _SECRET.search(name):
        return "looks like it holds a secret"
    if name.upper() in _BEHAVIOUR_NAMES or name.upper().startswith(_BEHAVIOUR_PREFIXES):
        return "changes how programs load, parse arguments or run helpers"
    return None


def build(
    source: Mapping[str, str], pass_names: Iterable[str], fixed: Mapping[str, str] | None = None
) -> dict[str, str]:
    """BASE, plus the passable names present in `source`, plus `fixed`."""
    env = dict(BASE)
    for name in pass_names:
        if name in source and refusal(name) is None:
            env[name] = source[name]
    env.update(fixed or {})
    return env
