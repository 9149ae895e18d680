"""A ControlService request is read when its turn comes (worker.hub.server
`_read_in_turn`, review8 finding 09): a call whose request does not arrive gives the
turn back with a clear refusal. A real gRPC server and client over loopback; the one
thing shortened is how long a request may take to arrive (10 s in the hub). And the
turns themselves (worker.hub.turns): one connection holds at most its share."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from worker.hub import server
from worker.hub.turns import Turns


async def _echo(request: bytes, _context: Any) -> bytes:
    return b"read: " + request


def test_a_request_that_does_not_arrive_gives_its_turn_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(server, "CONTROL_READ_WITHIN_S_OTHERWISE", 0.5)

    async def go() -> None:
        turns = Turns(1)
        read = server._read_in_turn("ListWorkers", _echo, turns)
        handler = grpc.stream_unary_rpc_method_handler(read)
        hub = grpc.aio.server()
        hub.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("t.T", {"Status": handler}),)
        )
        port = hub.add_insecure_port("127.0.0.1:0")
        await hub.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        try:
            held = channel.stream_stream("/t.T/Status")()  # takes the one turn, sends nothing
            while not turns.held():  # the server runs on this loop
                await asyncio.sleep(0.01)
            waiting = channel.unary_unary("/t.T/Status")(b"hello", timeout=60)
            assert await held.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert await held.details() == (
                "the ListWorkers request did not arrive within 0.5 s of its turn to be read; "
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


def test_one_peer_holds_at_most_its_share_and_others_pass_it() -> None:
    async def go() -> None:
        turns = Turns(2, per_peer=1)
        order: list[str] = []
        release: dict[str, asyncio.Event] = {}

        async def take(peer: str, name: str) -> None:
            async with turns.turn(peer):
                order.append(name)
                release[name] = asyncio.Event()
                await release[name].wait()

        async def settled() -> None:
            for _ in range(5):  # every task that can move has moved
                await asyncio.sleep(0)

        a1 = asyncio.ensure_future(take("a", "a1"))
        a2 = asyncio.ensure_future(take("a", "a2"))
        await settled()
        assert order == ["a1"] and turns.held("a") == 1 and turns.waiting() == 1
        b1 = asyncio.ensure_future(take("b", "b1"))  # came after a2, passes it
        c1 = asyncio.ensure_future(take("c", "c1"))
        await settled()
        assert order == ["a1", "b1"] and turns.waiting() == 2
        release["a1"].set()  # a's turn back: a2 came before c1 and may hold one again
        await settled()
        assert order == ["a1", "b1", "a2"]
        c1.cancel()  # a call that goes away while it waits leaves no trace
        await settled()
        assert turns.waiting() == 0
        release["b1"].set()
        release["a2"].set()
        await asyncio.gather(a1, a2, b1)
        assert turns.held() == 0 and turns.held("a") == 0

    asyncio.run(go())


def test_a_turn_handed_to_a_call_that_goes_away_comes_back() -> None:
    async def go() -> None:
        turns = Turns(1)
        holding = turns.turn("a")
        await holding.__aenter__()

        async def wait_turn() -> None:
            async with turns.turn("b"):
                pass

        waiter = asyncio.ensure_future(wait_turn())
        await asyncio.sleep(0)
        assert turns.waiting() == 1
        await holding.__aexit__(None, None, None)  # hands the turn on, without a loop turn
        assert turns.held("b") == 1
        waiter.cancel()  # before it ran with it
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert turns.held() == 0 and turns.waiting() == 0
        async with turns.turn("c"):
            assert turns.held("c") == 1

    asyncio.run(go())
