"""The `enrolments` table's bounds (worker.hub.enrolment), on a real hub.db."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from worker.hub import enrolment
from worker.hub.store import HubStore
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.transport import worker_key_digest_of

KEPT = 4  # PENDING_KEPT, made small: the flood that pushes a row out is as many Hellos


def test_a_flood_of_new_ids_does_not_serve_a_superseded_older_key_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review29 k1's rest: the key made for this hub, waiting under an id accepted with the
    older worker.key, is what keeps that older key unserved; a flood of new ids' Hellos
    pushed it out of the PENDING_KEPT and the older key was accepted again."""
    monkeypatch.setattr(enrolment, "PENDING_KEPT", KEPT)
    store = HubStore(tmp_path / "hub.db")
    enrolments = store.enrolments
    older, newer = (worker_key_digest_of(uuid.uuid4().hex) for _ in range(2))
    enrolments.accept("vm-1", older, by="operator", per_server=False)
    enrolments.waiting("vm-1", newer, pb.Hello(worker_id="vm-1"), per_server=True)
    assert enrolments.verdict("vm-1", older).superseded

    for n in range(KEPT + 3):
        flood = worker_key_digest_of(uuid.uuid4().hex)
        enrolments.waiting(f"f-{n}", flood, pb.Hello(worker_id=f"f-{n}"), per_server=True)

    verdict = enrolments.verdict("vm-1", older)
    assert (verdict.state, verdict.superseded) == ("pending", True)
    pending = [row for row in enrolments.all() if row.state == "pending"]
    assert len(pending) == KEPT + 1  # the flood's newest, and the upgraded key's
    store.close()


def test_keys_sent_under_a_superseded_id_are_pushed_out_but_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The row kept past PENDING_KEPT is one per id: keys made up under that id by anyone
    with the workers' token are pushed out as any other, the newest kept."""
    monkeypatch.setattr(enrolment, "PENDING_KEPT", KEPT)
    store = HubStore(tmp_path / "hub.db")
    enrolments = store.enrolments
    older = worker_key_digest_of(uuid.uuid4().hex)
    enrolments.accept("vm-1", older, by="operator", per_server=False)
    for _ in range(KEPT + 3):
        made_up = worker_key_digest_of(uuid.uuid4().hex)
        enrolments.waiting("vm-1", made_up, pb.Hello(worker_id="vm-1"), per_server=True)
    assert enrolments.verdict("vm-1", older).superseded
    for n in range(KEPT + 3):
        flood = worker_key_digest_of(uuid.uuid4().hex)
        enrolments.waiting(f"f-{n}", flood, pb.Hello(worker_id=f"f-{n}"), per_server=True)
    assert enrolments.verdict("vm-1", older).superseded
    pending = [row for row in enrolments.all() if row.state == "pending"]
    assert len(pending) == KEPT + 1
    assert sum(row.worker_id == "vm-1" for row in pending) == 1
    store.close()
