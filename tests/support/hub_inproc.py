"""A real hub (worker.app.start_hub: its gRPC server, auth and services) in the test's own
event loop, so that a test can look at its state and change its timings, and a worker
stream for it that a test drives by hand: the far side of the hub's boundary.

`driven_hub` is the set-up most hub tests share: the hub, the person's caller on a
connection of its own (`Caller`), the hand-driven streams the test opens, a wait on the
hub's state that wakes as the hub changes it, all closed as the test ends."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from tests.support.cluster import Proc, write_config
from worker import app
from worker.config import Paths, load
from worker.hub.session import Session
from worker.hub.store import HubStore
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


def real_worker(
    home: Path, address: str, name: str = "worker", *argv: str, env: dict[str, str] | None = None
) -> Proc:
    """A real worker (`agentworker run ARGV...`, a process of its own) dialling the hub
    at `address`, with the suite's settings (config.toml is written anew with the
    address: the hub read its own already) and `env` (AGENTWORKER_* overrides)."""
    write_config(home, address, keepalive_s=10.0, ping_timeout_s=20.0)
    inherited = os.environ.items()
    env = {k: v for k, v in inherited if not k.startswith(("AGENTWORKER_", "HTTP"))} | (env or {})
    env["AGENTWORKER_HOME"] = str(home)
    env["PYTHONUNBUFFERED"] = "1"
    return Proc(name, ["run", *argv], env, home / f"{name}.log").start()


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


def hand_hello(worker_id: str, **fields: Any) -> pb.Hello:
    """A hand-driven stream's Hello as `worker_id`, in the protocols this hub speaks (a
    new instance id unless `fields` name one)."""
    fields.setdefault("instance_id", uuid.uuid4().hex)
    return pb.Hello(
        worker_id=worker_id,
        version="hand",
        protocol_min=PROTOCOL_MIN,
        protocol_max=PROTOCOL_MAX,
        **fields,
    )


def worker_cli(home: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`agentworker ARGV...` for the worker whose data folder is `home` (blocking: call it
    off the loop, the hub in it must answer the worker meanwhile)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTWORKER_")}
    env["AGENTWORKER_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "worker", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def lift(home: Path, plan: str) -> None:
    """The person lifts the plan's kill at the worker of `home` (`agentworker lift`)."""
    done = worker_cli(home, "lift", plan)
    assert done.returncode == 0, done.stderr


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
        self.hello = hello or hand_hello(
            self.worker_id,
            surfaces=["workerDiag"],
            actions=["workerDiag.probe"],
            max_concurrency=4,
        )
        self.received: dict[str, list[Any]] = {}
        self.came = asyncio.Event()
        self._closed = False
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
        """End the stream and its channel (again: nothing more)."""
        if self._closed:
            return
        self._closed = True
        self._out.put_nowait(None)
        self.call.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await self._task
        await self._channel.close()


class Caller:
    """The person's caller of the hub's ControlService, on a connection of its own."""

    def __init__(self, address: str, home: Path) -> None:
        self.channel = own_channel(address)
        self.stub = pb_grpc.ControlServiceStub(self.channel)
        self.metadata = caller_metadata(home)

    def dispatch(self, request: pb.DispatchRequest, *, timeout: float | None) -> Any:
        """The Dispatch under way: await it for the answer, or cancel it (the caller
        hangs up)."""
        return self.stub.Dispatch(request, metadata=self.metadata, timeout=timeout)

    async def outcome(self, request: pb.DispatchRequest) -> str:
        """Its answer: "ok", or the refusal as "code: message"."""
        reply = await self.dispatch(request, timeout=120)
        if reply.result.status == pb.ActionResult.OK:
            return "ok"
        return f"{reply.result.error.code}: {reply.result.error.message}"

    async def code(self, worker_id: str, plan: str) -> str:
        """A probe of `plan` on `worker_id`: "ok", or the refusal's code."""
        reply = await self.dispatch(probe_request(worker_id, plan), timeout=120)
        return "ok" if reply.result.status == pb.ActionResult.OK else str(reply.result.error.code)

    async def kill(self, plan: str, reason: str = "stop") -> pb.KillPlanResponse:
        reply: pb.KillPlanResponse = await self.stub.KillPlan(
            pb.KillPlanRequest(plan_id=plan, reason=reason), metadata=self.metadata, timeout=60
        )
        return reply

    async def close(self) -> None:
        await self.channel.close()


class DrivenHub:
    """A real hub in this loop (`running`, `hub`), the person's `caller`, and the
    hand-driven worker streams and real workers the test opens through it (closed by
    `close`).

    `until` waits on the hub's state without a clock: the hub changes what the tests look
    at (its sessions, what their workers said, the calls it keeps) only where it takes a
    worker's Hello (store.seen_worker), lets a session go (store.touch_worker), handles a
    stream's envelope (_handle_all) or keeps a call (store.add), and each of those wakes
    the waits here."""

    def __init__(self, running: app.RunningHub, home: Path) -> None:
        self.running = running
        self.hub = running.hub
        self.home = home
        self.address = running.address
        self.caller = Caller(running.address, home)
        self._hands: list[HandWorker] = []
        self._workers: list[Proc] = []
        self._closes: list[Callable[[], Awaitable[object]]] = []
        self._moved = asyncio.Event()
        store = self.hub.store
        for owner, name in (
            (store, "seen_worker"),
            (store, "touch_worker"),
            (store, "add"),
            (self.hub, "_handle_all"),
        ):
            setattr(owner, name, self._waking(getattr(owner, name)))

    @property
    def sessions(self) -> dict[str, Session]:
        return self.hub.sessions

    @property
    def store(self) -> HubStore:
        return self.hub.store

    def _waking(self, change: Callable[..., Any]) -> Callable[..., Any]:
        def changed(*args: Any, **kwargs: Any) -> Any:
            try:
                return change(*args, **kwargs)
            finally:
                self._moved.set()

        return changed

    async def until(self, condition: Callable[[], object]) -> None:
        """Until `condition()` holds, looked at again each time the hub's state moves."""
        while not condition():
            self._moved.clear()
            await self._moved.wait()

    def hand(self, **kwargs: Any) -> HandWorker:
        """A hand-driven stream (HandWorker's `hello`, `key`, `first`), opened now."""
        worker = HandWorker(self.address, self.home, **kwargs)
        self._hands.append(worker)
        return worker

    async def welcomed(self, **kwargs: Any) -> HandWorker:
        """A hand-driven stream once its Welcome came."""
        worker = self.hand(**kwargs)
        await worker.until("welcome")
        return worker

    async def gone(self, worker: HandWorker) -> None:
        """Close `worker`'s stream and wait until the hub let go of its session."""
        await worker.close()
        await self.until(lambda: worker.worker_id not in self.sessions)

    async def away(self, **kwargs: Any) -> HandWorker:
        """A worker the hub remembers, away: it said Hello and left."""
        worker = await self.welcomed(**kwargs)
        await self.gone(worker)
        return worker

    async def real_worker(
        self, server: str | None = None, env: dict[str, str] | None = None
    ) -> Proc:
        """A real worker (`agentworker run`) of the hub's folder, once the hub has a
        session (`until_connected`): dialling the hub, or `server` (a relay to it), with
        `env` (AGENTWORKER_* overrides)."""
        # A relay is another address: the workers' token goes there only when given.
        token = str(self.home / "hub-workers.token")
        argv = ("--server", server, "--token-file", token) if server else ()
        worker = real_worker(self.home, self.address, "worker", *argv, env=env)
        self._workers.append(worker)
        await until_connected(self.running, worker)
        return worker

    def at_close(self, close: Callable[[], Awaitable[object]]) -> None:
        """Await `close()` as the test ends (another far side: a trickle stream...)."""
        self._closes.append(close)

    def back(self, first: HandWorker) -> HandWorker:
        """A new stream of `first`'s worker: its Hello, its key."""
        return self.hand(hello=first.hello, key=first.key)

    async def until_confirmed(self, worker_id: str) -> None:
        """Until the connected worker confirmed every kill the hub keeps for it."""
        last = max(k.seq for k in self.store.kills_after(worker_id, 0))
        await self.until(
            lambda: (
                (session := self.sessions.get(worker_id)) is not None
                and session.kills_through >= last
            )
        )

    async def close(self) -> None:
        for proc in self._workers:
            await stop_worker(proc)
        for worker in self._hands:
            await worker.close()
        for close in self._closes:
            await close()
        await self.caller.close()


@contextlib.asynccontextmanager
async def driven_hub(home: Path) -> AsyncIterator[DrivenHub]:
    """`hub_in_process` with its caller and hand-driven streams, closed as it ends."""
    async with hub_in_process(home) as running:
        driven = DrivenHub(running, home)
        try:
            yield driven
        finally:
            await driven.close()
