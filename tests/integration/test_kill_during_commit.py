"""A call whose id its caller chose goes to its worker only once hub.db holds it, and that
commit is made in the store's writer thread (review29 h1): a kill of the call's plan
that comes meanwhile, while the worker's kills go a page at a time, goes ahead of the
call on the stream. It did not (review30 on h1x): the call was sent once committed, ahead
of its plan's kill still in a page to come, and ran.

A real hub in this loop; a hand-driven worker stream that confirms its kills only when
the test says; another connection holding hub.db's write lock, as a backup would."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path
from typing import Any

from tests.support.hub_inproc import driven_hub, probe_request
from worker.hub.server import KILL_PAGE
from worker.wire.proto import agentworker_pb2 as pb

CHOSEN = "chosen-1"


class Arrivals(list[Any]):
    """What a stream received of one kind, noting each in `order` as it comes."""

    def __init__(self, kind: str, order: list[tuple[str, Any]]) -> None:
        super().__init__()
        self.kind, self.order = kind, order

    def append(self, item: Any) -> None:
        super().append(item)
        self.order.append((self.kind, item))


def test_a_kill_that_comes_while_a_call_is_committed_goes_ahead_of_it(tmp_path: Path) -> None:
    home = tmp_path / "hub"

    async def go() -> None:
        async with driven_hub(home) as hub:
            hand = await hub.welcomed()
            order: list[tuple[str, Any]] = []
            for kind in ("kill_plan", "request"):
                hand.received[kind] = Arrivals(kind, order)
            for n in range(KILL_PAGE + 1):  # the worker confirms none: its kills go paged
                await hub.caller.kill(f"made-up-{n}")
            session = hub.sessions[hand.worker_id]
            await hub.until(lambda: session.kills_paging)
            # hub.db held by another process: the call's commit waits for it in the
            # writer thread. It is let go once the kill of P is being kept, whose own
            # commit then waits on the loop for the call's (Database.settle).
            locker = sqlite3.connect(
                home / "hub.db", isolation_level=None, timeout=60, check_same_thread=False
            )
            locker.execute("BEGIN IMMEDIATE")
            killing = threading.Event()
            keep_kill = hub.store.kill

            def kill(*args: Any, **kwargs: Any) -> Any:
                killing.set()
                return keep_kill(*args, **kwargs)

            hub.store.kill = kill  # type: ignore[method-assign]
            letting_go = threading.Thread(
                target=lambda: killing.wait(60) and locker.execute("ROLLBACK")
            )
            letting_go.start()
            request = probe_request(hand.worker_id, "P")
            request.correlation_id = CHOSEN
            call = asyncio.ensure_future(hub.caller.dispatch(request, timeout=120))
            # Admitted (no kill of P yet) and waiting for its commit.
            await hub.until(
                lambda: hub.store.committing and hub.store.worker_of(CHOSEN) is not None
            )
            killed = await hub.caller.kill("P")
            letting_go.join(60)
            locker.close()
            assert list(killed.worker_ids) == [hand.worker_id]
            # The worker confirms each page as it comes, until both the kill of P and
            # the call have come.
            while not (
                any(kill.plan_id == "P" for kill in hand.received["kill_plan"])
                and hand.received["request"]
            ):
                last = hand.received["kill_plan"][-1].seq
                hand.send(pb.WorkerMessage(heartbeat=pb.Heartbeat(kills_through=last)))
                hand.came.clear()
                await hand.came.wait()
            kinds = [(kind, getattr(item, "plan_id", "")) for kind, item in order]
            assert kinds.index(("kill_plan", "P")) < kinds.index(("request", "P")), kinds
            call.cancel()

    asyncio.run(go())
