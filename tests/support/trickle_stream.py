"""A hostile worker stream spoken in raw HTTP/2 (h2), the far side of the hub's
boundary: gRPC's own client opens its receive windows as it reads, so it cannot play a
stream that reads only what the test lets it. This one opens a WorkerService.Stream with
the workers' token and a receive window of 0, says Hello, and then takes only the bytes
the test grants it (`grant`), sending the heartbeats the test gives it."""

from __future__ import annotations

import asyncio
import contextlib
import struct
import uuid

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.protocol import PROTOCOL_MAX, PROTOCOL_MIN
from worker.wire.transport import worker_metadata


def _grpc_message(payload: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(payload)) + payload


class TrickleStream:
    """One TCP connection, one WorkerService.Stream, its windows shut but for what the
    test grants. `received` counts the bytes of the hub's envelopes that came;
    `ended` says how the stream ended ("" while open)."""

    def __init__(self, address: str, token: str, worker_id: str, key: str = "") -> None:
        self.host, _, port = address.rpartition(":")
        self.port = int(port)
        self.token = token
        self.worker_id = worker_id
        self.key = key or uuid.uuid4().hex
        self.received = 0
        self.came = asyncio.Event()
        self.ended = ""

    async def open(self) -> None:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        self._conn = h2.connection.H2Connection(config=config)
        self._conn.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0,
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
            },
        )
        self._conn.initiate_connection()
        self._sid = self._conn.get_next_available_stream_id()
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/agentworker.v1.WorkerService/Stream"),
            (":authority", f"{self.host}:{self.port}"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            *worker_metadata(self.token, self.key),
        ]
        self._conn.send_headers(self._sid, headers)
        hello = pb.Hello(
            worker_id=self.worker_id,
            instance_id=uuid.uuid4().hex,
            version="trickle",
            protocol_min=PROTOCOL_MIN,
            protocol_max=PROTOCOL_MAX,
        )
        self._send(pb.WorkerMessage(hello=hello))
        await self._flush()
        self._pump = asyncio.ensure_future(self._read())

    def _send(self, *messages: pb.WorkerMessage) -> None:
        envelope = pb.WorkerEnvelope(messages=messages).SerializeToString()
        self._conn.send_data(self._sid, _grpc_message(envelope))

    async def _flush(self) -> None:
        data = self._conn.data_to_send()
        if data:
            self._writer.write(data)
            await self._writer.drain()

    async def _read(self) -> None:
        try:
            while data := await self._reader.read(65536):
                for event in self._conn.receive_data(data):
                    if isinstance(event, h2.events.DataReceived):
                        # Never acknowledged: only `grant` opens the windows again.
                        self.received += event.flow_controlled_length
                    elif isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
                        self.ended = type(event).__name__
                    elif isinstance(event, h2.events.ConnectionTerminated):
                        self.ended = f"GOAWAY {event.error_code!r}"
                self.came.set()
                await self._flush()
            self.ended = self.ended or "connection closed"
        except (OSError, h2.exceptions.ProtocolError) as exc:
            self.ended = self.ended or repr(exc)
        self.came.set()

    async def grant(self, size: int, *, kills_through: int = 0, beats: int = 1) -> None:
        """Open the stream's windows `size` bytes more, and send an envelope of `beats`
        heartbeats, each saying the worker recorded the hub's kills through
        `kills_through`."""
        self._conn.increment_flow_control_window(size)
        self._conn.increment_flow_control_window(size, stream_id=self._sid)
        beat = pb.Heartbeat(state=pb.Heartbeat.AVAILABLE, kills_through=kills_through)
        self._send(*[pb.WorkerMessage(heartbeat=beat)] * beats)
        await self._flush()

    async def until_received(self, size: int) -> None:
        """Wait until `size` bytes of the hub's came (or the stream ended)."""
        while self.received < size and not self.ended:
            self.came.clear()
            await self.came.wait()

    async def close(self) -> None:
        self._pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._pump
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()
