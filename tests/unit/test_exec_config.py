"""The [exec] section: coherent deadlines, and no secret in the pass-list."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from worker.config import ExecSection


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
