"""new_id is uuid.uuid4().hex without the UUID object: the same kind of id."""

from __future__ import annotations

import uuid

from worker.ids import new_id


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
