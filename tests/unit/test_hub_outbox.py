"""A worker stream's outbox counts the kills and heartbeats waiting in it (the hub sends
a worker no more kills while a page of them waits: review18 F7) and knows how long its
oldest message waited while the stream took next to nothing (past OUTBOX_WAIT_S the
stream is let go)."""

from __future__ import annotations

import asyncio

from worker.hub.outbox import PROGRESS_BYTES, Outbox
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


def test_a_stream_taking_what_it_is_written_is_not_stalled_however_old_its_backlog() -> None:
    """review21: a worker reading a slow link steadily, minutes behind its backlog of
    calls, was let go for its oldest message's age. The wait counts from the stream's
    last PROGRESS_BYTES taken; a stream taking less stalls as before."""

    async def go() -> None:
        now = [100.0]
        outbox = Outbox(clock=lambda: now[0])
        assert outbox.stalled_s() == 0.0  # nothing waits
        outbox.put_nowait(b"a call")
        now[0] += 200.0
        assert outbox.stalled_s() == 200.0 == outbox.waited_s()
        outbox.took(PROGRESS_BYTES - 1)  # not yet a part's worth
        assert outbox.stalled_s() == 200.0
        outbox.took(1)
        assert outbox.stalled_s() == 0.0 and outbox.waited_s() == 200.0
        now[0] += 30.0
        assert outbox.stalled_s() == 30.0
        outbox.get_nowait()
        assert outbox.stalled_s() == 0.0
        now[0] += 10.0
        outbox.put_nowait(b"another")  # queued after the last progress: from its put
        now[0] += 5.0
        assert outbox.stalled_s() == 5.0

    asyncio.run(go())
