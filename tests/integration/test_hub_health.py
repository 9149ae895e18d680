"""gRPC health at the hub, open without the token: the hub itself ("") and its own
services are SERVING, any other name is one it does not serve (Check: NOT_FOUND; Watch:
SERVICE_UNKNOWN), as the health protocol says. Requests are read in turn, a few at once
and one per connection, so a caller who sends its request slowly, or a large one, holds
no one else up and makes the hub hold little. A real hub; the callers are plain gRPC
clients without the token."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.cluster import cluster
from tests.support.hub_inproc import hub_in_process, own_channel
from worker.hub.client import ControlClient
from worker.hub.health import HEALTH_REQUEST_BYTES
from worker.wire.varint import field_head

Status = health_pb2.HealthCheckResponse
CONTROL = "agentworker.v1.ControlService"
WORKERS = "agentworker.v1.WorkerService"


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
