"""The worker stream of `agentworker up`'s own worker, inside the process, without gRPC.

Inside `up` the hub and its worker share one process, one event loop and one GIL.
Their `WorkerService.Stream` used to go through gRPC over loopback all the same, and
each envelope cost both ends what any stream message costs: gRPC's Cython and C
layers, HTTP/2 framing, a sendmsg, an eventfd write to wake its poller, and the
matching read, parse and wake-up at the other end; with 64 calls in flight that was
about a third of `up`'s CPU per call (a relay with the stream in process spent
0.34 ms of CPU a call where the same relay handing the bytes over spent 0.18).

`open_stream` joins the worker's connection to the hub's stream handler directly:
the very bytes each side frames (serialized envelopes, `worker.wire.framing`) go
through two in-memory pipes, one each way, read by the same code that reads them off
gRPC. So what the two sides say to each other, in what order and how a session
begins and ends are what they were:

- each direction keeps its order (a pipe is first in, first out), and the two
  directions are as independent as a stream's;
- the hub's handler sees its request iterator end when the worker is done writing,
  and the worker reads EOF when the handler returns (the hub ended the session);
- an abort of the handler (`context.abort`) or its failure reaches the worker as the
  `grpc.aio.AioRpcError` gRPC would raise (its code and details), so a refusal (a
  worker key not the one its id is known by, say) is fatal as before;
- the worker's end of the session (`LocalCall.cancel`) cancels the handler, as
  gRPC cancels a server's handler when its client goes, and the hub's stop cancels
  every handler still running (`LocalStreams.stop`), as a gRPC server's stop does;
- a writer waits while more than `PIPE_BYTES` it wrote are unread, as a gRPC write
  waits for the peer's flow-control window: neither side can grow the other's memory
  by not reading.

No bearer token is checked on this path: only code in the process holds the
`LocalStreams` object (the hub's listening socket, and every other worker and
caller, still go through gRPC and its token checks). The worker's metadata (its
key) is handed to the handler as gRPC would hand it, so the hub binds the worker's
id to its key just the same.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Final, Generic, NoReturn, TypeVar

import grpc

from worker.wire.framing import when_idle

log = logging.getLogger(__name__)

# Envelopes smaller than this, written since the reader last woke, are read as one
# (a protobuf message's serializations joined are one message with their repeated
# fields joined: an envelope's messages), up to this in all.
JOIN_BYTES: Final = 64 * 1024
# A write wakes the reader once the loop has run out of other work, or within this.
WAKE_WITHIN_S: Final = 0.002

# What a writer may have written and the reader not yet read, before its next write
# waits (gRPC's HTTP/2 window is of this order). A message larger than this still
# goes, alone.
PIPE_BYTES: Final = 4 * 1024 * 1024

T = TypeVar("T")
Metadata = Sequence[tuple[str, str]]
# The hub's stream handler: (request iterator, servicer context) -> what it yields.
Handler = Callable[[AsyncIterator[Any], Any], AsyncIterator[bytes]]

# What `context.peer()` names a stream opened in this process (`up`'s worker).
LOCAL_PEER: Final = "in-process"


class _Pipe:
    """One direction of a stream: byte strings in order, then an end (EOF, or an error
    the reader raises)."""

    def __init__(self, bound: int = PIPE_BYTES) -> None:
        self._items: collections.deque[bytes] = collections.deque()
        self._bytes = 0
        self._bound = bound
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._ended = False  # nothing more will be written
        self._error: BaseException | None = None  # raised to the reader once read up to
        self._waking = False  # the reader is to be woken when the loop runs out of work

    async def put(self, data: bytes) -> None:
        while self._bytes >= self._bound and not self._ended:
            self._writable.clear()
            await self._writable.wait()
        if self._ended:
            raise grpc.aio.UsageError("the stream has ended")
        self._items.append(data)
        self._bytes += len(data)
        if not self._waking:
            self._waking = True
            when_idle(self._wake, WAKE_WITHIN_S)

    def _wake(self) -> None:
        self._waking = False
        self._readable.set()

    async def get(self) -> bytes | Any:
        """The next message, or `grpc.aio.EOF` once the writer is done; raises the error
        the stream ended with."""
        while not self._items:
            if self._ended:
                if self._error is not None:
                    raise self._error
                return grpc.aio.EOF
            self._readable.clear()
            await self._readable.wait()
        data = self._items.popleft()
        if len(data) < JOIN_BYTES and self._items and len(self._items[0]) < JOIN_BYTES:
            # Small envelopes written since the reader last woke, read as one.
            joined = [data]
            size = len(data)
            while self._items and size + len(self._items[0]) <= JOIN_BYTES:
                size += len(self._items[0])
                joined.append(self._items.popleft())
            data = b"".join(joined)
        self._bytes -= len(data)
        if self._bytes < self._bound:
            self._writable.set()
        return data

    def end(self, error: BaseException | None = None) -> None:
        """No more writes: the reader gets what was written, then EOF (or `error`)."""
        if self._ended:
            return
        self._ended = True
        self._error = error
        self._readable.set()
        self._writable.set()

    def drop(self, error: BaseException) -> None:
        """End at once: what was written and not read goes, the reader gets `error`."""
        self._items.clear()
        self._bytes = 0
        self._ended = False
        self.end(error)


class _AbortedError(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class _Context:
    """What the hub's stream handler asks of its `grpc.aio.ServicerContext`."""

    def __init__(self, metadata: Metadata) -> None:
        self._metadata = tuple(metadata)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()
    ) -> NoReturn:
        raise _AbortedError(code, details)

    def peer(self) -> str:
        return LOCAL_PEER


def _rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, f"in-process stream: {details}"
    )


class LocalCall:
    """The worker's end of an in-process stream: what `worker.core.connection` uses of
    a `grpc.aio.StreamStreamCall` (read, write, done_writing, cancel)."""

    def __init__(self, down: _Pipe, up: _Pipe, serving: asyncio.Task[None]) -> None:
        self._down = down
        self._up = up
        self._serving = serving

    async def read(self) -> bytes | Any:
        return await self._down.get()

    async def write(self, data: bytes) -> None:
        await self._up.put(data)

    async def done_writing(self) -> None:
        self._up.end()

    def cancel(self) -> bool:
        """End the stream from the worker's side: the hub's handler is cancelled."""
        error = _rpc_error(grpc.StatusCode.CANCELLED, "the worker ended the stream")
        self._up.drop(error)
        self._down.drop(error)
        return self._serving.cancel()

    def done(self) -> bool:
        return self._serving.done()


class _Requests(Generic[T]):
    """The handler's request iterator: each message the worker wrote, deserialized."""

    def __init__(self, pipe: _Pipe, deserialize: Callable[[bytes], T]) -> None:
        self._pipe = pipe
        self._deserialize = deserialize

    def __aiter__(self) -> _Requests[T]:
        return self

    async def __anext__(self) -> T:
        data = await self._pipe.get()
        if data is grpc.aio.EOF:
            raise StopAsyncIteration
        return self._deserialize(data)


class LocalStreams:
    """Opens in-process streams to one hub's stream handler (`up` makes one), and
    ends the ones still open when the hub stops."""

    def __init__(self, handler: Handler, deserialize: Callable[[bytes], Any]) -> None:
        self._handler = handler
        self._deserialize = deserialize
        self._serving: set[asyncio.Task[None]] = set()
        self._stopped = False

    def open_stream(self, metadata: Metadata) -> LocalCall:
        """A new stream, as `channel.stream_stream(method)(metadata=metadata)` opens one."""
        down, up = _Pipe(), _Pipe()
        serving = asyncio.create_task(self._serve(up, down, metadata))
        self._serving.add(serving)
        serving.add_done_callback(self._serving.discard)
        return LocalCall(down, up, serving)

    async def _serve(self, up: _Pipe, down: _Pipe, metadata: Metadata) -> None:
        if self._stopped:
            down.end(_rpc_error(grpc.StatusCode.UNAVAILABLE, "the hub has stopped"))
            up.end()
            return
        stream = self._handler(_Requests(up, self._deserialize), _Context(metadata))
        try:
            async for message in stream:
                await down.put(message)
        except _AbortedError as aborted:
            down.end(_rpc_error(aborted.code, aborted.details))
        except asyncio.CancelledError:
            down.end(_rpc_error(grpc.StatusCode.CANCELLED, "the stream was cancelled"))
            raise
        except grpc.aio.UsageError:
            down.end(_rpc_error(grpc.StatusCode.CANCELLED, "the stream was cancelled"))
        except Exception as exc:  # as a gRPC server answers a failed handler
            log.exception("the in-process worker stream failed")
            down.end(_rpc_error(grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc).__name__}"))
        else:
            down.end()
        finally:
            up.end()
            # A handler stopped while its message was being put is suspended at its
            # yield: closed here, its own ending (the session's) runs now.
            with contextlib.suppress(Exception):
                await stream.aclose()  # type: ignore[attr-defined]

    @property
    def stopped(self) -> bool:
        return self._stopped

    async def stop(self, grace_s: float) -> None:
        """Open no more streams; give those open `grace_s` to end, then cancel them."""
        self._stopped = True
        serving = list(self._serving)
        if not serving:
            return
        _done, pending = await asyncio.wait(serving, timeout=grace_s)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
