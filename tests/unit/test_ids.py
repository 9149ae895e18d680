"""new_id is uuid.uuid4().hex without the UUID object: the same kind of id; ordered_id a
version-7 UUID's, in the order made."""

from __future__ import annotations

import time
import uuid

from worker.ids import new_id, ordered_id


def test_a_new_id_is_a_version_4_uuids_hex_and_never_repeats() -> None:
    ids = [new_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    for text in ids[:1000]:
        parsed = uuid.UUID(hex=text)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
        assert parsed.hex == text and len(text) == 32
    # Every bit that is not the version's or the variant's varies.
    fixed = ~0
    for text in ids:
        fixed &= ~(int(text, 16) ^ int(ids[0], 16))
    assert fixed == ~((1 << 128) - 1) | ((0xF << 76) | (0x3 << 62))


def test_an_ordered_id_is_a_version_7_uuids_hex_in_the_order_made() -> None:
    """The hub's call ids: each new row goes to the end of a grown index (see worker.ids)."""
    before_ms = time.time_ns() // 1_000_000
    ids = [ordered_id() for _ in range(10_000)]
    after_ms = time.time_ns() // 1_000_000
    assert len(set(ids)) == len(ids)
    for text in ids[:1000]:
        parsed = uuid.UUID(hex=text)
        assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
        assert parsed.hex == text and len(text) == 32
    made_ms = [int(text[:12], 16) for text in ids]
    assert made_ms == sorted(made_ms)
    assert before_ms <= made_ms[0] and made_ms[-1] <= after_ms
    # Every bit after the time that is not the version's or the variant's varies.
    fixed = ~0
    for text in ids:
        fixed &= ~(int(text, 16) ^ int(ids[0], 16))
    assert fixed & ((1 << 80) - 1) == (0xF << 76) | (0x3 << 62)
