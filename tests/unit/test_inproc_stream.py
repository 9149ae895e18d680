"""`agentworker up`'s worker stream inside the process (worker.wire.inproc): each
direction keeps its order, ends as a gRPC stream ends (EOF, an abort's status, a
cancel from either side, the hub's stop), bounds what a writer may leave unread, and
reads small envelopes written meanwhile as one (the same messages, in order)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from worker.wire import inproc
from worker.wire.inproc import LocalStreams
from worker.wire.proto import agentworker_pb2 as pb


def _envelope(*texts: str) -> bytes:
    messages = [pb.ServerMessage(drain=pb.Drain(reason=text)) for text in texts]
    return pb.ServerEnvelope(messages=messages).SerializeToString()


def _reasons(data: bytes) -> list[str]:
    return [m.drain.reason for m in pb.ServerEnvelope.FromString(data).messages]


async def _read_all(call: inproc.LocalCall) -> list[str]:
    reasons: list[str] = []
    while (data := await call.read()) is not grpc.aio.EOF:
        reasons += _reasons(data)
    return reasons


def test_each_way_keeps_its_order_and_ends_with_eof() -> None:
    """What the hub yields reaches the worker in order, then EOF when the handler
    returns; what the worker writes reaches the handler in order, deserialized, and
    its iterator ends when the worker is done writing."""
    heard: list[str] = []

    async def handler(requests: AsyncIterator[list[str]], _context: Any) -> AsyncIterator[bytes]:
        async for reasons in requests:
            heard.extend(reasons)
            yield _envelope(*(f"re {r}" for r in reasons))
        yield _envelope("bye")

    async def main() -> list[str]:
        streams = LocalStreams(handler, _reasons)
        call = streams.open_stream(())
        reading = asyncio.create_task(_read_all(call))
        for i in range(200):
            await call.write(_envelope(str(i)))
        await call.done_writing()
        return await reading

    got = asyncio.run(main())
    assert heard == [str(i) for i in range(200)]
    assert got == [f"re {i}" for i in range(200)] + ["bye"]


def test_small_envelopes_written_meanwhile_are_read_as_one() -> None:
    """Envelopes written before the reader wakes are read as one (their messages in
    order); one of JOIN_BYTES or more is read alone."""

    async def handler(requests: AsyncIterator[bytes], _context: Any) -> AsyncIterator[bytes]:
        for i in range(5):
            yield _envelope(str(i))
        yield _envelope("x" * inproc.JOIN_BYTES)
        yield _envelope("after")
        async for _ in requests:
            pass

    async def main() -> list[list[str]]:
        streams = LocalStreams(handler, bytes)
        call = streams.open_stream(())
        reads = []
        for _ in range(3):
            reads.append(_reasons(await call.read()))
        call.cancel()
        return reads

    first, large, after = asyncio.run(main())
    assert first == ["0", "1", "2", "3", "4"]
    assert large == ["x" * inproc.JOIN_BYTES]
    assert after == ["after"]


def test_an_abort_reaches_the_worker_as_grpc_raises_it() -> None:
    """`context.abort` ends the stream with its code and details, as an AioRpcError
    from the worker's next read; the metadata the worker opened with is the context's."""
    seen: list[tuple[tuple[str, str], ...]] = []

    async def handler(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        seen.append(context.invocation_metadata())
        await anext(requests)
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, "not this key")
        yield b""  # pragma: no cover - a generator, as the hub's handler is

    async def main() -> grpc.aio.AioRpcError:
        call = LocalStreams(handler, bytes).open_stream((("agentworker-worker-key", "k"),))
        await call.write(b"hello")
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call.read()
        with pytest.raises(grpc.aio.UsageError):  # the stream is over: a write fails
            await call.write(b"more")
        return raised.value

    error = asyncio.run(main())
    assert error.code() is grpc.StatusCode.PERMISSION_DENIED
    assert error.details() == "not this key"
    assert seen == [(("agentworker-worker-key", "k"),)]


def test_a_failed_handler_ends_the_stream_unknown() -> None:
    async def handler(requests: AsyncIterator[bytes], _context: Any) -> AsyncIterator[bytes]:
        yield _envelope("first")
        raise RuntimeError("boom")

    async def main() -> tuple[list[str], grpc.StatusCode]:
        call = LocalStreams(handler, bytes).open_stream(())
        first = _reasons(await call.read())
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call.read()
        return first, raised.value.code()

    assert asyncio.run(main()) == (["first"], grpc.StatusCode.UNKNOWN)


def test_the_workers_cancel_ends_the_handler_even_blocked_on_a_full_pipe() -> None:
    """Cancelled by the worker (its session ended), the handler runs its own ending,
    also when it was suspended at a yield the unread pipe held up; the handler's
    request iterator raises, as gRPC's does for a cancelled call."""
    ended = []

    async def handler(requests: AsyncIterator[bytes], _context: Any) -> AsyncIterator[bytes]:
        try:
            while True:
                yield b"x" * (inproc.PIPE_BYTES // 4)
        finally:
            ended.append(True)

    async def main() -> None:
        call = LocalStreams(handler, bytes).open_stream(())
        assert len(await call.read()) == inproc.PIPE_BYTES // 4
        while call._down._bytes < inproc.PIPE_BYTES:  # the handler fills the pipe
            await asyncio.sleep(0)
        call.cancel()
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call.read()
        assert raised.value.code() is grpc.StatusCode.CANCELLED
        while not call.done():
            await asyncio.sleep(0)

    asyncio.run(main())
    assert ended == [True]


def test_a_writer_waits_while_the_pipe_is_full() -> None:
    """A writer whose unread bytes reach PIPE_BYTES waits until the reader takes some,
    as a gRPC write waits for the flow-control window."""
    part = b"y" * (inproc.PIPE_BYTES // 2)

    async def handler(requests: AsyncIterator[bytes], _context: Any) -> AsyncIterator[bytes]:
        async for _ in requests:
            pass
        yield b""

    async def main() -> None:
        # The handler reads nothing until the worker's third write has waited.
        gate = asyncio.Event()

        async def gated(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
            await gate.wait()
            async for message in handler(requests, context):
                yield message

        call = LocalStreams(gated, bytes).open_stream(())
        await call.write(part)
        await call.write(part)
        third = asyncio.create_task(call.write(part))
        for _ in range(50):
            await asyncio.sleep(0)
        assert not third.done()
        gate.set()
        await third
        await call.done_writing()
        assert await call.read() == b""
        assert await call.read() is grpc.aio.EOF

    asyncio.run(main())


def test_the_hubs_stop_cancels_what_is_open_and_refuses_new_streams() -> None:
    ended = []

    async def handler(requests: AsyncIterator[bytes], _context: Any) -> AsyncIterator[bytes]:
        try:
            yield _envelope("welcome")
            async for _ in requests:
                pass
        finally:
            ended.append(True)

    async def main() -> tuple[grpc.StatusCode, grpc.StatusCode]:
        streams = LocalStreams(handler, bytes)
        call = streams.open_stream(())
        assert _reasons(await call.read()) == ["welcome"]
        await streams.stop(0.01)
        with pytest.raises(grpc.aio.AioRpcError) as first:
            await call.read()
        later = streams.open_stream(())
        with pytest.raises(grpc.aio.AioRpcError) as second:
            await later.read()
        return first.value.code(), second.value.code()

    assert asyncio.run(main()) == (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
    assert ended == [True]
