"""Several sandbox workers on one hub: a plan's calls stay with the worker holding its
workspace, a new plan goes to the least loaded worker, and a plan whose worker is
away gets a retryable error, never a fresh empty workspace somewhere else. A hub that
lost hub.db, or runs on an old copy of it, learns where each plan lives back from the
workers (each says in its Hello which workspaces it holds)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.support.cluster import Cluster, cluster, wait_for
from tests.support.policies import PYTHON3, exec_config
from tests.support.procs import STUBBORN, marker, processes_with, wait_until_gone
from tests.support.workbench import (
    call,
    files_of,
    placement_token_of,
    run,
    start_sandbox_worker,
    teardown,
    worker_id_of,
)
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.proto import agentworker_pb2_grpc as pb_grpc
from worker.wire.protocol import PROTOCOL_MAX, PROTOCOL_MIN
from worker.wire.transport import worker_metadata


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[Cluster, str]]:
    """A hub and two sandbox workers, `w1` and `w2`; the TOML their configs add."""
    settings = exec_config(tmp_path, PYTHON3)  # a program that runs until it is stopped
    with cluster(tmp_path / "hub", worker=False) as live:
        start_sandbox_worker(live, "w1", settings)
        start_sandbox_worker(live, "w2", settings)
        yield live, settings


def new_plan() -> str:
    return f"plan-{uuid.uuid4().hex[:12]}"


def where(live: Cluster, plan: str, **fields: Any) -> str:
    """The worker that ran a call of `plan` (one that writes, so that a new plan gets
    its workspace there: a call that only looks makes none)."""
    out, _ = call(live, plan, "fs_write", {"path": "placed", "mode": "overwrite"}, b"", **fields)
    assert out["status"] == "ok", out
    return str(out["worker_id"])


def take_away(live: Cluster, worker_id: str) -> str:
    """Stop worker `worker_id` (SIGTERM) and wait until the hub has it away; its name."""
    name = names(live)[worker_id]
    proc = next(p for p in live.procs if p.name == name and p.running())
    proc.signal(signal.SIGTERM)
    proc.wait(30)
    wait_for(lambda: worker_id not in {w.worker_id for w in live.workers() if w.connected}, 60)
    return name


def names(live: Cluster) -> dict[str, str]:
    """worker id -> its name in the harness (w1, w2)."""
    return {worker_id_of(live, name): name for name in ("w1", "w2")}


def busy_with(live: Cluster, plan: str) -> tuple[threading.Thread, list[Any], str]:
    """A call of `plan` that runs until the plan is torn down; the list gets its
    answer (or what its thread raised) when it ends."""
    tag = marker()
    answer: list[Any] = []

    def stubborn() -> None:
        try:
            answer.append(run(live, plan, ["python3", "-c", STUBBORN, tag], timeout_s=300)[0])
        except Exception as exc:  # noqa: BLE001 - the test reports it, not the thread
            answer.append(exc)

    thread = threading.Thread(target=stubborn, daemon=True)
    thread.start()
    wait_for(lambda: len(processes_with(tag)) >= 2, 60)
    return thread, answer, tag


def test_plans_stick_and_a_new_plan_goes_to_the_idle_worker(
    fleet: tuple[Cluster, str],
) -> None:
    live, _ = fleet
    x, y = worker_id_of(live, "w1"), worker_id_of(live, "w2")
    p1, p2, p3 = new_plan(), new_plan(), new_plan()
    assert where(live, p1, worker_id=x) == x  # naming a worker places a new plan there
    assert where(live, p2, worker_id=x) == x
    assert where(live, p3, worker_id=y) == y
    thread, answer, tag = busy_with(live, p3)  # y runs a call; x holds more plans but is idle
    p4 = new_plan()
    assert where(live, p4) == x
    for _ in range(3):  # sticky, however loaded: each plan where its workspace is
        assert where(live, p3) == y
        assert where(live, p1) == x and where(live, p4) == x
    assert files_of(live, "w1", p4).is_dir() and not files_of(live, "w2", p4).exists()
    assert teardown(live, p3)["result"]["removed"] is True
    thread.join(60)
    assert len(answer) == 1 and isinstance(answer[0], dict), answer  # the call was answered
    assert wait_until_gone(tag) == []
    p5 = new_plan()  # both idle now: the one holding fewer plans
    assert where(live, p5) == y


def test_a_call_naming_another_worker_than_the_plans_is_refused(
    fleet: tuple[Cluster, str],
) -> None:
    live, _ = fleet
    x, y = worker_id_of(live, "w1"), worker_id_of(live, "w2")
    plan = new_plan()
    assert where(live, plan, worker_id=x) == x
    out, _ = call(live, plan, "fs_stat", {"path": "."}, worker_id=y)
    assert out["error"]["code"] == "validation_error" and x in out["error"]["message"]
    assert not files_of(live, "w2", plan).exists()


def test_a_plan_whose_worker_is_away_gets_a_retryable_error_not_a_new_workspace(
    fleet: tuple[Cluster, str],
) -> None:
    live, settings = fleet
    plan = new_plan()
    out, _ = call(live, plan, "fs_write", {"path": "kept.txt"}, b"kept")
    holder = out["worker_id"]
    name = take_away(live, holder)
    other = "w2" if name == "w1" else "w1"
    out, _ = call(live, plan, "fs_read", {"path": "kept.txt"})
    error = out["error"]
    assert error["code"] == "sandbox_unavailable" and error["retryable"] is True, out
    assert holder in error["message"] and "not connected" in error["message"]
    assert error["details"] == {"plan_id": plan, "worker_id": holder}
    assert not files_of(live, other, plan).exists()
    start_sandbox_worker(live, name, settings)  # back, same home: the files are there
    out, blob = call(live, plan, "fs_read", {"path": "kept.txt"})
    assert out["status"] == "ok" and out["worker_id"] == holder and blob == b"kept"


def test_a_teardown_while_the_worker_is_away_waits_for_it_to_return(
    fleet: tuple[Cluster, str],
) -> None:
    live, settings = fleet
    plan = new_plan()
    out, _ = call(live, plan, "fs_write", {"path": "old.txt"}, b"old")
    holder = out["worker_id"]
    name = take_away(live, holder)
    done = teardown(live, plan)
    assert done["status"] == "ok", done
    assert done["result"] == {"plan_id": plan, "removed": False, "queued_worker_ids": [holder]}
    out, _ = call(live, plan, "fs_list", {"path": "."})  # torn down: a fresh start elsewhere
    assert out["status"] == "ok" and out["worker_id"] != holder
    assert out["result"]["entries"] == []
    assert files_of(live, name, plan).exists()
    start_sandbox_worker(live, name, settings)  # told on its return, before any call
    wait_for(lambda: not files_of(live, name, plan).exists(), 60)


def test_placements_survive_a_hub_restart(fleet: tuple[Cluster, str]) -> None:
    live, _ = fleet
    x, y = worker_id_of(live, "w1"), worker_id_of(live, "w2")
    plans = {new_plan(): x, new_plan(): y}
    for plan, worker_id in plans.items():
        assert where(live, plan, worker_id=worker_id) == worker_id
    hub = next(p for p in live.procs if p.name == "hub")
    hub.signal(signal.SIGTERM)
    hub.wait(30)
    live.start_hub()
    wait_for(lambda: live.status().connected_workers == 2, 20)
    for plan, worker_id in plans.items():
        assert where(live, plan) == worker_id


HUB_FILES = ("hub.db", "hub.db-wal", "hub.db-shm")


def stop_hub(live: Cluster) -> None:
    hub = next(p for p in live.procs if p.name == "hub" and p.running())
    hub.signal(signal.SIGTERM)
    hub.wait(30)


def start_hub(live: Cluster, workers: int) -> None:
    live.start_hub()
    wait_for(lambda: live.status().connected_workers == workers, 20)


def forget_hub_db(live: Cluster) -> None:
    for name in HUB_FILES:
        (live.home / name).unlink(missing_ok=True)


def read(live: Cluster, plan: str, path: str) -> tuple[str, bytes]:
    out, blob = call(live, plan, "fs_read", {"path": path})
    assert out["status"] == "ok", out
    return str(out["worker_id"]), blob


def test_a_hub_that_lost_hub_db_learns_the_placements_back_from_its_workers(
    fleet: tuple[Cluster, str],
) -> None:
    live, _ = fleet
    x, y = worker_id_of(live, "w1"), worker_id_of(live, "w2")
    plans = {new_plan(): x, new_plan(): y, new_plan(): y}
    for plan, worker_id in plans.items():
        out, _ = call(live, plan, "fs_write", {"path": "f"}, plan.encode(), worker_id=worker_id)
        assert out["status"] == "ok" and out["worker_id"] == worker_id, out
    stop_hub(live)
    forget_hub_db(live)
    start_hub(live, workers=2)
    for plan, worker_id in plans.items():  # back to their files, not placed anew
        assert read(live, plan, "f") == (worker_id, plan.encode())
    fresh = new_plan()  # the hub counts the plans it learned: x holds fewer
    assert where(live, fresh) == x
    doomed = next(iter(plans))
    done = teardown(live, doomed)
    assert done["worker_id"] == x and done["result"]["removed"] is True, done
    assert not files_of(live, "w1", doomed).exists()


def test_a_stale_hub_db_is_corrected_by_what_the_workers_hold(
    fleet: tuple[Cluster, str],
) -> None:
    live, _ = fleet
    x, y = worker_id_of(live, "w1"), worker_id_of(live, "w2")
    plan = new_plan()
    out, _ = call(live, plan, "fs_write", {"path": "f"}, b"old", worker_id=x)
    assert out["worker_id"] == x
    stop_hub(live)
    backup = live.home / "backup"
    backup.mkdir()
    for name in HUB_FILES:  # an old copy of hub.db: the plan on x
        if (live.home / name).exists():
            shutil.copy2(live.home / name, backup / name)
    start_hub(live, workers=2)
    assert teardown(live, plan)["result"]["removed"] is True
    out, _ = call(live, plan, "fs_write", {"path": "f"}, b"new", worker_id=y)  # now on y
    assert out["worker_id"] == y
    stop_hub(live)
    forget_hub_db(live)
    for name in HUB_FILES:
        if (backup / name).exists():
            shutil.copy2(backup / name, live.home / name)
    start_hub(live, workers=2)
    # x says it no longer holds the plan, y says it does: y, with the plan's files.
    assert read(live, plan, "f") == (y, b"new")
    assert not files_of(live, "w1", plan).exists()


def test_two_copies_of_a_plan_the_one_used_last_wins_and_teardown_takes_both(
    fleet: tuple[Cluster, str],
) -> None:
    live, settings = fleet
    x = worker_id_of(live, "w1")
    plan = new_plan()
    out, _ = call(live, plan, "fs_write", {"path": "f"}, b"old", worker_id=x)
    assert out["worker_id"] == x
    take_away(live, x)
    assert teardown(live, plan)["result"]["queued_worker_ids"] == [x]  # queued for x...
    out, _ = call(live, plan, "fs_write", {"path": "f"}, b"new")
    y = out["worker_id"]
    assert y != x
    stop_hub(live)
    forget_hub_db(live)  # ...and lost with hub.db: x comes back holding the old copy
    start_hub(live, workers=1)
    start_sandbox_worker(live, "w1", settings)
    assert files_of(live, "w1", plan).exists()
    assert read(live, plan, "f") == (y, b"new")  # y's copy was used last
    done = teardown(live, plan)
    assert done["result"]["removed"] is True, done
    assert not files_of(live, "w1", plan).exists()
    assert not files_of(live, "w2", plan).exists()


class _ClaimingWorker:
    """A sandbox worker's stream that claims, in its Hello, to hold `plan` last used at
    `used_ms`, with the hub's placement token of it (as if the hub had placed the plan
    there before it lost its record); it answers every call with its own id, so a test
    sees where calls go."""

    def __init__(self, live: Cluster, worker_id: str, plan: str, used_ms: int) -> None:
        self.worker_id = worker_id
        self.welcomed = asyncio.Event()
        self._answers: asyncio.Queue[pb.WorkerEnvelope] = asyncio.Queue()
        self._channel = grpc.aio.insecure_channel(live.listen)
        hello = pb.Hello(
            worker_id=worker_id,
            instance_id=worker_id,
            version="test",
            protocol_min=PROTOCOL_MIN,
            protocol_max=PROTOCOL_MAX,
            surfaces=["workbenchHost"],
            actions=["workbenchHost.fs_stat"],
            max_concurrency=4,
            plans=[
                pb.HeldPlan(
                    plan_id=plan,
                    last_used_unix_ms=used_ms,
                    placement_token=placement_token_of(live, worker_id, plan),
                )
            ],
        )

        async def envelopes() -> Any:
            yield pb.WorkerEnvelope(messages=[pb.WorkerMessage(hello=hello)])
            while True:
                yield await self._answers.get()

        stub = pb_grpc.WorkerServiceStub(self._channel)
        # A key of its own: a hub serves no worker without one (worker.hub.admission).
        metadata = worker_metadata(live.token, uuid.uuid4().hex)
        self._call = stub.Stream(envelopes(), metadata=metadata)
        self.task = asyncio.ensure_future(self._serve())

    async def _serve(self) -> None:
        async for envelope in self._call:
            for msg in envelope.messages:
                if msg.WhichOneof("kind") == "welcome":
                    self.welcomed.set()
                elif msg.WhichOneof("kind") == "request":
                    answer = pb.ActionResult(
                        correlation_id=msg.request.correlation_id,
                        status=pb.ActionResult.OK,
                        result_json=json.dumps({"who": self.worker_id}),
                    )
                    self._answers.put_nowait(
                        pb.WorkerEnvelope(messages=[pb.WorkerMessage(result=answer)])
                    )

    async def close(self) -> None:
        self._call.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await self.task
        await self._channel.close()


def test_a_workers_claim_from_the_future_does_not_win_the_plan_for_ever(tmp_path: Path) -> None:
    """A hub with no record of a plan learns where it lives from the workers' Hellos,
    and when two hold a copy, the one used last wins. A claim dated in the future (a
    clock running ahead, or a lie) counts as made now: a later, honest claim wins."""
    plan = new_plan()
    with cluster(tmp_path / "hub", worker=False) as live:

        async def scenario(client: Any) -> str:
            ahead = _ClaimingWorker(live, "a-ahead", plan, int(time.time() * 1000) + 10**10)
            await ahead.welcomed.wait()
            # Made after the hub saw the first claim; ties go to the larger id ("b-…").
            honest = _ClaimingWorker(live, "b-honest", plan, int(time.time() * 1000) + 1)
            await honest.welcomed.wait()
            reply = await client.dispatch(
                correlation_id=uuid.uuid4().hex,
                agent_id="tester",
                plan_id=plan,
                surface="workbenchHost",
                action="fs_stat",
                args_json='{"path": "."}',
            )
            await ahead.close()
            await honest.close()
            return str(json.loads(reply.result.result_json)["who"])

        assert live.run(scenario) == "b-honest"
