"""hub.db's workers table is bounded: anyone with hub-workers.token may say Hello under
new ids, and each grew the table for good. The hub remembers at most
`workers_away_kept` workers away (WORKERS_AWAY_KEPT), forgetting first those connected
the least, and none away longer than WORKERS_KEPT_MS; connected workers are never
forgotten. A real hub (worker.app.start_hub) in the test's loop; the workers are driven
by hand (the far side of the boundary)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.support.hub_inproc import HandWorker, caller_metadata, hub_in_process, own_channel
from worker.app import RunningHub
from worker.clock import now_ms
from worker.hub.store import WORKERS_AWAY_KEPT, WORKERS_KEPT_MS
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.proto import agentworker_pb2_grpc as pb_grpc

KEPT = 4


async def _gone(running: RunningHub, worker: HandWorker) -> None:
    """Close `worker` and wait until the hub let go of its session (its row touched)."""
    await worker.close()
    while worker.worker_id in running.hub.sessions:
        await asyncio.sleep(0.01)  # the hub's handler ends as the stream's cancel reaches it


def test_workers_away_are_remembered_up_to_a_bound(tmp_path: Path) -> None:
    assert WORKERS_AWAY_KEPT >= 256, "a person's fleet of workers fits"
    home = tmp_path / "home"

    async def go() -> None:
        async with hub_in_process(home) as running:
            store = running.hub.store
            store.workers_away_kept = KEPT
            channel = own_channel(running.address)
            control = pb_grpc.ControlServiceStub(channel)
            metadata = caller_metadata(home)

            async def listed() -> dict[str, bool]:
                reply = await control.ListWorkers(pb.ListWorkersRequest(), metadata=metadata)
                return {info.worker_id: info.connected for info in reply.workers}

            try:
                # The person's worker serves while twenty fleeting ids come and go.
                person = HandWorker(running.address, home)
                await person.until("welcome")
                fleeting = []
                for _ in range(20):
                    worker = HandWorker(running.address, home)
                    await worker.until("welcome")
                    fleeting.append(worker.worker_id)
                    await _gone(running, worker)
                    # The away remembered, one more until the next new id, the person's.
                    assert len(await listed()) <= KEPT + 2
                await _gone(running, person)
                # A new worker's Hello makes room: the person's worker, connected the
                # longest, is remembered; of the fleeting ids, KEPT - 1 at most.
                late = HandWorker(running.address, home)
                await late.until("welcome")
                known = await listed()
                assert known[late.worker_id] is True
                assert known[person.worker_id] is False, known
                assert len(known) == KEPT + 1, known
                assert sum(worker_id in known for worker_id in fleeting) == KEPT - 1
                status = await control.Status(pb.StatusRequest(), metadata=metadata)
                assert status.known_workers == KEPT + 1
                assert status.connected_workers == 1
                # Away past WORKERS_KEPT_MS: forgotten, the connected worker never.
                later = now_ms() + WORKERS_KEPT_MS + 1
                assert running.hub.forget_workers(now=later) == KEPT
                assert await listed() == {late.worker_id: True}
                # A worker forgotten is known again by its next Hello (its key bound anew).
                back = HandWorker(running.address, home, hello=person.hello)
                await back.until("welcome")
                assert (await listed())[person.worker_id] is True
                await back.close()
                await late.close()
            finally:
                await channel.close()

    asyncio.run(go())


def test_a_forgotten_workers_plans_are_placed_nowhere(tmp_path: Path) -> None:
    """review26 H8: the plans placed on a worker outlived its row (the key its id was
    bound to): whoever said Hello under the id next bound their key and was the plans'
    worker by the hub's record, no placement token needed. They go with the worker;
    the worker itself, back, proves each with its token."""
    home = tmp_path / "home"

    async def go() -> None:
        async with hub_in_process(home) as running:
            hub = running.hub
            person = HandWorker(running.address, home)
            await person.until("welcome")
            other = HandWorker(running.address, home)
            await other.until("welcome")
            hub.placements.place("deploy", person.worker_id)
            hub.placements.place("notes", other.worker_id)
            await _gone(running, person)
            later = now_ms() + WORKERS_KEPT_MS + 1
            assert hub.forget_workers(now=later) == 1
            assert hub.placements.by_plan == {"notes": other.worker_id}
            assert hub.store.placements() == {"notes": other.worker_id}
            await other.close()

    asyncio.run(go())
