"""Protobuf's base-128 varints and a length-delimited field's head, written by hand
where a message is joined from parts without copying them again (worker.wire.framing,
the hub client's Dispatch). Standard library only: `agentworker call` imports it."""

from __future__ import annotations

LENGTH_DELIMITED = 2  # the wire type of bytes, strings and embedded messages


def varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field_head(field_number: int, length: int) -> bytes:
    """The tag and length that precede a length-delimited field's `length` bytes."""
    return varint(field_number << 3 | LENGTH_DELIMITED) + varint(length)
