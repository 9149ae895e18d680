"""The person's grants are per server; a server's kill binds its own plan, the person's
kill a plan id whichever server names it; a sandbox built ahead for a plan never outlives
the worker that served its server.

A worker's data folder pointed at hub A, then hub B (another address and token), then
A again: real hubs and `agentworker run` subprocesses over loopback, real bubblewrap.
Before, a grant made while the worker served A admitted B's calls of the same agent, and
B's KillPlan of an id of A's plan stopped A's plan (review11 finding 04).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_exec_ahead import WHERE, gone, held, settings
from tests.support.cluster import Cluster, cluster, wait_for
from tests.support.host_calls import call
from tests.support.servers import START_S, Worker, key_of, workers_token
from worker.core.ledger import MAX_SERVER_KILLS
from worker.wire.proto import agentworker_pb2 as pb

STAT = json.dumps({"path": "."})


@pytest.fixture(scope="module")
def hubs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Cluster]]:
    base = tmp_path_factory.mktemp("servers")
    with cluster(base / "a", worker=False) as a, cluster(base / "b", worker=False) as b:
        yield a, b


@pytest.fixture
def worker(tmp_path: Path, hubs: tuple[Cluster, Cluster]) -> Iterator[Worker]:
    one = Worker(tmp_path / "w", hubs[0].listen, sandbox=False, extra_config=settings(tmp_path))
    yield one
    one.stop()


def stat_as(hub: Cluster, agent: str, **fields: Any) -> dict[str, Any]:
    return hub.call("workerHost.fs_stat", STAT, agent_id=agent, **fields)


def test_a_grant_admits_the_calls_of_the_server_it_was_made_for_only(
    hubs: tuple[Cluster, Cluster], worker: Worker
) -> None:
    a, b = hubs
    agent = f"me-{uuid.uuid4().hex[:8]}"
    # Before the worker here served any server: for the first one it serves.
    granted = worker.cli("grant", "fs_stat", "--agent", agent, "--for", "1h")
    assert granted.returncode == 0 and "the first server" in granted.stdout, granted
    worker.at(a)
    assert stat_as(a, agent)["status"] == "ok"
    again = worker.cli("grant", "fs_stat", "--agent", agent + "-2")  # the server served now
    assert again.returncode == 0 and key_of(a) in again.stdout, again

    worker.at(b)  # the same data folder and agent id, another server
    refused = stat_as(b, agent)
    assert refused["error"]["code"] == "scope_required", refused
    listed = json.loads(worker.cli("grants", "--json").stdout)
    assert {(g["agent"], g["server"]) for g in listed} == {
        (agent, key_of(a)),
        (agent + "-2", key_of(a)),
    }, listed

    worker.at(a)  # back at A: its grant holds as it did
    assert stat_as(a, agent)["status"] == "ok"

    # A grant for B, named as `run` names B, while the worker serves A.
    named = worker.cli(
        "grant", "fs_stat", "--agent", agent, "--server", b.listen,
        "--token-file", str(workers_token(b)),
    )  # fmt: skip
    assert named.returncode == 0 and key_of(b) in named.stdout, named
    assert stat_as(a, agent)["status"] == "ok"
    worker.at(b)
    assert stat_as(b, agent)["status"] == "ok"


def kill_from(hub: Cluster, plan: str, reason: str) -> None:
    hub.run(
        lambda c: c.stub.KillPlan(
            pb.KillPlanRequest(plan_id=plan, reason=reason), metadata=c.metadata, timeout=30
        )
    )


def code_of(hub: Cluster, plan: str) -> str:
    out = hub.call("workerHost.fs_stat", STAT, plan_id=plan)
    return "ok" if out["status"] == "ok" else str(out["error"]["code"])


def test_a_servers_kill_binds_its_own_plan_and_the_persons_kill_every_servers(
    hubs: tuple[Cluster, Cluster], worker: Worker
) -> None:
    a, b = hubs
    plan, theirs, persons = (f"plan-{uuid.uuid4().hex[:8]}-{n}" for n in ("a", "b", "p"))
    worker.at(a)
    kill_from(a, plan, "A stops its plan")
    wait_for(lambda: plan in worker.cli("killed").stdout, START_S)
    assert code_of(a, plan) == "plan_killed"
    assert worker.cli("kill", persons).returncode == 0  # the person's, at this machine
    assert code_of(a, persons) == "plan_killed"

    worker.at(b)
    assert code_of(b, plan) == "ok"  # B's plan of the id: A's kill stopped A's alone
    assert code_of(b, persons) == "plan_killed"  # the person's binds every server's
    kill_from(b, theirs, "B stops a plan of A's id")
    wait_for(lambda: code_of(b, theirs) == "plan_killed", START_S)
    listed = {k["plan"]: k["server"] for k in json.loads(worker.cli("killed", "--json").stdout)}
    assert listed == {plan: key_of(a), persons: "*", theirs: key_of(b)}, listed

    worker.at(a)  # back at A: its kill holds, B's kill does not reach A's plan
    assert code_of(a, plan) == "plan_killed"
    assert code_of(a, persons) == "plan_killed"
    assert code_of(a, theirs) == "ok"
    assert worker.cli("lift", plan).returncode == 0
    assert code_of(a, plan) == "ok"


def test_a_servers_flood_of_kills_prunes_its_own_kills_only(
    hubs: tuple[Cluster, Cluster], worker: Worker
) -> None:
    """B's kills of made-up plans past MAX_SERVER_KILLS prune B's oldest kills, never A's
    (review12 finding 04: they pruned A's kill of A's plan, and it ran again at A)."""
    a, b = hubs
    tag = uuid.uuid4().hex[:8]
    plan = f"plan-{tag}-a"
    worker.at(a)
    kill_from(a, plan, "A stops its plan")
    wait_for(lambda: plan in worker.cli("killed").stdout, START_S)

    worker.at(b)
    flood = [f"made-up-{tag}-{n:05d}" for n in range(MAX_SERVER_KILLS + 1)]

    async def kill_all(client: Any) -> None:
        for made_up in flood:
            await client.stub.KillPlan(
                pb.KillPlanRequest(plan_id=made_up, reason="x"),
                metadata=client.metadata,
                timeout=30,
            )

    b.run(kill_all)

    def killed() -> dict[str, str]:
        out = worker.cli("killed", "--json").stdout
        return {k["plan"]: k["server"] for k in json.loads(out)}

    wait_for(lambda: flood[-1] in killed(), START_S)  # the worker read the whole flood
    listed = killed()
    assert listed[plan] == key_of(a), listed
    # B's oldest went, B's alone (and B's own earlier kills of plans in use stay, review14
    # finding 02: how many of the flood go depends on those).
    gone = [made_up for made_up in flood if made_up not in listed]
    assert gone and gone == flood[: len(gone)]
    assert sum(server == key_of(b) for server in listed.values()) == MAX_SERVER_KILLS

    worker.at(a)  # back at A: its plan is still killed
    assert code_of(a, plan) == "plan_killed"
    assert worker.cli("lift", plan).returncode == 0
    assert code_of(a, plan) == "ok"


def test_a_sandbox_built_ahead_for_a_plan_goes_with_the_worker_of_its_server(
    hubs: tuple[Cluster, Cluster], worker: Worker
) -> None:
    a, b = hubs
    plan = f"plan-{uuid.uuid4().hex[:8]}"
    proc = worker.at(a)
    args = {"argv": ["python3", "-c", WHERE]}
    out, _ = call(a, "exec", args, plan_id=plan)
    assert out["status"] == "ok", out
    wait_for(lambda: len(held(proc.pid)) == 1, START_S, proc)
    pids = list(held(proc.pid))

    proc = worker.at(b)  # A's worker ended: what it built ahead for A's plan with it
    assert gone(pids)
    out, blob = call(b, "exec", args, plan_id=plan)
    assert out["status"] == "ok" and blob.strip() == b"", (out, blob)  # built for B's call
