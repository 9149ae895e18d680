"""A recording is of one server's plan (review12 finding 04a).

Plan ids are unique per server only. The person ran `agentworker record start P`
while the worker served hub A; the worker, the same data folder, was then pointed at
hub B, whose calls in a plan it also calls P went into the recording: `record P -o`
wrote B's step, args and blob into the script of A's plan. Now recordings, the
recorded calls and the invocation rows they draw on are kept by (server, plan).

Real parts: two `agentworker hub` subprocesses (each its own home and tokens), the
worker as `agentworker run --server ADDR --token-file FILE` subprocesses on one data
folder, the CLI as the person runs it.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, cluster
from tests.support.servers import Worker, key_of, workers_token

A_BYTES = b"A's report\n"
B_BYTES = b"B's bytes, not for A's recording\n"


@pytest.fixture(scope="module")
def hubs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Cluster]]:
    base = tmp_path_factory.mktemp("servers")
    with cluster(base / "a", worker=False) as a, cluster(base / "b", worker=False) as b:
        yield a, b


@pytest.fixture
def worker(tmp_path: Path, hubs: tuple[Cluster, Cluster]) -> Iterator[Worker]:
    one = Worker(tmp_path / "w", hubs[0].listen, sandbox=False)
    yield one
    one.stop()


def write(hub: Cluster, plan: str, path: str, blob: bytes) -> str:
    """An fs_write in `plan` through `hub`; its status or error code."""
    result = hub.run(
        lambda c: c.dispatch(
            agent_id="tester",
            surface="workerHost",
            action="fs_write",
            args_json=json.dumps({"path": path, "mode": "overwrite"}),
            blob=blob,
            plan_id=plan,
        )
    ).result
    return str(result.error.code or "ok")


def rows(home: Path, sql: str) -> list[tuple[object, ...]]:
    with contextlib.closing(sqlite3.connect(home / "state.db")) as db:
        return db.execute(sql).fetchall()


def test_another_servers_calls_in_a_plan_of_the_same_id_stay_out_of_the_recording(
    hubs: tuple[Cluster, Cluster], worker: Worker, tmp_path: Path
) -> None:
    a, b = hubs
    worker.at(a)
    started = worker.cli("record", "start", "P")
    assert started.returncode == 0, started
    assert write(a, "P", "a-report.txt", A_BYTES) == "ok"

    worker.at(b)  # the same data folder, another hub and token
    assert write(b, "P", "b-was-here.txt", B_BYTES) == "ok"
    worker.stop()

    out = tmp_path / "out" / "p.json"
    out.parent.mkdir()
    done = worker.cli("record", "P", "-o", str(out))
    assert done.returncode == 0, done
    text = out.read_text()
    assert "a-report.txt" in text and "b-was-here.txt" not in text, text
    blobs = {p.name: p.read_bytes() for p in out.parent.rglob("*.bin")}
    assert blobs == {"step-1.bin": A_BYTES}, blobs
    assert key_of(a) in started.stdout, started.stdout  # `start` said whose plan P it is
    # It says whose plan it wrote, and that another server has a plan of the id.
    assert key_of(a) in done.stderr and f"--server-key {key_of(b)}" in done.stderr, done.stderr

    # B's plan P was never recorded: its call is a comment, without its args or bytes.
    theirs = tmp_path / "theirs" / "p.json"
    theirs.parent.mkdir()
    done = worker.cli("record", "P", "-o", str(theirs), "--server-key", key_of(b))
    assert done.returncode == 0, done
    lines = theirs.read_text().splitlines()
    assert len(lines) == 2 and "recording was off" in lines[1], lines
    assert "b-was-here.txt" not in theirs.read_text()
    assert not list(theirs.parent.rglob("*.bin"))

    assert rows(worker.home, "SELECT server, plan_id FROM recorded_calls") == [(key_of(a), "P")]
    assert sorted(
        rows(worker.home, "SELECT server, action FROM invocations WHERE plan_id = 'P'")
    ) == sorted([(key_of(a), "fs_write"), (key_of(b), "fs_write")])

    # `stop` takes the one server the plan is recorded for.
    stopped = worker.cli("record", "stop", "P")
    assert stopped.returncode == 0 and key_of(a) in stopped.stdout, stopped
    assert rows(worker.home, "SELECT * FROM recording_plans") == []


def test_record_start_names_the_server_when_none_was_served_yet(
    hubs: tuple[Cluster, Cluster], worker: Worker
) -> None:
    a, _ = hubs
    refused = worker.cli("record", "start", "P")  # no worker has served any server here
    assert refused.returncode == 2, refused
    assert "no worker has served a server" in refused.stderr, refused.stderr
    assert "--server ADDRESS --token-file FILE" in refused.stderr, refused.stderr
    assert rows(worker.home, "SELECT * FROM recording_plans") == []

    named = worker.cli(
        "record", "start", "P", "--server", a.listen, "--token-file", str(workers_token(a))
    )
    assert named.returncode == 0 and key_of(a) in named.stdout, named
    worker.at(a)  # the plan named is the one the worker records
    assert write(a, "P", "a.txt", A_BYTES) == "ok"
    worker.stop()
    assert rows(worker.home, "SELECT server, plan_id FROM recorded_calls") == [(key_of(a), "P")]
