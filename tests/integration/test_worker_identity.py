"""Who may be a worker at the hub: a worker's id is bound to the key it first came
with (worker.key in its data folder), so another holder of the hub's token cannot
take its place, its calls (and their secrets) and its answers."""

from __future__ import annotations

import asyncio
import signal

import grpc

from tests.support.cluster import Cluster
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.protocol import PROTOCOL_MAX, PROTOCOL_MIN, STREAM_METHOD
from worker.wire.transport import WORKER_KEY_HEADER, bearer


async def _hello_as(live: Cluster, worker_id: str, key: str | None) -> grpc.StatusCode | str:
    """Open a worker stream under `worker_id`: the refusal's code, or 'welcome'."""
    hello = pb.Hello(
        worker_id=worker_id,
        instance_id="impostor",
        version="9",
        protocol_min=PROTOCOL_MIN,
        protocol_max=PROTOCOL_MAX,
        surfaces=["workerDiag"],
        actions=["workerDiag.probe"],
        max_concurrency=8,
    )
    metadata = bearer(live.token) + (() if key is None else ((WORKER_KEY_HEADER, key),))
    async with grpc.aio.insecure_channel(live.listen) as channel:
        stream = channel.stream_stream(
            STREAM_METHOD,
            request_serializer=pb.WorkerEnvelope.SerializeToString,
            response_deserializer=pb.ServerEnvelope.FromString,
        )
        held = asyncio.Event()  # never set: the stream stays open until cancelled

        async def envelopes():  # type: ignore[no-untyped-def]
            yield pb.WorkerEnvelope(messages=[pb.WorkerMessage(hello=hello)])
            await held.wait()

        call = stream(envelopes(), metadata=metadata)
        try:
            async for envelope in call:
                if envelope.messages[0].WhichOneof("kind") == "welcome":
                    call.cancel()
                    return "welcome"
        except grpc.aio.AioRpcError as exc:
            assert "belongs to another worker" in (exc.details() or ""), exc.details()
            return exc.code()
    return "ended"


def test_a_hello_under_a_connected_workers_id_without_its_key_is_refused(live: Cluster) -> None:
    (real,) = live.workers()
    assert real.connected
    for key in (None, "", "another-workers-key"):
        assert (
            asyncio.run(_hello_as(live, real.worker_id, key)) is grpc.StatusCode.PERMISSION_DENIED
        )
    # The real worker kept its stream: its calls still reach it. (The other key is
    # listed too, pending: its operator may accept a worker whose key was made anew.)
    (still,) = [w for w in live.workers() if w.enrolment == "accepted"]
    assert still.connected and still.instance_id == real.instance_id
    assert live.call("workerDiag.probe")["status"] == "ok"
    # A new id is anyone's to take: that is a new worker, not this one.
    assert asyncio.run(_hello_as(live, "a-new-worker", "its-own-key")) == "welcome"
    assert (
        asyncio.run(_hello_as(live, "a-new-worker", "not-its-key"))
        is grpc.StatusCode.PERMISSION_DENIED
    )


def test_a_worker_whose_id_was_taken_while_away_is_refused_not_robbed(live: Cluster) -> None:
    """The key is kept at the hub: an impostor waiting for the worker to go away (a
    restart) cannot take its id meanwhile, and the worker comes back as itself."""
    (real,) = live.workers()
    worker = live.procs[1]
    worker.signal(signal.SIGTERM)
    worker.wait(30)
    assert asyncio.run(_hello_as(live, real.worker_id, None)) is grpc.StatusCode.PERMISSION_DENIED
    live.start_worker()
    assert live.call("workerDiag.probe")["status"] == "ok"
    (back,) = [
        w for w in live.workers() if w.worker_id == real.worker_id and w.enrolment == "accepted"
    ]
    assert back.connected
