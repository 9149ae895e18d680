"""worker.wire.framing's field walk (split_field, field_spans) against what was
built: any field numbers (a key of one byte or more), any wire types, values of any
length (a length of one byte or more), and a message cut anywhere refused."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.wire.framing import TooManyFieldsError, field_spans, split_field


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_FIELD = st.one_of(
    st.tuples(st.integers(1, 3000), st.just(2), st.binary(max_size=300)),
    st.tuples(st.integers(1, 3000), st.just(0), st.integers(0, 2**64 - 1)),
    st.tuples(st.integers(1, 3000), st.just(1), st.binary(min_size=8, max_size=8)),
    st.tuples(st.integers(1, 3000), st.just(5), st.binary(min_size=4, max_size=4)),
)


def _encoded(number: int, wire_type: int, value: bytes | int) -> bytes:
    key = _varint(number << 3 | wire_type)
    if wire_type == 0:
        assert isinstance(value, int)
        return key + _varint(value)
    assert isinstance(value, bytes)
    return key + (_varint(len(value)) if wire_type == 2 else b"") + value


@settings(max_examples=300, deadline=None)
@given(st.lists(_FIELD, max_size=12), st.sampled_from([1, 10, 16, 2047, 2048]))
def test_a_field_is_split_off_where_it_was_put(
    fields: list[tuple[int, int, bytes | int]], number: int
) -> None:
    fields = [*fields, (number, 2, b"x" * 200)] if fields else fields
    parts = [_encoded(*field) for field in fields]
    data = b"".join(parts)
    rest, found = split_field(data, number)
    kept = [p for p, (n, t, _v) in zip(parts, fields, strict=True) if not (n == number and t == 2)]
    values = [v for n, t, v in fields if n == number and t == 2]
    assert rest == b"".join(kept)
    assert (None if found is None else bytes(found)) == (values[-1] if values else None)
    assert len(field_spans(data, number)) == len(values)
    assert split_field(data, number, most=len(fields))[0] == rest
    if fields:
        with pytest.raises(TooManyFieldsError):
            split_field(data, number, most=len(fields) - 1)


def test_a_message_cut_inside_a_key_a_length_or_a_value_is_refused() -> None:
    value = b"v" * 200  # a two-byte length
    data = _encoded(2047, 2, value)  # a two-byte key
    assert split_field(data, 2047) == (b"", memoryview(value))
    for cut in (1, 2, 3, 4, len(data) - 1):
        with pytest.raises(ValueError):
            split_field(data[:cut], 2047)
