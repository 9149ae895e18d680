"""A worker stream that does not take what the hub writes it asks for no later-read
turn (review16 F1): a read asked for in a turn stays asked for after the turn is given
up, and such a stream cannot be ended (its handler waits for gRPC to take the envelope
it handed over), so each took in a message whole outside LATER_READS_AT_ONCE. The hub
and its session are real; the stream's messages are the far side, an iterator here."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from worker.hub.envelopes import EnvelopeRefused, Incoming
from worker.hub.server import Hub
from worker.hub.session import Session
from worker.hub.store import HubStore
from worker.wire.proto import agentworker_pb2 as pb

PEER = "ipv4:127.0.0.1:40000"


def test_a_stream_whose_writes_are_not_taken_asks_for_no_read_turn(tmp_path: Path) -> None:
    async def go() -> None:
        hub = Hub(HubStore(tmp_path / "hub.db"))
        session = Session(hello=pb.Hello(worker_id="w"), session_id="s")
        asked = asyncio.Event()
        message = asyncio.get_running_loop().create_future()

        async def requests() -> AsyncIterator[Incoming | EnvelopeRefused]:
            asked.set()  # gRPC is asked for the stream's next message
            yield await message

        session.writes()  # the Welcome, handed to gRPC, not taken: the worker reads nothing
        reader = asyncio.create_task(hub._next(session, requests(), PEER))
        for _ in range(100):  # the reader runs as far as it goes
            await asyncio.sleep(0)
        assert not reader.done() and not asked.is_set()
        assert hub.later_reads.held() == 0 and hub.later_reads.waiting() == 0

        session.wrote()  # gRPC took it: the stream reads what it is sent
        await asyncio.wait_for(asked.wait(), 10)
        assert hub.later_reads.held(PEER) == 1  # in a turn
        message.set_result([])
        assert await asyncio.wait_for(reader, 10) == []
        assert hub.later_reads.held() == 0
        hub.store.close()

    asyncio.run(go())


def test_a_stream_that_takes_nothing_for_long_is_let_go_and_queues_nothing_more(
    tmp_path: Path,
) -> None:
    """review17 E5: such a stream never asks for a read, so it was never found silent:
    its session stayed connected for as long as its TCP connection lived, and every
    KillPlan (sent to every session) and heartbeat queued on it, hub memory unbounded
    (+60 MB for 16 streams and 4,000 kills). Now the heartbeat timer finds its last
    envelope not taken for WRITE_STUCK_S and lets the session go."""

    async def go() -> None:
        hub = Hub(HubStore(tmp_path / "hub.db"), heartbeat_s=0.01)
        hub.write_stuck_s = 0.05
        session = Session(hello=pb.Hello(worker_id="w"), session_id="s")
        hub.sessions["w"] = session
        session.writes()  # the Welcome, handed to gRPC, never taken
        session.send(pb.ServerMessage(kill_plan=pb.KillPlan(plan_id="p", reason="r")))
        reader = asyncio.create_task(asyncio.Event().wait())  # waits for ever, as _next does
        beats = asyncio.create_task(hub._beat(session, reader))
        await asyncio.wait_for(beats, 10)
        assert "w" not in hub.sessions and session.closed and session.ended
        assert session.outbox.qsize() == 1  # what was queued went; the end is queued
        await asyncio.gather(reader, return_exceptions=True)
        assert reader.cancelled()
        session.send(pb.ServerMessage(kill_plan=pb.KillPlan(plan_id="q", reason="r")))
        assert session.outbox.qsize() == 1  # nothing more is queued on it
        hub.store.close()

    asyncio.run(go())


def test_a_stream_that_takes_what_it_is_written_is_kept(tmp_path: Path) -> None:
    async def go() -> None:
        hub = Hub(HubStore(tmp_path / "hub.db"), heartbeat_s=0.01)
        hub.write_stuck_s = 0.05
        session = Session(hello=pb.Hello(worker_id="w"), session_id="s")
        hub.sessions["w"] = session
        reader = asyncio.create_task(asyncio.Event().wait())
        beats = asyncio.create_task(hub._beat(session, reader))
        for _ in range(20):  # heartbeats go out, each taken at once
            while session.outbox.empty():
                await asyncio.sleep(0.01)
            session.outbox.get_nowait()
            session.writes()
            session.wrote()
        assert hub.sessions["w"] is session and not session.closed
        beats.cancel()
        reader.cancel()
        await asyncio.gather(beats, reader, return_exceptions=True)
        hub.store.close()

    asyncio.run(go())


def test_a_stream_whose_oldest_queued_message_waited_too_long_is_let_go(
    tmp_path: Path,
) -> None:
    """review18 F7: a stream that takes each envelope in time (its window opened 24 KB
    every 2 s) may still read slower than the hub writes it, and it was kept while what
    waited for it grew. Now the heartbeat timer finds the oldest message of its outbox
    waited past OUTBOX_WAIT_S and lets it go, as one that takes nothing."""

    async def go() -> None:
        hub = Hub(HubStore(tmp_path / "hub.db"), heartbeat_s=0.01)
        hub.outbox_wait_s = 0.0  # a message still queued at a beat waited too long
        session = Session(hello=pb.Hello(worker_id="w"), session_id="s")
        hub.sessions["w"] = session
        # Queued, never taken; nothing is held by gRPC: it is not deaf (stuck_for 0).
        session.send(pb.ServerMessage(kill_plan=pb.KillPlan(plan_id="p", reason="r")))
        reader = asyncio.create_task(asyncio.Event().wait())
        beats = asyncio.create_task(hub._beat(session, reader))
        await asyncio.wait_for(beats, 10)
        assert "w" not in hub.sessions and session.closed and session.ended
        assert session.refusal is not None and "waited" in session.refusal[1]
        assert session.outbox.qsize() == 1  # what was queued went; the end is queued
        await asyncio.gather(reader, return_exceptions=True)
        assert reader.cancelled()
        hub.store.close()

    asyncio.run(go())
