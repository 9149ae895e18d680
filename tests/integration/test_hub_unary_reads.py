"""A Dispatch is served as a unary call while one of Dispatch's unary reads is free
(gRPC reads its request before the handler runs), and read in its turn otherwise
(worker.hub.services._ControlHandlers, reads.DISPATCH_UNARY_READS): calls whose
request never comes hold the unary reads at most, every other Dispatch is still
answered meanwhile, and a read is given back however its call ends (answered, refused
before it was read, refused once read, or gone unread).

A real hub in the test's loop (its state looked at) and a real worker process."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from tests.support.hub_inproc import DrivenHub, driven_hub, own_channel, probe_request, token_of
from worker.hub.reads import DISPATCH_UNARY_READS, UnaryReads
from worker.hub.services import DISPATCH_BESIDES_BLOB_BYTES
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.transport import bearer

DISPATCH = "/agentworker.v1.ControlService/Dispatch"
MIB = 1024 * 1024


class Watched:
    """The hub's unary reads, and a wait on them that wakes as one is taken or given
    back (no clock)."""

    def __init__(self, reads: UnaryReads) -> None:
        self.reads = reads
        self.taken = 0  # reads taken so far
        self._moved = asyncio.Event()
        take, give_back = reads.take, reads.give_back

        def counted() -> bool:
            took = take()
            self.taken += took
            self._moved.set()
            return took

        def given() -> None:
            give_back()
            self._moved.set()

        reads.take = counted  # type: ignore[method-assign]
        reads.give_back = given  # type: ignore[method-assign]

    async def until(self, condition: Callable[[UnaryReads], bool]) -> None:
        while not condition(self.reads):
            self._moved.clear()
            await self._moved.wait()


async def _with_worker(hub: DrivenHub) -> tuple[str, Watched]:
    await hub.real_worker()
    (worker_id,) = hub.sessions
    return worker_id, Watched(hub.hub.unary_reads)


def test_calls_whose_request_never_comes_hold_the_unary_reads_and_others_go_in_turn(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        async with driven_hub(tmp_path / "home") as hub:
            worker_id, unary = await _with_worker(hub)
            # Calls that send no request, each on its connection: each holds a unary
            # read (gRPC waits for its request), none more than there are.
            channels = [own_channel(hub.address) for _ in range(DISPATCH_UNARY_READS)]
            stalled = [
                channel.stream_stream(DISPATCH)(metadata=hub.caller.metadata)
                for channel in channels
            ]
            for call in stalled:
                await call.wait_for_connection()
            await unary.until(lambda reads: reads.held == DISPATCH_UNARY_READS)
            # Every other Dispatch is read in its turn meanwhile, and answered.
            replies = await asyncio.gather(
                *(hub.caller.dispatch(probe_request(worker_id), timeout=60) for _ in range(8))
            )
            assert [r.result.status for r in replies] == [pb.ActionResult.OK] * 8
            assert unary.reads.held == DISPATCH_UNARY_READS
            # Their callers leave: the reads are given back (gRPC lets the calls go).
            for call in stalled:
                call.cancel()
            await unary.until(lambda reads: reads.held == 0)
            for channel in channels:
                await channel.close()
            # Then taken again, and given back as each request is read.
            waiting = asyncio.Semaphore(64)

            async def one() -> int:
                async with waiting:
                    reply = await hub.caller.dispatch(probe_request(worker_id), timeout=120)
                    return int(reply.result.status)

            answers = await asyncio.gather(*(one() for _ in range(256)))
            assert answers == [pb.ActionResult.OK] * 256
            assert unary.reads.held == 0

    asyncio.run(go())


def test_a_dispatch_read_unary_and_refused_gives_its_read_back(tmp_path: Path) -> None:
    async def go() -> None:
        async with driven_hub(tmp_path / "home") as hub:
            worker_id, unary = await _with_worker(hub)
            raw = hub.caller.channel.unary_unary(DISPATCH)
            probe = probe_request(worker_id).SerializeToString()
            padded = pb.DispatchRequest(
                agent_id="tester", surface="workerDiag", action="probe", args_json="{}"
            ).SerializeToString() + _unknown_field(DISPATCH_BESIDES_BLOB_BYTES + 1)
            workers = bearer(token_of(hub.home, "hub-workers.token"))
            refusals = {
                # Refused before its request is read (the token), a read taken at the
                # lookup and let go at once.
                "no token": (probe, (), grpc.StatusCode.UNAUTHENTICATED),
                "the workers' token": (probe, workers, grpc.StatusCode.PERMISSION_DENIED),
                # Read, then refused.
                "undecodable": (
                    b"\x0a\x02\xff\xfe",
                    hub.caller.metadata,
                    grpc.StatusCode.INVALID_ARGUMENT,
                ),
                "padded": (padded, hub.caller.metadata, grpc.StatusCode.RESOURCE_EXHAUSTED),
                "no action": (b"", hub.caller.metadata, grpc.StatusCode.INVALID_ARGUMENT),
            }
            for name, (request, metadata, code) in refusals.items():
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await raw(request, metadata=metadata, timeout=60)
                assert refused.value.code() == code, (name, refused.value)
                await unary.until(lambda reads: reads.held == 0)
            # A call that ends its sending with no request at all: gRPC's unary path
            # leaves it unanswered (until its caller's deadline), its read given back.
            taken = unary.taken
            empty = hub.caller.channel.stream_stream(DISPATCH)(metadata=hub.caller.metadata)
            await empty.done_writing()
            await unary.until(lambda reads: unary.taken > taken and reads.held == 0)
            empty.cancel()
            # A blob of 20 MiB sent whole, read as a unary call's: answered, let go.
            reply = await hub.caller.stub.Dispatch(
                pb.DispatchRequest(
                    worker_id=worker_id,
                    agent_id="tester",
                    surface="workerDiag",
                    action="probe",
                    args_json="{}",
                    blob=b"b" * 20 * MIB,
                ),
                metadata=hub.caller.metadata,
                timeout=120,
            )
            assert reply.result.status == pb.ActionResult.OK, reply.result
            assert unary.reads.held == 0

    asyncio.run(go())


def _unknown_field(size: int) -> bytes:
    """An unknown length-delimited field (number 15) of `size` bytes in all."""
    room = size - 1 - 4  # its tag, a 4-byte varint length
    length = bytes([room & 0x7F | 0x80, room >> 7 & 0x7F | 0x80, room >> 14 & 0x7F | 0x80])
    return bytes([15 << 3 | 2]) + length + bytes([room >> 21]) + b"x" * room
