"""A ControlService request is read when its turn comes (worker.hub.services
`_read_in_turn`, review8 finding 09): a call whose request does not arrive gives the
turn back with a clear refusal. A real gRPC server and client over loopback; the one
thing shortened is how long a request may take to arrive (10 s in the hub). And the
turns themselves (worker.hub.turns): one connection holds at most its share."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from worker.hub import reads, services
from worker.hub.health import address_of
from worker.hub.turns import Turns
from worker.wire import framing
from worker.wire.proto import agentworker_pb2 as pb


async def _echo(request: bytes, _context: Any) -> bytes:
    return b"read: " + request


def test_a_request_that_does_not_arrive_gives_its_turn_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reads, "CONTROL_READ_WITHIN_S_OTHERWISE", 0.5)

    async def go() -> None:
        turns = Turns(1)
        read = services._read_in_turn("ListWorkers", _echo, turns)
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


class _Holders:
    """Calls taking turns of `turns`, each holding its turn until released by name;
    `order` says in which order they got them."""

    def __init__(self, turns: Turns) -> None:
        self.turns = turns
        self.order: list[str] = []
        self.release: dict[str, asyncio.Event] = {}

    async def take(self, peer: str, name: str) -> None:
        async with self.turns.turn(peer):
            self.order.append(name)
            self.release[name] = asyncio.Event()
            await self.release[name].wait()


async def _settled() -> None:
    for _ in range(5):  # every task that can move has moved
        await asyncio.sleep(0)


def test_one_peer_holds_at_most_its_share_and_others_pass_it() -> None:
    async def go() -> None:
        turns = Turns(2, per_peer=1)
        holders = _Holders(turns)
        order, release, take, settled = holders.order, holders.release, holders.take, _settled

        a1 = asyncio.ensure_future(take("a", "a1"))
        a2 = asyncio.ensure_future(take("a", "a2"))
        await settled()
        assert order == ["a1"] and turns.held("a") == 1 and turns.waiting() == 1
        b1 = asyncio.ensure_future(take("b", "b1"))  # came after a2, passes it
        c1 = asyncio.ensure_future(take("c", "c1"))
        await settled()
        assert order == ["a1", "b1"] and turns.waiting() == 2
        # a's turn back: a2 came before c1, but c has not been served, a has
        release["a1"].set()
        await settled()
        assert order == ["a1", "b1", "c1"]
        a2.cancel()  # a call that goes away while it waits leaves no trace
        await settled()
        assert turns.waiting() == 0
        release["b1"].set()
        release["c1"].set()
        await asyncio.gather(a1, b1, c1)
        assert turns.held() == 0 and turns.held("a") == 0

    asyncio.run(go())


def test_a_turn_goes_round_the_connections_not_to_the_earliest_call() -> None:
    """Two connections queue many calls whose requests never come (each holds a turn
    until its read time is up); another caller's call, come last, is handed the first
    turn given back, not the queuers' next calls (review12 finding 03)."""

    async def go() -> None:
        turns = Turns(2, per_peer=1)
        holders = _Holders(turns)
        order, release, take, settled = holders.order, holders.release, holders.take, _settled

        calls = [
            asyncio.ensure_future(take(peer, f"{peer}{i}")) for i in range(12) for peer in "ab"
        ]
        await settled()
        victim = asyncio.ensure_future(take("v", "v0"))
        await settled()
        assert order == ["a0", "b0"] and turns.waiting() == 23
        release["a0"].set()
        await settled()
        assert order == ["a0", "b0", "v0"]
        release["b0"].set()  # then the queuers, each in turn
        await settled()
        release["v0"].set()
        await settled()
        assert order[3:5] == ["a1", "b1"]
        for call in calls:
            call.cancel()
        await asyncio.gather(*calls, victim, return_exceptions=True)
        assert turns.held() == 0 and turns.waiting() == 0

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


def test_a_wait_asked_without_a_task_leaves_the_queue_when_woken_or_gives_its_turn_back() -> None:
    """Turns.ask (the hub's idle worker streams wait so, worker.hub.server Hub._next):
    one future, resolved True with a turn or False by whoever wakes it; withdrawn, a
    woken wait leaves the queue and a turn handed to it goes back."""

    async def go() -> None:
        turns = Turns(1)
        assert turns.ask("a") is None  # held at once
        woken = turns.ask("b")
        assert woken is not None and turns.waiting() == 1
        woken.set_result(False)  # a send woke it before its turn came
        turns.withdraw("b", woken)
        assert turns.waiting() == 0
        handed = turns.ask("c")
        assert handed is not None
        turns.give_back("a")  # hands the turn to c's wait, not to b's woken one
        assert handed.done() and handed.result() is True
        assert turns.held("c") == 1 and turns.held("b") == 0
        turns.withdraw("c", handed)  # its reader went away with the turn handed
        assert turns.held() == 0 and turns.waiting() == 0
        assert turns.ask("d") is None

    asyncio.run(go())


def test_a_call_of_a_higher_rank_takes_a_turn_only_when_no_lower_one_waits() -> None:
    """gRPC health ranks the calls of connections and addresses whose requests came late
    (worker.hub.health): they are handed a turn only when no call of a lower rank waits
    that may take it, and a call's rank may rise while it waits."""

    async def go() -> None:
        turns = Turns(1, per_peer=1)
        order: list[str] = []
        release: dict[str, asyncio.Event] = {}

        async def take(peer: str, name: str, rank: int = 0) -> None:
            async with turns.turn(peer, rank=rank):
                order.append(name)
                release[name] = asyncio.Event()
                await release[name].wait()

        async def settled() -> None:
            for _ in range(5):  # every task that can move has moved
                await asyncio.sleep(0)

        tasks = [asyncio.ensure_future(take("a", "a1"))]
        await settled()
        tasks += [
            asyncio.ensure_future(take("late", "late1", rank=2)),
            asyncio.ensure_future(take("addr", "addr1", rank=1)),
            asyncio.ensure_future(take("b", "b1")),
            asyncio.ensure_future(take("c", "c1")),
            asyncio.ensure_future(take("a", "a2")),
        ]
        await settled()
        assert turns.waiting() == 5 and turns.waiting(2) == 1 and turns.waiting(1) == 1
        assert turns.wanting(0) == 2  # b1, c1 (a holds its share): a turn given back goes
        turns.put_behind(lambda peer: 2 if peer == "b" else 0)  # b came late meanwhile
        assert turns.waiting(0) == 2 and turns.waiting(2) == 2
        for name, then in (("a1", "c1"), ("c1", "a2"), ("a2", "addr1"), ("addr1", "late1")):
            release[name].set()
            await settled()
            assert order[-1] == then, order
        release["late1"].set()
        await settled()
        assert order[-1] == "b1", order
        release["b1"].set()
        await asyncio.gather(*tasks)
        assert turns.held() == 0 and turns.waiting() == 0

    asyncio.run(go())


def test_health_counts_a_late_address_by_its_ipv4_address_or_ipv6_64() -> None:
    """gRPC health holds an address late once enough of its connections were (worker.hub
    .health): an IPv6 caller has a /64 to pick addresses from, so that is one address."""
    assert address_of("ipv4:203.0.113.7:5000") == address_of("ipv4:203.0.113.7:6000")
    assert address_of("ipv4:203.0.113.7:5000") == "ipv4:203.0.113.7"
    assert address_of("ipv4:203.0.113.8:5000") != "ipv4:203.0.113.7"
    # gRPC names IPv6 peers percent-encoded; either way, one /64 is one address.
    assert address_of("ipv6:%5B2001:db8::1%5D:5000") == "ipv6:2001:db8::/64"
    assert address_of("ipv6:[2001:db8::ffff:1]:6000") == "ipv6:2001:db8::/64"
    assert address_of("ipv6:%5B2001:db8:0:1::1%5D:5000") == "ipv6:2001:db8:0:1::/64"
    assert address_of("ipv6:%5Bfe80::1%25eth0%5D:5000") == "ipv6:fe80::/64"
    assert address_of("ipv6:%5B::ffff:203.0.113.7%5D:5000") == "ipv4:203.0.113.7"
    assert address_of("unix:") == "unix:"
    assert address_of("ipv4:not-an-address:1") == "ipv4:not-an-address:1"


def _field(number: int, value: bytes) -> bytes:
    """A length-delimited field, as the wire has it."""
    head, length = bytearray([number << 3 | 2]), len(value)
    while length > 0x7F:
        head.append(length & 0x7F | 0x80)
        length >>= 7
    head.append(length)
    return bytes(head) + value


def test_a_dispatch_is_measured_before_it_is_parsed_and_parsed_once() -> None:
    """What a Dispatch carries besides its blob is measured on the wire: past
    DISPATCH_BESIDES_BLOB_BYTES it is refused unparsed (a request padded to 31 MiB with
    an unknown field was parsed with it and kept while answered), and a request that
    does not decode is not parsed a second time, blob and all."""
    head = pb.DispatchRequest(agent_id="a", surface="workerDiag", action="probe")
    limit = services.DISPATCH_BESIDES_BLOB_BYTES
    padded = head.SerializeToString() + _field(15, b"x" * limit) + _field(10, b"b" * 100)
    refused = services._dispatch_request(padded)
    assert isinstance(refused, services._Refused)
    assert refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    besides = len(padded) - 100
    assert refused.message == (
        f"the Dispatch request carries {besides:,} bytes besides its blob, over the "
        f"{limit:,} a call's ids and args_json take (args_json: 1,048,576 characters at "
        "most); bulk data goes in blob"
    )
    # The most args_json a worker takes (in characters) passes, with a blob of any size.
    widest = pb.DispatchRequest(agent_id="a", args_json="\U0001f600" * (1024 * 1024))
    taken = services._dispatch_request(widest.SerializeToString() + _field(10, b"b" * limit))
    assert isinstance(taken, services._WithBlob) and len(taken.blob) == limit
    assert taken.request.args_json == widest.args_json and not taken.request.blob
    # Invalid UTF-8 beside a blob, or more fields than a DispatchRequest has: undecodable.
    for bad in (
        head.SerializeToString() + _field(4, b"\xff") + _field(10, b"b" * 100),
        _field(4, b"a") * (services.DISPATCH_FIELDS + 1),
    ):
        assert isinstance(services._dispatch_request(bad), services._Undecodable)


def test_a_dispatch_is_walked_once_and_one_without_a_blob_is_not_copied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Dispatch's fields are walked in Python once (where its blob is tells how much
    it carries besides, and what to parse): each walk cost ~5 us a call. A request
    with no blob is parsed from the received bytes as they are."""
    walks: list[int] = []
    walk = framing._delimited_fields

    def counted(view: memoryview, most: int | None = None) -> Any:
        walks.append(len(view))
        return walk(view, most)

    monkeypatch.setattr(framing, "_delimited_fields", counted)
    head = pb.DispatchRequest(agent_id="a", surface="workerHost", action="fs_stat")
    data = head.SerializeToString()
    copied: list[object] = []
    parse = pb.DispatchRequest.FromString
    monkeypatch.setattr(
        services.pb.DispatchRequest, "FromString", lambda d: copied.append(d) or parse(d)
    )
    read = services._dispatch_request(data)
    assert isinstance(read, services._WithBlob) and read.request == head and not read.blob
    assert walks == [len(data)]
    assert copied[0] is data
    walks.clear()
    with_blob = services._dispatch_request(data + _field(10, b"b" * 300))
    assert isinstance(with_blob, services._WithBlob) and bytes(with_blob.blob) == b"b" * 300
    assert with_blob.request == head and walks == [len(data) + 303]
