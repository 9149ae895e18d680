"""A sandbox worker's plans stay with the server that made them (review11 finding 03).

A worker started again with the same data folder against another server (another
hub, or the same hub with a new token) used to name the first server's plans in its
Hello and serve the second server's calls in the first server's workspaces (same
plan id: the same folder). Now a workspace belongs to (server key, plan id): B
neither hears of nor reaches A's plans, and A finds them again when the worker
returns to it. Workspaces from before servers were recorded are given theirs if the
ledger knows it, else held apart until `agentworker sandbox claim`.

Real parts: `agentworker hub` subprocesses (each its own home and tokens), the worker
as `agentworker run --sandbox` subprocesses on one data folder, real bubblewrap.
"""

from __future__ import annotations

import json
import shutil
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.workspaces import FILES, META, UNCLAIMED, old_plan_key
from tests.support.cluster import Cluster, cluster
from tests.support.servers import START_S, Worker, key_of, workers_token
from tests.support.workbench import call, run, teardown

SECRET = b"SECRET-OF-SERVER-A-customer-data-42\n"


@pytest.fixture(scope="module")
def hubs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Cluster]]:
    base = tmp_path_factory.mktemp("servers")
    with cluster(base / "a", worker=False) as a, cluster(base / "b", worker=False) as b:
        yield a, b


def new_plan() -> str:
    return f"plan-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def worker(tmp_path: Path, hubs: tuple[Cluster, Cluster]) -> Iterator[Worker]:
    one = Worker(tmp_path / "w", hubs[0].listen)
    yield one
    one.stop()


def learned(hub: Cluster, worker: Worker) -> bool:
    """Whether `hub` learned plans from the worker's Hello (its log says so while the
    worker is being connected, before ListWorkers shows it)."""
    proc = next(p for p in hub.procs if p.name == "hub")
    return f"worker {worker.worker_id} holds " in proc.log()


def read(hub: Cluster, plan: str, path: str = "secret.txt") -> tuple[dict[str, Any], bytes]:
    return call(hub, plan, "fs_read", {"path": path}, agent_id="agent")


def test_another_server_neither_hears_of_nor_reaches_a_servers_plans(
    hubs: tuple[Cluster, Cluster], worker: Worker
) -> None:
    a, b = hubs
    plan = new_plan()
    worker.at(a)
    wrote, _ = call(a, plan, "fs_write", {"path": "secret.txt"}, SECRET, agent_id="agent")
    assert wrote["status"] == "ok", wrote
    shown, blob = run(a, plan, ["cat", "/workspace/secret.txt"], agent_id="agent")
    assert blob == SECRET, shown

    worker.at(b)  # the same data folder, another hub and token
    assert not learned(b, worker), "B's hub was told A's plan in the Hello"
    out, blob = read(b, plan)
    assert out["error"]["code"] == "not_found" and SECRET not in blob, out
    listing, _ = call(b, plan, "fs_list", {"path": "."}, agent_id="agent")
    assert listing["result"]["entries"] == [], listing
    shown, blob = run(b, plan, ["ls", "-A", "/workspace"], agent_id="agent")
    assert shown["status"] == "ok" and blob == b"", (shown, blob)
    wrote, _ = call(b, plan, "fs_write", {"path": "b.txt"}, b"B's own\n", agent_id="agent")
    assert wrote["status"] == "ok", wrote
    assert teardown(b, plan)["result"] == {"plan_id": plan, "removed": True}
    assert not worker.folder(key_of(b), plan).exists()
    assert (worker.folder(key_of(a), plan) / FILES / "secret.txt").read_bytes() == SECRET

    worker.at(a)  # back: A's plan is there as it left it, and nothing of B's
    out, blob = read(a, plan)
    assert out["status"] == "ok" and blob == SECRET, out
    gone, _ = read(a, plan, "b.txt")
    assert gone["error"]["code"] == "not_found", gone
    rows = worker.listed()
    assert [(r["plan_id"], r["server"]) for r in rows] == [(plan, key_of(a))], rows


def test_the_same_hub_with_a_new_token_is_another_server(tmp_path: Path) -> None:
    plan = new_plan()
    with cluster(tmp_path / "hub", worker=False) as hub:
        worker = Worker(tmp_path / "w", hub.listen)
        try:
            worker.at(hub)
            wrote, _ = call(hub, plan, "fs_write", {"path": "secret.txt"}, SECRET)
            assert wrote["status"] == "ok", wrote
            old = key_of(hub)
            worker.stop()
            kept = tmp_path / "old-tokens"
            kept.mkdir()
            hub_proc = next(p for p in hub.procs if p.name == "hub")
            hub_proc.signal(signal.SIGTERM)
            hub_proc.wait(START_S)
            for name in ("hub.token", "hub-workers.token"):
                shutil.move(hub.home / name, kept / name)
            hub.procs.remove(hub_proc)
            hub.start_hub()  # new tokens, the same address and hub.db
            assert key_of(hub) != old

            worker.at(hub)
            out, blob = read(hub, plan)
            assert out["error"]["code"] == "not_found" and SECRET not in blob, out

            worker.stop()
            hub_proc = next(p for p in hub.procs if p.name == "hub")
            hub_proc.signal(signal.SIGTERM)
            hub_proc.wait(START_S)
            hub.procs.remove(hub_proc)
            for name in ("hub.token", "hub-workers.token"):
                shutil.move(kept / name, hub.home / name)
            hub.start_hub()  # the old tokens again: the old server
            worker.at(hub)
            out, blob = read(hub, plan)
            assert out["status"] == "ok" and blob == SECRET, out
        finally:
            worker.stop()


def make_old(worker: Worker, server: str, plan: str) -> Path:
    """Turn `server`'s workspace of `plan` into one as workspaces were before servers
    were recorded: named by the plan id alone, its plan.json without a server."""
    folder = worker.folder(server, plan)
    meta = json.loads((folder / META).read_text())
    del meta["server"]
    (folder / META).write_text(json.dumps(meta))
    old = folder.parent / old_plan_key(plan)
    folder.rename(old)
    return old


def test_old_workspaces_go_to_their_server_if_known_else_wait_for_a_claim(
    hubs: tuple[Cluster, Cluster], worker: Worker
) -> None:
    a, b = hubs
    known, mixed = new_plan(), new_plan()
    worker.at(a)
    for plan in (known, mixed):
        wrote, _ = call(a, plan, "fs_write", {"path": "secret.txt"}, SECRET, agent_id="agent")
        assert wrote["status"] == "ok", wrote
    worker.at(b)  # B's calls of `mixed` in the ledger too: whose its old workspace is is unknown
    wrote, _ = call(b, mixed, "fs_write", {"path": "b.txt"}, b"B's\n", agent_id="agent")
    assert wrote["status"] == "ok", wrote
    worker.stop()
    shutil.rmtree(worker.folder(key_of(b), mixed))
    for plan in (known, mixed):
        make_old(worker, key_of(a), plan)
    listed = {r["plan_id"]: r["server"] for r in worker.listed()}
    assert listed == {known: UNCLAIMED, mixed: UNCLAIMED}, listed  # not sorted yet

    worker.at(b)  # sorted at the start: `known` is A's, `mixed` no one's
    for plan in (known, mixed):
        out, blob = read(b, plan)
        assert out["error"]["code"] == "not_found" and SECRET not in blob, out
    assert not learned(b, worker)
    listed = {r["plan_id"]: r["server"] for r in worker.listed()}
    assert listed == {known: key_of(a), mixed: UNCLAIMED}, listed

    worker.at(a)
    out, blob = read(a, known)
    assert out["status"] == "ok" and blob == SECRET, out
    out, blob = read(a, mixed)
    assert out["error"]["code"] == "not_found" and SECRET not in blob, out

    # The person gives it to A, named as `run` names A: A's calls reach it at once.
    claimed = worker.cli(
        "sandbox", "claim", mixed, "--server", a.listen, "--token-file", str(workers_token(a))
    )
    assert claimed.returncode == 0, claimed
    out, blob = read(a, mixed)
    assert out["status"] == "ok" and blob == SECRET, out
    again = worker.cli("sandbox", "claim", mixed, "--server-key", key_of(b))
    assert again.returncode != 0 and "no unclaimed workspace" in again.stdout, again
    listed = {r["plan_id"]: r["server"] for r in worker.listed()}
    assert listed == {known: key_of(a), mixed: key_of(a)}, listed
