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


def test_the_hub_checks_a_pre_blake3_call_against_its_own_old_digest(tmp_path: Path) -> None:
    import asyncio

    from worker.clock import now_ms
    from worker.hub.server import Hub, Session
    from worker.hub.store import HubStore
    from worker.wire.protocol import legacy_digest

    async def go() -> None:
        hub = Hub(HubStore(tmp_path / "hub.db"))
        session = Session(hello=pb.Hello(worker_id="w"), session_id="s", protocol=2)
        hub.sessions["w"] = session
        alice = _request(correlation_id="old")
        recorded = legacy_digest(alice, b"alice's notes")
        hub.store.add("w", recorded, alice, 13, now_ms() + 60_000)
        hub.store.flush()  # pending, recorded by the previous version

        mallory = pb.DispatchRequest(correlation_id="old", worker_id="w", blob=b"mallory's")
        for field in ("surface", "action", "plan_id", "agent_id", "args_json"):
            setattr(mallory, field, getattr(alice, field))
        refused = await hub.dispatch(mallory)
        assert refused.result.error.code == "args_mismatch"
        assert session.outbox.empty()  # nothing of it went to the worker

        retry = pb.DispatchRequest()
        retry.CopyFrom(mallory)
        retry.blob = b"alice's notes"
        retried = asyncio.create_task(hub.dispatch(retry))
        sent = await session.outbox.get()  # the same call: sent on
        assert sent is not None
        retried.cancel()
        hub.store.close()

    asyncio.run(go())
