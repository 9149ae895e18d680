"""A real hub (worker.app.start_hub: its gRPC server, auth and services) in the test's own
event loop, so that a test can look at its state and change its timings, and a worker
stream for it that a test drives by hand: the far side of the hub's boundary."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from tests.support.cluster import Proc, write_config
from worker import app
from worker.config import Paths, load
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.proto import agentworker_pb2_grpc as pb_grpc
from worker.wire.protocol import PROTOCOL_MAX, PROTOCOL_MIN
from worker.wire.transport import bearer, worker_metadata


@contextlib.asynccontextmanager
async def hub_in_process(home: Path) -> AsyncIterator[app.RunningHub]:
    # Keepalive as a hub's default, not the suite's 1 s: a hand-driven stream is not
    # dialled again when a ping goes unanswered for a second on a loaded machine.
    write_config(home, "127.0.0.1:0", keepalive_s=10.0, ping_timeout_s=20.0)
    paths = Paths(home, home)
    running = await app.start_hub(paths, load(paths))
    try:
        yield running
    finally:
        await running.stop(0)


def real_worker(home: Path, address: str, name: str = "worker") -> Proc:
    """A real worker (`agentworker run`, a process of its own) dialling the hub at
    `address`, with the suite's settings (config.toml is written anew with the address:
    the hub read its own already)."""
    write_config(home, address, keepalive_s=10.0, ping_timeout_s=20.0)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTWORKER_", "HTTP"))}
    env["AGENTWORKER_HOME"] = str(home)
    env["PYTHONUNBUFFERED"] = "1"
    return Proc(name, ["run"], env, home / f"{name}.log").start()


async def until_connected(running: app.RunningHub, proc: Proc, count: int = 1) -> list[str]:
    """Wait until `count` workers are connected to the hub in this loop (the ids), or
    raise with the log of `proc` if it exits first."""
    while len(running.hub.sessions) < count:
        if not proc.running():
            raise AssertionError(f"{proc.name} exited early:\n{proc.log()}")
        await asyncio.sleep(0.02)  # the hub runs in this loop: it is not held up
    return list(running.hub.sessions)


async def stop_worker(proc: Proc) -> None:
    """SIGTERM, waited for off the loop (the hub in it serves the worker's goodbye)."""
    if proc.running():
        proc.signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(proc.wait, 30)
        except subprocess.TimeoutExpired:
            proc.kill()


def token_of(home: Path, name: str = "hub.token") -> str:
    return (home / name).read_text().strip()


def own_channel(address: str) -> grpc.aio.Channel:
    """A channel on a connection of its own (gRPC shares one between channels to the
    same address with the same options, and the hub tells callers by connection)."""
    return grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])


def caller_metadata(home: Path) -> tuple[tuple[str, str], ...]:
    return bearer(token_of(home))


def probe_request(worker_id: str, plan_id: str = "") -> pb.DispatchRequest:
    """A Dispatch of workerDiag.probe (an action with no effect) to `worker_id`."""
    return pb.DispatchRequest(
        worker_id=worker_id,
        agent_id="tester",
        plan_id=plan_id,
        surface="workerDiag",
        action="probe",
        args_json="{}",
    )


async def probe(channel: grpc.aio.Channel, home: Path, worker_id: str) -> None:
    """Dispatch a probe to `worker_id` as the person's caller and check it ran: the
    worker is still served."""
    stub = pb_grpc.ControlServiceStub(channel)
    reply = await stub.Dispatch(
        probe_request(worker_id), metadata=caller_metadata(home), timeout=60
    )
    assert reply.result.status == pb.ActionResult.OK, reply.result


class HandWorker:
    """A worker stream opened with the workers' token: it says Hello (or `first`), then
    sends what the test gives it, and keeps what the hub sends, by kind."""

    def __init__(
        self,
        address: str,
        home: Path,
        *,
        first: pb.WorkerEnvelope | None = None,
        hello: pb.Hello | None = None,
        key: str | None = None,
    ) -> None:
        self.key = key or uuid.uuid4().hex  # its worker key (a worker's own, kept)
        self.worker_id = hello.worker_id if hello else "hand-" + uuid.uuid4().hex[:8]
        self.hello = hello or pb.Hello(
            worker_id=self.worker_id,
            instance_id=uuid.uuid4().hex,
            version="hand",
            protocol_min=PROTOCOL_MIN,
            protocol_max=PROTOCOL_MAX,
            surfaces=["workerDiag"],
            actions=["workerDiag.probe"],
            max_concurrency=4,
        )
        self.received: dict[str, list[Any]] = {}
        self.came = asyncio.Event()
        self._out: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._channel = own_channel(address)
        opening = first or pb.WorkerEnvelope(messages=[pb.WorkerMessage(hello=self.hello)])

        async def envelopes() -> AsyncIterator[bytes]:
            yield opening.SerializeToString()
            while (raw := await self._out.get()) is not None:
                yield raw

        call = self._channel.stream_stream(
            "/agentworker.v1.WorkerService/Stream",
            request_serializer=None,
            response_deserializer=pb.ServerEnvelope.FromString,
        )
        metadata = worker_metadata(token_of(home, "hub-workers.token"), self.key)
        self.call = call(envelopes(), metadata=metadata)
        self._task = asyncio.ensure_future(self._serve())

    def send(self, *messages: pb.WorkerMessage) -> None:
        self.send_raw(pb.WorkerEnvelope(messages=list(messages)).SerializeToString())

    def send_raw(self, envelope: bytes) -> None:
        self._out.put_nowait(envelope)

    async def _serve(self) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for envelope in self.call:
                for msg in envelope.messages:
                    kind = msg.WhichOneof("kind") or ""
                    self.received.setdefault(kind, []).append(getattr(msg, kind) if kind else msg)
                self.came.set()
        self.came.set()

    async def until(self, kind: str, count: int = 1, *, or_end: bool = False) -> list[Any]:
        """What the hub sent of `kind`, once it sent `count` of them; if the stream ends
        first, an AssertionError with its status (or, `or_end`, what came)."""
        while len(self.received.get(kind, [])) < count and not self._task.done():
            self.came.clear()
            await self.came.wait()
        got = self.received.get(kind, [])
        if len(got) < count and not or_end:
            code, details = await self.call.code(), await self.call.details()
            raise AssertionError(f"the stream ended ({code}: {details}) before {count} {kind}")
        return got

    async def ended(self) -> grpc.StatusCode:
        await self._task
        return await self.call.code()

    async def close(self) -> None:
        self._out.put_nowait(None)
        self.call.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await self._task
        await self._channel.close()
