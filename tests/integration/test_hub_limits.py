"""What a hub holds for callers is bounded: request blobs of calls not yet answered
stay under `[hub] held_blobs_mib`, and a call past it is answered `busy` at once; a
ControlService request larger than its method takes is refused undecoded."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.cluster import Cluster, call_in_background, cluster, release, wait_for
from tests.support.hub_inproc import own_channel
from worker.hub.client import ControlClient
from worker.hub.reads import (
    CONTROL_READS_AT_ONCE,
    CONTROL_READS_AT_ONCE_OTHERWISE,
    DISPATCH_UNARY_READS,
)
from worker.hub.services import (
    CONTROL_REQUEST_BYTES,
    CONTROL_REQUEST_BYTES_OTHERWISE,
    DISPATCH_BESIDES_BLOB_BYTES,
)
from worker.wire.proto import agentworker_pb2 as pb

MIB = 1024 * 1024


def test_blobs_held_for_unanswered_calls_are_bounded(tmp_path: Path) -> None:
    with cluster(tmp_path / "home", held_blobs_mib=16) as live:
        held = call_in_background(
            live, "workerDiag.probe", '{"hold": "h1"}', correlation_id="h1", blob=b"a" * 10 * MIB
        )
        wait_for(lambda: _in_ledger(live, "h1"), 30)  # claimed by the worker: it runs
        # 10 MiB held: another 10 MiB would pass 16, and is refused before it is sent.
        refused = live.call("workerDiag.probe", "{}", correlation_id="b1", blob=b"b" * 10 * MIB)
        assert refused["status"] == "error" and refused["error"]["code"] == "busy", refused
        assert refused["error"]["retryable"] is True
        assert refused["error"]["details"]["limit_bytes"] == 16 * MIB
        assert "held_blobs_mib" in refused["error"]["message"]
        assert not _in_ledger(live, "b1"), "a refused call never reached the worker"
        # A call with a smaller blob, or none, still goes.
        assert live.call("workerDiag.probe", "{}", blob=b"c" * MIB)["status"] == "ok"
        assert live.call("workerDiag.probe", "{}")["status"] == "ok"
        release(live.home, "h1")
        held["thread"].join(30)
        assert held["out"]["status"] == "ok", held
        # What the answered call held is given back.
        again = live.call("workerDiag.probe", "{}", correlation_id="b2", blob=b"b" * 10 * MIB)
        assert again["status"] == "ok", again


def _padded(message: bytes, size: int) -> bytes:
    """`message` with an unknown length-delimited field (number 15) making it `size`
    bytes: proto3 keeps unknown fields, so it decodes as the message it was."""
    room = size - len(message) - 1 - 4  # the tag, a 4-byte varint length
    assert 1 << 14 <= room < 1 << 28
    length = bytes([room & 0x7F | 0x80, room >> 7 & 0x7F | 0x80, room >> 14 & 0x7F | 0x80])
    return message + bytes([15 << 3 | 2]) + length + bytes([room >> 21]) + b"x" * room


def test_each_control_method_takes_requests_only_as_large_as_it_needs(tmp_path: Path) -> None:
    """gRPC's limit is the server's, 32 MiB (a 16 MiB blob must fit a Dispatch), and it
    held on every method: a KillPlan with a 30 MiB reason went to every worker and was
    queued in the hub's database for those away. Each method now has its own cap,
    refused RESOURCE_EXHAUSTED before the request is decoded, with what to do."""
    small, scope = CONTROL_REQUEST_BYTES_OTHERWISE, CONTROL_REQUEST_BYTES["RequestScope"]
    kill = pb.KillPlanRequest(plan_id="p-limits", reason="r").SerializeToString()
    teardown = pb.TeardownRequest(plan_id="p-limits").SerializeToString()
    ask = pb.RequestScopeRequest(agent_id="tester", scopes=["workerHost.exec"])
    oversized = {
        "ListWorkers": _padded(b"", small + 1),
        "Status": _padded(b"", small + 1),
        "KillPlan": _padded(kill, small + 1),
        "Teardown": _padded(teardown, small + 1),
        "RequestScope": _padded(ask.SerializeToString(), scope + 1),
    }

    async def send(client: ControlClient, method: str, raw: bytes) -> grpc.aio.AioRpcError:
        call = client.channel.unary_unary(f"/agentworker.v1.ControlService/{method}")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(raw, metadata=client.metadata, timeout=30)
        return caught.value

    with cluster(tmp_path / "home") as live:
        for method, raw in oversized.items():
            refused = live.run(lambda c, m=method, r=raw: send(c, m, r))
            assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (method, refused)
            limit = scope if method == "RequestScope" else small
            assert refused.details() == (
                f"the {method} request is {limit + 1:,} bytes, over the {limit:,} that "
                f"{method} takes (only Dispatch carries a blob); send less"
            )
        # Refused undecoded: the kill never reached the worker.
        assert live.call("workerDiag.probe", "{}", plan_id="p-limits")["status"] == "ok"
        # At the cap, a request is taken as before.
        at_cap = pb.KillPlanRequest.FromString(_padded(kill, small))
        told = live.run(lambda c: c.stub.KillPlan(at_cap, metadata=c.metadata, timeout=30))
        assert len(told.worker_ids) == 1, told
        killed = live.call("workerDiag.probe", "{}", plan_id="p-limits")
        assert killed["error"]["code"] == "plan_killed", killed
        assert live.status().state == pb.StatusResponse.CONNECTED
        # Dispatch still takes a blob far over the others' caps.
        assert live.call("workerDiag.probe", "{}", blob=b"d" * 2 * MIB)["status"] == "ok"
        # But not as much besides its blob: refused before it is parsed.
        dispatch = pb.DispatchRequest(agent_id="tester", surface="workerDiag", action="probe")
        padded = _padded(dispatch.SerializeToString(), DISPATCH_BESIDES_BLOB_BYTES + 1)
        refused = live.run(lambda c: send(c, "Dispatch", padded))
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused
        assert refused.details().startswith(
            f"the Dispatch request carries {DISPATCH_BESIDES_BLOB_BYTES + 1:,} bytes besides "
            "its blob"
        )


def _in_ledger(live: Cluster, cid: str) -> bool:
    db = sqlite3.connect(live.home / "state.db")
    try:
        found = db.execute("SELECT 1 FROM calls WHERE correlation_id = ?", (cid,)).fetchone()
    finally:
        db.close()
    return found is not None


def test_control_requests_are_read_a_few_at_a_time(tmp_path: Path) -> None:
    """gRPC reads a request whole (up to 32 MiB, whatever its method takes) before its
    size can be checked, so sixteen 31 MiB ListWorkers at once took the hub from 63 to
    525 MiB (review8 finding 09). A request is now read when its turn comes: at most
    CONTROL_READS_AT_ONCE_OTHERWISE of the small methods' at once, one per connection,
    Dispatch's apart, and KillPlan's and Status's apart too (test_hub_kill_path)."""
    turns = CONTROL_READS_AT_ONCE_OTHERWISE
    assert CONTROL_READS_AT_ONCE["Dispatch"] > 0

    async def go(client: ControlClient) -> None:
        # Calls whose request never comes, each on its connection, hold every turn of the
        # small methods.
        channels = [own_channel(live.listen) for _ in range(turns)]
        held = [
            channel.stream_stream("/agentworker.v1.ControlService/ListWorkers")(
                metadata=client.metadata
            )
            for channel in channels
        ]
        for call in held:
            await call.wait_for_connection()
        # Connected is not yet holding a turn (the hub starts each call's read as it
        # comes): until a ListWorkers goes unanswered, every turn is not held yet.
        while True:
            try:
                await client.stub.ListWorkers(
                    pb.ListWorkersRequest(), metadata=client.metadata, timeout=2
                )
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED, exc
                break
        listing = asyncio.ensure_future(
            client.stub.ListWorkers(pb.ListWorkersRequest(), metadata=client.metadata, timeout=60)
        )
        # Dispatch's reads are apart: a call goes meanwhile, and ListWorkers still waits.
        answered = await client.dispatch(
            agent_id="tester", surface="workerDiag", action="probe", args_json="{}"
        )
        assert answered.result.status == pb.ActionResult.OK, answered
        status = await client.stub.Status(pb.StatusRequest(), metadata=client.metadata, timeout=60)
        assert status.connected_workers == 1  # Status's reads are apart too
        assert not listing.done()
        held[0].cancel()  # a turn is free: ListWorkers is read and answered
        assert len((await listing).workers) == 1
        # The held call's request comes: it is read in turn and answered as ever.
        await held[1].write(pb.ListWorkersRequest().SerializeToString())
        await held[1].done_writing()
        reply = pb.ListWorkersResponse.FromString(await held[1].read())
        assert len(reply.workers) == 1
        assert await held[1].code() == grpc.StatusCode.OK
        for channel in channels:
            await channel.close()

    with cluster(tmp_path / "home") as live:
        live.run(go)


def test_health_reads_its_requests_in_turn(tmp_path: Path) -> None:
    """gRPC health is open without the token; as a unary method its request was read
    whole first, up to 32 MiB: sixteen tokenless 31 MiB Health/Check calls at once took
    the hub from 62 MiB to 1.2 GB (review8 finding 12). Its requests are read in turn
    now (worker.hub.health), and one longer than a service name is refused."""
    serving = health_pb2.HealthCheckResponse.SERVING

    async def go(client: ControlClient) -> None:
        # A request sent on a stream, as the hub reads it.
        check = client.channel.stream_stream("/grpc.health.v1.Health/Check")()
        await check.write(health_pb2.HealthCheckRequest().SerializeToString())
        assert health_pb2.HealthCheckResponse.FromString(await check.read()).status == serving
        assert await check.code() == grpc.StatusCode.OK
        # Four 31 MiB requests at once: each refused once read, none answered.
        oversized = _padded(b"", 31 * MIB)
        calls = [
            client.channel.unary_unary("/grpc.health.v1.Health/Check")(oversized) for _ in range(4)
        ]
        for call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # The ordinary client's calls, as before.
        health = health_pb2_grpc.HealthStub(client.channel)
        request = health_pb2.HealthCheckRequest()
        assert (await health.Check(request, timeout=30)).status == serving
        watched = health.Watch(request)
        assert (await watched.read()).status == serving
        watched.cancel()

    with cluster(tmp_path / "home", worker=False) as live:
        live.run(go, token="not-the-token")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_calls_waiting_for_their_turn_leave_their_requests_with_the_sender(
    tmp_path: Path,
) -> None:
    """A call waiting for its read turn holds its request unread: past its stream's
    first window (gRPC's 64 KiB) flow control leaves the rest with the caller, so 16
    waiting Dispatches sending 6 MiB each grow the hub by about a MiB. A window the
    hub's server granted ahead of its reads (`grpc.http2.lookahead_bytes` of 4 MiB:
    16 MiB uploads through hub + run up to 7 ms faster under load) would let every such
    call, and every stream the hub leaves unread, take that much in: +65 MiB here."""
    waiting, size = 16, 6 * MIB
    # Dispatch's unary reads and its turns (each held 300 s without its request).
    held_reads = DISPATCH_UNARY_READS + CONTROL_READS_AT_ONCE["Dispatch"]
    method = "/agentworker.v1.ControlService/Dispatch"

    async def go(client: ControlClient) -> float:
        holders = [own_channel(live.listen) for _ in range(held_reads)]
        callers = [own_channel(live.listen) for _ in range(2)]
        try:
            # Calls whose request never comes, each on its connection, hold every read.
            held = [channel.stream_stream(method)(metadata=client.metadata) for channel in holders]
            for call in held:
                await call.wait_for_connection()
            probe = pb.DispatchRequest(agent_id="tester", surface="workerDiag", action="probe")
            while True:  # until a Dispatch goes unread: every read is held
                try:
                    await client.stub.Dispatch(probe, metadata=client.metadata, timeout=2)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                        break
            before = _rss_mib(hub)
            request = _padded(b"", size)
            calls = [
                callers[i % len(callers)].stream_stream(method)(metadata=client.metadata)
                for i in range(waiting)
            ]
            for call in calls:
                await call.wait_for_connection()
            writes = [asyncio.ensure_future(call.write(request)) for call in calls]
            # A Status answered on each connection: what its callers sent before it is in.
            for channel in callers:
                status = channel.unary_unary(
                    "/agentworker.v1.ControlService/Status",
                    request_serializer=pb.StatusRequest.SerializeToString,
                    response_deserializer=pb.StatusResponse.FromString,
                )
                await status(pb.StatusRequest(), metadata=client.metadata, timeout=30)
            grown = _rss_mib(hub) - before
            assert not any(write.done() for write in writes)  # none was read whole
            for call in [*calls, *held]:
                call.cancel()
            await asyncio.gather(*writes, return_exceptions=True)
            return grown
        finally:
            for channel in [*holders, *callers]:
                await channel.close()

    with cluster(tmp_path / "home", worker=False) as live:
        hub = live.procs[0].pid
        grown = live.run(go)
        # The first windows (1 MiB in all) and what the hub allocates meanwhile.
        assert grown < waiting * 64 / 1024 + 2, f"the hub took in {grown:.1f} MiB unread"
