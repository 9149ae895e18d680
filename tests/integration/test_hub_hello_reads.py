"""A worker stream's first message is read when its connection's turn comes
(HELLO_READS_AT_ONCE at once, HELLO_READS_PER_CONNECTION of them one connection's), not
at once on every stream: gRPC reads a message whole, up to 32 MiB, and eighty streams of
the workers' token sending 31 MiB first took the hub up 802 MiB (review12 finding 09).
A real hub in the test's loop; the streams are raw gRPC ones (the far side of the
boundary) and HandWorkers, each on a connection of its own unless said."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path

import grpc

from tests.support.hub_inproc import HandWorker, hub_in_process, own_channel, token_of
from worker.hub.server import HELLO_READS_AT_ONCE, HELLO_READS_PER_CONNECTION
from worker.hub.turns import Turns
from worker.wire.protocol import STREAM_METHOD
from worker.wire.transport import worker_metadata


async def _until(condition: Callable[[], bool]) -> None:
    """Wait until `condition()` holds (the hub runs in this loop: it is not held up)."""
    while not condition():
        await asyncio.sleep(0.01)


def _silent(channel: grpc.aio.Channel, home: Path) -> grpc.aio.StreamStreamCall:
    """A worker stream that never sends its first message: it holds a turn."""
    return channel.stream_stream(STREAM_METHOD, request_serializer=None)(
        metadata=worker_metadata(token_of(home, "hub-workers.token"), uuid.uuid4().hex)
    )


def test_first_messages_are_read_a_few_at_once(tmp_path: Path) -> None:
    """Streams past HELLO_READS_AT_ONCE wait for a turn with their first message unread
    (a Hello too), and are welcomed once the turns come back."""
    home = tmp_path / "home"

    async def go() -> None:
        async with hub_in_process(home) as running:
            reads: Turns = running.hub.hello_reads
            channels = [own_channel(running.address) for _ in range(HELLO_READS_AT_ONCE)]
            silent = [_silent(channel, home) for channel in channels]
            try:
                await _until(lambda: reads.held() == HELLO_READS_AT_ONCE)
                worker = HandWorker(running.address, home)
                await _until(lambda: reads.waiting() == 1)
                assert worker.worker_id not in running.hub.sessions
                assert not worker.received
                for call in silent:
                    call.cancel()
                (welcome,) = await worker.until("welcome")
                assert welcome.session_id
                assert worker.worker_id in running.hub.sessions
                await _until(lambda: reads.held() == 0 and reads.waiting() == 0)
                await worker.close()
            finally:
                for channel in channels:
                    await channel.close()

    asyncio.run(go())


def test_one_connection_takes_its_share_of_the_turns(tmp_path: Path) -> None:
    """A connection whose streams send nothing holds HELLO_READS_PER_CONNECTION turns
    however many it opens; another connection's worker is read and welcomed meanwhile."""
    home = tmp_path / "home"

    async def go() -> None:
        async with hub_in_process(home) as running:
            reads: Turns = running.hub.hello_reads
            channel = own_channel(running.address)
            silent = [_silent(channel, home) for _ in range(HELLO_READS_AT_ONCE + 2)]
            try:
                await _until(lambda: reads.waiting() == len(silent) - HELLO_READS_PER_CONNECTION)
                assert reads.held() == HELLO_READS_PER_CONNECTION
                worker = HandWorker(running.address, home)
                await worker.until("welcome")
                assert worker.worker_id in running.hub.sessions
                await worker.close()
            finally:
                for call in silent:
                    call.cancel()
                await channel.close()

    asyncio.run(go())
