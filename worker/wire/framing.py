"""Batching for the worker stream: one gRPC message carries everything that queued up.

A stream write costs far more in gRPC's Python layer than the bytes it carries, so
each side's single writer packs the messages waiting in its outbox into one
envelope — never more than fits the message limit — and writes that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.transport import MAX_MESSAGE_BYTES

# Room left for the envelope's own framing.
MAX_ENVELOPE_BYTES = MAX_MESSAGE_BYTES - 64 * 1024
MAX_ENVELOPE_MESSAGES = 512


M = TypeVar("M")


class Batcher(Generic[M]):
    """Takes messages off an outbox (None ends it) in envelope-sized batches; `size`
    says how many bytes a message takes on the wire."""

    def __init__(self, outbox: asyncio.Queue[M | None], size: Callable[[M], int]) -> None:
        self._outbox = outbox
        self._size = size
        self._carry: M | None = None
        self._ended = False

    async def next_batch(self) -> list[M] | None:
        """The next batch, waiting for at least one message; None once the outbox ended."""
        if self._carry is not None:
            first: M | None = self._carry
            self._carry = None
        elif self._ended:
            return None
        else:
            first = await self._outbox.get()
        if first is None:
            return None
        if self._outbox.empty():
            return [first]  # alone: no need to size it (a 16 MiB blob takes ~9 ms to size)
        batch, size = [first], self._size(first)
        while len(batch) < MAX_ENVELOPE_MESSAGES and not self._outbox.empty():
            msg = self._outbox.get_nowait()
            if msg is None:
                self._ended = True
                break
            msg_size = self._size(msg)
            if size + msg_size > MAX_ENVELOPE_BYTES:
                self._carry = msg
                break
            batch.append(msg)
            size += msg_size
        return batch


# ------------------------------------------------------------- wire framing
#
# The worker's messages are serialized once, as they are queued (a result once, for
# the ledger and the wire alike), and an envelope is those bytes framed and joined.
# A protobuf message is its fields back to back, and a length-delimited field is
# its tag, its length and its bytes, so this is exactly WorkerEnvelope's encoding,
# without copying each message into an envelope object and serializing it again.

_LENGTH_DELIMITED = 2
RESULT_FIELD = pb.WorkerMessage.DESCRIPTOR.fields_by_name["result"].number
_REQUEST_FIELD = pb.ServerMessage.DESCRIPTOR.fields_by_name["request"].number
_BLOB_FIELD = pb.ActionRequest.DESCRIPTOR.fields_by_name["blob"].number
_MESSAGES_FIELD = pb.WorkerEnvelope.DESCRIPTOR.fields_by_name["messages"].number


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def framed(field_number: int, payload: bytes) -> bytes:
    """`payload` (a serialized message) as field `field_number` of its parent."""
    return _varint(field_number << 3 | _LENGTH_DELIMITED) + _varint(len(payload)) + payload


def framed_size(payload_bytes: int, field_number: int = _MESSAGES_FIELD) -> int:
    """The size of a `payload_bytes`-byte message once framed as a field (an
    envelope of that one message, by default)."""
    return (
        len(_varint(field_number << 3 | _LENGTH_DELIMITED))
        + len(_varint(payload_bytes))
        + payload_bytes
    )


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
