"""gRPC health at the hub, open without the token: the hub itself ("") and its own
services are SERVING, any other name is one it does not serve (Check: NOT_FOUND; Watch:
SERVICE_UNKNOWN), as the health protocol says. Requests are read in turn, a few at once
and one per connection, so a caller who sends its request slowly, or a large one, holds
no one else up and makes the hub hold little; callers whose requests never come (review11
finding 05) are bounded and answered at once, and a check that sends its request gets
through while they flood the hub. A real hub; the callers are plain gRPC clients, without
the token unless a test says."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.cluster import cluster
from tests.support.hub_inproc import hub_in_process, own_channel, token_of
from worker import app
from worker.hub.client import ControlClient
from worker.hub.health import HEALTH_REQUEST_BYTES
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.transport import bearer
from worker.wire.varint import field_head

Status = health_pb2.HealthCheckResponse
CONTROL = "agentworker.v1.ControlService"
WORKERS = "agentworker.v1.WorkerService"
CHECK = "/grpc.health.v1.Health/Check"
REQUEST = health_pb2.HealthCheckRequest()


def _padded(size: int) -> bytes:
    """A HealthCheckRequest for "" with an unknown field making it `size` bytes."""
    room = size - len(field_head(15, size))
    while len(field_head(15, room)) + room != size:
        room += 1
    return field_head(15, room) + b"x" * room


def test_health_answers_for_the_services_the_hub_serves_only(tmp_path: Path) -> None:
    """Every name was SERVING, "no.such.Service" too. Now a name the hub does not serve
    is NOT_FOUND to Check and SERVICE_UNKNOWN to Watch (which then ends)."""

    async def go(client: ControlClient) -> None:
        health = health_pb2_grpc.HealthStub(client.channel)
        for name in ("", CONTROL, WORKERS):
            request = health_pb2.HealthCheckRequest(service=name)
            assert (await health.Check(request)).status == Status.SERVING, name
            watched = health.Watch(request)
            assert (await watched.read()).status == Status.SERVING, name
            watched.cancel()
        for name in ("no.such.Service", "grpc.health.v1.Health", "agentworker.v1", "\u202e"):
            request = health_pb2.HealthCheckRequest(service=name)
            try:
                await health.Check(request)
                raise AssertionError(f"{name!r} answered")
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.NOT_FOUND, (name, exc)
                assert CONTROL in (exc.details() or "")
            watched = health.Watch(request)
            assert (await watched.read()).status == Status.SERVICE_UNKNOWN, name
            assert await watched.code() == grpc.StatusCode.OK
        # A request longer than a name needs, or not a HealthCheckRequest, is refused.
        for raw in (_padded(HEALTH_REQUEST_BYTES + 1), b"\x0a\x02\xff\xfe"):
            for method in ("Check", "Watch"):
                call = client.channel.unary_unary(f"/grpc.health.v1.Health/{method}")
                try:
                    await call(raw)
                    raise AssertionError(f"{method} of {len(raw)} bytes answered")
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, exc)
        ok = client.channel.unary_unary("/grpc.health.v1.Health/Check")
        assert Status.FromString(await ok(_padded(HEALTH_REQUEST_BYTES))).status == Status.SERVING

    with cluster(tmp_path / "home", worker=False) as live:
        live.run(go, token="not-the-token")


def test_a_caller_slow_to_send_holds_up_no_other(tmp_path: Path) -> None:
    """One connection's calls are read one at a time: a caller whose requests never come
    holds one of the two turns, and another connection's Check is answered meanwhile;
    a request that does not come in its time answers DEADLINE_EXCEEDED."""

    async def go() -> None:
        async with hub_in_process(tmp_path / "home") as running:
            running.health.read_within_s = 600.0  # the slow calls end when the test says
            slow_channel, other = own_channel(running.address), own_channel(running.address)
            try:
                slow = [
                    slow_channel.stream_stream("/grpc.health.v1.Health/Check")() for _ in range(3)
                ]
                while running.health.reads.held() < 1 or running.health.reads.waiting() < 2:
                    await asyncio.sleep(0.01)  # until the hub took the three calls in
                health = health_pb2_grpc.HealthStub(other)
                request = health_pb2.HealthCheckRequest()
                assert (await health.Check(request)).status == Status.SERVING
                assert not any(call.done() for call in slow)
                for call in slow:  # their callers go: the hub lets go of their turns
                    call.cancel()
                while running.health.reads.held() or running.health.reads.waiting():
                    await asyncio.sleep(0.01)
                # A request that does not come within its time is answered so.
                running.health.read_within_s = 0.0
                late = slow_channel.stream_stream("/grpc.health.v1.Health/Check")()
                assert await late.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                assert running.health.reads.held() == 0
            finally:
                await slow_channel.close()
                await other.close()

    asyncio.run(go())


async def _until(done: Callable[[], bool]) -> None:
    while not done():
        await asyncio.sleep(0.01)  # the hub runs in this loop: it is not held up


def _silent(channel: grpc.aio.Channel, count: int, **kwargs: Any) -> list[Any]:
    """`count` Check calls on `channel` whose request is never written (as the attack)."""
    return [channel.stream_stream(CHECK)(**kwargs) for _ in range(count)]


async def _refused(call: Any) -> tuple[grpc.StatusCode, str]:
    return await call.code(), await call.details()


async def _check(channel: grpc.aio.Channel, **kwargs: Any) -> int:
    return int((await health_pb2_grpc.HealthStub(channel).Check(REQUEST, **kwargs)).status)


@contextlib.asynccontextmanager
async def _hub_with_channels(
    home: Path, count: int
) -> AsyncIterator[tuple[app.RunningHub, list[grpc.aio.Channel]]]:
    """A hub in this loop whose silent calls live until the test ends them (a long
    budget, no turn given up unless a test says), and `count` connections to it."""
    async with hub_in_process(home) as running:
        running.health.read_within_s = 600.0
        running.health.prompt_s = 600.0
        channels = [own_channel(running.address) for _ in range(count)]
        try:
            yield running, channels
        finally:
            for channel in channels:
                await channel.close()


def test_a_token_the_hub_does_not_know_is_refused_and_hub_token_goes_ahead(
    tmp_path: Path,
) -> None:
    """Silent tokenless calls hold both turns and wait for more; a Check presenting a
    token that is not the hub's is refused UNAUTHENTICATED, unread; one with the workers'
    token waits as a tokenless one does; one with hub.token (the person's) is read on
    turns of its own and answered, and so is the Status `agentworker status` sends."""
    home = tmp_path / "home"

    async def go() -> None:
        async with _hub_with_channels(home, 4) as (running, channels):
            reads = running.health.reads
            flood = [*_silent(channels[0], 3), *_silent(channels[1], 3)]
            await _until(lambda: reads.held() == 2 and reads.waiting() == 4)
            wrong = _silent(channels[2], 1, metadata=bearer("not-the-token"))[0]
            code, details = await _refused(wrong)
            assert code == grpc.StatusCode.UNAUTHENTICATED
            assert "hub.token" in details, details
            assert reads.waiting() == 4 and running.health.own_reads.held() == 0
            workers = bearer(token_of(home, "hub-workers.token"))
            as_tokenless = _silent(channels[2], 1, metadata=workers)[0]
            await _until(lambda: reads.waiting() == 5)
            person = bearer(token_of(home))
            assert await _check(channels[3], metadata=person) == Status.SERVING
            status = await ControlClient(channels[3], person).stub.Status(
                pb.StatusRequest(), metadata=person
            )
            assert status.connected_workers == 0
            assert not any(call.done() for call in [*flood, as_tokenless])
            for call in [*flood, as_tokenless]:
                call.cancel()

    asyncio.run(go())


def test_one_connection_has_at_most_four_calls_waiting(tmp_path: Path) -> None:
    """Past HEALTH_CALLS_PER_CONNECTION of a connection's calls waiting or being read,
    its next is answered RESOURCE_EXHAUSTED at once, unread; another connection's Check
    is answered."""

    async def go() -> None:
        async with _hub_with_channels(tmp_path / "home", 2) as (running, channels):
            health = running.health
            silent = _silent(channels[0], health.calls_per_connection)
            await _until(lambda: sum(health.calls.values()) == health.calls_per_connection)
            code, details = await _refused(_silent(channels[0], 1)[0])
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert details.startswith(f"busy: {health.calls_per_connection} health calls of "), (
                details
            )
            assert await _check(channels[1]) == Status.SERVING
            assert not any(call.done() for call in silent)
            for call in silent:
                call.cancel()

    asyncio.run(go())


def test_past_the_calls_waiting_of_all_a_newcomer_takes_a_busier_connections_place(
    tmp_path: Path,
) -> None:
    """Past HEALTH_WAITING calls waiting (two here), a new call of a connection with
    fewer calls takes the place of the latest call of a connection with more (answered
    busy), and is answered in its turn; a newcomer that has no fewer is answered busy at
    once. Callers that filled the places kept every check out (review14 finding 03)."""

    async def go() -> None:
        async with _hub_with_channels(tmp_path / "home", 3) as (running, channels):
            reads = running.health.reads
            running.health.waiting_most = 2
            silent = [*_silent(channels[0], 2), *_silent(channels[1], 2)]
            await _until(lambda: reads.held() == 2 and reads.waiting() == 2)
            check = _silent(channels[2], 1)[0]
            ends = [asyncio.ensure_future(_refused(call)) for call in silent]
            done, left = await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
            code, details = done.pop().result()  # the latest waiting
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert details.startswith("busy: its place among the health calls waiting"), details
            await _until(lambda: reads.waiting() == 2)
            code, details = await _refused(_silent(channels[2], 1)[0])
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert details == "busy: 2 health calls already wait to be read; ask again later"
            await check.write(REQUEST.SerializeToString())
            await check.done_writing()
            for call in silent[:2]:  # channel 0's turn goes back: to the check, whose
                call.cancel()  # connection was never served
            assert Status.FromString(await check.read()).status == Status.SERVING
            for call in silent:
                call.cancel()
            await asyncio.wait(left)

    asyncio.run(go())


def test_a_request_that_comes_late_in_its_turn_makes_its_connection_late(
    tmp_path: Path,
) -> None:
    """A request that comes HEALTH_READY_S or more into its call's turn (none here) is
    answered, and its connection goes late as one whose request never came: its next call
    waits behind the others'. Callers sending theirs 1.7 s into each turn, under the 2 s
    it was, were never late and kept every check out (review14 finding 03)."""

    async def go() -> None:
        async with _hub_with_channels(tmp_path / "home", 3) as (running, channels):
            health = running.health
            slow = _silent(channels[0], 1)[0]
            await _until(lambda: health.reads.held() == 1)
            health.ready_s = 0.0
            await slow.write(REQUEST.SerializeToString())
            await slow.done_writing()
            assert Status.FromString(await slow.read()).status == Status.SERVING
            assert len(health.late_connections) == 1
            health.ready_s = 600.0
            holding = [*_silent(channels[1], 1), *_silent(channels[2], 1)]
            await _until(lambda: health.reads.held() == 2)
            again = _silent(channels[0], 1)[0]
            await _until(lambda: health.reads.waiting() == 1)
            assert health.reads.waiting(2) == 1
            for call in [*holding, again]:
                call.cancel()

    asyncio.run(go())


def test_a_call_has_its_budget_from_its_start_waiting_included(tmp_path: Path) -> None:
    """A call's time counts from its start, not from its turn: one that spends it
    waiting for a turn is answered busy, and its connection is not held to be late (it
    never held a turn)."""

    async def go() -> None:
        async with _hub_with_channels(tmp_path / "home", 3) as (running, channels):
            reads = running.health.reads
            silent = [*_silent(channels[0], 1), *_silent(channels[1], 1)]
            await _until(lambda: reads.held() == 2)
            running.health.read_within_s = 0.0  # the next call's budget
            code, details = await _refused(_silent(channels[2], 1)[0])
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert details.startswith("busy: waited 0 s for a turn"), details
            assert len(running.health.late_connections) == 0
            for call in silent:
                call.cancel()

    asyncio.run(go())


def test_a_call_without_its_request_gives_its_turn_to_a_waiting_check(tmp_path: Path) -> None:
    """Two silent calls on two connections hold both turns: a Check that sends its
    request takes one of them (HEALTH_PROMPT_S into the turn; none here), the silent call
    answered busy, and its connection is late: its next call waits behind the others."""

    async def go() -> None:
        async with _hub_with_channels(tmp_path / "home", 3) as (running, channels):
            health = running.health
            silent = [*_silent(channels[0], 1), *_silent(channels[1], 1)]
            await _until(lambda: health.reads.held() == 2)
            health.prompt_s = 0.0
            assert await _check(channels[2]) == Status.SERVING
            first = await asyncio.wait(
                [asyncio.ensure_future(_refused(call)) for call in silent],
                return_when=asyncio.FIRST_COMPLETED,
            )
            (gave_up,) = first[0]
            code, details = gave_up.result()
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert details.startswith("busy: the health request had not come"), details
            assert len(health.late_connections) == 1
            # The late connection's next call waits behind, and gives its turn up at once.
            late = next(ch for ch, call in zip(channels, silent, strict=True) if call.done())
            again = _silent(late, 1)[0]
            await _until(lambda: health.reads.held() == 2 or health.reads.waiting(2))
            assert await _check(channels[2]) == Status.SERVING
            assert (await _refused(again))[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
            (other,) = first[1]
            assert not other.done()  # the call that is not late kept its turn
            for call in silent:
                call.cancel()
            other.cancel()

    asyncio.run(go())


def test_a_late_connection_has_few_places_to_wait(tmp_path: Path) -> None:
    """A call whose request did not come in its time is answered DEADLINE_EXCEEDED and
    makes its connection late; the late ones' calls have HEALTH_WAITING_LATE places to
    wait (one here), past them they are answered busy at once, unread."""

    async def go() -> None:
        async with _hub_with_channels(tmp_path / "home", 3) as (running, channels):
            health = running.health
            health.waiting_late = 1
            health.read_within_s = 0.0
            code, details = await _refused(_silent(channels[0], 1)[0])
            assert code == grpc.StatusCode.DEADLINE_EXCEEDED
            assert details.startswith("the health request did not arrive within 0 s of the"), (
                details
            )
            assert len(health.late_connections) == 1
            health.read_within_s = 600.0
            holding = [*_silent(channels[1], 1), *_silent(channels[2], 1)]
            await _until(lambda: health.reads.held() == 2)
            behind = _silent(channels[0], 1)[0]
            await _until(lambda: health.reads.waiting(2) == 1)
            code, details = await _refused(_silent(channels[0], 1)[0])
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "came late, and 1 such calls already wait" in details, details
            for call in [*holding, behind]:
                call.cancel()

    asyncio.run(go())


def test_an_address_whose_connections_come_late_ranks_between(tmp_path: Path) -> None:
    """Once HEALTH_LATE_PER_ADDRESS connections of one address came late, a new
    connection of that address (loopback: every caller here) waits behind other
    addresses' calls, but ahead of the late connections': a Check on one takes the turn
    of a late connection's silent call at once, not that of a silent call of its rank."""

    async def go() -> None:
        async with _hub_with_channels(tmp_path / "home", 6) as (running, channels):
            health = running.health
            health.read_within_s = 0.0
            for channel in channels[: health.late_addresses.burst]:
                code, _details = await _refused(_silent(channel, 1)[0])
                assert code == grpc.StatusCode.DEADLINE_EXCEEDED
            health.read_within_s = 600.0
            late = _silent(channels[0], 1)[0]  # a late connection's: rank 2
            await _until(lambda: health.reads.held() == 1)
            fresh = _silent(channels[-2], 2)  # a new connection's: rank 1, one of them waits
            await _until(lambda: health.reads.waiting(1) == 1)
            assert await _check(channels[-1]) == Status.SERVING
            code, details = await _refused(late)
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
            assert not any(call.done() for call in fresh)
            for call in fresh:
                call.cancel()

    asyncio.run(go())


def test_a_check_gets_through_while_silent_calls_flood_the_hub(tmp_path: Path) -> None:
    """Review11 finding 05: 66 silent tokenless calls held both turns 10 s each and
    filled the queue, and every other Check failed for minutes. Now twelve connections
    open eight silent calls each (half refused at once), the turns go from one silent
    call to another as the waiting ones ask, and a Check that sends its request, on a
    connection of its own, is answered while they hold on; so are Status and a Check with
    hub.token (on loopback every caller is one address, late here: the Check's connection
    goes ahead of the late connections')."""
    home = tmp_path / "home"

    async def go() -> None:
        async with _hub_with_channels(home, 13) as (running, channels):
            health = running.health
            health.prompt_s = 0.0
            flood = [call for channel in channels[:12] for call in _silent(channel, 8)]
            ends = [asyncio.ensure_future(_refused(call)) for call in flood]
            # Turns went from silent call to silent call while another connection's waited,
            # till the flood's address went late and those left wait behind the holders.
            await _until(
                lambda: (
                    len(health.late_connections) >= health.late_addresses.burst
                    and health.reads.held() == 2
                    and not health.reads.wanting(0)
                    and not health.reads.wanting(1)
                )
            )
            for _ in range(3):
                assert await _check(channels[12]) == Status.SERVING
            person = bearer(token_of(home))
            assert await _check(channels[12], metadata=person) == Status.SERVING
            status = await ControlClient(channels[12], person).stub.Status(
                pb.StatusRequest(), metadata=person
            )
            assert status.connected_workers == 0
            refused = [task.result()[0] for task in ends if task.done()]
            assert len(refused) >= 12 * 4, len(refused)  # at once, or turns given up
            assert set(refused) == {grpc.StatusCode.RESOURCE_EXHAUSTED}, set(refused)
            for call in flood:
                call.cancel()
            for task in ends:
                task.cancel()

    asyncio.run(go())
