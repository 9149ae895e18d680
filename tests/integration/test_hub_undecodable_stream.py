"""A worker stream message that does not decode as a WorkerEnvelope, first or later,
ends the stream INVALID_ARGUMENT with a message a person can act on, and the hub logs
it in one line, no traceback; so does a stream that ends or says nothing before its
Hello (DEADLINE_EXCEEDED) (gRPC's deserializer logged a DecodeError's traceback for
each and answered UNKNOWN); a client looping on it does not fill the log. A real hub
in the test's loop and a real worker process, served throughout; the hostile client is
a raw gRPC stream (the far side of the boundary)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from pathlib import Path

import grpc
import pytest

from tests.support.hub_inproc import (
    hub_in_process,
    own_channel,
    probe,
    real_worker,
    stop_worker,
    token_of,
    until_connected,
)
from worker.hub import server
from worker.hub.hellos import REFUSED_LINES_BURST
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.protocol import PROTOCOL_MAX, PROTOCOL_MIN, STREAM_METHOD
from worker.wire.transport import worker_metadata

GARBAGE = b"\xff\xff\xff"
LOOPS = 30


def test_an_undecodable_stream_message_is_refused_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger's, gRPC's own too
    home = tmp_path / "home"

    async def go() -> None:
        async with hub_in_process(home) as running:
            worker = real_worker(home, running.address)
            channel = own_channel(running.address)
            try:
                (worker_id,) = await until_connected(running, worker)
                running.hub.stream_refusals.rate.per_s = 1e-9  # the burst alone: exact
                token = token_of(home, "hub-workers.token")

                async def raw(*messages: bytes) -> tuple[grpc.StatusCode, str]:
                    call = channel.stream_stream(STREAM_METHOD, request_serializer=None)(
                        metadata=worker_metadata(token, uuid.uuid4().hex)
                    )
                    for message in messages:
                        await call.write(message)
                    with contextlib.suppress(grpc.aio.AioRpcError):  # the refusal, read
                        while await call.read() is not grpc.aio.EOF:
                            pass  # a Welcome: the status comes after what was sent
                    return await call.code(), await call.details() or ""

                caplog.clear()
                code, details = await raw(GARBAGE)
                assert code == grpc.StatusCode.INVALID_ARGUMENT, details
                assert details.startswith(
                    "a stream message of 3 bytes does not decode as an "
                    "agentworker.v1.WorkerEnvelope: "
                ), details
                assert "is this an agentworker worker" in details
                lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
                assert len(lines) == 1, [r.getMessage() for r in lines]
                assert "refused a worker stream before its Hello" in lines[0].getMessage()
                assert not any(r.exc_info for r in caplog.records)
                assert "Traceback" not in caplog.text and "DecodeError" not in caplog.text

                # After a Hello: the same answer, one line, and the stream is ended.
                hello = pb.Hello(
                    worker_id="garbled",
                    instance_id=uuid.uuid4().hex,
                    version="raw",
                    protocol_min=PROTOCOL_MIN,
                    protocol_max=PROTOCOL_MAX,
                )
                opening = pb.WorkerEnvelope(messages=[pb.WorkerMessage(hello=hello)])
                caplog.clear()
                code, details = await raw(opening.SerializeToString(), GARBAGE + GARBAGE)
                assert code == grpc.StatusCode.INVALID_ARGUMENT, details
                assert "6 bytes does not decode" in details
                lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
                assert len(lines) == 1, [r.getMessage() for r in lines]
                assert lines[0].getMessage().startswith("worker garbled: ")
                assert "Traceback" not in caplog.text and "DecodeError" not in caplog.text

                # A stream that ends, or says nothing, before its Hello: answered too.
                caplog.clear()
                call = channel.stream_stream(STREAM_METHOD, request_serializer=None)(
                    metadata=worker_metadata(token, uuid.uuid4().hex)
                )
                await call.done_writing()
                assert await call.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "ended before its Hello" in (await call.details() or "")
                with pytest.MonkeyPatch.context() as patch:
                    patch.setattr(server, "HANDSHAKE_TIMEOUT_S", 0.2)  # read as a stream begins
                    silent = channel.stream_stream(STREAM_METHOD, request_serializer=None)(
                        metadata=worker_metadata(token, uuid.uuid4().hex)
                    )
                    assert await silent.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                    assert "no Hello came within 0.2 s" in (await silent.details() or "")
                lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
                assert len(lines) == 2, [r.getMessage() for r in lines]
                assert not any(r.exc_info for r in caplog.records)
                assert "Traceback" not in caplog.text

                # A client looping on it: each answered, the lines bounded.
                caplog.clear()
                for _ in range(LOOPS):
                    code, _details = await raw(GARBAGE)
                    assert code == grpc.StatusCode.INVALID_ARGUMENT
                lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
                assert len(lines) == REFUSED_LINES_BURST - 3, [r.getMessage() for r in lines]
                assert running.hub.stream_refusals.left_out == LOOPS - len(lines)
                assert "Traceback" not in caplog.text

                # The real worker was served throughout.
                assert list(running.hub.sessions) == [worker_id]
                await probe(channel, home, worker_id)
            finally:
                await channel.close()
                await stop_worker(worker)

    asyncio.run(go())
