"""A hub that does exactly what a test tells it — including what a good hub never would.

It is the far side of the worker's stream: tests use it to re-send ids with other
args, cancel, kill plans, withhold acks, drop the stream or speak another protocol
version, and read every message the worker sends back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from worker.wire.auth import BearerAuth
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.proto import agentworker_pb2_grpc as pb_grpc
from worker.wire.protocol import WORKER_SERVICE
from worker.wire.transport import MAX_MESSAGE_BYTES

TOKEN = "scripted-token"


class ScriptedHub(pb_grpc.WorkerServiceServicer):
    # Channel arguments of its gRPC server beside the message limits.
    server_options: tuple[tuple[str, int], ...] = ()

    def __init__(
        self, *, protocol: int = 1, ack_results: bool = True, heartbeat_ms: int = 0
    ) -> None:
        self.protocol = protocol
        self.heartbeat_ms = heartbeat_ms  # promised in Welcome, never sent: a hung server
        self.ack_results = ack_results
        self.inbox: asyncio.Queue[pb.WorkerMessage] = asyncio.Queue()
        self.hellos: list[pb.Hello] = []
        self._dialled = asyncio.Condition()
        # What goes down the stream, one envelope each: a message, or raw envelope bytes.
        self._outbox: asyncio.Queue[pb.ServerMessage | bytes | None] = asyncio.Queue()
        self._server: grpc.aio.Server | None = None
        self.address = ""

    async def start(self) -> str:
        # A real hub's message limits: a worker's envelope of results may pass gRPC's 4 MiB.
        limits = [
            (f"grpc.max_{way}_message_length", MAX_MESSAGE_BYTES) for way in ("send", "receive")
        ]
        self._server = grpc.aio.server(options=[*limits, *self.server_options])
        # Registered by hand, not with the generated helper, so that raw bytes (an
        # envelope no honest hub would send) go out as they are.
        handler = grpc.stream_stream_rpc_method_handler(
            self.Stream,
            request_deserializer=pb.WorkerEnvelope.FromString,
            response_serializer=_as_bytes,
        )
        routes = grpc.method_handlers_generic_handler(WORKER_SERVICE, {"Stream": handler})
        self._server.add_generic_rpc_handlers((BearerAuth(TOKEN, [routes]),))
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        self.address = f"127.0.0.1:{port}"
        return self.address

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)

    def send(self, **message: Any) -> None:
        self._outbox.put_nowait(pb.ServerMessage(**message))

    def request(self, cid: str, args: str = "{}", **fields: Any) -> None:
        fields.setdefault("surface", "workerDiag")
        fields.setdefault("action", "probe")
        fields.setdefault("agent_id", "tester")
        self.send(request=pb.ActionRequest(correlation_id=cid, args_json=args, attempt=1, **fields))

    def send_raw(self, envelope: bytes) -> None:
        """Bytes as the worker will read them for one ServerEnvelope, well-formed or not."""
        self._outbox.put_nowait(envelope)

    def hang_up(self) -> None:
        self._outbox.put_nowait(None)

    async def dials(self, count: int, timeout: float = 10.0) -> None:
        """Wait until the worker has said Hello `count` times in all."""
        async with asyncio.timeout(timeout), self._dialled:
            await self._dialled.wait_for(lambda: len(self.hellos) >= count)

    async def next(self, kind: str, timeout: float = 10.0) -> Any:
        """The next message of `kind` from the worker (others are skipped)."""
        async with asyncio.timeout(timeout):
            while True:
                msg = await self.inbox.get()
                if msg.WhichOneof("kind") == kind:
                    return getattr(msg, kind)

    async def Stream(  # noqa: N802
        self, request_iterator: AsyncIterator[pb.WorkerEnvelope], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ServerEnvelope | bytes]:
        first = await anext(request_iterator)
        async with self._dialled:
            self.hellos.append(first.messages[0].hello)
            self._dialled.notify_all()
        welcome = pb.Welcome(
            session_id="s", protocol=self.protocol, heartbeat_interval_ms=self.heartbeat_ms
        )
        yield pb.ServerEnvelope(messages=[pb.ServerMessage(welcome=welcome)])
        reader = asyncio.create_task(self._read(request_iterator))
        try:
            while (msg := await self._outbox.get()) is not None:
                # One at a time: the script's order.
                yield msg if isinstance(msg, bytes) else pb.ServerEnvelope(messages=[msg])
        finally:
            reader.cancel()

    async def _read(self, requests: AsyncIterator[pb.WorkerEnvelope]) -> None:
        async for envelope in requests:
            for msg in envelope.messages:
                self.inbox.put_nowait(msg)
                if msg.WhichOneof("kind") == "result" and self.ack_results:
                    self.send(ack=pb.Ack(correlation_ids=[msg.result.correlation_id]))


def _as_bytes(envelope: pb.ServerEnvelope | bytes) -> bytes:
    return envelope if isinstance(envelope, bytes) else envelope.SerializeToString()
