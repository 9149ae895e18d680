"""A worker stream's outbox counts the kills and heartbeats waiting in it (the hub sends
a worker no more kills while a page of them waits: review18 F7) and knows how long its
oldest message waited (past OUTBOX_WAIT_S the stream is let go)."""

from __future__ import annotations

import asyncio

from worker.hub.session import Session
from worker.wire.proto import agentworker_pb2 as pb


def test_kills_and_heartbeats_are_counted_until_taken_and_other_messages_never() -> None:
    async def go() -> None:
        session = Session(hello=pb.Hello(worker_id="w"), session_id="s")
        outbox = session.outbox
        assert outbox.unasked_bytes == 0 and outbox.waited_s() == 0.0
        session.send(pb.ServerMessage(ack=pb.Ack(correlation_ids=["c"])))
        assert outbox.unasked_bytes == 0 and outbox.waited_s() >= 0.0
        session.send(pb.ServerMessage(kill_plan=pb.KillPlan(plan_id="p", reason="r" * 100)))
        session.send(pb.ServerMessage(heartbeat=pb.Heartbeat(unix_ms=1)))
        session.send(b"a kill's envelope part", answered=False)
        counted = outbox.unasked_bytes
        assert counted > 100 + len(b"a kill's envelope part")
        outbox.get_nowait()  # the ack
        assert outbox.unasked_bytes == counted
        sizes = [len(outbox.get_nowait()) for _ in range(3)]  # type: ignore[arg-type]
        assert sum(sizes) == counted and outbox.unasked_bytes == 0
        assert outbox.empty() and outbox.waited_s() == 0.0

    asyncio.run(go())
