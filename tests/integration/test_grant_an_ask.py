"""A headless worker refuses an allowlist ask `scope_required`, and says how to grant it
ahead; that command grants it (review19 A8: `agentworker grant` answered "is not a
scope" for the very name the refusal gave). Real hub and `agentworker run`, the CLI as
a person types it."""

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
    assert _run(live, "s.py")["status"] == "ok"
    (live.workspace / "s.py").write_text("print('rewritten')\n")
    assert _run(live, "s.py")["error"]["code"] == "scope_required"  # bound to that script
