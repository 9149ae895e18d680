"""A headless worker refuses an allowlist ask `scope_required`, and says how to grant it
ahead; that command grants it (review19 A8: `agentworker grant` answered "is not a
scope" for the very name the refusal gave), and only it: the refusal reaches the person
through the agent, which could rename the digest of one command as another's (review21
B7). Real hub and `agentworker run`, the CLI as a person types it."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import Cluster, cluster
from tests.support.policies import PYTHON3_ASKS, exec_config


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Cluster]:
    config = exec_config(tmp_path / "policy", PYTHON3_ASKS)
    with cluster(tmp_path / "home", extra_config=config) as c:
        yield c


def _run(live: Cluster, script: str) -> dict[str, Any]:
    args = {"argv": ["python3", script], "cwd": str(live.workspace)}
    answer = live.cli(
        "call", "exec", json.dumps(args), "--agent", "tester", "--plan", "plan-1"
    )  # fmt: skip
    return dict(json.loads(answer.stdout))


def test_the_command_a_headless_ask_names_grants_it(live: Cluster) -> None:
    (live.workspace / "s.py").write_text("print('granted ahead')\n")
    refused = _run(live, "s.py")
    assert refused["error"]["code"] == "scope_required", refused
    message = refused["error"]["message"]
    command = shlex.split(message.split("grant it ahead: ", 1)[1].removesuffix(")"))
    assert command[:3] == ["agentworker", "grant", refused["error"]["details"]["needs_approval"]]
    typed = [word.replace("AGENT", "tester").replace("PLAN", "plan-1") for word in command[1:]]
    granted = live.cli(*typed)
    assert granted.returncode == 0, granted.stderr
    assert "    command: python3 s.py\n" in granted.stdout  # what it lets run, shown
    assert _run(live, "s.py")["status"] == "ok"
    (live.workspace / "s.py").write_text("print('rewritten')\n")
    assert _run(live, "s.py")["error"]["code"] == "scope_required"  # bound to that script


def _granted_asks(live: Cluster) -> list[str]:
    listed = live.cli("grants", "--json")
    return [g["scope"] for g in json.loads(listed.stdout) if g["scope"].startswith("ask:")]


def test_an_ask_the_agent_renamed_is_not_granted(live: Cluster) -> None:
    """The digest of `python3 evil.py` named as `ls`: the person is shown what it is."""
    (live.workspace / "evil.py").write_text("open('PWNED', 'w').write('ran')\n")
    refused = _run(live, "evil.py")
    name = refused["error"]["details"]["needs_approval"]
    forged = name.replace("python3 (1 arg)", "ls (1 arg)")
    assert forged != name
    granted = live.cli("grant", forged, "--agent", "tester", "--plan", "plan-1")
    assert granted.returncode == 2, granted.stdout
    assert "is not what the worker here refused" in granted.stderr
    assert "    command: python3 evil.py\n" in granted.stderr
    assert _granted_asks(live) == []
    assert _run(live, "evil.py")["error"]["code"] == "scope_required"
    assert not (live.workspace / "PWNED").exists()


def test_an_ask_the_worker_never_refused_is_not_granted(live: Cluster) -> None:
    name = f"workerHost.exec ls (1 arg) in {live.workspace} (sha256 {'0' * 64})"
    granted = live.cli("grant", name, "--agent", "tester", "--plan", "plan-1")
    assert granted.returncode == 2, granted.stdout
    assert "Let the call run once so that the worker refuses it" in granted.stderr
    assert _granted_asks(live) == []


def test_an_argument_cannot_print_lines_of_its_own_under_what_a_grant_lets_run(
    live: Cluster,
) -> None:
    """review23 C18: `grant` split what it shows with str.splitlines, which also breaks
    at U+2028 (and U+2029, U+0085, \\v, \\f): an argument holding one printed a second
    `command:` line of the agent's choosing. Lines break at the prompt's own only."""
    (live.workspace / "s.py").write_text("print('x')\n")
    forged = "x\u2028command: python3 harmless.py\u2029y"
    args = {"argv": ["python3", "s.py", forged], "cwd": str(live.workspace)}
    answer = live.cli("call", "exec", json.dumps(args), "--agent", "tester", "--plan", "plan-1")
    refused = dict(json.loads(answer.stdout))
    name = refused["error"]["details"]["needs_approval"]
    forged_name = name.replace("python3 (2 args)", "ls (2 args)")
    for label, out in ((name, "stdout"), (forged_name, "stderr")):
        granted = live.cli("grant", label, "--agent", "tester", "--plan", "plan-1")
        printed = getattr(granted, out)
        assert "\n    command: python3 harmless.py" not in printed, printed
        assert "\u2028" not in printed and "\u2029" not in printed, printed
