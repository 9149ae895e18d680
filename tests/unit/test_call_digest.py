"""The call digest: BLAKE3 over every field that says what to do and every byte of the
blob, and how a digest recorded before BLAKE3 (a bare sha256) meets today's."""

from __future__ import annotations

import hashlib
from pathlib import Path

from worker.core.ledger import Seen, State
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.protocol import DIGEST_SCHEME, call_digest, same_call

BLOB = bytes(range(256)) * 65536  # 16 MiB


def _request(**fields: str) -> pb.ActionRequest:
    base = {"surface": "workerHost", "action": "fs_write", "plan_id": "p", "agent_id": "a"}
    return pb.ActionRequest(**{**base, "args_json": '{"path": "out.bin"}', **fields})


def test_the_digest_covers_each_field_and_every_byte_of_the_blob() -> None:
    digest = call_digest(_request(), BLOB)
    assert digest.startswith(DIGEST_SCHEME) and len(digest) == len(DIGEST_SCHEME) + 64
    assert call_digest(_request(), BLOB) == digest  # deterministic
    last_byte_changed = BLOB[:-1] + b"\x01"
    assert call_digest(_request(), last_byte_changed) != digest
    for field, value in [("plan_id", "q"), ("agent_id", "b"), ("args_json", "{}")]:
        assert call_digest(_request(**{field: value}), BLOB) != digest
    # Field boundaries count: "ab" + "c" is not "a" + "bc".
    moved = call_digest(_request(surface="workerHos", action="tfs_write"), BLOB)
    assert moved != digest


def test_two_digests_of_todays_scheme_match_only_when_equal() -> None:
    one, other = call_digest(_request(), b"one"), call_digest(_request(), b"other")
    assert same_call(one, one)
    assert not same_call(one, other)


def test_a_call_recorded_before_blake3_is_the_same_call_when_retried_after(
    tmp_path: Path,
) -> None:
    state = State(tmp_path / "state.db")
    legacy = hashlib.sha256(b"what an earlier version recorded").hexdigest()
    assert state.begin("in-flight", legacy, "p").seen is Seen.NEW
    state.finish("in-flight", pb.ActionResult(correlation_id="in-flight").SerializeToString())
    retried = state.begin("in-flight", call_digest(_request(), BLOB), "p")
    assert retried.seen is Seen.DONE  # answered from the ledger, not run again

    # Today's digests still tell a re-used id apart.
    assert state.begin("reused", call_digest(_request(), b"one"), "p").seen is Seen.NEW
    assert state.begin("reused", call_digest(_request(), b"two"), "p").seen is Seen.MISMATCH
    state.close()
