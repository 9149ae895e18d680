"""ControlClient writes a DispatchRequest's blob apart (`dispatch_bytes`): the bytes must
parse as the very message protobuf would have written, whatever the blob's size."""

from __future__ import annotations

import pytest

from worker.hub.client import dispatch_bytes
from worker.wire.proto import agentworker_pb2 as pb

FIELDS = {
    "agent_id": "tester",
    "surface": "workerHost",
    "action": "fs_write",
    "args_json": '{"path": "a.txt"}',
    "correlation_id": "c-1",
    "timeout_ms": 5000,
}


# Sizes around each varint boundary of the blob's length (1, 2 and 3 bytes of length).
@pytest.mark.parametrize("size", [0, 1, 127, 128, 16_383, 16_384, 300_000])
def test_the_bytes_parse_as_protobufs_own(size: int) -> None:
    blob = bytes(range(256)) * (size // 256) + bytes(size % 256)
    ours = dispatch_bytes({**FIELDS, "blob": blob})
    theirs = pb.DispatchRequest(**FIELDS, blob=blob)
    assert pb.DispatchRequest.FromString(ours) == theirs
    assert len(ours) == theirs.ByteSize()


def test_a_view_of_a_buffer_is_sent_without_making_bytes_of_it_first() -> None:
    buffer = bytearray(b"0123456789" * 1000)
    view = memoryview(buffer)[10:-10]
    parsed = pb.DispatchRequest.FromString(dispatch_bytes({**FIELDS, "blob": view}))
    assert parsed.blob == bytes(view)
    assert parsed.agent_id == "tester"
    empty = dispatch_bytes({**FIELDS, "blob": memoryview(buffer)[:0]})
    assert empty == pb.DispatchRequest(**FIELDS).SerializeToString()
