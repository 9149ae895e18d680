"""A worker's key accepted by its whole fingerprint ahead of its Hello (docs/architecture.md,
"Workers are enrolled"; review28 L2): a real hub in this loop, hand-driven worker streams
for the worker and for a holder of the workers' token flooding the hub with new ids."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import grpc
import pytest

from tests.support.hub_inproc import DrivenHub, HandWorker, driven_hub, hand_hello
from worker.hub import enrolment
from worker.hub.hellos import NEW_WORKERS_PER_S
from worker.hub.rates import Rate
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.protocol import ENROLMENT_KEY
from worker.wire.transport import fingerprint_of_digest, worker_key_digest_of

KEPT = 4  # PENDING_KEPT, made small: the flood that pushes a row out is as many Hellos


async def answer(worker: HandWorker) -> tuple[str, str]:
    """How the hub answered `worker`'s Hello: ("welcome", "") or (code, ENROLMENT_KEY's)."""
    welcomed = await worker.until("welcome", or_end=True)
    if welcomed:
        return "welcome", ""
    code = await worker.ended()
    trailer = dict(await worker.call.trailing_metadata() or ()).get(ENROLMENT_KEY, "")
    return code.name, str(trailer)


async def accept(hub: DrivenHub, worker_id: str, fingerprint: str) -> pb.DecideWorkerResponse:
    request = pb.DecideWorkerRequest(
        worker_id=worker_id, fingerprint=fingerprint, decision=pb.DecideWorkerRequest.ACCEPT
    )
    reply: pb.DecideWorkerResponse = await hub.caller.stub.DecideWorker(
        request, metadata=hub.caller.metadata, timeout=60
    )
    return reply


def test_a_worker_pushed_out_by_a_flood_of_new_ids_is_accepted_by_its_fingerprint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review28 L2: fresh ids said Hello at the new ids' pace pushed a real worker's
    pending row out of the PENDING_KEPT, `workers accept ID` then answered that no such
    worker had said Hello, and its next Hellos were refused busy with the flood's. Now
    its whole fingerprint (printed at its start) accepts it ahead, and a Hello the
    operator accepted is not counted among the new ids: it is served, the flood still
    under way. Another key under the id is then refused as not the id's."""
    monkeypatch.setattr(enrolment, "PENDING_KEPT", KEPT)

    async def go() -> None:
        async with driven_hub(tmp_path / "hub") as hub:
            hub.hub.admission.accept_new = False
            # The new ids' bucket as the flood leaves it: a few, then its pace.
            hub.hub.hellos.new = Rate(KEPT + 2, NEW_WORKERS_PER_S / 1e6, keys=1)
            key = uuid.uuid4().hex
            hello = hand_hello("vm-1", surfaces=["workerDiag"], actions=["workerDiag.probe"])
            assert await answer(hub.hand(hello=hello, key=key)) == ("PERMISSION_DENIED", "pending")
            flood = []
            while not flood or flood[-1][0] != "RESOURCE_EXHAUSTED":
                flood.append(await answer(hub.hand(hello=hand_hello(f"f-{uuid.uuid4().hex}"))))
            assert len(flood) > KEPT
            assert [row.state for row in hub.store.enrolments.of("vm-1")] == []  # pushed out
            fingerprint = fingerprint_of_digest(worker_key_digest_of(key))
            reply = await accept(hub, "vm-1", fingerprint)
            assert (reply.enrolment, reply.fingerprint) == ("accepted", fingerprint)
            assert await answer(hub.hand(hello=hello, key=key)) == ("welcome", "")
            [row] = hub.store.enrolments.of("vm-1")
            assert (row.state, row.key_digest) == ("accepted", worker_key_digest_of(key))
            hub.hub.hellos.new = Rate(KEPT, NEW_WORKERS_PER_S, keys=1)  # the flood over
            other = hub.hand(hello=hello, key=uuid.uuid4().hex)
            assert await answer(other) == ("PERMISSION_DENIED", "key_mismatch")

    asyncio.run(go())


def test_accepting_ahead_needs_the_whole_fingerprint(tmp_path: Path) -> None:
    """A key not seen is accepted only by all of its fingerprint's 16 hex digits: a start
    of it (enough to pick a listed key) is refused NOT_FOUND, saying what to give."""

    async def go() -> None:
        async with driven_hub(tmp_path / "hub") as hub:
            fingerprint = fingerprint_of_digest(worker_key_digest_of(uuid.uuid4().hex))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await accept(hub, "vm-2", fingerprint[:9])
            assert refused.value.code() == grpc.StatusCode.NOT_FOUND
            assert "whole fingerprint it printed at its start" in (refused.value.details() or "")
            assert hub.store.enrolments.of("vm-2") == []

    asyncio.run(go())


def test_a_key_accepted_ahead_and_then_refused_is_refused(tmp_path: Path) -> None:
    """The operator's later word holds for a key accepted ahead: refused by the same
    fingerprint, that key's Hello is refused, never served."""

    async def go() -> None:
        async with driven_hub(tmp_path / "hub") as hub:
            hub.hub.admission.accept_new = False
            key = uuid.uuid4().hex
            fingerprint = fingerprint_of_digest(worker_key_digest_of(key))
            assert (await accept(hub, "vm-3", fingerprint)).enrolment == "accepted"
            request = pb.DecideWorkerRequest(
                worker_id="vm-3", fingerprint=fingerprint, decision=pb.DecideWorkerRequest.REFUSE
            )
            await hub.caller.stub.DecideWorker(request, metadata=hub.caller.metadata, timeout=60)
            hello = hand_hello("vm-3", surfaces=["workerDiag"], actions=["workerDiag.probe"])
            assert await answer(hub.hand(hello=hello, key=key)) == ("PERMISSION_DENIED", "refused")

    asyncio.run(go())


def test_no_key_is_accepted_ahead_for_an_id_accepted_with_another(tmp_path: Path) -> None:
    """A fingerprint mistyped for a worker served now neither replaces its key nor ends
    its stream: a key not seen is accepted ahead only for an id with no key accepted."""

    async def go() -> None:
        async with driven_hub(tmp_path / "hub") as hub:
            served = await hub.welcomed(hello=hand_hello("vm-4"))
            typo = fingerprint_of_digest(worker_key_digest_of(uuid.uuid4().hex))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await accept(hub, "vm-4", typo)
            assert refused.value.code() == grpc.StatusCode.NOT_FOUND
            assert "accepted with another key" in (refused.value.details() or "")
            assert "vm-4" in hub.sessions and not served.call.done()

    asyncio.run(go())
