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
    caller_metadata,
    hub_in_process,
    own_channel,
    probe,
    probe_request,
    real_worker,
    stop_worker,
    until_connected,
)
from worker.hub.reads import LATER_READS_AT_ONCE
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.proto import agentworker_pb2_grpc as pb_grpc


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
            reads.silent_s = 3600.0  # the holders are not given up here (see below)
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


def test_a_turn_held_silent_while_others_wait_is_given_up(tmp_path: Path) -> None:
    """review15 finding 02: two streams that said Hello and then nothing held both turns
    for ever, and no other worker with no call open was read again. Now a turn held
    `silent_s` (LATER_SILENT_S; small here) with no message while another stream waits
    goes to that stream, the silent stream ends (UNAVAILABLE; its worker would dial
    again) and its connection goes behind; the other holder keeps its turn."""
    home = tmp_path / "home"

    async def go() -> None:
        async with hub_in_process(home) as running:
            reads = running.hub.later_reads
            reads.silent_s = 0.05
            holders = [HandWorker(running.address, home) for _ in range(LATER_READS_AT_ONCE)]
            for hand in holders:
                await hand.until("welcome")
            await _until(lambda: reads.held() == LATER_READS_AT_ONCE)
            third = HandWorker(running.address, home)
            try:
                await third.until("welcome")
                third.send(pb.WorkerMessage(heartbeat=pb.Heartbeat(unix_ms=7)))
                ended = [asyncio.ensure_future(hand.ended()) for hand in holders]
                done, _ = await asyncio.wait(ended, return_when=asyncio.FIRST_COMPLETED)
                assert [task.result() for task in done] == [grpc.StatusCode.UNAVAILABLE]
                session = running.hub.sessions[third.worker_id]
                await _until(lambda: session.heartbeat.unix_ms == 7)  # read in its turn
                assert reads.gave_up == 1
                (gone,) = [h for h, task in zip(holders, ended, strict=True) if task in done]
                assert "no message within" in (await gone.call.details() or "")
                kept = next(h for h in holders if h is not gone)
                assert kept.worker_id in running.hub.sessions and not kept.call.done()
            finally:
                for hand in [*holders, third]:
                    await hand.close()

    asyncio.run(go())


def test_a_worker_owing_a_result_is_read_at_once_while_turns_are_held(tmp_path: Path) -> None:
    """review15 finding 02: a call the worker was running when its link dropped, its
    caller gone, is owed: the worker coming back names it in its Hello, and its messages
    (here a heartbeat, which confirms the kill backlog's pages) are read at once, not in
    the turns two idle streams hold (kept here: `silent_s` long)."""
    home = tmp_path / "home"

    async def go() -> None:
        async with hub_in_process(home) as running:
            reads = running.hub.later_reads
            reads.silent_s = 3600.0
            channel = own_channel(running.address)
            stub = pb_grpc.ControlServiceStub(channel)
            first = HandWorker(running.address, home)
            holders: list[HandWorker] = []
            back: HandWorker | None = None
            try:
                await first.until("welcome")
                call = asyncio.ensure_future(
                    stub.Dispatch(
                        probe_request(first.worker_id),
                        metadata=caller_metadata(home),
                        timeout=120,
                    )
                )
                (request,) = await first.until("request")
                call.cancel()  # its caller leaves; the call is open at the worker
                await first.close()
                await _until(lambda: first.worker_id not in running.hub.sessions)
                holders = [HandWorker(running.address, home) for _ in range(LATER_READS_AT_ONCE)]
                for hand in holders:
                    await hand.until("welcome")
                await _until(lambda: reads.held() == LATER_READS_AT_ONCE)
                hello = pb.Hello()
                hello.CopyFrom(first.hello)
                hello.running_ids.append(request.correlation_id)
                back = HandWorker(running.address, home, hello=hello, key=first.key)
                await back.until("welcome")
                back.send(pb.WorkerMessage(heartbeat=pb.Heartbeat(unix_ms=7)))
                session = running.hub.sessions[back.worker_id]
                await _until(lambda: session.heartbeat.unix_ms == 7)
                assert reads.held() == LATER_READS_AT_ONCE and reads.gave_up == 0
            finally:
                for hand in [*holders, *([back] if back else [])]:
                    await hand.close()
                await channel.close()

    asyncio.run(go())
