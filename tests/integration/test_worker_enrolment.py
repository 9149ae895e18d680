"""A hub serves a worker only with the key its operator accepted for the worker's id
(docs/architecture.md, "Workers are enrolled"; review26 H5 and its neighbour): real
hubs and workers over loopback, hand-opened worker streams for the holders of the
workers' token who are not the operator's workers, and the real CLI for the verbs."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
import threading
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.support.cluster import Cluster, Proc, cluster, wait_for, write_config
from worker.hub.hellos import HELLO_BURST_PER_WORKER, HELLO_DESCRIBED_BYTES
from worker.hub.store import HubStore
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.proto import agentworker_pb2_grpc as pb_grpc
from worker.wire.protocol import ENROLMENT_KEY, PROTOCOL_MAX, PROTOCOL_MIN
from worker.wire.transport import fingerprint_of_digest, worker_key_digest_of, worker_metadata

SANDBOX_ACTIONS = ("workbenchHost.fs_write", "workbenchHost.fs_read", "workbenchHost.teardown")


def sandbox_hello(worker_id: str, **more: Any) -> pb.Hello:
    """A worker's Hello under `worker_id` offering the sandbox's actions (and `more` of
    the Hello's fields), as a new instance."""
    return pb.Hello(
        worker_id=worker_id,
        instance_id=uuid.uuid4().hex,
        version="test",
        protocol_min=PROTOCOL_MIN,
        protocol_max=PROTOCOL_MAX,
        surfaces=["workbenchHost"],
        actions=list(SANDBOX_ACTIONS),
        max_concurrency=4,
        **more,
    )


def say_hello(live: Cluster, worker_id: str, key: str, **more: Any) -> tuple[str, str, str]:
    """Open a worker stream with the workers' token and `key`, say Hello under
    `worker_id` offering the sandbox's actions (and `more` of the Hello's fields), and
    tell how the hub answered: ("welcome", "", "") or (status code name, ENROLMENT_KEY's
    value, message)."""
    token = (live.home / "hub-workers.token").read_text().strip()

    async def go() -> tuple[str, str, str]:
        async with grpc.aio.insecure_channel(live.listen) as channel:
            hello = sandbox_hello(worker_id, **more)

            async def envelopes():  # type: ignore[no-untyped-def]
                yield pb.WorkerEnvelope(messages=[pb.WorkerMessage(hello=hello)])
                await asyncio.Event().wait()  # held open until the call ends

            call = pb_grpc.WorkerServiceStub(channel).Stream(
                envelopes(), metadata=worker_metadata(token, key)
            )
            try:
                first = await call.read()
            except grpc.aio.AioRpcError as exc:
                trailer = dict(exc.trailing_metadata() or ()).get(ENROLMENT_KEY, "")
                return exc.code().name, str(trailer), exc.details() or ""
            finally:
                call.cancel()
            assert first is not grpc.aio.EOF
            kinds = [m.WhichOneof("kind") for m in first.messages]
            return ("welcome", "", "") if "welcome" in kinds else (str(kinds), "", "")

    return asyncio.run(go())


class HeldStream:
    """A worker stream said Hello with the workers' token and `key` and held open in a
    thread of its own: `welcomed` once the hub welcomed it, `done` once it ended, with
    `ended` (status code name, ENROLMENT_KEY's value, message)."""

    def __init__(self, live: Cluster, worker_id: str, key: str) -> None:
        self.welcomed, self.done = threading.Event(), threading.Event()
        self.ended: tuple[str, str, str] = ("", "", "")
        self._token = (live.home / "hub-workers.token").read_text().strip()
        self._listen, self._worker_id, self._key = live.listen, worker_id, key
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve)
        self._thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):  # close() while it is served
            self._loop.run_until_complete(self._run())

    async def _run(self) -> None:
        self._stop = asyncio.Event()
        hello = sandbox_hello(self._worker_id)

        async def envelopes():  # type: ignore[no-untyped-def]
            yield pb.WorkerEnvelope(messages=[pb.WorkerMessage(hello=hello)])
            await self._stop.wait()

        async with grpc.aio.insecure_channel(self._listen) as channel:
            call = pb_grpc.WorkerServiceStub(channel).Stream(
                envelopes(), metadata=worker_metadata(self._token, self._key)
            )
            try:
                async for envelope in call:
                    if any(m.WhichOneof("kind") == "welcome" for m in envelope.messages):
                        self.welcomed.set()
                self.ended = ("OK", "", "")
            except grpc.aio.AioRpcError as exc:
                trailer = dict(exc.trailing_metadata() or ()).get(ENROLMENT_KEY, "")
                self.ended = (exc.code().name, str(trailer), exc.details() or "")
            finally:
                self.done.set()

    def close(self) -> None:
        if not self.done.is_set():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._loop.call_soon_threadsafe(
                lambda: [task.cancel() for task in asyncio.all_tasks(self._loop)]
            )
        self._thread.join(30)
        self._loop.close()


def fingerprint(key: str) -> str:
    return fingerprint_of_digest(worker_key_digest_of(key))


def listed(live: Cluster, worker_id: str) -> list[pb.WorkerInfo]:
    return [w for w in live.workers() if w.worker_id == worker_id]


def decide(live: Cluster, verb: str, worker_id: str, *more: str) -> tuple[int, str]:
    done = live.cli("workers", verb, worker_id, *more)
    return done.returncode, done.stdout + done.stderr


def write_key_blob(live: Cluster, plan: str) -> dict[str, object]:
    return live.call(
        "workbenchHost.fs_write",
        '{"path": "deploy-key", "mode": "overwrite"}',
        plan_id=plan,
        blob=b"-----BEGIN OPENSSH PRIVATE KEY----- secret",
    )


def test_a_new_worker_id_waits_pending_and_is_given_no_plan(tmp_path: Path) -> None:
    """H5: a holder of the workers' token offering workbenchHost.* under a new id is not
    served: its Hello is refused as pending (the worker tries again), the hub lists it
    with its key's fingerprint, and a new plan's call (its key blob) is not placed on
    it. Before, it was welcomed and given every new plan (review26 r4: 8/8)."""
    with cluster(tmp_path / "hub", worker=False, accept_new_workers=False) as live:
        key = uuid.uuid4().hex
        for _ in range(2):  # and again: still pending, one row
            code, why, message = say_hello(live, "rogue-1", key)
            assert (code, why) == ("PERMISSION_DENIED", "pending"), (code, why, message)
            assert "agentworker workers accept rogue-1" in message
            assert fingerprint(key) in message
        [row] = listed(live, "rogue-1")
        assert (row.enrolment, row.fingerprint, row.connected) == (
            "pending",
            fingerprint(key),
            False,
        )
        assert list(row.actions) == list(SANDBOX_ACTIONS)
        answer = write_key_blob(live, "new-0")
        assert answer["status"] == "error"
        assert answer["error"]["code"] == "sandbox_unavailable"  # type: ignore[index]
        assert "1 worker(s) said Hello and wait" in answer["error"]["message"]  # type: ignore[index]
        assert live.status().connected_workers == 0


def test_accept_serves_the_key_it_names_and_refuses_the_other(tmp_path: Path) -> None:
    """Neighbour of H5: with hub.db lost, a rogue that says Hello first under a real
    worker's id binds nothing; both wait, `accept` without a fingerprint says which two
    keys came, and the one accepted by its fingerprint is served while the other is
    refused as a key that is not the id's (before: the first Hello bound the id, and the
    real worker was locked out)."""
    with cluster(tmp_path / "hub", worker=False, accept_new_workers=False) as live:
        rogue, real = uuid.uuid4().hex, uuid.uuid4().hex
        assert say_hello(live, "vm-1", rogue)[1] == "pending"
        assert say_hello(live, "vm-1", real)[1] == "pending"
        assert sorted(w.fingerprint for w in listed(live, "vm-1")) == sorted(
            [fingerprint(rogue), fingerprint(real)]
        )
        rc, said = decide(live, "accept", "vm-1")
        assert rc != 0 and "--fingerprint" in said and fingerprint(real) in said, said
        assert "Traceback" not in said
        rc, said = decide(live, "accept", "vm-1", "--fingerprint", fingerprint(real))
        assert rc == 0 and "accepted worker 'vm-1'" in said, said
        assert say_hello(live, "vm-1", real)[0] == "welcome"
        code, why, message = say_hello(live, "vm-1", rogue)
        assert (code, why) == ("PERMISSION_DENIED", "key_mismatch"), (code, why, message)
        assert "belongs to another worker at this hub" in message
        [row] = [w for w in listed(live, "vm-1") if w.enrolment == "accepted"]
        assert row.fingerprint == fingerprint(real)


def test_refused_worker_is_refused_and_its_stream_ends(tmp_path: Path) -> None:
    """`refuse` on a worker waiting: its Hellos are refused as refused (a worker stops
    on that); `forget` undoes it (pending again)."""
    with cluster(tmp_path / "hub", worker=False, accept_new_workers=False) as live:
        key = uuid.uuid4().hex
        assert say_hello(live, "odd-1", key)[1] == "pending"
        rc, said = decide(live, "refuse", "odd-1")
        assert rc == 0 and "refused worker 'odd-1'" in said, said
        code, why, message = say_hello(live, "odd-1", key)
        assert (code, why) == ("PERMISSION_DENIED", "refused"), (code, why, message)
        assert [w.enrolment for w in listed(live, "odd-1")] == ["refused"]
        rc, said = decide(live, "forget", "odd-1")
        assert rc == 0, said
        assert say_hello(live, "odd-1", key)[1] == "pending"
        rc, said = decide(live, "accept", "nobody-here")
        assert rc != 0 and "has said Hello to this hub" in said and "Traceback" not in said


def start_own_home_worker(live: Cluster, name: str) -> Proc:
    """A real worker (`agentworker run`) with a home of its own, joining the hub as a
    worker on another machine would; not waited for."""
    home = live.home.parent / name
    write_config(home, live.listen)
    return live.spawn_worker_at(name, home)


def test_a_real_worker_serves_once_accepted_with_the_cli(tmp_path: Path) -> None:
    """The operator's path: a worker started elsewhere prints its key's fingerprint, the
    hub lists it pending with the same one and gives it no call; `agentworker workers
    accept ID` (the real CLI) and it connects on its own and serves."""
    with cluster(tmp_path / "hub", worker=False, accept_new_workers=False) as live:
        proc = start_own_home_worker(live, "far")
        wait_for(lambda: any(w.enrolment == "pending" for w in live.workers()), 60, proc)
        [row] = live.workers()
        printed = re.search(r"key fingerprint ([0-9a-f-]+)", proc.log())
        assert printed is not None and printed.group(1) == row.fingerprint, proc.log()
        with pytest.raises(grpc.aio.AioRpcError) as unserved:
            live.call("workerHost.fs_stat", '{"path": "."}')
        assert "wait to be accepted" in (unserved.value.details() or "")
        listing = live.cli("workers")
        assert "pending, key " + row.fingerprint in listing.stdout, listing
        rc, said = decide(live, "accept", row.worker_id)
        assert rc == 0, said
        wait_for(lambda: live.status().connected_workers == 1, 60, proc)
        assert proc.running()
        [row] = live.workers()
        assert (row.enrolment, row.connected) == ("accepted", True)


def test_refusing_a_connected_worker_ends_it(tmp_path: Path) -> None:
    """`refuse` of an accepted, connected worker ends its stream at once, and the real
    worker stops with the hub's reason (no traceback) rather than dialling for ever."""
    with cluster(tmp_path / "hub", worker=False, accept_new_workers=False) as live:
        proc = start_own_home_worker(live, "far")
        wait_for(lambda: any(w.enrolment == "pending" for w in live.workers()), 60, proc)
        [row] = live.workers()
        assert decide(live, "accept", row.worker_id)[0] == 0
        wait_for(lambda: live.status().connected_workers == 1, 60, proc)
        rc, said = decide(live, "refuse", row.worker_id)
        assert rc == 0, said
        assert live.status().connected_workers == 0
        assert proc.wait(60) != 0
        assert "the operator of this hub refused worker" in proc.log()
        assert "Traceback" not in proc.log()


def test_the_hubs_own_users_worker_is_accepted_unasked(tmp_path: Path) -> None:
    """`agentworker hub` and `agentworker run` sharing a data folder (one user, one
    machine): the worker's key is the hub's folder's worker.key, accepted unasked."""
    with cluster(tmp_path / "hub", accept_new_workers=False) as live:
        [row] = live.workers()
        assert (row.enrolment, row.connected) == ("accepted", True)
        assert live.call("workerHost.fs_stat", '{"path": "."}')["status"] == "ok"


def test_workers_bound_in_an_older_hub_db_stay_accepted(tmp_path: Path) -> None:
    """A hub.db from before enrolment: each worker bound to a key then is accepted with
    that key (an upgraded hub keeps serving its workers); one with no key is not."""
    path = tmp_path / "hub.db"
    store = HubStore(path)
    store.seen_worker(pb.Hello(worker_id="old-1"), worker_key_digest_of("k1"))
    store.seen_worker(pb.Hello(worker_id="old-2"), "")
    store._db.execute("DROP TABLE enrolments")
    store.close()
    store = HubStore(path)
    try:
        assert store.enrolments.migrated == 1
        assert store.enrolments.verdict("old-1", worker_key_digest_of("k1")).state == "accepted"
        other = store.enrolments.verdict("old-1", worker_key_digest_of("k2"))
        assert (other.state, other.taken) == ("pending", True)
        assert store.enrolments.verdict("old-2", worker_key_digest_of("k1")).state == "pending"
    finally:
        store.close()


@pytest.mark.parametrize("verb", ["accept", "refuse", "forget"])
def test_a_decision_needs_the_persons_token(tmp_path: Path, verb: str) -> None:
    """The workers' token cannot accept a worker (or refuse one): only hub.token."""
    with cluster(tmp_path / "hub", worker=False, accept_new_workers=False) as live:
        assert say_hello(live, "w-1", "k")[1] == "pending"
        workers_token = (live.home / "hub-workers.token").read_text().strip()
        request = pb.DecideWorkerRequest(
            worker_id="w-1", decision=pb.DecideWorkerRequest.Decision.Value(verb.upper())
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            live.run(
                lambda c: c.stub.DecideWorker(request, metadata=c.metadata, timeout=30),
                token=workers_token,
            )
        assert refused.value.code() in (
            grpc.StatusCode.PERMISSION_DENIED,
            grpc.StatusCode.UNAUTHENTICATED,
        )
        assert [w.enrolment for w in listed(live, "w-1")] == ["pending"]


def test_a_waiting_hello_is_kept_as_its_description_alone(tmp_path: Path) -> None:
    """review28 r6: a Hello waiting for the operator was kept whole in hub.db, its call
    ids and plans too (up to the 8 MiB a Hello may be): made-up ids under fresh worker
    ids grew hub.db by 7.5 MB a Hello (256 kept: about 2 GB), and each ListWorkers
    parsed them all on the hub's loop. Now the description alone is kept, as for a
    worker served."""
    with cluster(tmp_path / "hub", worker=False, accept_new_workers=False) as live:
        ids = [f"{n:032x}" for n in range(60_000)]  # 2 MB of call ids
        plans = [pb.HeldPlan(plan_id=f"p-{n}", placement_token="x" * 64) for n in range(4096)]
        answer = say_hello(live, "big-1", uuid.uuid4().hex, unacked_ids=ids, plans=plans)
        assert answer[1] == "pending", answer
        with sqlite3.connect(live.home / "hub.db") as db:
            [(size,)] = db.execute(
                "SELECT length(hello) FROM enrolments WHERE worker_id = 'big-1'"
            ).fetchall()
        assert 0 < size <= HELLO_DESCRIBED_BYTES, size
        [row] = listed(live, "big-1")
        assert (row.enrolment, list(row.actions)) == ("pending", list(SANDBOX_ACTIONS))


def hello_until_busy(live: Cluster, worker_id: str, key: str) -> tuple[str, str, str]:
    """Say Hello under `worker_id` with `key` until the hub says busy; that answer."""
    for _ in range(3 * HELLO_BURST_PER_WORKER):
        answer = say_hello(live, worker_id, key)
        if answer[0] == "RESOURCE_EXHAUSTED":
            return answer
    raise AssertionError(f"never refused busy: {answer}")


def test_hellos_under_an_accepted_id_with_another_key_cost_that_worker_nothing(
    tmp_path: Path,
) -> None:
    """review28 r1: a holder of the workers' token saying Hello under an accepted
    worker's id with a key of its own (waiting, or refused by the operator) is paced as
    itself, not as the worker: before, its Hellos emptied the worker's bucket (30, then
    1 a second) and the real worker was refused busy as long as the rogue said Hello
    once a second."""
    with cluster(tmp_path / "hub", worker=False, accept_new_workers=False) as live:
        real, rogue, refused = (uuid.uuid4().hex for _ in range(3))
        assert say_hello(live, "vm-1", real)[1] == "pending"
        assert decide(live, "accept", "vm-1")[0] == 0
        assert say_hello(live, "vm-1", refused)[1] == "key_mismatch"
        rc, said = decide(live, "refuse", "vm-1", "--fingerprint", fingerprint(refused))
        assert rc == 0, said
        for key in (rogue, refused):
            code, _, message = hello_until_busy(live, "vm-1", key)
            assert "busy" in message, (code, message)
            assert say_hello(live, "vm-1", real)[0] == "welcome"


def test_accepting_another_key_ends_the_stream_of_the_key_accepted_before(
    tmp_path: Path,
) -> None:
    """review28 r2: a rogue accepted on first contact under a worker's id (or kept from a
    migrated hub.db) loses its stream as the operator accepts the real worker's key for
    that id; before, it stayed connected, listed as accepted, and was sent the worker's
    next calls until the real worker (stopped by key_mismatch) was started again."""
    with cluster(tmp_path / "hub", worker=False, accept_new_workers=True) as live:
        token = (live.home / "hub-workers.token").read_text().strip()
        real, rogue = uuid.uuid4().hex, uuid.uuid4().hex

        async def go() -> tuple[str, str]:
            async with grpc.aio.insecure_channel(live.listen) as channel:
                hello = pb.Hello(
                    worker_id="vm-1",
                    instance_id="rogue",
                    protocol_min=PROTOCOL_MIN,
                    protocol_max=PROTOCOL_MAX,
                    actions=list(SANDBOX_ACTIONS),
                )

                async def envelopes():  # type: ignore[no-untyped-def]
                    yield pb.WorkerEnvelope(messages=[pb.WorkerMessage(hello=hello)])
                    await asyncio.Event().wait()

                call = pb_grpc.WorkerServiceStub(channel).Stream(
                    envelopes(), metadata=worker_metadata(token, rogue)
                )
                first = await call.read()
                assert first is not grpc.aio.EOF
                assert "welcome" in [m.WhichOneof("kind") for m in first.messages]
                answer = await asyncio.to_thread(say_hello, live, "vm-1", real)
                assert answer[1] == "key_mismatch", answer
                rc, said = await asyncio.to_thread(
                    decide, live, "accept", "vm-1", "--fingerprint", fingerprint(real)
                )
                assert rc == 0, said
                try:
                    async with asyncio.timeout(60):  # a hang's bound: the end comes at once
                        while await call.read() is not grpc.aio.EOF:
                            pass
                except grpc.aio.AioRpcError as exc:
                    trailer = dict(exc.trailing_metadata() or ()).get(ENROLMENT_KEY, "")
                    return exc.code().name, str(trailer)
                return "EOF", ""

        assert asyncio.run(go()) == ("PERMISSION_DENIED", "key_mismatch")
        assert live.status().connected_workers == 0
        assert say_hello(live, "vm-1", real)[0] == "welcome"


def test_a_hello_under_an_id_no_call_could_name_is_refused(tmp_path: Path) -> None:
    """review28 r7: a worker id that a call, a kill or `workers accept` would be refused
    for (a line break, an escape, over 256 characters) was taken in a Hello: with
    accept_new_workers on it was served, and its id went into the hub's log as it came,
    forging lines there. Now the Hello is refused, and nothing is recorded."""
    forged = "vm-1\nWARNING worker.hub.admission: hub: worker vm-9 accepted"
    with cluster(tmp_path / "hub", worker=False, accept_new_workers=True) as live:
        for worker_id in (forged, "vm-\x1b[2J", "v" * 300):
            code, _, message = say_hello(live, worker_id, uuid.uuid4().hex)
            assert code == "INVALID_ARGUMENT", (code, message)
            assert "worker_id" in message and "worker's data folder" in message, message
        assert live.workers() == []
        hub = next(p for p in live.procs if p.name == "hub")
        assert "\nWARNING worker.hub.admission: hub: worker vm-9" not in hub.log()


def bound_key(live: Cluster, worker_id: str) -> str:
    """The key digest hub.db's `workers` row of `worker_id` is bound to (HubStore.knows_key
    reads a stream's Hello on the known keys' turns by it)."""
    with sqlite3.connect(live.home / "hub.db") as db:
        [(digest,)] = db.execute(
            "SELECT key_digest FROM workers WHERE worker_id = ?", (worker_id,)
        ).fetchall()
    return str(digest)


def test_a_decision_binds_the_workers_row_to_the_key_served_from_then_on(tmp_path: Path) -> None:
    """review28 L3: after `workers accept ID --fingerprint NEW`, the id's row in hub.db
    still named the old key, so the old key's Hellos kept the known keys' turns and the
    new key's waited on the unknown keys' until it was served. Now an accept binds the
    row to the key it accepts, and a forget to none."""
    with cluster(tmp_path / "hub", worker=False, accept_new_workers=False) as live:
        old, new = uuid.uuid4().hex, uuid.uuid4().hex
        assert say_hello(live, "vm-1", old)[1] == "pending"
        assert decide(live, "accept", "vm-1")[0] == 0
        assert say_hello(live, "vm-1", old)[0] == "welcome"
        assert bound_key(live, "vm-1") == worker_key_digest_of(old)
        assert say_hello(live, "vm-1", new)[1] == "key_mismatch"  # its key made anew
        rc, said = decide(live, "accept", "vm-1", "--fingerprint", fingerprint(new))
        assert rc == 0, said
        assert bound_key(live, "vm-1") == worker_key_digest_of(new)
        assert decide(live, "forget", "vm-1")[0] == 0
        assert bound_key(live, "vm-1") == ""
