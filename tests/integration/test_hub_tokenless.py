"""What callers without the token can make the hub hold: gRPC health's Watch calls held
open are bounded (HEALTH_WATCHES_HELD, of them HEALTH_WATCHES_PER_CONNECTION per
connection; the others are told SERVING and ended). A real hub and a real worker
(tests/support/cluster.py); the hostile callers are plain gRPC clients."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.cluster import cluster
from tests.support.hub_inproc import own_channel
from worker.hub.client import ControlClient
from worker.hub.health import HEALTH_WATCHES_HELD, HEALTH_WATCHES_PER_CONNECTION
from worker.wire.proto import agentworker_pb2 as pb

SERVING = health_pb2.HealthCheckResponse.SERVING


async def _watches(channel: grpc.aio.Channel, count: int) -> list[grpc.aio.UnaryStreamCall]:
    """`count` tokenless Watch calls on `channel` (as gRPC's health client makes them),
    each past the SERVING it is told first. One at a time, each read before the next
    starts: made at once, more than HEALTH_CALLS_PER_CONNECTION of them waiting to be
    read on a loaded machine were answered busy (a CI run at load 4)."""
    health = health_pb2_grpc.HealthStub(channel)
    calls = []
    for _ in range(count):
        call = health.Watch(health_pb2.HealthCheckRequest())
        assert (await call.read()).status == SERVING
        calls.append(call)
    return calls


async def _until_ended(calls: list[grpc.aio.UnaryStreamCall], count: int) -> None:
    """Until `count` of `calls` ended, each with OK (the others stay open)."""
    pending = {asyncio.ensure_future(call.code()) for call in calls}
    ended = 0
    while ended < count:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for code in done:
            assert code.result() == grpc.StatusCode.OK
        ended += len(done)
    assert ended == count, f"{ended} Watch calls ended, {count} expected"
    for code in pending:
        code.cancel()


def test_tokenless_watch_calls_held_open_are_bounded(tmp_path: Path) -> None:
    """A Watch was held until its caller went, without a bound: 2,400 tokenless ones took
    the hub from 63 to 255 MiB (review9 finding 04). Now the hub holds at most
    HEALTH_WATCHES_PER_CONNECTION of one connection's and HEALTH_WATCHES_HELD of all;
    the others are told SERVING and ended, and the worker and callers are served."""
    per, most = HEALTH_WATCHES_PER_CONNECTION, HEALTH_WATCHES_HELD
    connections = most // per + 4  # more than the hub holds of all

    async def go(client: ControlClient) -> None:
        channels = [own_channel(live.listen) for _ in range(connections)]
        try:
            # One connection: `per` held, the rest ended.
            first = await _watches(channels[0], per + 6)
            await _until_ended(first, 6)
            # Many: `most` held of all, every other one ended.
            rest = [call for channel in channels[1:] for call in await _watches(channel, per)]
            await _until_ended([*first, *rest], 6 + (per * connections - most))
            # Past the bound, an ordinary client's Watch is told SERVING and ended.
            extra = own_channel(live.listen)
            watched = health_pb2_grpc.HealthStub(extra).Watch(health_pb2.HealthCheckRequest())
            assert (await watched.read()).status == SERVING
            assert await watched.code() == grpc.StatusCode.OK
            check = health_pb2_grpc.HealthStub(extra).Check(health_pb2.HealthCheckRequest())
            assert (await check).status == SERVING
            await extra.close()
            # The worker and the callers are not held up by them.
            status = await client.stub.Status(pb.StatusRequest(), metadata=client.metadata)
            assert status.connected_workers == 1
            reply = await client.dispatch(
                agent_id="tester", surface="workerDiag", action="probe", args_json="{}"
            )
            assert reply.result.status == pb.ActionResult.OK, reply
            # Held ones let go when their callers go: a new connection is held again.
            for call in [*first, *rest]:
                call.cancel()
            again = await _watches(channels[0], per + 1)
            await _until_ended(again, 1)
        finally:
            for channel in channels:
                await channel.close()

    with cluster(tmp_path / "home") as live:
        live.run(go)
