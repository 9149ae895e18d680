"""A ControlService request is read when its turn comes (worker.hub.server
`_read_in_turn`, review8 finding 09): a call whose request does not arrive gives the
turn back with a clear refusal. A real gRPC server and client over loopback; the one
thing shortened is how long a request may take to arrive (30 s in the hub)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from worker.hub import server


async def _echo(request: bytes, _context: Any) -> bytes:
    return b"read: " + request


def test_a_request_that_does_not_arrive_gives_its_turn_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(server, "CONTROL_READ_WITHIN_S_OTHERWISE", 0.5)

    async def go() -> None:
        turns = asyncio.Semaphore(1)
        handler = grpc.stream_unary_rpc_method_handler(server._read_in_turn("Status", _echo, turns))
        hub = grpc.aio.server()
        hub.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("t.T", {"Status": handler}),)
        )
        port = hub.add_insecure_port("127.0.0.1:0")
        await hub.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        try:
            held = channel.stream_stream("/t.T/Status")()  # takes the one turn, sends nothing
            while not turns.locked():  # the server runs on this loop
                await asyncio.sleep(0.01)
            waiting = channel.unary_unary("/t.T/Status")(b"hello", timeout=60)
            assert await held.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert await held.details() == (
                "the Status request did not arrive within 0.5 s of its turn to be read; "
                "send the request whole when the call begins"
            )
            assert await waiting == b"read: hello"  # the turn was given back
            empty = channel.stream_stream("/t.T/Status")()
            await empty.done_writing()
            assert await empty.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert await empty.details() == "the call carried no request"
        finally:
            await channel.close()
            await hub.stop(None)

    asyncio.run(go())
