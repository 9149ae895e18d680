"""The exec policy engine and the shipped default policy (`default.toml`).

Decides, for an argument list, whether `workerHost.exec` may run it: allow, ask
the person, or refuse (a `Refusal`: not allowed, forbidden, or a path refused).
It never runs anything and never touches the worker: standard library only, so
the policy can be reviewed and tested on its own.

    policy = load_policy(Path("~/.config/agentworker/allowlist.toml"))
    decision = policy.decide(["git", "log", "-n", "5"], check_path)
    decision.verdict, decision.path, decision.reason
"""

from allowlist._describe import describe, explain, render
from allowlist._file import PolicyFile
from allowlist._grammar import Grammar, NoMatchError, PathCheck, PathRefusedError, Slot
from allowlist._load import PolicyError
from allowlist._policy import Decision, Deny, Policy, Program, Refusal, Rule
from allowlist._self_test import EXAMPLE_ROOT, example_path_check, load_policy, load_text

__all__ = [
    "EXAMPLE_ROOT",
    "Decision",
    "Deny",
    "Grammar",
    "NoMatchError",
    "PathCheck",
    "PathRefusedError",
    "Policy",
    "PolicyError",
    "PolicyFile",
    "Program",
    "Refusal",
    "Rule",
    "Slot",
    "describe",
    "example_path_check",
    "explain",
    "load_policy",
    "load_text",
    "render",
]
