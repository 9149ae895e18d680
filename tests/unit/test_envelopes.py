from __future__ import annotations

import asyncio
import os
from typing import Any

from worker.wire.framing import (
    BATCH_BYTES,
    MAX_ENVELOPE_BYTES,
    Batcher,
    envelope_bytes,
    request_message,
    result_message,
    when_idle,
)
from worker.wire.proto import agentworker_pb2 as pb


def result(cid: str, blob_bytes: int = 0) -> pb.WorkerMessage:
    return pb.WorkerMessage(result=pb.ActionResult(correlation_id=cid, blob=b"x" * blob_bytes))


def test_waiting_messages_share_an_envelope_and_order_is_kept() -> None:
    async def go() -> list[list[str]]:
        outbox: asyncio.Queue[pb.WorkerMessage | None] = asyncio.Queue()
        for i in range(5):
            outbox.put_nowait(result(str(i)))
        outbox.put_nowait(None)
        batches = Batcher(outbox, pb.WorkerMessage.ByteSize)
        seen = []
        while (batch := await batches.next_batch()) is not None:
            seen.append([m.result.correlation_id for m in batch])
        return seen

    assert asyncio.run(go()) == [["0", "1", "2", "3", "4"]]


def test_an_envelope_never_exceeds_the_message_limit() -> None:
    async def go() -> list[int]:
        outbox: asyncio.Queue[pb.WorkerMessage | None] = asyncio.Queue()
        for i in range(4):
            outbox.put_nowait(result(str(i), 12 * 1024 * 1024))
        outbox.put_nowait(None)
        batches = Batcher(outbox, pb.WorkerMessage.ByteSize)
        sizes = []
        while (batch := await batches.next_batch()) is not None:
            sizes.append(sum(m.ByteSize() for m in batch))
            assert pb.WorkerEnvelope(messages=batch).ByteSize() <= MAX_ENVELOPE_BYTES + 1024
        return sizes

    sizes = asyncio.run(go())
    assert len(sizes) == 2, "two 12 MiB results per envelope, the rest carried over"


def test_messages_queued_while_a_batch_is_held_leave_with_it() -> None:
    async def go() -> list[list[str]]:
        outbox: asyncio.Queue[pb.WorkerMessage | None] = asyncio.Queue()
        release: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        holds = [release, None]  # the first batch is held, the next is not
        batches = Batcher(outbox, pb.WorkerMessage.ByteSize, lambda: holds.pop(0))
        outbox.put_nowait(result("0"))
        first = asyncio.ensure_future(batches.next_batch())
        await asyncio.sleep(0)  # the batch has its first message, and waits
        assert not first.done()
        outbox.put_nowait(result("1"))
        outbox.put_nowait(result("2"))
        release.set_result(None)
        seen = [await first]
        outbox.put_nowait(result("3"))
        seen.append(await batches.next_batch())
        return [[m.result.correlation_id for m in batch or []] for batch in seen]

    assert asyncio.run(go()) == [["0", "1", "2"], ["3"]]


def test_a_lone_message_goes_out_without_being_sized() -> None:
    """Sizing a 16 MiB message costs as much as serializing it; alone, it need not be."""

    class Unsizable:
        def ByteSize(self) -> int:  # noqa: N802 - protobuf's name
            raise AssertionError("sized a message that travels alone")

    async def go() -> list[object] | None:
        outbox: asyncio.Queue[Unsizable | None] = asyncio.Queue()
        outbox.put_nowait(Unsizable())
        return await Batcher(outbox, Unsizable.ByteSize).next_batch()

    batch = asyncio.run(go())
    assert batch is not None and len(batch) == 1


def test_framed_bytes_are_exactly_the_envelope_protobuf_would_write() -> None:
    big = pb.ActionResult(correlation_id="big", blob=b"z" * (16 * 1024 * 1024 + 3))
    small = pb.ActionResult(correlation_id="small", result_json='{"ok": true}')
    beat = pb.WorkerMessage(heartbeat=pb.Heartbeat(in_flight=3))
    messages = [
        result_message(big.SerializeToString()),
        beat.SerializeToString(),
        result_message(small.SerializeToString()),
    ]
    expected = pb.WorkerEnvelope(
        messages=[pb.WorkerMessage(result=big), beat, pb.WorkerMessage(result=small)]
    )
    assert envelope_bytes(messages) == expected.SerializeToString()
    assert pb.WorkerEnvelope.FromString(envelope_bytes(messages)) == expected
    assert envelope_bytes([]) == b""


def test_a_request_framed_with_its_blob_is_what_the_worker_will_parse() -> None:
    blob = b"q" * (3 * 1024 * 1024)
    request = pb.ActionRequest(correlation_id="c", surface="workerHost", action="fs_write")
    kill = pb.ServerMessage(kill_plan=pb.KillPlan(plan_id="p"))
    raw = envelope_bytes([kill.SerializeToString(), request_message(request, blob)])
    parsed = pb.ServerEnvelope.FromString(raw)
    with_blob = pb.ActionRequest()
    with_blob.CopyFrom(request)
    with_blob.blob = blob
    assert list(parsed.messages) == [kill, pb.ServerMessage(request=with_blob)]
    assert request_message(request, b"") == pb.ServerMessage(request=request).SerializeToString()


def test_a_large_results_blob_is_read_apart_and_framed_once_into_the_response() -> None:
    from worker.hub.envelopes import READ_APART_BYTES, Answer, worker_envelope

    blob = os.urandom(READ_APART_BYTES + 5)
    result = pb.ActionResult(correlation_id="c", status=pb.ActionResult.OK, result_json="{}")
    whole = pb.ActionResult()
    whole.CopyFrom(result)
    whole.blob = blob
    beat = pb.WorkerMessage(heartbeat=pb.Heartbeat(in_flight=1))
    envelope = pb.WorkerEnvelope(messages=[beat, pb.WorkerMessage(result=whole)])
    (first, none), (second, apart) = worker_envelope(envelope.SerializeToString())
    assert first == beat and none is None
    assert apart is not None and bytes(apart) == blob and second.result == result
    answer = Answer(second.result, apart)
    assert answer.message() == whole
    expected = pb.DispatchResponse(worker_id="w", result=whole)
    assert pb.DispatchResponse.FromString(answer.response("w")) == expected
    small = pb.WorkerEnvelope(messages=[pb.WorkerMessage(result=result)]).SerializeToString()
    assert worker_envelope(small) == [(pb.WorkerMessage(result=result), None)]


def test_a_large_result_without_a_blob_is_parsed_once_and_an_empty_one_stays_a_result() -> None:
    """A 1.5 MB listing has no blob to read apart: parsed from the received bytes as it
    is. A result whose only field is its blob is still a result once read apart."""
    from worker.hub.envelopes import READ_APART_BYTES, Answer, worker_envelope

    listing = pb.ActionResult(correlation_id="l", status=pb.ActionResult.OK)
    listing.result_json = '{"entries": ["' + "é" * READ_APART_BYTES + '"]}'
    only_blob = pb.ActionResult(blob=os.urandom(READ_APART_BYTES))
    messages = [pb.WorkerMessage(result=listing), pb.WorkerMessage(result=only_blob)]
    envelope = pb.WorkerEnvelope(messages=messages).SerializeToString()
    (first, none), (second, apart) = worker_envelope(envelope)
    assert first.result == listing and none is None
    assert second.WhichOneof("kind") == "result" and second.result == pb.ActionResult()
    assert apart is not None and bytes(apart) == only_blob.blob
    response = pb.DispatchResponse.FromString(Answer(first.result, none).response("w"))
    assert response == pb.DispatchResponse(worker_id="w", result=listing)


def busy(turns: int, seen: list[str]) -> None:
    """Keep the running loop busy for `turns` more turns, noting each in `seen`."""
    seen.append("busy")
    if turns > 1:
        asyncio.get_running_loop().call_soon(busy, turns - 1, seen)


def test_idle_callbacks_wait_for_the_loop_to_run_out_of_work_and_share_one_chain() -> None:
    async def go() -> list[str]:
        seen: list[str] = []
        busy(20, seen)
        when_idle(lambda: seen.append("first"), 3600)
        when_idle(lambda: seen.append("second"), 3600)  # the same chain calls it
        done = asyncio.Event()
        when_idle(done.set, 3600)
        await done.wait()
        return seen

    assert asyncio.run(go()) == ["busy"] * 20 + ["first", "second"]


def test_an_idle_callback_comes_within_its_bound_on_a_loop_that_never_idles() -> None:
    async def go() -> None:
        called = asyncio.Event()

        def spin() -> None:  # busy for as long as the callback has not come
            if not called.is_set():
                asyncio.get_running_loop().call_soon(spin)

        spin()
        when_idle(called.set, 0.01)
        async with asyncio.timeout(60):  # only a broken bound would reach this
            await called.wait()

    asyncio.run(go())


def test_a_hubs_batch_holds_batch_bytes_and_a_larger_message_goes_alone() -> None:
    """Ten requests of 400 KiB for a worker: two to an envelope (a third would take it
    past BATCH_BYTES), so that on a slow link the worker hears the hub every ~1 MiB,
    never a 32 MiB envelope's worth of silence (review21); one of 3 MiB goes alone, and
    small ones behind it share the next. A batcher without the cap (the worker's) takes
    them all at once, as before."""

    async def go(sizes: list[int], **cap: int) -> list[list[str]]:
        outbox: asyncio.Queue[pb.WorkerMessage | None] = asyncio.Queue()
        for i, size in enumerate(sizes):
            outbox.put_nowait(result(str(i), size))
        outbox.put_nowait(None)
        batches = Batcher(outbox, pb.WorkerMessage.ByteSize, **cap)
        seen = []
        while (batch := await batches.next_batch()) is not None:
            seen.append([m.result.correlation_id for m in batch])
        return seen

    assert 2 * 400 * 1024 < BATCH_BYTES < 3 * 400 * 1024
    kib400 = [400 * 1024] * 10
    capped = asyncio.run(go(kib400, batch_bytes=BATCH_BYTES))
    assert capped == [[str(i), str(i + 1)] for i in range(0, 10, 2)]
    assert asyncio.run(go(kib400)) == [[str(i) for i in range(10)]]
    mixed = asyncio.run(go([100, 3 * 1024 * 1024, 100, 100], batch_bytes=BATCH_BYTES))
    assert mixed == [["0"], ["1"], ["2", "3"]]


def test_an_idle_chain_takes_each_turn_with_the_one_handle_it_began_with() -> None:
    """The chain's turn, once a loop iteration while work is ready, queues its handle
    again rather than a new one (call_soon made one a turn: five a Dispatch in `up`)."""

    async def go() -> tuple[list[str], int]:
        loop = asyncio.get_running_loop()
        seen: list[str] = []
        made: list[object] = []
        call_soon = loop.call_soon

        def counted(callback: Any, *args: Any, **kwargs: Any) -> asyncio.Handle:
            if getattr(callback, "__name__", "") == "turn":
                made.append(callback)
            return call_soon(callback, *args, **kwargs)

        loop.call_soon = counted  # type: ignore[method-assign]
        try:
            busy(20, seen)
            done = asyncio.Event()
            when_idle(lambda: seen.append("idle"), 3600)
            when_idle(done.set, 3600)
            await done.wait()
        finally:
            del loop.call_soon
        return seen, len(made)

    seen, handles = asyncio.run(go())
    assert seen == ["busy"] * 20 + ["idle"]
    assert handles == 1
