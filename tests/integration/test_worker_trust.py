"""What the workers' token (hub-workers.token) lets a machine do at the hub: serve the
calls sent to its own worker id, nothing more. A rogue holding it, under a new worker
id, can neither answer a call the hub sent to another worker nor take another
worker's sandbox plan by claiming it in its Hello (review2 finding 03), nor a plan no
one has used yet, nor one of a hub that lost hub.db: a claim the hub has no record of
counts only with the placement token the hub gave that worker for the plan (review25
G8)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc

from tests.integration.test_resilience import marks
from tests.support.cluster import Cluster, call_in_background, cluster, release, wait_for
from tests.support.workbench import (
    call,
    files_of,
    held_token_of,
    placement_token_of,
    start_sandbox_worker,
    worker_id_of,
)
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.proto import agentworker_pb2_grpc as pb_grpc
from worker.wire.protocol import PROTOCOL_MIN
from worker.wire.transport import worker_metadata

SANDBOX_ACTIONS = ("workbenchHost.fs_read", "workbenchHost.fs_write", "workerDiag.probe")


class Rogue:
    """A worker stream opened with the workers' token under a fresh id, which claims
    `plans` in its Hello (with the placement tokens `tokens` names, none otherwise),
    offers `actions`, answers every call it is sent, and records the acks."""

    def __init__(
        self,
        live: Cluster,
        plans: tuple[str, ...] = (),
        *,
        tokens: Mapping[str, str] | None = None,
        actions: tuple[str, ...] = SANDBOX_ACTIONS,
    ) -> None:
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
            surfaces=sorted({action.split(".")[0] for action in actions}),
            actions=list(actions),
            max_concurrency=4,
            plans=[
                pb.HeldPlan(
                    plan_id=p,
                    last_used_unix_ms=int(time.time() * 1000),
                    placement_token=(tokens or {}).get(p, ""),
                )
                for p in plans
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


def _bytes_of(path: Path) -> bytes:
    """A file's bytes; none for anything else, or a file gone meanwhile (a journal)."""
    try:
        return path.read_bytes() if path.is_file() and not path.is_symlink() else b""
    except FileNotFoundError:
        return b""


def test_a_plan_claimed_before_it_exists_goes_where_the_hub_places_it(tmp_path: Path) -> None:
    """Plan ids are the server's, and may be guessed ahead: a claim of one the hub has
    no record of, without the hub's placement token or with a made-up one, is ignored.
    The rogue offers no sandbox action, so only a claim taken could bring it a plan."""
    with cluster(tmp_path / "hub", worker=False) as live:
        start_sandbox_worker(live, "w1")
        real = worker_id_of(live, "w1")
        bare, forged = ("p-" + uuid.uuid4().hex[:8] for _ in range(2))

        async def claim() -> list[pb.ActionRequest]:
            tokens = {forged: "0" * 64}
            rogue = Rogue(live, (bare, forged), tokens=tokens, actions=("workerDiag.probe",))
            await rogue.welcomed.wait()  # its Hello's claims have been weighed
            for plan in (bare, forged, bare):
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
        said = (live.home / "hub.log").read_text()
        assert "2 plan(s) this hub did not place there, without the placement token" in said
        assert "0" * 64 not in said


def test_a_restarted_worker_proves_its_plans_to_a_hub_that_lost_hub_db(tmp_path: Path) -> None:
    """The worker keeps each plan's placement token with its workspace, so after its
    restart it proves to a hub that lost hub.db (its placement key kept) where the
    plan lives; a rogue that claimed the plan first, even with that worker's own token
    (a token proves a placement on the worker id it was given for), does not get it."""
    with cluster(tmp_path / "hub", worker=False) as live:
        start_sandbox_worker(live, "w1")
        start_sandbox_worker(live, "w2")
        x, y = worker_id_of(live, "w1"), worker_id_of(live, "w2")
        plan = "p-" + uuid.uuid4().hex[:8]
        out, _ = call(live, plan, "fs_write", {"path": "f"}, b"on x", worker_id=x)
        assert out["status"] == "ok" and out["worker_id"] == x, out
        for name in ("hub", "w1"):  # the hub loses hub.db, and x restarts meanwhile
            proc = next(p for p in live.procs if p.name == name and p.running())
            proc.signal(signal.SIGTERM)
            proc.wait(30)
        for name in ("hub.db", "hub.db-wal", "hub.db-shm"):
            (live.home / name).unlink(missing_ok=True)
        live.start_hub()
        wait_for(lambda: live.status().connected_workers == 1, 20)  # y

        async def claim_then_restart() -> list[pb.ActionRequest]:
            stolen = {plan: placement_token_of(live, x, plan)}
            rogue = Rogue(live, (plan,), tokens=stolen)
            await rogue.welcomed.wait()
            await asyncio.to_thread(start_sandbox_worker, live, "w1")
            out, blob = await asyncio.to_thread(call, live, plan, "fs_read", {"path": "f"})
            assert (out["status"], out["worker_id"], blob) == ("ok", x, b"on x"), out
            await rogue.close()
            return rogue.received

        assert asyncio.run(claim_then_restart()) == []
        assert files_of(live, "w1", plan).exists() and y != x
        # The token is kept with the workspace (beside its files) and in hub.db (the
        # requests the hub keeps), never logged nor in telemetry or the ledger.
        token = held_token_of(live, "w1", plan).encode()
        assert token
        holding = {path.name for path in tmp_path.rglob("*") if token in _bytes_of(path)}
        assert holding - {"hub.db", "hub.db-wal"} == {"plan.json"}, holding
