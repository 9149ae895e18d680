"""What the workers' token (hub-workers.token) lets a machine do at the hub: serve the
calls sent to its own worker id, nothing more. A rogue holding it, under a new worker
id, can neither answer a call the hub sent to another worker nor take another
worker's sandbox plan by claiming it in its Hello (review2 finding 03)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from pathlib import Path
from typing import Any

import grpc

from tests.integration.test_resilience import marks
from tests.support.cluster import Cluster, call_in_background, cluster, release, wait_for
from tests.support.workbench import start_sandbox_worker, worker_id_of
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.proto import agentworker_pb2_grpc as pb_grpc
from worker.wire.protocol import PROTOCOL_MIN
from worker.wire.transport import worker_metadata


class Rogue:
    """A worker stream opened with the workers' token under a fresh id, which claims
    `plans` in its Hello, answers every call it is sent, and records the acks."""

    def __init__(self, live: Cluster, plans: tuple[str, ...] = ()) -> None:
        token = (live.home / "hub-workers.token").read_text().strip()
        self.worker_id = "rogue-" + uuid.uuid4().hex[:8]
        self.welcomed = asyncio.Event()
        self.acked: set[str] = set()
        self.ack_came = asyncio.Event()
        self.received: list[pb.ActionRequest] = []
        self.scope_requests: list[pb.ScopeRequest] = []  # never answered
        self.asked = asyncio.Event()
        self._out: asyncio.Queue[pb.WorkerEnvelope] = asyncio.Queue()
        self._channel = grpc.aio.insecure_channel(live.listen)
        hello = pb.Hello(
            worker_id=self.worker_id,
            instance_id=uuid.uuid4().hex,
            version="rogue",
            protocol_min=PROTOCOL_MIN,
            protocol_max=1,
            surfaces=["workbenchHost", "workerDiag"],
            actions=["workbenchHost.fs_read", "workbenchHost.fs_write", "workerDiag.probe"],
            max_concurrency=4,
            plans=[
                pb.HeldPlan(plan_id=p, last_used_unix_ms=int(time.time() * 1000)) for p in plans
            ],
        )

        async def envelopes() -> Any:
            yield pb.WorkerEnvelope(messages=[pb.WorkerMessage(hello=hello)])
            while True:
                yield await self._out.get()

        stub = pb_grpc.WorkerServiceStub(self._channel)
        self._call = stub.Stream(envelopes(), metadata=worker_metadata(token, uuid.uuid4().hex))
        self._task = asyncio.ensure_future(self._serve())

    def send(self, *messages: pb.WorkerMessage) -> None:
        self._out.put_nowait(pb.WorkerEnvelope(messages=list(messages)))

    @staticmethod
    def forged(cid: str) -> pb.WorkerMessage:
        result = pb.ActionResult(
            correlation_id=cid,
            status=pb.ActionResult.OK,
            result_json=json.dumps({"forged": True}),
            blob=b"FORGED",
        )
        return pb.WorkerMessage(result=result)

    async def _serve(self) -> None:
        async for envelope in self._call:
            for msg in envelope.messages:
                kind = msg.WhichOneof("kind")
                if kind == "welcome":
                    self.welcomed.set()
                elif kind == "ack":
                    self.acked.update(msg.ack.correlation_ids)
                    self.ack_came.set()
                elif kind == "scope_request":
                    self.scope_requests.append(msg.scope_request)
                    self.asked.set()
                elif kind == "request":
                    self.received.append(msg.request)
                    self.send(self.forged(msg.request.correlation_id))

    async def acked_for(self, cid: str) -> None:
        while cid not in self.acked:
            self.ack_came.clear()
            await self.ack_came.wait()

    async def close(self) -> None:
        self._call.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await self._task
        await self._channel.close()


def test_a_worker_cannot_answer_or_fail_a_call_sent_to_another(tmp_path: Path) -> None:
    with cluster(tmp_path / "home") as live:
        args = '{"hold": "tr-1", "mark": "trust"}'
        pending = call_in_background(live, "workerDiag.probe", args, correlation_id="tr-1")
        wait_for(lambda: marks(live, "trust") == 1, 10)  # running at the real worker

        async def forge() -> None:
            rogue = Rogue(live)
            await rogue.welcomed.wait()
            mismatch = pb.ActionAck(
                correlation_ids=["tr-1"], kind=pb.ActionAck.REJECTED_ARGS_MISMATCH, message="no"
            )
            rogue.send(pb.WorkerMessage(ack=mismatch), rogue.forged("tr-1"))
            await asyncio.wait_for(rogue.acked_for("tr-1"), 10)  # the hub has read both
            await rogue.close()

        asyncio.run(forge())
        assert pending["thread"].is_alive(), f"the caller was answered: {pending.get('out')}"
        release(live.home, "tr-1")
        pending["thread"].join(20)
        out = pending["out"]
        assert out["status"] == "ok" and out["result"]["marks"] == 1, out
        again = live.call("workerDiag.probe", args, correlation_id="tr-1")
        assert again["replayed"] is True and again["result"] == out["result"], again


def test_a_worker_cannot_take_another_workers_plan_by_claiming_it(tmp_path: Path) -> None:
    with cluster(tmp_path / "hub", worker=False) as live:
        start_sandbox_worker(live, "w1")
        real = worker_id_of(live, "w1")
        plan = "p-" + uuid.uuid4().hex[:8]
        made = live.call("workbenchHost.fs_write", '{"path": "k"}', plan_id=plan, blob=b"x")
        assert made["status"] == "ok" and made["worker_id"] == real, made

        async def claim() -> list[pb.ActionRequest]:
            rogue = Rogue(live, plans=(plan,))
            await rogue.welcomed.wait()  # its Hello's claim has been weighed
            reply = await asyncio.to_thread(
                live.call,
                "workbenchHost.fs_write",
                '{"path": "deploy-key", "mode": "overwrite"}',
                plan_id=plan,
                blob=b"secret",
            )
            assert reply["status"] == "ok" and reply["worker_id"] == real, reply
            await rogue.close()
            return rogue.received

        assert asyncio.run(claim()) == []
