"""Workspaces belong to (server, plan id): another server naming the same plan id
reaches another folder; old workspaces are sorted to their server or held apart."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from sandbox.workspaces import (
    FILES,
    META,
    UNCLAIMED,
    WorkspaceError,
    Workspaces,
    old_plan_key,
    plan_key,
)

A = "plain://127.0.0.1:7421#0123456789abcdef"
B = "plain://127.0.0.1:7421#fedcba9876543210"


@pytest.fixture
def spaces(tmp_path: Path) -> Workspaces:
    found = Workspaces(tmp_path / "workbench", quota_bytes=64 * 1024)
    found.prepare()
    return found


def test_two_servers_naming_one_plan_id_get_two_workspaces(spaces: Workspaces) -> None:
    spaces.max_plans_per_agent = 1
    (spaces.open("p", "agent", server=A).files / "a.txt").write_text("A's")
    assert spaces.find("p", server=B) is None and spaces.find("p") is None
    b = spaces.open("p", "agent", server=B)  # the same agent id: its own cap per server
    assert os.listdir(b.files) == [] and b.folder != spaces.open("p", server=A).folder
    assert [p.server for p in spaces.plans(server=B)] == [B]
    assert spaces.teardown("p", server=B) and not spaces.teardown("p", server=B)
    found = spaces.find("p", server=A)
    assert found is not None and (found.files / "a.txt").read_text() == "A's"
    assert spaces.last_used("p", server=B) is None and spaces.last_used("p", server=A)


def test_unclaimed_names_no_server(spaces: Workspaces) -> None:
    for reach in (spaces.open, spaces.find, spaces.detach):
        with pytest.raises(WorkspaceError):
            reach("p", server=UNCLAIMED)


def make_old(spaces: Workspaces, plan: str, used: float) -> Path:
    """A workspace as made before servers were recorded."""
    folder = spaces.base / old_plan_key(plan)
    (folder / FILES).mkdir(mode=0o700, parents=True)
    folder.chmod(0o700)
    (folder / META).write_text(json.dumps({"plan_id": plan, "agent_id": "x", "created_unix": 1}))
    (folder / FILES / "old.txt").write_text(f"{plan}'s")
    os.utime(folder / META, (used, used))
    return folder


def test_old_workspaces_are_sorted_once_to_their_known_server_else_held_apart(
    spaces: Workspaces,
) -> None:
    used = time.time() - 3600
    for plan in ("known", "unknown"):
        make_old(spaces, plan, used)
    assert {p.plan_id: p.server for p in spaces.plans()} == {
        "known": UNCLAIMED,
        "unknown": UNCLAIMED,
    }
    asked: list[list[str]] = []

    def servers_of(plans: list[str]) -> dict[str, str]:
        asked.append(sorted(plans))
        return {"known": A}

    sorted_now = spaces.sort_old(servers_of)
    assert asked == [["known", "unknown"]]
    assert {p.plan_id: p.server for p in sorted_now} == {"known": A, "unknown": UNCLAIMED}
    assert spaces.sort_old(servers_of) == [] and len(asked) == 1  # once
    assert [abs(p.last_used_unix - used) < 1 for p in spaces.plans()] == [True, True]
    assert spaces.idle(0) == [(A, "known")]  # an unclaimed one is never swept
    found = spaces.find("known", server=A)
    assert found is not None and (found.files / "old.txt").read_text() == "known's"
    for server in (A, B, ""):
        assert spaces.find("unknown", server=server) is None


def test_a_claim_gives_an_unclaimed_workspace_to_one_server(spaces: Workspaces) -> None:
    make_old(spaces, "p", time.time())
    spaces.sort_old(lambda _plans: {})
    spaces.open("q", server=B)
    with pytest.raises(WorkspaceError, match="no unclaimed workspace"):
        spaces.claim("q", A)
    with pytest.raises(WorkspaceError):
        spaces.claim("p", UNCLAIMED)
    taken = spaces.open("p", server=B)  # B's own workspace of the plan: the claim waits
    with pytest.raises(WorkspaceError, match="holds a workspace of plan 'p' already"):
        spaces.claim("p", B)
    assert not (taken.files / "old.txt").exists()
    claimed = spaces.claim("p", A)
    assert claimed.server == A and claimed.key == plan_key("p", A)
    found = spaces.find("p", server=A)
    assert found is not None and (found.files / "old.txt").read_text() == "p's"
    with pytest.raises(WorkspaceError, match="no unclaimed workspace"):
        spaces.claim("p", A)


def test_a_move_cut_short_is_finished_at_the_next_sort(spaces: Workspaces) -> None:
    folder = make_old(spaces, "p", time.time())
    meta = json.loads((folder / META).read_text())
    (folder / META).write_text(json.dumps({**meta, "server": A}))  # crashed before the rename
    assert [p.server for p in spaces.plans()] == [UNCLAIMED]
    assert spaces.find("p", server=A) is None
    spaces.sort_old(lambda _plans: {"p": B})  # decided already: the ledger is not asked
    found = spaces.find("p", server=A)
    assert found is not None and found.folder.name == plan_key("p", A)


def test_the_sweep_takes_any_servers_idle_plan_but_spares_the_busy(spaces: Workspaces) -> None:
    for server in (A, B):
        spaces.open("p", server=server)
    long_ago = time.time() - 3600
    for server in (A, B):
        os.utime(spaces.base / plan_key("p", server) / META, (long_ago, long_ago))
    assert spaces.sweep(idle_s=600, busy={(B, "p")}) == [(A, "p")]
    assert [(p.server, p.plan_id) for p in spaces.plans()] == [(B, "p")]
