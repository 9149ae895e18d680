"""The child's environment is rebuilt from a pass-list; secrets never pass."""

from __future__ import annotations

from pathlib import Path

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


def test_hidden_folders_land_on_top_of_the_shared_folder_that_holds_them(tmp_path: Path) -> None:
    """Shallowest first; a hidden folder is sealed read-only only after every mount (a
    deeper shared folder needs its mount point made in it); a hidden file is covered
    by an empty one; places outside every shared folder, or missing, need no hiding."""
    me = tmp_path / "me"
    (me / "work" / "ws").mkdir(parents=True)
    (me / ".config" / "agentworker").mkdir(parents=True)
    (me / "policy.toml").write_text("")
    config, policy, ws = me / ".config" / "agentworker", me / "policy.toml", me / "work" / "ws"
    args = _folders(
        [Mount(str(ws), True), Mount(str(me), False)],
        [str(config), str(policy), "/elsewhere/data", str(me / "missing")],
    )
    assert args == [
        "--ro-bind", str(me), str(me),
        "--ro-bind", str(me / ".config"), str(me / ".config"),
        "--ro-bind", str(me / "work"), str(me / "work"),
        "--ro-bind", "/dev/null", str(policy),
        "--bind", str(ws), str(ws),
        "--tmpfs", str(config),
        "--remount-ro", str(config),
    ]  # fmt: skip


def test_the_way_down_to_a_hidden_place_is_pinned_with_the_writability_of_its_folder(
    tmp_path: Path,
) -> None:
    """Each folder between a shared folder and a hidden place is bound onto itself (a
    mount point cannot be renamed), with its shared folder's writability; a shared
    folder on the way is a mount point already, and nothing inside a hidden place
    is bound (that would show what its tmpfs covers)."""
    me = tmp_path / "me"
    data = me / ".local" / "share" / "work" / "agentworker"
    (data / "blobs").mkdir(parents=True)
    (me / ".config" / "agentworker").mkdir(parents=True)
    args = _folders(
        [Mount(str(me), True), Mount(str(me / ".local" / "share" / "work"), False)],
        [str(data), str(data / "blobs"), str(me / ".config" / "agentworker")],
    )
    local, share, work = me / ".local", me / ".local" / "share", me / ".local" / "share" / "work"
    assert args == [
        "--bind", str(me), str(me),
        "--bind", str(me / ".config"), str(me / ".config"),
        "--bind", str(local), str(local),
        "--bind", str(share), str(share),
        "--tmpfs", str(me / ".config" / "agentworker"),
        "--ro-bind", str(work), str(work),
        "--tmpfs", str(data),
        "--tmpfs", str(data / "blobs"),
        "--remount-ro", str(data),
        "--remount-ro", str(data / "blobs"),
        "--remount-ro", str(me / ".config" / "agentworker"),
    ]  # fmt: skip


def test_held_places_are_pinned_among_the_shared_and_hidden_folders(tmp_path: Path) -> None:
    """review21 B0 and B8: the places other calls' asked programs hold (sandbox.held
    pins) were bound after every mount and hiding, writable for each folder on the way:
    a held place beneath ~/.config brought the worker's hidden config back, and a
    read-only shared folder nested in a writable one became writable. Now each goes at
    its depth: a folder on the way before what hides beneath it and as its deepest
    shared folder has it, nothing inside a hidden place, the held place read-only
    after the mount at its own path."""
    me = tmp_path / "me"
    config = me / ".config" / "agentworker"
    config.mkdir(parents=True)
    ro = me / "ro"
    (ro / "sub").mkdir(parents=True)
    held = [
        (10, str(me / ".config"), True),  # on the way to .config/x.py
        (11, str(me / ".config" / "x.py"), False),
        (12, str(config), True),  # inside a hidden place: never bound
        (13, str(config / "allowlist.toml"), False),
        (14, str(ro / "sub"), True),  # on the way, in the read-only shared folder
        (15, str(ro / "sub" / "x.py"), False),
        (16, str(ro), False),  # a held shared folder: read-only after its mount
    ]
    args = _folders([Mount(str(me), True), Mount(str(ro), False)], [str(config)], held)
    assert args == [
        "--bind", str(me), str(me),
        "--bind", str(me / ".config"), str(me / ".config"),
        "--bind-fd", "10", str(me / ".config"),
        "--ro-bind", str(ro), str(ro),
        "--ro-bind-fd", "16", str(ro),
        "--ro-bind-fd", "14", str(ro / "sub"),
        "--tmpfs", str(config),
        "--ro-bind-fd", "11", str(me / ".config" / "x.py"),
        "--ro-bind-fd", "15", str(ro / "sub" / "x.py"),
        "--remount-ro", str(config),
    ]  # fmt: skip


def test_what_is_bound_beneath_a_held_folder_is_read_only(tmp_path: Path) -> None:
    """review23 C7: a held folder is bound read-only at its depth, and what is bound
    deeper lands on top of it: a read-write shared folder nested in it, and the folders
    on the way to one, were bound writable, and a program beside rewrote files of the
    approved folder while the approved program ran. Beneath a held place every bind is
    read-only; beside it, nothing changes."""
    ws = tmp_path / "ws"
    build = ws / "proj" / "deep" / "build"
    build.mkdir(parents=True)
    (ws / "other").mkdir()
    held = [(20, str(ws / "proj"), False)]
    mounts = [Mount(str(ws), True), Mount(str(build), True), Mount(str(ws / "other"), True)]
    args = _folders(mounts, [], held)
    assert args == [
        "--bind", str(ws), str(ws),
        "--bind", str(ws / "other"), str(ws / "other"),
        "--ro-bind", str(ws / "proj"), str(ws / "proj"),  # on the way to build
        "--ro-bind-fd", "20", str(ws / "proj"),
        "--ro-bind", str(ws / "proj" / "deep"), str(ws / "proj" / "deep"),
        "--ro-bind", str(build), str(build),
    ]  # fmt: skip
