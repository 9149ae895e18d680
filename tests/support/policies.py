"""Allowlist rules the suite adds to the shipped policy, to misbehave with on purpose:
programs the default never allows (an interpreter, the environment printers, endless
output) and a rule that asks the person. A test module picks the rules it needs and
points its worker at them with `exec_config`."""

from __future__ import annotations

from pathlib import Path

PYTHON3 = """
[program.python3]
paths = ["/usr/bin/python3"]
[[program.python3.rule]]
id = "test-python"
reason = "tests: an interpreter that misbehaves on purpose"
any_args = true
"""

PRINTENV = """
[program.printenv]
paths = ["/usr/bin/printenv"]
[[program.printenv.rule]]
id = "test-printenv"
reason = "tests: shows the child's whole environment"
any_args = true
"""

ENV = """
[program.env]
paths = ["/usr/bin/env"]
[[program.env.rule]]
id = "test-env"
reason = "tests: shows the child's whole environment"
match = ["env"]
not_match = ["env sh"]
"""

YES = """
[program.yes]
paths = ["/usr/bin/yes"]
[[program.yes.rule]]
id = "test-yes"
reason = "tests: endless output"
match = ["yes"]
not_match = ["yes no"]
"""

TOUCH_ASKS = """
[program.touch]
paths = ["/usr/bin/touch"]
[[program.touch.rule]]
id = "test-touch-asks"
decision = "ask"
reason = "tests: writing a file needs the person's approval"
positionals = ["write_path..."]
match = ["touch new.txt"]
not_match = ["touch /etc/new"]
"""

PYTHON3_ASKS = """
[program.python3]
paths = ["/usr/bin/python3"]
[[program.python3.rule]]
id = "python-asks"
decision = "ask"
reason = "the person approves each script"
any_args = true
"""

# The same interpreter allowed under another name: the agent's programs run beside an
# asked one (sandbox.held).
PYTHON3_BESIDE = """
[program.python3x]
paths = ["/usr/bin/python3"]
[[program.python3x.rule]]
id = "test-python-beside"
reason = "tests: an interpreter the agent may run unasked"
any_args = true
"""


def write_policy(folder: Path, *rules: str) -> Path:
    """`folder`/allowlist.toml holding `rules` (on top of the shipped policy)."""
    folder.mkdir(parents=True, exist_ok=True)
    policy = folder / "allowlist.toml"
    policy.write_text("".join(rules))
    return policy


def exec_config(folder: Path, *rules: str, extra: str = "") -> str:
    """The config TOML for a worker whose allowlist adds `rules` (written to
    `folder`/allowlist.toml); `extra` is more of [exec] (pass_env, say)."""
    return f'[exec]\npolicy = "{write_policy(folder, *rules)}"\n{extra}'
