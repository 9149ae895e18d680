"""ControlService.DispatchUpload: a call whose blob comes to the hub in parts, relayed to
the worker as it arrives (protocol 3: the request first, the digest last). A real hub
and worker, in one process as `agentworker up` runs them (the worker's stream in
memory) and over loopback gRPC as `hub` + `run` do, and a real caller over gRPC
(`ControlClient`, or the raw call for a caller that misbehaves): the write is on its
way before the upload ends; a blob that does not come as announced (too large, out of
order, short, a caller that leaves or never finishes) places nothing, leaves no
temporary file and claims nothing; a retried id is the same call or `args_mismatch`;
a worker that speaks protocol 2 gets the blob whole; a worker stream that drops
mid-upload writes the file once."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest

from sandbox import Arriving
from tests.integration import test_parts_follow
from tests.integration.test_local_link import up
from tests.integration.test_parts_follow import OLD, Writes, ledger, target, temporary_files
from tests.integration.test_stream_rules import MIB, error_code
from worker.actions.host import fs_write
from worker.config import Paths, load
from worker.core import connection
from worker.core.connection import WorkerConnection
from worker.hub import services, upload
from worker.hub.client import ControlClient, upload_part
from worker.hub.server import Hub
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.transport import read_token
from worker.wire.varint import field_head

# fs_write's writing threads that have ended (a fixture of test_parts_follow's).
writes = test_parts_follow.writes

ARGS = json.dumps({"path": "target.bin", "mode": "overwrite"})
TOPOLOGIES = pytest.mark.parametrize("local", [True, False], ids=["up", "hub+run"])


def call(correlation_id: str = "", args: str = ARGS, **fields: object) -> pb.DispatchRequest:
    return pb.DispatchRequest(
        correlation_id=correlation_id,
        agent_id="tester",
        surface="workerHost",
        action="fs_write",
        args_json=args,
        **fields,  # type: ignore[arg-type]
    )


@contextlib.asynccontextmanager
async def caller(home: Path) -> AsyncIterator[ControlClient]:
    """A caller of the hub `up` started in `home`, over gRPC, with the callers' token."""
    paths = Paths(home, home)
    client = ControlClient.connect(load(paths).hub.listen, read_token(paths.token_file))
    try:
        yield client
    finally:
        await client.close()


class Upload:
    """A DispatchUpload written a message at a time, as a caller may (or may not)."""

    def __init__(self, client: ControlClient, request: pb.DispatchRequest, size: int) -> None:
        self.call = client._upload(metadata=client.metadata)
        self.request, self.size = request, size

    async def begin(self, *, accepted: bool = True) -> None:
        head = pb.DispatchUploadPart(request=self.request, blob_bytes=self.size)
        await self.call.write(head.SerializeToString())
        if accepted:  # as ControlClient does: the hub takes the parts
            await self.call.initial_metadata()
            assert not self.call.done()

    async def parts(self, blob: bytes, start: int = 0, end: int | None = None) -> None:
        for at in range(start, len(blob) if end is None else end, MIB):
            await self.call.write(upload_part(at, blob[at : at + MIB]))

    async def answer(self) -> pb.ActionResult:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await self.call.done_writing()
        response: pb.DispatchResponse = await self.call
        return response.result


class Relayed:
    """A blob's parts as the worker's call gets them while they still come (a
    sandbox.Arriving: handed inside `up`, down the stream to hub + run), and whether a
    request came ahead of its parts (`parts_follow`, protocol 3)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sizes: list[int] = []
        self.came = asyncio.Event()
        self.follows: list[bool] = []
        real_add = Arriving.add
        real_handle = WorkerConnection._handle

        def add(arriving: Arriving, part: bytes | memoryview) -> None:
            self.sizes.append(len(part))
            self.came.set()  # on the event loop: the hub's (`up`) or the worker's
            real_add(arriving, part)

        def handle(conn: WorkerConnection, msg: pb.ServerMessage, data: object = None) -> bool:
            if msg.WhichOneof("kind") == "request" and msg.request.blob_in_parts:
                self.follows.append(msg.request.parts_follow)
            return real_handle(conn, msg, data)  # type: ignore[arg-type]

        monkeypatch.setattr(Arriving, "add", add)
        monkeypatch.setattr(WorkerConnection, "_handle", handle)


@pytest.fixture
def relayed(monkeypatch: pytest.MonkeyPatch) -> Relayed:
    return Relayed(monkeypatch)


class Begun:
    """fs_write's writing threads begun (`writes` counts those that ended)."""

    def __init__(self) -> None:
        self.count = 0
        self.first = threading.Event()

    async def writing(self) -> None:
        """Once a write has begun: the worker's call reads the blob as it comes."""
        await asyncio.to_thread(self.first.wait, 60)
        assert self.first.is_set()


@pytest.fixture
def begun(writes: Writes, monkeypatch: pytest.MonkeyPatch) -> Begun:
    seen = Begun()
    counted = fs_write._write  # as `writes` wraps it

    def write(*args: object) -> object:
        seen.count += 1
        seen.first.set()
        return counted(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(fs_write, "_write", write)
    return seen


def quiet(hub: Hub, worker: WorkerConnection) -> None:
    """Nothing of an upload left held: the hub's blobs, the worker's parts."""
    assert hub._holding == 0 and hub._blobs == {}
    assert hub.reads["DispatchUpload"].held() == 0
    assert worker._follows == {} and worker._parts.held_bytes == 0


def placed_nothing(home: Path, cid: str | None = None) -> None:
    assert target(home).read_bytes() == OLD and temporary_files(home) == []
    if cid is not None:
        assert ledger(home, cid) is None


@TOPOLOGIES
def test_an_upload_is_relayed_and_written_as_it_comes(
    tmp_path: Path, relayed: Relayed, local: bool
) -> None:
    """The worker has the request and the first parts before the caller sent the rest;
    the file is written once, with the SHA-256 of every byte."""
    blob = os.urandom(5 * MIB + 1)

    async def scenario() -> pb.ActionResult:
        async with up(tmp_path, local=local) as (hub, _link, worker), caller(tmp_path) as client:
            upload = Upload(client, call(), len(blob))
            await upload.begin()
            await upload.parts(blob, end=2 * MIB)
            await relayed.came.wait()  # relayed while the upload goes on
            assert hub.reads["DispatchUpload"].held() == 1  # read in a turn of the uploads'
            assert hub.reads["Dispatch"].held() == 0
            await upload.parts(blob, start=2 * MIB)
            result = await upload.answer()
            quiet(hub, worker)
            return result

    result = asyncio.run(scenario())
    assert error_code(result) == "ok", result
    assert json.loads(result.result_json)["sha256"] == hashlib.sha256(blob).hexdigest()
    assert target(tmp_path).read_bytes() == blob and temporary_files(tmp_path) == []
    # Down the stream the request went ahead of its parts; inside `up` the blob was
    # handed (the request as after parts), each part as it came.
    assert relayed.follows == [not local] and sum(relayed.sizes) == len(blob)
    assert len(relayed.sizes) == 6
    assert ledger(tmp_path, result.correlation_id) is not None


@TOPOLOGIES
def test_the_client_uploads_a_large_blob_and_dispatches_a_small_one(
    tmp_path: Path, relayed: Relayed, local: bool
) -> None:
    blob = os.urandom(3 * MIB)

    async def scenario() -> tuple[pb.ActionResult, pb.ActionResult]:
        async with up(tmp_path, local=local) as (hub, _link, worker), caller(tmp_path) as client:
            large = (await client.dispatch(**_fields(call(), blob))).result
            small = (await client.dispatch(**_fields(call(args=_args("small.bin")), b"x"))).result
            quiet(hub, worker)
            return large, small

    large, small = asyncio.run(scenario())
    assert error_code(large) == "ok" and error_code(small) == "ok", (large, small)
    assert target(tmp_path).read_bytes() == blob
    assert (tmp_path / "workspace" / "small.bin").read_bytes() == b"x"
    assert relayed.follows == [not local]  # the small one went whole
    assert sum(relayed.sizes) == len(blob)


def _args(name: str) -> str:
    return json.dumps({"path": name, "mode": "overwrite"})


def _fields(request: pb.DispatchRequest, blob: bytes) -> dict[str, object]:
    fields: dict[str, object] = {f.name: v for f, v in request.ListFields()}
    fields["blob"] = blob
    return fields


@TOPOLOGIES
@pytest.mark.parametrize("broken", ["out of order", "more than announced", "short"])
def test_a_blob_that_does_not_come_as_announced_is_refused_and_places_nothing(
    tmp_path: Path, relayed: Relayed, writes: Writes, begun: Begun, local: bool, broken: str
) -> None:
    blob = os.urandom(4 * MIB)

    async def scenario() -> pb.ActionResult:
        async with up(tmp_path, local=local) as (hub, _link, worker), caller(tmp_path) as client:
            target(tmp_path).write_bytes(OLD)
            upload = Upload(client, call(), len(blob))
            await upload.begin()
            await upload.parts(blob, end=2 * MIB)
            await begun.writing()  # the worker is writing it
            if broken == "out of order":
                await upload.parts(blob, start=3 * MIB)
            elif broken == "more than announced":
                await upload.parts(blob + b"!", start=2 * MIB)
            result = await upload.answer()
            await writes.until(1)  # the writing thread ended (its temporary file gone)
            quiet(hub, worker)
            return result

    result = asyncio.run(scenario())
    expected = {"out of order": "validation_error", "short": "validation_error"}
    assert error_code(result) == expected.get(broken, "too_large"), result
    assert result.error.message.endswith(("send the call again", "announce the blob's true size"))
    placed_nothing(tmp_path, result.correlation_id)


@TOPOLOGIES
def test_a_part_padded_beside_its_data_is_refused_and_places_nothing(
    tmp_path: Path, writes: Writes, begun: Begun, local: bool
) -> None:
    """A part carries its offset and data only: one byte of data beside padding (an
    unknown field, which protobuf skips) would keep the whole message alive with the
    call (review13 01: ~4 MiB a part, 1 GiB an upload)."""
    blob = os.urandom(2 * MIB)
    padding = field_head(1000, MIB) + b"\0" * MIB

    async def scenario() -> pb.ActionResult:
        async with up(tmp_path, local=local) as (hub, _link, worker), caller(tmp_path) as client:
            target(tmp_path).write_bytes(OLD)
            upload = Upload(client, call(), len(blob))
            await upload.begin()
            await upload.parts(blob, end=MIB)
            await begun.writing()
            await upload.call.write(upload_part(MIB, blob[MIB : MIB + 1]) + padding)
            result = await upload.answer()
            await writes.until(1)
            quiet(hub, worker)
            return result

    result = asyncio.run(scenario())
    assert error_code(result) == "validation_error", result
    assert f"carries {len(padding) + 4:,} bytes besides its data, over the 32" in (
        result.error.message
    )
    placed_nothing(tmp_path, result.correlation_id)


@TOPOLOGIES
def test_a_blob_announced_past_the_cap_is_refused_before_any_part_is_read(
    tmp_path: Path, relayed: Relayed, local: bool
) -> None:
    async def scenario() -> pb.ActionResult:
        async with up(tmp_path, local=local) as (hub, _link, worker), caller(tmp_path) as client:
            upload = Upload(client, call(), 16 * MIB + 1)
            await upload.begin(accepted=False)  # the answer comes, no part is asked for
            result: pb.ActionResult = (await upload.call).result
            quiet(hub, worker)
            return result

    result = asyncio.run(scenario())
    assert error_code(result) == "too_large", result
    assert json.loads(result.error.details_json)["limit"] == 16 * MIB
    assert relayed.follows == []  # the worker never heard of it


@TOPOLOGIES
@pytest.mark.parametrize("ends", ["caller leaves", "never finishes"])
def test_an_upload_that_stops_coming_places_nothing(
    tmp_path: Path, writes: Writes, begun: Begun, local: bool, ends: str
) -> None:
    """A caller that cancels mid-upload, or one that stops sending before the call's
    deadline: the worker's temporary file goes, nothing is claimed, nothing is held."""
    blob = os.urandom(4 * MIB)

    async def scenario() -> pb.ActionResult | None:
        async with up(tmp_path, local=local) as (hub, _link, worker), caller(tmp_path) as client:
            target(tmp_path).write_bytes(OLD)
            timeout_ms = 600 if ends == "never finishes" else 0
            upload = Upload(client, call(timeout_ms=timeout_ms), len(blob))
            await upload.begin()
            await upload.parts(blob, end=2 * MIB)
            await begun.writing()
            result = None
            if ends == "caller leaves":
                upload.call.cancel()
            else:
                result = (await upload.call).result
            await writes.until(1)
            while hub._holding or worker._follows:  # the hub learns of the cancel in turn
                await asyncio.sleep(0.01)
            quiet(hub, worker)
            return result

    result = asyncio.run(scenario())
    if ends == "never finishes":
        assert result is not None and error_code(result) == "timeout", result
    placed_nothing(tmp_path)


@TOPOLOGIES
def test_a_stalled_upload_holds_back_nothing_else_sent_to_the_worker(
    tmp_path: Path, begun: Begun, local: bool
) -> None:
    """While an upload's caller sends nothing more, the hub's other messages to the
    worker go: another call is answered on the same stream (review13 09: the hub's
    writer waited for the upload's next part, heartbeats too, until the worker took the
    stream for dead and dropped it, and what was queued on it with it)."""
    blob = os.urandom(3 * MIB)

    async def scenario() -> list[pb.ActionResult]:
        async with up(tmp_path, local=local) as (hub, _link, _worker), caller(tmp_path) as client:
            target(tmp_path).write_bytes(OLD)
            (session,) = hub.sessions.values()
            upload = Upload(client, call(), len(blob))
            await upload.begin()
            await upload.parts(blob, end=MIB)
            await begun.writing()  # the stall: no more parts for now
            stat = await _stat_target(client)
            assert list(hub.sessions.values()) == [session]  # the same stream throughout
            await upload.parts(blob, start=MIB)
            return [stat.result, await upload.answer()]

    stat, written = asyncio.run(scenario())
    assert error_code(stat) == "ok" and json.loads(stat.result_json)["size"] == len(OLD)
    assert error_code(written) == "ok", written
    assert target(tmp_path).read_bytes() == blob


async def _stat_target(client: ControlClient) -> pb.DispatchResponse:
    """A plain Dispatch (fs_stat of the target) beside the uploads."""
    return await client.dispatch(
        agent_id="tester",
        surface="workerHost",
        action="fs_stat",
        args_json=json.dumps({"path": "target.bin"}),
    )


def test_stalled_uploads_hold_back_no_dispatch(
    tmp_path: Path, writes: Writes, begun: Begun
) -> None:
    """Uploads are read on turns of their own: two whose caller stopped sending hold
    back no Dispatch (review13 05: they held both of Dispatch's turns up to 600 s)."""
    blob = os.urandom(3 * MIB)

    async def scenario() -> pb.ActionResult:
        async with up(tmp_path, local=False) as (hub, _link, worker), caller(tmp_path) as client:
            target(tmp_path).write_bytes(OLD)
            stalled = [Upload(client, call(), len(blob)) for _ in range(2)]
            for each in stalled:
                await each.begin()
                await each.parts(blob, end=MIB)
            await begun.writing()
            stat = await _stat_target(client)
            assert not any(each.call.done() for each in stalled)  # still read, meanwhile
            for each in stalled:
                each.call.cancel()
            await writes.until(2)
            while hub._holding or worker._follows:  # the hub learns of the cancels in turn
                await asyncio.sleep(0.01)
            quiet(hub, worker)
            return stat.result

    assert error_code(asyncio.run(scenario())) == "ok"
    placed_nothing(tmp_path)


@TOPOLOGIES
def test_an_upload_that_sends_nothing_more_ends_at_its_part_time(
    tmp_path: Path, writes: Writes, begun: Begun, local: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller that stops sending is refused once no part came for PART_WITHIN_S, long
    before the call's deadline: its turn and the worker's call are let go."""
    monkeypatch.setattr(upload, "PART_WITHIN_S", 0.5)
    blob = os.urandom(3 * MIB)

    async def scenario() -> pb.ActionResult:
        async with up(tmp_path, local=local) as (hub, _link, worker), caller(tmp_path) as client:
            target(tmp_path).write_bytes(OLD)
            stalled = Upload(client, call(timeout_ms=600_000), len(blob))
            await stalled.begin()
            await stalled.parts(blob, end=MIB)
            await begun.writing()
            result: pb.ActionResult = (await stalled.call).result
            await writes.until(1)
            while hub._holding or worker._follows:
                await asyncio.sleep(0.01)
            quiet(hub, worker)
            return result

    result = asyncio.run(scenario())
    assert error_code(result) == "timeout", result
    assert "no part of the call's blob came for 0.5 s (after byte 1,048,576)" in (
        result.error.message
    )
    placed_nothing(tmp_path, result.correlation_id)


@TOPOLOGIES
def test_a_retried_upload_is_the_same_call_or_an_args_mismatch(tmp_path: Path, local: bool) -> None:
    """An id the caller chose: the same bytes again answer the recorded outcome, other
    bytes `args_mismatch`, and the file is written once."""
    blob = os.urandom(3 * MIB)
    other = blob[:-1] + bytes([blob[-1] ^ 1])

    async def scenario() -> list[pb.ActionResult]:
        async with up(tmp_path, local=local) as (hub, _link, worker), caller(tmp_path) as client:
            results = []
            for data in (blob, blob, other):
                results.append((await client.dispatch(**_fields(call("retried-1"), data))).result)
            quiet(hub, worker)
            return results

    first, again, mismatch = asyncio.run(scenario())
    assert error_code(first) == "ok" and not first.replayed, first
    assert error_code(again) == "ok" and again.replayed, again
    assert again.result_json == first.result_json
    assert error_code(mismatch) == "args_mismatch", mismatch
    assert target(tmp_path).read_bytes() == blob
    assert ledger(tmp_path, "retried-1") is not None


def test_a_worker_that_speaks_protocol_2_gets_the_blob_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, relayed: Relayed
) -> None:
    monkeypatch.setattr(connection, "PROTOCOL_MAX", 2)
    blob = os.urandom(3 * MIB + 5)

    async def scenario() -> pb.ActionResult:
        async with up(tmp_path, local=False) as (hub, _link, worker), caller(tmp_path) as client:
            result = (await client.dispatch(**_fields(call(), blob))).result
            quiet(hub, worker)
            return result

    result = asyncio.run(scenario())
    assert error_code(result) == "ok", result
    assert target(tmp_path).read_bytes() == blob
    assert relayed.follows == [False]  # its parts ahead of it, once the blob came whole


@TOPOLOGIES
def test_a_worker_stream_that_drops_mid_upload_writes_the_file_once(
    tmp_path: Path, relayed: Relayed, writes: Writes, begun: Begun, local: bool
) -> None:
    """What was relayed on the stream that dropped goes with it (a write begun there
    stops unanswered, its temporary file removed); the hub kept every byte, and once the
    upload ended it records the call and sends it whole on the worker's next stream (under
    an id of its own: no answer to the first delivery can stand for it). One write, one
    claim."""
    blob = os.urandom(4 * MIB)

    async def scenario() -> pb.ActionResult:
        async with up(tmp_path, local=local) as (hub, _link, worker), caller(tmp_path) as client:
            target(tmp_path).write_bytes(OLD)
            upload = Upload(client, call(), len(blob))
            await upload.begin()
            await upload.parts(blob, end=2 * MIB)
            await relayed.came.wait()
            (session,) = hub.sessions.values()
            session.close()  # the hub ends the stream: the worker dials again
            await upload.parts(blob, start=2 * MIB)
            result = await upload.answer()
            assert worker.sessions_started == 2
            await writes.until(begun.count)  # every write begun has ended
            quiet(hub, worker)
            return result

    result = asyncio.run(scenario())
    assert error_code(result) == "ok" and not result.replayed, result
    assert json.loads(result.result_json)["sha256"] == hashlib.sha256(blob).hexdigest()
    assert target(tmp_path).read_bytes() == blob and temporary_files(tmp_path) == []
    assert claims(tmp_path) == [(result.correlation_id, "DONE")]


def claims(home: Path) -> list[tuple[str, str]]:
    """Every call the worker's ledger claimed: (correlation id, state)."""
    with contextlib.closing(sqlite3.connect(home / "state.db")) as db:
        return [(row[0], row[1]) for row in db.execute("SELECT correlation_id, state FROM calls")]


def test_an_upload_without_the_token_is_refused(tmp_path: Path) -> None:
    async def scenario() -> grpc.StatusCode:
        async with up(tmp_path, local=True), caller(tmp_path) as client:
            client.metadata = (("authorization", "Bearer wrong"),)
            upload = Upload(client, call(), 2 * MIB)
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                await upload.begin(accepted=False)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await upload.call
            return refused.value.code()

    assert asyncio.run(scenario()) == grpc.StatusCode.UNAUTHENTICATED


def test_a_client_falls_back_to_dispatch_for_a_hub_without_uploads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub from before DispatchUpload answers UNIMPLEMENTED: the call goes as a Dispatch."""
    monkeypatch.setattr(services, "_upload_in_turn", _unimplemented)
    blob = os.urandom(2 * MIB)

    async def scenario() -> tuple[pb.ActionResult, bool]:
        async with up(tmp_path, local=True), caller(tmp_path) as client:
            result = (await client.dispatch(**_fields(call(), blob))).result
            return result, client.uploads

    result, uploads = asyncio.run(scenario())
    assert error_code(result) == "ok" and not uploads, result
    assert target(tmp_path).read_bytes() == blob


def _unimplemented(_hub: Hub, _reads: object) -> Callable[..., object]:
    async def handle(_requests: object, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")

    return handle


@TOPOLOGIES
def test_an_action_that_takes_its_blob_whole_gets_every_byte(tmp_path: Path, local: bool) -> None:
    """An action other than fs_write (a probe that answers with its blob) gets the blob
    whole once it all came: inside `up` the worker joins the parts handed as they came,
    down the stream it holds them until the digest."""
    blob = os.urandom(3 * MIB + 7)
    probe = pb.DispatchRequest(
        agent_id="tester",
        surface="workerDiag",
        action="probe",
        args_json=json.dumps({"blob_repeat": 1}),
    )

    async def scenario() -> pb.ActionResult:
        async with up(tmp_path, local=local) as (hub, _link, worker), caller(tmp_path) as client:
            result = (await client.dispatch(**_fields(probe, blob))).result
            quiet(hub, worker)
            return result

    result = asyncio.run(scenario())
    assert error_code(result) == "ok", result
    assert result.blob == blob


def test_a_handed_write_refused_at_once_is_hashed_from_the_hubs_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside `up` the hub hashes a handed blob as the worker reads it; a write that
    stops reading it before any part came (its folder is missing) stops that hash too,
    and the hub hashes the parts it keeps instead: the call is recorded and answered
    (`not_found`), nothing is placed, nothing is held."""
    blob = os.urandom(3 * MIB)
    from_parts: list[int] = []
    hashed_from_parts = upload.sha256_of

    def sha256_of(pieces: upload.Pieces) -> bytes:
        from_parts.append(len(pieces))
        return hashed_from_parts(pieces)

    monkeypatch.setattr(upload, "sha256_of", sha256_of)
    stopped = threading.Event()
    real_stop = Arriving.stop

    def stop(arriving: Arriving, reason: BaseException) -> None:
        real_stop(arriving, reason)
        stopped.set()

    monkeypatch.setattr(Arriving, "stop", stop)
    missing = json.dumps({"path": "missing/target.bin", "mode": "overwrite"})

    async def scenario() -> pb.ActionResult:
        async with up(tmp_path, local=True) as (hub, _link, worker), caller(tmp_path) as client:
            upload_ = Upload(client, call(args=missing), len(blob))
            await upload_.begin()
            await asyncio.to_thread(stopped.wait, 60)  # the worker's write stopped reading
            assert stopped.is_set()
            await upload_.parts(blob)
            result = await upload_.answer()
            quiet(hub, worker)
            return result

    result = asyncio.run(scenario())
    assert error_code(result) == "not_found", result
    assert from_parts == [len(blob)]
    assert not (tmp_path / "workspace" / "missing").exists()
