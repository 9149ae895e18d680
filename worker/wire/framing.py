"""Batching for the worker stream: one gRPC message carries everything that queued up.

A stream write costs far more in gRPC's Python layer than the bytes it carries, so
each side's single writer packs the messages waiting in its outbox into one
envelope — never more than fits the message limit — and writes that.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Final, Generic, TypeVar, cast

from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.transport import MAX_MESSAGE_BYTES
from worker.wire.varint import LENGTH_DELIMITED, field_head
from worker.wire.varint import varint as _varint

# Room left for the envelope's own framing.
MAX_ENVELOPE_BYTES = MAX_MESSAGE_BYTES - 64 * 1024
MAX_ENVELOPE_MESSAGES = 512
# What the hub batches for a worker: a message that would take a batch past this starts
# the next one (a message larger alone goes alone; a blob goes a part at a time). The
# worker can tell the hub is there only by its envelopes coming whole: gRPC hands on
# none of a message before its last byte. Batched up to MAX_ENVELOPE_BYTES, the calls a
# hub sends again to a worker dialling in (55 of ~1 MiB args) went as 32 MiB with the
# Welcome and then 23 MiB, which took 66 s to come at 0.35 MB/s, past the worker's
# 15 s of silence: it dialled again, was sent them all again, and no call came through
# (review21). A part's worth comes every 3 s on such a link, and costs small messages
# nothing (512 of them are ~150 KB). The worker's own batches stay whole: its outbox's
# bound holds a hub that does not read (with small envelopes a deaf hub's gRPC took in
# 78 MiB unread, and the bound never held).
BATCH_BYTES = 1024 * 1024


M = TypeVar("M")


_PART_CAME: Final = object()  # Batcher._part_or_message: the part came first


class Batcher(Generic[M]):
    """Takes messages off an outbox (None ends it) in envelope-sized batches; `size`
    says how many bytes a message takes on the wire, and a message that would take a
    batch past `batch_bytes` starts the next one (the hub's: BATCH_BYTES). `hold`,
    when given, is asked once a batch has its first message: it returns None to send
    at once, or something to wait for first while more messages join the batch."""

    def __init__(
        self,
        outbox: asyncio.Queue[M | None],
        size: Callable[[M], int],
        hold: Callable[[], Awaitable[None] | None] | None = None,
        spread: Callable[[M], tuple[M | None, M | None]] | None = None,
        pending: Callable[[M], Awaitable[None] | None] | None = None,
        batch_bytes: int = MAX_ENVELOPE_BYTES,
    ) -> None:
        self._outbox = outbox
        self._size = size
        self._batch_bytes = min(batch_bytes, MAX_ENVELOPE_BYTES)
        self._hold = hold
        # Splits a message into what goes in this batch and the rest (None: nothing
        # left), for a large transfer sent a part at a time (see `Chunked`): a batch
        # ends with a part, and the rest queues again behind whatever came meanwhile.
        # What goes is None when nothing of the message is left to send (a transfer
        # stopped early).
        self._spread = spread
        # What to wait for before a message's next part can be taken (a transfer whose
        # parts are still being built), or None when it can be taken now.
        self._pending = pending
        self._rest: M | None = None
        self._carry: M | None = None
        self._ended = False

    async def next_batch(self) -> list[M] | None:
        """The next batch, waiting for at least one message; None once the outbox ended."""
        resumed, self._rest = self._rest, None
        if resumed is not None:  # behind what queued while its last part went out
            self._outbox.put_nowait(resumed)
        rotated = 0
        while True:
            if self._carry is not None:
                first: M | None = self._carry
                self._carry = None
            elif self._ended:
                return None
            else:
                first = await self._outbox.get()
            if first is None:
                return None
            if (
                self._pending is not None
                and rotated < self._outbox.qsize()
                and self._pending(first) is not None
            ):
                # Its next part is not built yet: what queued behind it goes first (once
                # round the outbox, then it is waited for).
                rotated += 1
                self._outbox.put_nowait(first)
                continue
            if self._pending is not None and (coming := self._pending(first)) is not None:
                # Its next part is waited for, and so is the outbox: a message queued
                # meanwhile goes first. (Waiting for the part alone, an upload whose
                # caller stalls held back heartbeats, kills and every other call to the
                # worker: review13 finding 09.)
                other = await self._part_or_message(coming)
                if other is _PART_CAME:
                    self._carry = first  # looked at again: its part may go now
                elif other is None:  # the outbox ended: what still comes never goes
                    self._ended = True
                else:
                    self._outbox.put_nowait(first)
                    self._carry = cast(M, other)
                continue
            # A transfer already under way is not held back again for each part.
            pause = None if self._hold is None or first is resumed else self._hold()
            if pause is not None:
                await pause
            if self._spread is None:
                break
            part, self._rest = self._spread(first)
            if part is not None:
                first = part
                break
        if self._rest is not None:
            return [first]
        if self._outbox.empty():
            return [first]  # alone: no need to size it (a 16 MiB blob takes ~9 ms to size)
        batch, size = [first], self._size(first)
        while len(batch) < MAX_ENVELOPE_MESSAGES and not self._outbox.empty():
            msg = self._outbox.get_nowait()
            if msg is None:
                self._ended = True
                break
            if self._pending is not None and self._pending(msg) is not None:
                self._carry = msg  # its next part is not built yet: it starts the next batch
                break
            msg_size = self._size(msg)
            if size + msg_size > self._batch_bytes:
                self._carry = msg
                break
            if self._spread is not None:
                part, self._rest = self._spread(msg)
                if part is None:
                    continue
                msg = part
            batch.append(msg)
            size += msg_size
            if self._rest is not None:
                break  # a part ends the batch
        return batch

    async def _part_or_message(self, coming: Awaitable[None]) -> M | object | None:
        """Whichever comes first: the awaited part (`_PART_CAME`), or the outbox's next
        message (taken off it; None once it ended)."""
        getting = asyncio.ensure_future(self._outbox.get())
        waiting = asyncio.ensure_future(coming)  # a transfer's own future: never cancelled
        try:
            await asyncio.wait((getting, waiting), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getting.done():
                getting.cancel()
        if getting.done() and not getting.cancelled():
            return getting.result()  # taken: it must go, even if the part came too
        return _PART_CAME


# ------------------------------------------------------------- wire framing
#
# The worker's messages are serialized once, as they are queued (a result once, for
# the ledger and the wire alike), and an envelope is those bytes framed and joined.
# A protobuf message is its fields back to back, and a length-delimited field is
# its tag, its length and its bytes, so this is exactly WorkerEnvelope's encoding,
# without copying each message into an envelope object and serializing it again.
#
# Both outboxes hold *parts*: a message already framed as one entry of its
# envelope's `messages` field. An envelope of one part is that part itself, so a
# 16 MiB request or a 1 MiB result is copied once on its way to gRPC (when its
# part is built), not once per layer of framing.

RESULT_FIELD = pb.WorkerMessage.DESCRIPTOR.fields_by_name["result"].number
_REQUEST_FIELD = pb.ServerMessage.DESCRIPTOR.fields_by_name["request"].number
_BLOB_FIELD = pb.ActionRequest.DESCRIPTOR.fields_by_name["blob"].number
_RESULT_BLOB_FIELD = pb.ActionResult.DESCRIPTOR.fields_by_name["blob"].number
_MESSAGES_FIELD = pb.WorkerEnvelope.DESCRIPTOR.fields_by_name["messages"].number


# The callbacks waiting for each loop to run out of work (see `when_idle`): one chain
# of turns per loop, since two would each see the other's turn queued and never end.
_IDLE: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[Callable[[], None]]] = (
    weakref.WeakKeyDictionary()
)


def when_idle(callback: Callable[[], None], within_s: float) -> None:
    """Call `callback` in the running loop's first turn that leaves nothing else ready
    to run (just before the loop waits for I/O or a timer, as a server writes out its
    replies before it sleeps), or `within_s` from now at the latest. A writer holding
    a batch until then sends it with every message the work under way queued: the
    calls gRPC hands the hub one per loop turn, and in `up`, where the hub and the
    worker share the loop, the worker's too. asyncio has no public hook for that
    moment; its loop's queue of ready callbacks (`_ready`, there since asyncio began)
    says it. A loop without one (another implementation) calls back in the next turn."""
    loop = asyncio.get_running_loop()
    waiting = _IDLE.get(loop)
    if waiting is not None:  # a chain of turns is under way: it calls this one too
        waiting.append(callback)
        return
    waiting = _IDLE[loop] = [callback]
    ready = getattr(loop, "_ready", None)
    deadline = loop.time() + within_s

    def turn() -> None:
        if ready and loop.time() < deadline:
            # The same handle queued again, as call_soon would queue a new one: the chain
            # takes a turn of every loop iteration while work is ready (five a Dispatch
            # in `up`), and making a handle each time was most of a turn's cost.
            ready.append(again)
            return
        del _IDLE[loop]
        for each in waiting:
            each()

    again = loop.call_soon(turn)


def _tag(field_number: int) -> bytes:
    return _varint(field_number << 3 | LENGTH_DELIMITED)


def framed(field_number: int, payload: bytes) -> bytes:
    """`payload` (a serialized message) as field `field_number` of its parent."""
    return field_head(field_number, len(payload)) + payload


def framed_size(payload_bytes: int, field_number: int = _MESSAGES_FIELD) -> int:
    """The size of a `payload_bytes`-byte message once framed as a field (an
    envelope of that one message, by default)."""
    return len(_tag(field_number)) + len(_varint(payload_bytes)) + payload_bytes


def result_message(result_bytes: bytes) -> bytes:
    """A serialized WorkerMessage carrying the serialized ActionResult `result_bytes`."""
    return framed(RESULT_FIELD, result_bytes)


def request_message(request: pb.ActionRequest, blob: bytes) -> bytes:
    """A serialized ServerMessage carrying `request` with `blob` as its blob; the blob
    is appended as its field rather than copied into the message (fields may come in
    any order, and `request` must not carry one of its own)."""
    body = request.SerializeToString()
    if blob:
        body += framed(_BLOB_FIELD, blob)
    return framed(_REQUEST_FIELD, body)


def envelope_bytes(messages: list[bytes]) -> bytes:
    """A serialized WorkerEnvelope (or ServerEnvelope: the same layout) holding the
    serialized messages `messages`."""
    return b"".join(framed(_MESSAGES_FIELD, message) for message in messages)


# ------------------------------------------------------------- envelope parts


def message_part(message: bytes) -> bytes:
    """A serialized WorkerMessage or ServerMessage as one part of its envelope."""
    return framed(_MESSAGES_FIELD, message)


def _nested_part(outer_field: int, body: bytes, blob_field: int, blob: Buffer) -> bytes:
    """An envelope part whose message is `outer_field` holding `body` with `blob`
    appended as its field `blob_field`: built with one copy of the blob."""
    pieces: list[Buffer] = [body]
    if blob:
        pieces += [_tag(blob_field), _varint(len(blob)), blob]
    inner = len(body) + (len(pieces[1]) + len(pieces[2]) + len(blob) if blob else 0)
    message = [_tag(outer_field), _varint(inner)]
    size = len(message[0]) + len(message[1]) + inner
    return b"".join([_tag(_MESSAGES_FIELD), _varint(size), *message, *pieces])


def nested_message(
    outer_field: int, body: bytes, blob_field: int, blob: Buffer, *, after: bytes = b""
) -> bytes:
    """`after` (serialized fields of the parent), then field `outer_field` holding the
    message `body` with `blob` appended as its field `blob_field` (fields may come in
    any order): one copy of the blob, and of `body`."""
    pieces: list[Buffer] = [after, _tag(outer_field), b"", body]
    if blob:
        pieces += [_tag(blob_field), _varint(len(blob)), blob]
    pieces[2] = _varint(sum(len(piece) for piece in pieces[3:]))
    return b"".join(pieces)


def request_part(request: pb.ActionRequest, blob: Buffer) -> bytes:
    """`request_message(request, blob)` as an envelope part, in one copy of the blob."""
    return _nested_part(_REQUEST_FIELD, request.SerializeToString(), _BLOB_FIELD, blob)


# A request blob larger than this goes ahead of its request in parts this large
# (protocol 2; see `Chunked`): about 2 ms on the stream each, what a small message
# behind it waits at most.
PART_BYTES = 1024 * 1024
_BLOB_PART_FIELD = pb.ServerMessage.DESCRIPTOR.fields_by_name["blob_part"].number
_PART_DATA_FIELD = pb.BlobPart.DESCRIPTOR.fields_by_name["data"].number


# A transfer's count of parts while it is not known yet (`Chunked.relayed`).
_OPEN_ENDED: Final = 1 << 62


@dataclass(eq=False)
class Chunked:
    """A request whose blob goes ahead of it in BlobParts, one part per envelope,
    with other messages between them: `parts` are the BlobParts' envelope parts,
    then the request's (announcing `blob_in_parts`). `request` and `blob` rebuild it
    whole (`inline`) for a worker that does not take parts.

    The parts may still be coming when it is queued (`begun`): `count` says how many
    there will be, the hub's writer waits (`pending`) for each not yet built, and
    `stop` ends it early."""

    parts: list[bytes]
    request: pb.ActionRequest
    blob: Buffer
    sent: int = 0
    count: int = -1  # how many parts in all; -1: as many as `parts` holds
    stopped: bool = False
    follow: bool = False  # protocol 3: the request went first, its digest goes last
    _coming: asyncio.Future[None] | None = None

    def __post_init__(self) -> None:
        if self.count < 0:
            self.count = len(self.parts)

    @classmethod
    def begun(cls, request: pb.ActionRequest, blob: Buffer, *, follow: bool = False) -> Chunked:
        """A transfer of `blob` whose parts are yet to be built (`add`), and then the
        request's (`add` too). With `follow` (protocol 3) the request's part goes first
        (`announced(..., follow=True)`, added at once), then the parts, then the one
        that carries the digest (`digest_part`)."""
        count = -(-len(blob) // PART_BYTES) + (2 if follow else 1)
        return cls([], request, blob, count=count, follow=follow)

    @classmethod
    def relayed(cls, request: pb.ActionRequest, size: int) -> Chunked:
        """A protocol 3 transfer of a blob of `size` bytes still coming to the hub (a
        DispatchUpload): the request's part (`announced`, follow) at once, then the parts
        as they come (`add`), however many; `ending` says when the last is near."""
        first = announced(request, size, follow=True)
        return cls([first], request, b"", count=_OPEN_ENDED, follow=True)

    def ending(self, more: int) -> None:
        """Only `more` parts are still to come (a transfer begun `relayed`)."""
        self.count = len(self.parts) + more
        self._wake()

    @property
    def finished(self) -> bool:
        return self.sent >= self.count

    @property
    def size(self) -> int:
        return sum(len(part) for part in self.parts)

    def add(self, part: bytes) -> None:
        """The next part, built (ignored once stopped)."""
        if self.stopped or len(self.parts) >= self.count:
            return
        self.parts.append(part)
        self._wake()

    def stop(self) -> None:
        """Send no more of it: parts not yet sent never go."""
        self.stopped = True
        self.count = self.sent
        self._wake()

    def pending(self) -> asyncio.Future[None] | None:
        """What to wait for before the next part can go; None when it can (or when
        nothing more will)."""
        if self.sent < len(self.parts) or self.finished:
            return None
        if self._coming is None or self._coming.done():
            self._coming = asyncio.get_running_loop().create_future()
        return self._coming

    def _wake(self) -> None:
        if self._coming is not None and not self._coming.done():
            self._coming.set_result(None)

    def spread(self) -> tuple[bytes | None, Chunked | None]:
        """The next part (None if none is left), and this transfer if parts remain."""
        if self.finished:
            return None, None
        part = self.parts[self.sent]
        self.sent += 1
        return part, None if self.finished else self

    def inline(self) -> bytes:
        """The request with its blob in it, as one envelope part (built on the loop:
        only for a worker that reconnected speaking protocol 1 meanwhile)."""
        whole = pb.ActionRequest()
        whole.CopyFrom(self.request)
        whole.ClearField("blob_in_parts")
        return request_part(whole, self.blob)


def blob_part(correlation_id: str, offset: int, data: Buffer) -> bytes:
    """A BlobPart of `data` (the blob's bytes from `offset`) as an envelope part: one
    copy of `data`."""
    header = pb.BlobPart(correlation_id=correlation_id, offset=offset).SerializeToString()
    return _nested_part(_BLOB_PART_FIELD, header, _PART_DATA_FIELD, data)


def announced(request: pb.ActionRequest, blob_bytes: int, *, follow: bool = False) -> bytes:
    """`request`, announcing a blob of `blob_bytes` that went ahead of it in parts (or,
    with `follow`, protocol 3, that follows it, its digest after: none is sent here), as
    an envelope part."""
    copy = pb.ActionRequest()
    copy.CopyFrom(request)
    copy.blob_in_parts = blob_bytes
    if follow:
        copy.parts_follow = True
        copy.ClearField("args_digest")
    return request_part(copy, b"")


def digest_part(correlation_id: str, blob_bytes: int, digest: str) -> bytes:
    """The BlobPart that ends a blob that followed its request (protocol 3): no data,
    at the blob's end, with the call's digest; as an envelope part."""
    part = pb.BlobPart(correlation_id=correlation_id, offset=blob_bytes, args_digest=digest)
    return _nested_part(_BLOB_PART_FIELD, part.SerializeToString(), _PART_DATA_FIELD, b"")


def chunked(request: pb.ActionRequest, blob: Buffer) -> Chunked:
    """`request` with `blob` as BlobParts of PART_BYTES ahead of it (a copy of each)."""
    view = memoryview(blob)
    parts = [
        blob_part(request.correlation_id, at, view[at : at + PART_BYTES])
        for at in range(0, len(view), PART_BYTES)
    ]
    parts.append(announced(request, len(view)))
    return Chunked(parts, request, blob)


def spread_parts(
    message: bytes | Chunked,
) -> tuple[bytes | Chunked | None, bytes | Chunked | None]:
    """Batcher's `spread` for an outbox of envelope parts and Chunked transfers."""
    if isinstance(message, Chunked):
        return message.spread()
    return message, None


def pending_parts(message: bytes | Chunked) -> asyncio.Future[None] | None:
    """Batcher's `pending` for such an outbox: a transfer's next part, until built."""
    return message.pending() if isinstance(message, Chunked) else None


def outgoing_size(message: bytes | Chunked) -> int:
    """Batcher's `size` for such an outbox: a transfer's next part (0 when none is
    left)."""
    if isinstance(message, Chunked):
        return 0 if message.finished else len(message.parts[message.sent])
    return len(message)


def result_part(result_bytes: bytes, blob: Buffer = b"") -> bytes:
    """A WorkerMessage carrying the serialized ActionResult `result_bytes` (which has
    no blob of its own) with `blob` as its blob, as an envelope part."""
    return _nested_part(RESULT_FIELD, result_bytes, _RESULT_BLOB_FIELD, blob)


# ------------------------------------------------------------- reading a blob out
#
# Parsing a message that carries a 16 MiB blob and then reading the blob out of it
# copies the blob twice or more (the parser's copy, then a new bytes object on each
# read of the field). `split_field` walks a serialized message's top-level fields on
# a memoryview instead: the message without one field is parsed (it is small), and
# that field's value is a view of the received bytes, copied at most once, by whoever
# needs bytes of its own.

Buffer = bytes | memoryview


def read_varint(data: Buffer, pos: int) -> tuple[int, int]:
    """The varint at `pos` and the position after it; ValueError if cut short."""
    value = shift = 0
    end = len(data)
    while pos < end and shift < 64:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise ValueError("truncated varint")


class TooManyFieldsError(ValueError):
    """A message has more fields than its reader takes (`most`)."""


def _delimited_fields(
    view: memoryview, most: int | None = None
) -> Iterator[tuple[int, int, int, int]]:
    """Each length-delimited top-level field of the message `view`: its number, where
    the field starts, and where its value starts and ends. ValueError if the message is
    not well framed, TooManyFieldsError once it has more than `most` fields of any kind
    (each is read here in Python: a hostile message of 2-byte fields has millions)."""
    end = len(view)
    pos = 0
    left = -1 if most is None else most
    while pos < end:
        if left == 0:
            raise TooManyFieldsError(f"more than {most:,} fields")
        left -= 1
        field_start = pos
        # A key or a length under 128 is one byte: read here, not by read_varint (most
        # of a message's fields; a call's own Python per field is what this walk costs).
        key = view[pos]
        if key < 0x80:
            pos += 1
        else:
            key, pos = read_varint(view, pos)
        wire_type = key & 7
        if wire_type == LENGTH_DELIMITED:
            if pos < end and view[pos] < 0x80:
                length = view[pos]
                pos += 1
            else:
                length, pos = read_varint(view, pos)
            if pos + length <= end:
                yield key >> 3, field_start, pos, pos + length
            pos += length
        elif wire_type == 0:
            _value, pos = read_varint(view, pos)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        else:
            raise ValueError(f"wire type {wire_type} is not one a message here uses")
        if pos > end:
            raise ValueError("a field runs past the end of the message")


def field_spans(
    data: Buffer, field_number: int, *, most: int | None = None
) -> list[tuple[int, int, int]]:
    """Where each length-delimited top-level field `field_number` of `data` is: where
    the field starts, and where its value starts and ends. ValueError if `data` is not
    a well-framed message, TooManyFieldsError if it has more than `most` fields."""
    return [
        (field_start, value_start, value_end)
        for number, field_start, value_start, value_end in _delimited_fields(memoryview(data), most)
        if number == field_number
    ]


def without_spans(
    data: Buffer, spans: list[tuple[int, int, int]]
) -> tuple[bytes, memoryview | None]:
    """`data` without the fields `spans` (field_spans) locates, and the last one's
    value (as a parser would take it), or None when there are none. A message without
    any is `data` itself when it is bytes (no copy)."""
    if not spans:
        return (data if isinstance(data, bytes) else bytes(data)), None
    view = memoryview(data)
    kept: list[memoryview] = []
    start = 0
    for field_start, _value_start, value_end in spans:
        kept.append(view[start:field_start])
        start = value_end
    kept.append(view[start:])
    _field_start, value_start, value_end = spans[-1]
    return b"".join(kept), view[value_start:value_end]


def split_field(
    data: Buffer, field_number: int, *, most: int | None = None
) -> tuple[bytes, memoryview | None]:
    """The serialized message `data` without its length-delimited field `field_number`,
    and that field's value (the last one, as a parser would take it), or None when it
    has none. ValueError if `data` is not a well-framed message, TooManyFieldsError if
    it has more than `most` fields (read here a field at a time: a parser reads many
    faster)."""
    return without_spans(data, field_spans(data, field_number, most=most))


def fields_of(data: Buffer, field_number: int, *, most: int | None = None) -> list[memoryview]:
    """The values of the length-delimited top-level field `field_number` of `data`, as
    views (no copy); ValueError if `data` is not a well-framed message, and
    TooManyFieldsError if it has more than `most` fields."""
    view = memoryview(data)
    return [
        view[value_start:value_end]
        for number, _, value_start, value_end in _delimited_fields(view, most)
        if number == field_number
    ]


def worker_message_of(part: bytes) -> pb.WorkerMessage:
    """The WorkerMessage an envelope part carries (for in-process readers and tests)."""
    return pb.WorkerEnvelope.FromString(part).messages[0]


def envelope_of(parts: list[bytes]) -> bytes:
    """The envelope holding `parts`: a lone part is its own envelope (no copy)."""
    return parts[0] if len(parts) == 1 else b"".join(parts)
