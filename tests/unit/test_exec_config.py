"""The [exec] section: coherent deadlines, and no secret in the pass-list."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError

from sandbox import Root
from worker.actions.host.exec_cmd import ExecArgs, exec_command
from worker.config import ExecSection, Paths
from worker.core.registry import Context
from worker.errors import WorkerError


def test_defaults_match_the_design() -> None:
    section = ExecSection()
    assert section.default_timeout_s == 30 and section.policy is None
    assert "LANG" in section.pass_env


@pytest.mark.parametrize("name", ["AGENTWORKER_TOKEN", "GITHUB_TOKEN", "LD_PRELOAD", "MY_API_KEY"])
def test_a_pass_list_naming_a_secret_or_loader_variable_is_refused(name: str) -> None:
    with pytest.raises(ValidationError, match="never passed to programs"):
        ExecSection(pass_env=["LANG", name])


def test_the_default_timeout_must_fit_under_the_ceiling() -> None:
    with pytest.raises(ValidationError, match="must not exceed max_timeout_s"):
        ExecSection(default_timeout_s=60, max_timeout_s=10)


def test_exec_reads_the_allowlist_beside_the_config_it_was_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An allowlist.toml in a --home folder counts, whatever the environment says."""
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    (home / "ws").mkdir(parents=True)
    elsewhere.mkdir()
    monkeypatch.setenv("AGENTWORKER_HOME", str(elsewhere))
    (home / "allowlist.toml").write_text(
        '[program.date]\npaths = ["/usr/bin/date"]\n[[program.date.rule]]\nid = "no-date"\n'
        'decision = "forbidden"\nreason = "not today"\nmatch = ["date"]\nnot_match = []\n'
    )
    ctx = Context(
        correlation_id="c",
        plan_id="p",
        agent_id="a",
        blob=b"",
        roots=[Root(path=(home / "ws").resolve(), writable=True)],
        paths=Paths(config_dir=home, data_dir=home),
    )
    with pytest.raises(WorkerError) as refused:
        asyncio.run(exec_command(ctx, ExecArgs(argv=["date"])))
    assert refused.value.code == "command_forbidden"
    assert "no-date" in refused.value.message or refused.value.details.get("rule") == "no-date"
