"""The hub sends a blob larger than a part as BlobParts, one part per stream message,
so a small message queued meanwhile leaves ahead of the next part, never behind the
whole blob; to a worker that speaks protocol 1 it sends the blob whole."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

from worker.hub.server import Hub
from worker.hub.session import Session
from worker.hub.store import HubStore
from worker.wire.framing import (
    PART_BYTES,
    Batcher,
    Chunked,
    blob_part,
    message_part,
    outgoing_size,
    pending_parts,
    spread_parts,
)
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.protocol import call_digest

BLOB = os.urandom(3 * PART_BYTES + 123)
CALL = {"agent_id": "a", "surface": "workerHost", "action": "fs_write", "args_json": "{}"}


def messages(batch: list[bytes | Chunked]) -> list[pb.ServerMessage]:
    """The ServerMessages of one stream message the hub would write."""
    assert all(isinstance(part, bytes) for part in batch)
    return list(pb.ServerEnvelope.FromString(b"".join(batch)).messages)  # type: ignore[arg-type]


async def queued_for(tmp_path: Path, protocol: int) -> bytes | Chunked:
    """What the hub queues for a worker speaking `protocol` when a call with BLOB comes."""
    hub = Hub(HubStore(tmp_path / "hub.db"))
    session = Session(hello=pb.Hello(worker_id="w"), session_id="s", protocol=protocol)
    hub.sessions["w"] = session
    call = pb.DispatchRequest(correlation_id="big", worker_id="w", blob=BLOB, **CALL)
    dispatched = asyncio.create_task(hub.dispatch(call))
    queued = await session.outbox.get()
    dispatched.cancel()
    hub.store.close()
    assert queued is not None
    return queued


def test_a_small_message_leaves_ahead_of_the_next_part(tmp_path: Path) -> None:
    async def go() -> None:
        transfer = await queued_for(tmp_path, protocol=2)
        assert isinstance(transfer, Chunked)

        outbox: asyncio.Queue[bytes | Chunked | None] = asyncio.Queue()
        outbox.put_nowait(transfer)
        batches = Batcher(outbox, outgoing_size, None, spread_parts)
        sent = [messages(await batches.next_batch() or [])]
        # A heartbeat queued while the first part is on the wire goes next.
        outbox.put_nowait(
            message_part(pb.ServerMessage(heartbeat=pb.Heartbeat()).SerializeToString())
        )
        while sent[-1][-1].WhichOneof("kind") != "request":  # the request comes last
            sent.append(messages(await batches.next_batch() or []))

        kinds = [[m.WhichOneof("kind") for m in stream_message] for stream_message in sent]
        assert kinds == [
            ["blob_part"],
            ["heartbeat", "blob_part"],
            ["blob_part"],
            ["blob_part"],
            ["request"],
        ]
        parts = [m.blob_part for stream_message in sent for m in stream_message]
        data = b"".join(p.data for p in parts if p.correlation_id == "big")
        assert data == BLOB and all(len(p.data) <= PART_BYTES for p in parts if p.data)
        request = sent[-1][0].request
        assert request.blob_in_parts == len(BLOB) and request.blob == b""

    asyncio.run(go())


def test_a_protocol_1_worker_gets_the_blob_whole(tmp_path: Path) -> None:
    async def go() -> None:
        whole = await queued_for(tmp_path, protocol=1)
        assert isinstance(whole, bytes)
        (message,) = pb.ServerEnvelope.FromString(whole).messages
        assert message.request.blob == BLOB and message.request.blob_in_parts == 0

    asyncio.run(go())


def test_a_transfer_queued_for_a_worker_that_came_back_on_protocol_1_goes_whole() -> None:
    session = Session(hello=pb.Hello(worker_id="w"), session_id="s", protocol=1)
    request = pb.ActionRequest(correlation_id="big", **CALL)
    from worker.wire.framing import chunked

    session.send(chunked(request, BLOB))
    whole = session.outbox.get_nowait()
    assert isinstance(whole, bytes)
    (message,) = pb.ServerEnvelope.FromString(whole).messages
    assert message.request.blob == BLOB and message.request.blob_in_parts == 0


def test_a_stream_message_stays_within_the_limit_with_transfers_in_the_outbox() -> None:
    async def go() -> None:
        from worker.wire.framing import MAX_ENVELOPE_BYTES, chunked

        outbox: asyncio.Queue[bytes | Chunked | None] = asyncio.Queue()
        whole = b"w" * (MAX_ENVELOPE_BYTES // 2 + 1)  # two of these do not fit one message
        outbox.put_nowait(b"small")
        outbox.put_nowait(whole)
        outbox.put_nowait(whole)
        transfer = chunked(pb.ActionRequest(correlation_id="t", **CALL), BLOB)
        outbox.put_nowait(transfer)
        batches = Batcher(outbox, outgoing_size, None, spread_parts)
        sizes = []
        while not transfer.finished:
            batch = await batches.next_batch() or []
            sizes.append(sum(len(part) for part in batch if isinstance(part, bytes)))
        assert max(sizes) <= MAX_ENVELOPE_BYTES
        assert len(sizes) == 6  # small + whole, whole + a part, three parts, the request

    asyncio.run(go())


def test_a_second_transfer_of_a_call_waits_for_the_first_not_beside_it() -> None:
    from worker.wire.framing import chunked

    session = Session(hello=pb.Hello(worker_id="w"), session_id="s", protocol=2)
    request = pb.ActionRequest(correlation_id="retried", **CALL)
    first = chunked(request, BLOB)
    session.send(first)
    session.send(chunked(request, BLOB))  # a retry while the first is under way
    assert session.outbox.qsize() == 1  # its parts would interleave with the first's
    while not first.finished:
        first.spread()
    session.send(chunked(request, BLOB))  # once the first went out, a re-send may go
    assert session.outbox.qsize() == 2


async def _drain(transfer: Chunked) -> list[pb.ServerMessage]:
    """Every message of `transfer`, as the hub's writer sends them (waiting for parts
    still being built)."""
    outbox: asyncio.Queue[bytes | Chunked | None] = asyncio.Queue()
    outbox.put_nowait(transfer)
    batches = Batcher(outbox, outgoing_size, None, spread_parts, pending_parts)
    sent = []
    while not transfer.finished:
        sent += messages(await batches.next_batch() or [])
    return sent


def test_a_new_calls_parts_go_while_its_digest_is_computed(tmp_path: Path) -> None:
    """A call the hub names itself is queued before its digest exists: its parts are
    built (and sent) as the digest is fed the same bytes, and the request, which
    carries the digest over every byte, goes last."""

    async def go() -> None:
        hub = Hub(HubStore(tmp_path / "hub.db"))
        session = Session(hello=pb.Hello(worker_id="w"), session_id="s", protocol=2)
        hub.sessions["w"] = session
        call = pb.DispatchRequest(worker_id="w", blob=BLOB, **CALL)  # no id: the hub names it
        dispatched = asyncio.create_task(hub.dispatch(call))
        transfer = await session.outbox.get()
        assert isinstance(transfer, Chunked)
        assert not transfer.request.args_digest  # queued before the digest was computed
        sent = await _drain(transfer)
        *parts, last = sent
        assert [m.WhichOneof("kind") for m in parts] == ["blob_part"] * 4
        assert b"".join(m.blob_part.data for m in parts) == BLOB
        request = last.request
        assert request.blob_in_parts == len(BLOB) and not request.blob
        assert request.args_digest == call_digest(request, BLOB)
        dispatched.cancel()
        hub.store.close()

    asyncio.run(go())


def test_a_call_whose_caller_leaves_before_its_digest_sends_no_more_parts(tmp_path: Path) -> None:
    async def go() -> None:
        hub = Hub(HubStore(tmp_path / "hub.db"))
        session = Session(hello=pb.Hello(worker_id="w"), session_id="s", protocol=2)
        hub.sessions["w"] = session
        call = pb.DispatchRequest(worker_id="w", blob=BLOB, **CALL)
        dispatched = asyncio.create_task(hub.dispatch(call))
        transfer = await session.outbox.get()
        assert isinstance(transfer, Chunked)
        first, _rest = transfer.spread() if transfer.parts else (None, None)
        if first is None:  # the first part is built in a thread: wait for it
            await transfer.pending()
            first, _rest = transfer.spread()
        assert first is not None
        dispatched.cancel()  # the caller goes away while the rest is built
        with contextlib.suppress(asyncio.CancelledError):
            await dispatched
        assert transfer.finished and transfer.sent == 1  # nothing more of it goes
        assert transfer.spread() == (None, None)
        (cancel,) = pb.ServerEnvelope.FromString(session.outbox.get_nowait()).messages
        assert cancel.cancel.correlation_id == transfer.request.correlation_id
        assert not hub.store.open_calls("w")  # never recorded, never sent whole
        hub.store.close()

    asyncio.run(go())


def test_a_message_behind_a_part_not_yet_built_does_not_wait_for_it() -> None:
    """The hub queues a new call's transfer before its parts are built (they are made
    as its digest is computed): a small message queued behind it goes meanwhile."""

    async def go() -> None:
        request = pb.ActionRequest(correlation_id="new", **CALL)
        transfer = Chunked.begun(request, BLOB)  # no part built yet
        outbox: asyncio.Queue[bytes | Chunked | None] = asyncio.Queue()
        outbox.put_nowait(transfer)
        beat = message_part(pb.ServerMessage(heartbeat=pb.Heartbeat()).SerializeToString())
        outbox.put_nowait(beat)
        batches = Batcher(outbox, outgoing_size, None, spread_parts, pending_parts)
        first = asyncio.ensure_future(batches.next_batch())
        for _ in range(3):  # no part will come: only a batch that did not wait is done
            await asyncio.sleep(0)
        assert first.done() and first.result() == [beat]
        waiting = asyncio.ensure_future(batches.next_batch())  # now it waits for the part
        await asyncio.sleep(0)
        assert not waiting.done()
        view = memoryview(BLOB)
        transfer.add(blob_part("new", 0, view[:PART_BYTES]))
        (part,) = messages(await waiting)
        assert part.blob_part.offset == 0 and part.blob_part.data == BLOB[:PART_BYTES]

    asyncio.run(go())
