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
from pathlib import Path

from tests.support.hub_inproc import (
    driven_hub,
    hand_hello,
    lift,
    stop_worker,
)
from worker.hub.store import KILLS_SKIPPED_AT_MOST
from worker.wire.proto import agentworker_pb2 as pb


def _hello(worker_id: str, epoch: str, through: int) -> pb.Hello:
    """A hand-driven worker's Hello saying it confirmed kills of `epoch` through `through`."""
    return hand_hello(worker_id, instance_id="i", kills_epoch=epoch, kills_through=through)


def test_a_hello_claiming_kills_never_numbered_does_not_undo_the_persons_lift(
    tmp_path: Path,
) -> None:
    """The person lifts a kill at the worker; a co-tenant says Hello in the hub's epoch
    with kills_through = 2**62. The epoch stays, and after the worker's next Hello the
    plan still runs (before: a new epoch, and the kill bound again there)."""
    home = tmp_path / "home"

    async def go() -> None:
        async with driven_hub(home) as hub:
            worker = await hub.real_worker()
            (worker_id,) = hub.sessions
            await hub.caller.kill("lifted")
            await hub.until_confirmed(worker_id)
            await asyncio.to_thread(lift, home, "lifted")
            assert await hub.caller.code(worker_id, "lifted") == "ok"

            epoch = hub.store.kills_epoch
            liar = await hub.welcomed(hello=_hello("cotenant", epoch, 2**62))
            await liar.close()
            assert hub.store.kills_epoch == epoch

            await stop_worker(worker)  # its next Hello
            await hub.real_worker()
            await hub.until_confirmed(worker_id)
            assert await hub.caller.code(worker_id, "lifted") == "ok"
            assert hub.store.kills_epoch == epoch

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
        async with driven_hub(home) as hub:
            store = hub.store
            # It confirmed kills through 7 before the folder went back.
            hello = _hello("restored-hubs-worker", store.kills_epoch, 7)
            worker = await hub.welcomed(hello=hello)
            await hub.caller.kill("victim")
            (kill,) = await worker.until("kill_plan")
            assert (kill.plan_id, kill.seq) == ("victim", 8)  # before: 1, "lifted since"
            session = hub.sessions[worker.worker_id]
            worker.send(pb.WorkerMessage(heartbeat=pb.Heartbeat(kills_through=2**40)))
            await hub.until(lambda: session.heartbeat.kills_through == 2**40)
            assert session.kills_through == store.kills_issued() == 8

            liar = await hub.welcomed(hello=_hello("liar", store.kills_epoch, 2**62))
            await liar.close()
            assert store.kills_issued() == 8 + KILLS_SKIPPED_AT_MOST

    asyncio.run(go())
