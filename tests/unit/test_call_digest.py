"""The call digest: BLAKE3 over every field that says what to do and every byte of the
blob (or, for a blob the hub hands to the worker of its own process, over the fields and
the blob's SHA-256), and how a digest recorded in another scheme (a bare sha256 before
BLAKE3, BLAKE3 over the blob before the SHA-256 one) meets today's."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from worker.core.ledger import Seen, State
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.protocol import (
    DIGEST_SCHEME,
    SHA256_SCHEME,
    blob_sha256,
    call_digest,
    digest_as,
    digest_of_sha256,
    same_call,
)

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


def _sha256_digest(req: pb.ActionRequest, blob: bytes) -> str:
    return digest_of_sha256(req, blob_sha256(blob))


def test_the_digest_made_from_the_blobs_sha256_covers_each_field_and_every_byte() -> None:
    digest = _sha256_digest(_request(), BLOB)
    assert digest.startswith(SHA256_SCHEME) and len(digest) == len(SHA256_SCHEME) + 64
    assert digest_of_sha256(_request(), hashlib.sha256(BLOB).digest()) == digest
    assert _sha256_digest(_request(), BLOB[:-1] + b"\x01") != digest
    for field, value in [("plan_id", "q"), ("agent_id", "b"), ("args_json", "{}")]:
        assert _sha256_digest(_request(**{field: value}), BLOB) != digest
    moved = _sha256_digest(_request(surface="workerHos", action="tfs_write"), BLOB)
    assert moved != digest
    # The scheme each digest names is the one digest_as makes again.
    assert digest_as(digest, _request(), BLOB) == digest
    blake = call_digest(_request(), BLOB)
    assert blake != digest and digest_as(blake, _request(), BLOB) == blake


@pytest.mark.parametrize("digest", [call_digest, _sha256_digest])
def test_two_digests_of_one_scheme_match_only_when_equal(digest: object) -> None:
    assert callable(digest)
    one, other = digest(_request(), b"one"), digest(_request(), b"other")
    assert same_call(one, one)
    assert not same_call(one, other)
    assert not same_call(one, other, lambda: one)  # one scheme: never hashed again


def test_where_only_digests_are_at_hand_an_older_schemes_row_is_the_same_call() -> None:
    """The worker's ledger: a row an earlier version recorded (bare sha256, or BLAKE3
    over the blob) is taken as the call a newer scheme's delivery names; a row of the
    newest scheme matches nothing but itself."""
    bare = hashlib.sha256(b"recorded before BLAKE3").hexdigest()
    blake, newest = call_digest(_request(), b"x"), _sha256_digest(_request(), b"x")
    assert same_call(bare, blake) and same_call(bare, newest) and same_call(blake, newest)
    assert not same_call(newest, blake) and not same_call(blake, bare)
    assert not same_call(newest, bare)


_BARE = hashlib.sha256(b"what an earlier version recorded").hexdigest()


@pytest.mark.parametrize(
    ("recorded", "digest"),
    [(_BARE, call_digest), (_BARE, _sha256_digest), (call_digest(_request()), _sha256_digest)],
    ids=["before BLAKE3", "before BLAKE3, then SHA-256's", "BLAKE3 over the blob, then SHA-256's"],
)
def test_a_call_recorded_by_an_earlier_version_is_the_same_call_when_retried_after(
    tmp_path: Path, recorded: str, digest: object
) -> None:
    assert callable(digest)
    delivered = digest(_request(), BLOB)
    state = State(tmp_path / "state.db")
    assert state.begin("in-flight", recorded, "p").seen is Seen.NEW
    state.finish("in-flight", pb.ActionResult(correlation_id="in-flight").SerializeToString())
    retried = state.begin("in-flight", delivered, "p")
    assert retried.seen is Seen.DONE  # answered from the ledger, not run again

    # Today's digests still tell a re-used id apart.
    assert state.begin("reused", digest(_request(), b"one"), "p").seen is Seen.NEW
    assert state.begin("reused", digest(_request(), b"two"), "p").seen is Seen.MISMATCH
    state.close()


@pytest.mark.parametrize("scheme", ["before BLAKE3", "BLAKE3 over the blob", "from its SHA-256"])
def test_the_hub_checks_a_call_recorded_in_another_scheme_in_that_scheme(
    tmp_path: Path, scheme: str
) -> None:
    """A call the hub recorded in another scheme than the one a retry of its id is
    hashed in (an earlier version's, or, inside `up`, the digest made from the blob's
    SHA-256 for a blob handed to the worker): the retry is hashed again in the recorded
    scheme, refused `args_mismatch` with other bytes and sent on with the same ones,
    under the digest it was recorded with (the worker's ledger may hold that one)."""
    import asyncio

    from worker.clock import now_ms
    from worker.hub.server import Hub
    from worker.hub.session import Session
    from worker.hub.store import HubStore

    async def go() -> None:
        hub = Hub(HubStore(tmp_path / "hub.db"))
        session = Session(hello=pb.Hello(worker_id="w"), session_id="s", protocol=2)
        hub.sessions["w"] = session
        alice = _request(correlation_id="old")
        notes = b"alice's notes" * 30_000  # hashed again off the loop: 390 KB
        recorded = {
            "before BLAKE3": digest_as("", alice, notes),  # a bare sha256
            "BLAKE3 over the blob": call_digest(alice, notes),
            "from its SHA-256": _sha256_digest(alice, notes),
        }[scheme]
        assert digest_as(recorded, alice, notes) == recorded
        assert scheme != "before BLAKE3" or len(recorded) == 64
        hub.store.add("w", recorded, alice, len(notes), now_ms() + 60_000)
        hub.store.flush()  # pending, recorded so

        mallory = pb.DispatchRequest(correlation_id="old", worker_id="w", blob=b"mallory's")
        for field in ("surface", "action", "plan_id", "agent_id", "args_json"):
            setattr(mallory, field, getattr(alice, field))
        refused = await hub.dispatch(mallory)
        assert refused.result.error.code == "args_mismatch"
        assert session.outbox.empty()  # nothing of it went to the worker

        retry = pb.DispatchRequest()
        retry.CopyFrom(mallory)
        retry.blob = notes
        retried = asyncio.create_task(hub.dispatch(retry))
        sent = await session.outbox.get()  # the same call: sent on
        assert sent is not None
        assert isinstance(sent, bytes) and recorded.encode() in sent
        retried.cancel()
        hub.store.close()

    asyncio.run(go())


def test_the_fields_are_hashed_each_ended_by_a_nul_whatever_they_hold() -> None:
    """The bytes hashed are kept digests' (ledgers, hub.db): each field's UTF-8, each
    ended by a NUL, then the blob."""
    import blake3

    for fields in [
        ("workerHost", "fs_write", "p", "a", '{"path": "out.bin"}'),
        ("s", "a", "plan \u00e9", "\u4e2d agent", '{"t": "\u00e9\u4e2d\U0001f600 \\ud800"}'),
        ("", "", "", "", ""),
    ]:
        req = pb.ActionRequest(
            surface=fields[0], action=fields[1], plan_id=fields[2], agent_id=fields[3]
        )
        req.args_json = fields[4]
        h = blake3.blake3()
        for field in fields:
            h.update(field.encode("utf-8", "surrogatepass") + b"\x00")
        h.update(b"blob")
        assert call_digest(req, b"blob") == DIGEST_SCHEME + h.hexdigest()
