"""A worker's stream messages (WorkerEnvelopes) as the hub reads them, and a call's
result as the hub hands it on (`Answer`): large results are read apart from their
blobs, so that a blob is copied once on its way to the caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, cast

import grpc
from google.protobuf.message import DecodeError

from worker.wire.framing import (
    MAX_ENVELOPE_MESSAGES,
    RESULT_FIELD,
    Buffer,
    TooManyFieldsError,
    fields_of,
    nested_message,
    split_field,
)
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.protocol import for_caller

# A WorkerEnvelope at least this large has its results' blobs read apart (see
# `worker_envelope`); a smaller one is parsed whole, which is quicker for it.
READ_APART_BYTES: Final = 64 * 1024
_ENVELOPE_MESSAGES: Final = pb.WorkerEnvelope.DESCRIPTOR.fields_by_name["messages"].number
_RESULT_BLOB: Final = pb.ActionResult.DESCRIPTOR.fields_by_name["blob"].number
_RESPONSE_RESULT: Final = pb.DispatchResponse.DESCRIPTOR.fields_by_name["result"].number


# A worker's envelope as the hub reads it: each message, and for a result read apart
# from its blob, the blob (a view of the bytes received).
Incoming = list[tuple[pb.WorkerMessage, memoryview | None]]


# A message (and the result in it) is read apart here a field at a time, in Python: one
# with more fields than this (a worker's have a few; a hostile one, millions of 2-byte
# ones) is parsed whole instead, at the parser's speed.
FIELDS_READ_APART: Final = 64


class EnvelopeRefused:
    """A WorkerEnvelope the hub does not read, and why: the stream is closed with
    `code` (RESOURCE_EXHAUSTED: too many messages; INVALID_ARGUMENT: it does not
    decode)."""

    def __init__(
        self, message: str, code: grpc.StatusCode = grpc.StatusCode.RESOURCE_EXHAUSTED
    ) -> None:
        self.message = message
        self.code = code


def _undecodable(data: bytes) -> EnvelopeRefused:
    return EnvelopeRefused(
        f"a stream message of {len(data):,} bytes does not decode as an "
        f"{pb.WorkerEnvelope.DESCRIPTOR.full_name}: WorkerService.Stream takes the envelopes "
        "an agentworker worker sends, a Hello first (is this an agentworker worker, "
        "dialling this hub's address?); the hub closed the stream",
        grpc.StatusCode.INVALID_ARGUMENT,
    )


def _too_many(count: str) -> EnvelopeRefused:
    return EnvelopeRefused(
        f"a stream message carried {count} messages, more than the {MAX_ENVELOPE_MESSAGES} a "
        "worker sends in one; the hub closed the stream"
    )


def worker_envelope(data: bytes) -> Incoming | EnvelopeRefused:
    """A WorkerEnvelope off the wire. In a large one, each result is parsed without its
    blob and the blob is a view of `data`: the hub then copies a result blob once, into
    the caller's response (`Answer.response`), where parsing it and building a
    DispatchResponse around it copied it three times. Each message is parsed once,
    from a view of `data` (a 1.5 MB fs_list answer, which has no blob, was copied
    three times on its way in). An envelope of more than MAX_ENVELOPE_MESSAGES
    messages (a worker's batches hold at most that many) is refused unread: 400,000
    small results in one held the hub's loop for seconds each. One that does not decode
    ends the stream INVALID_ARGUMENT, saying so (raised here, gRPC's deserializer logged
    a DecodeError's traceback for each and answered UNKNOWN)."""
    if len(data) >= READ_APART_BYTES:
        try:
            messages: Incoming = []
            for message in fields_of(data, _ENVELOPE_MESSAGES, most=MAX_ENVELOPE_MESSAGES):
                messages.append(_worker_message(message))
            return messages
        except TooManyFieldsError:
            return _too_many(f"more than {MAX_ENVELOPE_MESSAGES}")
        except (ValueError, DecodeError):
            pass  # parsed whole below, which says what is wrong
    try:
        parsed = pb.WorkerEnvelope.FromString(data).messages
    except DecodeError:
        return _undecodable(data)
    if len(parsed) > MAX_ENVELOPE_MESSAGES:
        return _too_many(f"{len(parsed):,}")
    return [(message, None) for message in parsed]


def _worker_message(message: memoryview) -> tuple[pb.WorkerMessage, memoryview | None]:
    """One message of a large envelope: a result read apart from its blob (a view),
    any other parsed as it is (from the view: upb parses any buffer, its stub says
    bytes). ValueError or DecodeError if it is not well framed."""
    try:
        rest, result = split_field(message, RESULT_FIELD, most=FIELDS_READ_APART)
        blob = (
            None
            if result is None or rest
            else split_field(result, _RESULT_BLOB, most=FIELDS_READ_APART)
        )
    except TooManyFieldsError:
        blob = None
    if blob is None or blob[1] is None:  # no blob to read apart: parsed as it is
        return pb.WorkerMessage.FromString(cast(bytes, message)), None
    parsed = pb.WorkerMessage()
    parsed.result.SetInParent()
    parsed.result.MergeFromString(blob[0])
    return parsed, blob[1]


@dataclass(frozen=True)
class Answer:
    """A call's result as the hub hands it on: `result`, and when it was read apart
    from its blob, the blob (else `result` holds its own). A result the worker of this
    process handed over (worker.wire.local) comes `serialized` (without its blob), and
    `result` is then its stub: the same without its `result_json`."""

    result: pb.ActionResult
    blob: Buffer | None = None
    serialized: bytes | None = None

    def message(self) -> pb.ActionResult:
        """The result with its blob in it (a copy of the blob, for in-process callers),
        as a caller gets it (protocol.for_caller)."""
        if self.serialized is not None:
            whole = pb.ActionResult.FromString(self.serialized)
        elif self.blob is None:
            return for_caller(self.result)
        else:
            whole = pb.ActionResult()
            whole.CopyFrom(self.result)
        if self.blob:
            whole.blob = bytes(self.blob)
        return for_caller(whole)

    def response(self, worker_id: str) -> bytes:
        """A serialized DispatchResponse carrying this result: its blob copied once (a
        1 MiB fs_read's was copied twice, the second time to put the worker id first),
        and a handed result's bytes as they came (a 1.5 MB listing is not serialized
        again)."""
        worker = pb.DispatchResponse(worker_id=worker_id).SerializeToString()
        body = self.serialized if self.serialized is not None else self.result.SerializeToString()
        if self.result.result_json_at_rest:  # the stores' form is not the caller's
            body = for_caller(pb.ActionResult.FromString(body)).SerializeToString()
        blob = b"" if self.blob is None else self.blob
        return nested_message(_RESPONSE_RESULT, body, _RESULT_BLOB, blob, after=worker)
