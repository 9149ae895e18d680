"""The child's environment is rebuilt from a pass-list; secrets never pass."""

from __future__ import annotations

import pytest

from sandbox import environment
from sandbox._bwrap import Mount, _folders


@pytest.mark.parametrize(
    "name",
    [
        "AGENTWORKER_TOKEN",
        "AGENTWORKER_SERVER",
        "GITHUB_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "OPENAI_API_KEY",
        "DB_PASSWORD",
        "SSH_AUTH_SOCK",
        "LD_PRELOAD",
        "GIT_DIR",
        "POSIXLY_CORRECT",
        "GREP_OPTIONS",
        "RIPGREP_CONFIG_PATH",
        "PYTHONSTARTUP",
        "PATH",
        "HOME",
        "BAD NAME",
    ],
)
def test_secret_and_behaviour_changing_names_never_pass(name: str) -> None:
    assert environment.refusal(name) is not None
    assert environment.build({name: "value"}, [name]).get(name) != "value"


@pytest.mark.parametrize("name", ["LANG", "LC_ALL", "TZ", "HARMLESS_VAR"])
def test_plain_names_pass_when_listed_and_present(name: str) -> None:
    assert environment.refusal(name) is None
    assert environment.build({name: "v"}, [name])[name] == "v"
    assert environment.build({name: "v"}, []).get(name) != "v"  # not passed unless listed


def test_the_base_is_fixed_and_the_programs_own_settings_come_last() -> None:
    env = environment.build({"PATH": "/workspace:/usr/bin"}, ["PATH"], {"GIT_PAGER": "cat"})
    assert env["PATH"] == environment.SAFE_PATH
    assert env["HOME"] == "/tmp" and env["GIT_PAGER"] == "cat"


def test_hidden_folders_land_on_top_of_the_shared_folder_that_holds_them() -> None:
    """Shallowest first; folders outside every shared folder need no hiding."""
    args = _folders(
        [Mount("/home/me/work/ws", True), Mount("/home/me", False)],
        ["/home/me/.config/agentworker", "/elsewhere/data"],
    )
    assert args == [
        "--ro-bind", "/home/me", "/home/me",
        "--bind", "/home/me/work/ws", "/home/me/work/ws",
        "--tmpfs", "/home/me/.config/agentworker", "--remount-ro", "/home/me/.config/agentworker",
    ]  # fmt: skip
