"""A worker's word never starts a new kills epoch (review16 E3). The hub learnt that
hub.db went back (restored from a backup) from a Hello confirming kills past those it
numbered, and made a new epoch: every worker was sent every kill kept anew and recorded
it again, the person's lifts at the workers undone. Anyone with hub-workers.token could
say so (the epoch is in every Welcome), as often as it liked. Now the hub knows it from
the file beside hub.db (store.KILLS_ISSUED_FILE), at its start, and such a Hello is
logged and not taken.

A real hub (worker.app.start_hub) in the test's loop and a real worker process; the
co-tenant is a hand-driven stream (the far side)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from tests.support.hub_inproc import (
    HandWorker,
    caller_metadata,
    hub_in_process,
    own_channel,
    probe_request,
    real_worker,
    stop_worker,
    until_connected,
)
from worker import app
from worker.hub.store import KILLS_SKIPPED_AT_MOST
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.proto import agentworker_pb2_grpc as pb_grpc
from worker.wire.protocol import PROTOCOL_MAX, PROTOCOL_MIN


async def _code(stub: pb_grpc.ControlServiceStub, home: Path, worker_id: str, plan: str) -> str:
    reply = await stub.Dispatch(
        probe_request(worker_id, plan), metadata=caller_metadata(home), timeout=120
    )
    return "ok" if reply.result.status == pb.ActionResult.OK else reply.result.error.code


async def _until_confirmed(running: app.RunningHub, worker_id: str) -> None:
    """Until the connected worker confirmed every kill the hub keeps for it."""
    last = max(k.seq for k in running.hub.store.kills_after(worker_id, 0))
    while (session := running.hub.sessions.get(worker_id)) is None or (
        session.kills_through < last
    ):
        await asyncio.sleep(0.02)  # the hub runs in this loop


def _hello(worker_id: str, epoch: str, through: int) -> pb.Hello:
    """A hand-driven worker's Hello saying it confirmed kills of `epoch` through `through`."""
    return pb.Hello(
        worker_id=worker_id,
        instance_id="i",
        version="hand",
        protocol_min=PROTOCOL_MIN,
        protocol_max=PROTOCOL_MAX,
        kills_epoch=epoch,
        kills_through=through,
    )


def _lift(home: Path, plan: str) -> None:
    """The person lifts the plan's kill at the worker (`agentworker lift`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTWORKER_")}
    env["AGENTWORKER_HOME"] = str(home)
    done = subprocess.run(
        [sys.executable, "-m", "worker", "lift", plan],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_a_hello_claiming_kills_never_numbered_does_not_undo_the_persons_lift(
    tmp_path: Path,
) -> None:
    """The person lifts a kill at the worker; a co-tenant says Hello in the hub's epoch
    with kills_through = 2**62. The epoch stays, and after the worker's next Hello the
    plan still runs (before: a new epoch, and the kill bound again there)."""
    home = tmp_path / "home"

    async def go() -> None:
        async with hub_in_process(home) as running:
            worker = real_worker(home, running.address)
            channel = own_channel(running.address)
            stub = pb_grpc.ControlServiceStub(channel)
            try:
                (worker_id,) = await until_connected(running, worker)
                await stub.KillPlan(
                    pb.KillPlanRequest(plan_id="lifted", reason="stop"),
                    metadata=caller_metadata(home),
                    timeout=60,
                )
                await _until_confirmed(running, worker_id)
                await asyncio.to_thread(_lift, home, "lifted")
                assert await _code(stub, home, worker_id, "lifted") == "ok"

                epoch = running.hub.store.kills_epoch
                hello = _hello("cotenant", epoch, 2**62)
                liar = HandWorker(running.address, home, hello=hello)
                try:
                    await liar.until("welcome")
                finally:
                    await liar.close()
                assert running.hub.store.kills_epoch == epoch

                await stop_worker(worker)  # its next Hello
                worker = real_worker(home, running.address)
                await until_connected(running, worker)
                await _until_confirmed(running, worker_id)
                assert await _code(stub, home, worker_id, "lifted") == "ok"
                assert running.hub.store.kills_epoch == epoch
            finally:
                await channel.close()
                await stop_worker(worker)

    asyncio.run(go())


def test_kills_are_numbered_past_a_workers_mark_the_hub_never_reached(tmp_path: Path) -> None:
    """review17 E2: the hub's whole folder put back from a backup (hub-kills-issued
    with hub.db) shows nothing at its start, and its next kills took seqs the workers
    had confirmed: each took the person's kill as one recorded before and lifted since,
    the hub counted it confirmed on the worker's next heartbeat, and the plan ran. Now a
    Hello in the hub's epoch past what it numbered moves the numbering past it (by
    store.KILLS_SKIPPED_AT_MOST at most, no epoch), and a heartbeat confirms no kill
    the hub never numbered."""
    home = tmp_path / "home"

    async def go() -> None:
        async with hub_in_process(home) as running:
            store = running.hub.store
            channel = own_channel(running.address)
            stub = pb_grpc.ControlServiceStub(channel)
            # It confirmed kills through 7 before the folder went back.
            hello = _hello("restored-hubs-worker", store.kills_epoch, 7)
            worker = HandWorker(running.address, home, hello=hello)
            try:
                await worker.until("welcome")
                await stub.KillPlan(
                    pb.KillPlanRequest(plan_id="victim", reason="stop"),
                    metadata=caller_metadata(home),
                    timeout=60,
                )
                (kill,) = await worker.until("kill_plan")
                assert (kill.plan_id, kill.seq) == ("victim", 8)  # before: 1, "lifted since"
                session = running.hub.sessions[worker.worker_id]
                worker.send(pb.WorkerMessage(heartbeat=pb.Heartbeat(kills_through=2**40)))
                while session.heartbeat.kills_through != 2**40:
                    await asyncio.sleep(0.02)  # the hub runs in this loop
                assert session.kills_through == store.kills_issued() == 8

                liar = HandWorker(
                    running.address, home, hello=_hello("liar", store.kills_epoch, 2**62)
                )
                await liar.until("welcome")
                await liar.close()
                assert store.kills_issued() == 8 + KILLS_SKIPPED_AT_MOST
            finally:
                await worker.close()
                await channel.close()

    asyncio.run(go())
