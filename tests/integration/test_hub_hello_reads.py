"""A worker stream's first message is read when its connection's turn comes
(HELLO_READS_AT_ONCE at once, HELLO_READS_PER_CONNECTION of them one connection's), not
at once on every stream: gRPC reads a message whole, up to 32 MiB, and eighty streams of
the workers' token sending 31 MiB first took the hub up 802 MiB (review12 finding 09).
Streams that never say Hello hold no worker out (review14 finding 04): a worker whose
key the hub knows is read on turns of its own, a turn held without a Hello goes to a
waiting stream and its connection behind, and the streams waiting are bounded.
A real hub in the test's loop; the streams are raw gRPC ones (the far side of the
boundary), HandWorkers, each on a connection of its own unless said, and a real worker."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from tests.support.hub_inproc import (
    HandWorker,
    hub_in_process,
    own_channel,
    real_worker,
    stop_worker,
    token_of,
    until_connected,
)
from worker.hub import server
from worker.hub.reads import HELLO_READS_AT_ONCE, HELLO_READS_PER_CONNECTION
from worker.hub.turns import Turns, address_of
from worker.wire.protocol import RETRY_AFTER_KEY, STREAM_METHOD
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
            reads: Turns = running.hub.hello_reads.reads
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
            reads: Turns = running.hub.hello_reads.reads
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


SILENT = 8  # streams of the workers' token that never say Hello


def test_a_known_worker_gets_in_however_many_silent_streams_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real worker restarted while SILENT streams of keys the hub does not know hold
    both turns and wait, none of them ever giving its turn up (their time made
    endless): its key is bound to it in hub.db, so it is read on turns of its own and
    connected while every silent stream still waits (before review14 finding 04 it
    waited behind them all, its Welcome past its 15 s, and dialled again at the back)."""
    home = tmp_path / "home"
    monkeypatch.setattr(server, "HANDSHAKE_TIMEOUT_S", 3600.0)

    async def go() -> None:
        async with hub_in_process(home) as running:
            strangers = running.hub.hello_reads
            strangers.prompt_s = 3600.0
            worker = real_worker(home, running.address)
            channels: list[grpc.aio.Channel] = []
            try:
                (worker_id,) = await until_connected(running, worker)
                await stop_worker(worker)
                await _until(lambda: worker_id not in running.hub.sessions)
                channels = [own_channel(running.address) for _ in range(SILENT)]
                silent = [_silent(channel, home) for channel in channels]
                reads = strangers.reads
                await _until(lambda: reads.held() == HELLO_READS_AT_ONCE)
                await _until(lambda: reads.waiting() == SILENT - HELLO_READS_AT_ONCE)
                worker = real_worker(home, running.address)
                assert await until_connected(running, worker) == [worker_id]
                assert not any(call.done() for call in silent)
                assert reads.held() == HELLO_READS_AT_ONCE
                assert reads.waiting() == SILENT - HELLO_READS_AT_ONCE
            finally:
                await stop_worker(worker)
                for channel in channels:
                    await channel.close()

    asyncio.run(go())


def test_a_silent_turn_holder_gives_its_turn_up_and_goes_behind(tmp_path: Path) -> None:
    """A stream holding a turn without its Hello while another waits gives the turn up
    (prompt_s into it, here at once) and is ended DEADLINE_EXCEEDED; its connection is
    late, and the next stream it opens waits behind a fresh connection's worker that
    came after it."""
    home = tmp_path / "home"

    async def go() -> None:
        async with hub_in_process(home) as running:
            gate = running.hub.hello_reads
            reads = gate.reads
            gate.prompt_s = 0.0  # a waiting stream takes a silent holder's turn at once
            channels = [own_channel(running.address) for _ in range(5)]
            late, fresh = channels[:2], channels[2:]
            try:
                silent = [_silent(channel, home) for channel in late]
                await _until(lambda: reads.held() == HELLO_READS_AT_ONCE)
                first = HandWorker(running.address, home)
                await first.until("welcome")  # one holder's turn went to it
                # Its end reaches this side of the stream on its own: not always before
                # the welcome does (a loaded full check: [False, False]).
                await _until(lambda: any(call.done() for call in silent))
                ended = [call.done() for call in silent]
                assert ended.count(True) == 1
                gave_up = silent[ended.index(True)]
                assert await gave_up.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                assert "other streams waited for the turn" in (await gave_up.details() or "")
                silent[ended.index(False)].cancel()
                await first.close()

                gate.prompt_s = 3600.0  # from here on, holders keep their turns
                holders = [_silent(channel, home) for channel in fresh[:2]]
                await _until(lambda: reads.held() == HELLO_READS_AT_ONCE)
                behind = _silent(late[ended.index(True)], home)  # a late connection's: rank 2
                await _until(lambda: reads.waiting(2) == 1)
                second = HandWorker(running.address, home)  # after it, on a fresh one
                await _until(lambda: reads.waiting(0) == 1)
                holders[0].cancel()
                await second.until("welcome")  # the freed turn went to it
                assert not behind.done()  # it waited behind, and holds that turn now
                for call in (holders[1], behind):
                    call.cancel()
                await second.close()
            finally:
                for channel in channels:
                    await channel.close()

    asyncio.run(go())


def test_streams_waiting_from_one_address_are_bounded(tmp_path: Path) -> None:
    """Past the streams an address may have waiting or read (HELLO_STREAMS_PER_ADDRESS,
    here made small), another is refused RESOURCE_EXHAUSTED busy with retry-after,
    unread; once they end, a worker from there is read."""
    home = tmp_path / "home"

    async def go() -> None:
        async with hub_in_process(home) as running:
            gate = running.hub.hello_reads
            gate.prompt_s = 3600.0
            gate.calls_per_address = 4
            channels = [own_channel(running.address) for _ in range(5)]
            try:
                silent = [_silent(channel, home) for channel in channels[:4]]
                reads = gate.reads
                await _until(lambda: reads.held() == 2 and reads.waiting() == 2)
                refused = _silent(channels[4], home)
                assert await refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "busy: streams from this address" in (await refused.details() or "")
                assert int(dict(await refused.trailing_metadata())[RETRY_AFTER_KEY]) > 0
                for call in silent:
                    call.cancel()
                await _until(lambda: reads.held() == 0 and reads.waiting() == 0)
                worker = HandWorker(running.address, home)
                await worker.until("welcome")
                await worker.close()
            finally:
                for channel in channels:
                    await channel.close()

    asyncio.run(go())


def _silent_of(channel: grpc.aio.Channel, home: Path, key: str) -> grpc.aio.StreamStreamCall:
    """A stream of worker key `key` that never sends its first message."""
    return channel.stream_stream(STREAM_METHOD, request_serializer=None)(
        metadata=worker_metadata(token_of(home, "hub-workers.token"), key)
    )


def test_a_known_key_never_late_is_not_bound_by_its_late_neighbours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review15 finding 04: the known keys' late-address bound (HELLO_STREAMS_PER_LATE_
    ADDRESS; here 4) was shared by every key of the address, so keys gone late (their
    streams silent) filled it with silent streams, and a worker of the same address (a
    NAT, the same host) coming back was refused busy for as long as they were kept up.
    Now that bound counts and binds late keys' streams only: the worker's key never went
    late, so its stream is admitted, the late keys' turns go to it, and it is welcomed."""
    home = tmp_path / "home"

    async def go() -> None:
        async with hub_in_process(home) as running:
            gate = running.hub.known_hello_reads
            gate.calls_per_late_address = 4
            keys = [uuid.uuid4().hex for _ in range(3)]
            victim = HandWorker(running.address, home)
            for hand in [victim, *(HandWorker(running.address, home, key=k) for k in keys)]:
                await hand.until("welcome")  # its key is now bound to its id in hub.db
                await hand.close()
            channels = [own_channel(running.address) for _ in range(7)]
            try:
                # Their keys go late: a stream of each holds its turn without a Hello.
                monkeypatch.setattr(server, "HANDSHAKE_TIMEOUT_S", 0.2)
                first = [_silent_of(channels[n], home, key) for n, key in enumerate(keys)]
                for call in first:
                    assert await call.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                address = address_of("ipv4:127.0.0.1:1")  # the streams' (loopback)
                loop = asyncio.get_running_loop()
                assert gate.late_addresses.wait_s(address, loop.time()) > 0  # address late
                monkeypatch.setattr(server, "HANDSHAKE_TIMEOUT_S", 3600.0)
                # Their silent streams now fill the late-address places: 2 of each key.
                silent = [_silent_of(channels[3 + n % 4], home, keys[n % 3]) for n in range(6)]
                await _until(lambda: sum(call.done() for call in silent) == 2)
                await _until(lambda: gate.address_calls.get(address) == 4)
                for call in silent:
                    if call.done():
                        assert await call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                back = HandWorker(running.address, home, hello=victim.hello, key=victim.key)
                try:
                    await back.until("welcome")
                    assert back.worker_id in running.hub.sessions
                finally:
                    await back.close()
            finally:
                for channel in channels:
                    await channel.close()

    asyncio.run(go())
