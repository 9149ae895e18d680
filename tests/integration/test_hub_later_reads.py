"""A worker stream's messages after its Hello are asked of gRPC at once only while the hub
expects answers of its worker (calls open there, a scope request, a teardown); otherwise
in a turn (LATER_READS_AT_ONCE at once, LATER_READS_PER_CONNECTION of them one
connection's), the message left unread with the sender meanwhile: gRPC reads a message
whole, up to 32 MiB, and 48 admitted streams each sending 31 MiB after a small Hello took
the hub's peak up 535 MiB (review14 finding 05). A real hub in the test's loop, a real
worker, and HandWorkers (the far side of the boundary), each on a connection of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import grpc

from tests.support.hub_inproc import (
    HandWorker,
    hub_in_process,
    own_channel,
    probe,
    real_worker,
    stop_worker,
    until_connected,
)
from worker.hub.reads import LATER_READS_AT_ONCE
from worker.wire.proto import agentworker_pb2 as pb


async def _until(condition: Callable[[], bool]) -> None:
    """Wait until `condition()` holds (the hub runs in this loop: it is not held up)."""
    while not condition():
        await asyncio.sleep(0.01)


def test_messages_nobody_expects_wait_for_a_turn_and_answers_do_not(tmp_path: Path) -> None:
    """Two idle streams hold both turns (their next message not come); a third stream's
    message (here one that does not decode) stays unread, while a real worker's result
    of a call open there is read at once; once the holders' heartbeats came, the third's
    message is read in its turn (and refused)."""
    home = tmp_path / "home"

    async def go() -> None:
        async with hub_in_process(home) as running:
            reads = running.hub.later_reads
            holders = [HandWorker(running.address, home) for _ in range(LATER_READS_AT_ONCE)]
            for hand in holders:
                await hand.until("welcome")
            await _until(lambda: reads.held() == LATER_READS_AT_ONCE)
            third = HandWorker(running.address, home)
            await third.until("welcome")
            await _until(lambda: reads.waiting() == 1)
            third.send_raw(b"\xff" * 1024)  # not an envelope: the stream ends once read
            worker = real_worker(home, running.address)
            channel = own_channel(running.address)
            try:
                (worker_id,) = [
                    w
                    for w in await until_connected(running, worker, LATER_READS_AT_ONCE + 2)
                    if not w.startswith("hand-")
                ]
                await probe(channel, home, worker_id)  # its result is read at once
                await probe(channel, home, worker_id)
                assert not third.call.done()  # its message still unread
                assert reads.held() == LATER_READS_AT_ONCE
                for hand in holders:
                    hand.send(pb.WorkerMessage(heartbeat=pb.Heartbeat(unix_ms=1)))
                assert await third.ended() == grpc.StatusCode.INVALID_ARGUMENT
            finally:
                await stop_worker(worker)
                await channel.close()
                for hand in [*holders, third]:
                    await hand.close()

    asyncio.run(go())
