"""`agentworker up`: hub and worker in one process hand blobs over by reference
(worker.wire.local): a request's not as BlobParts down their stream, a result's not
inside the result. A worker that did not open its session in this process is never
handed anything nor hands anything, a handed request blob is held to the bounds parts
are, and nothing handed stays held once its call is answered, its caller gone, or
its stream dropped."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import json
import os
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import free_port, write_config
from worker import app
from worker.config import Paths, load
from worker.core import blob_parts, connection, ledger, pipeline
from worker.core.connection import WorkerConnection
from worker.hub import delivery
from worker.hub.server import Hub
from worker.hub.session import Session
from worker.wire.local import HandedResult, LocalLink, result_key
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.protocol import SHA256_SCHEME, digest_of_sha256
from worker.wire.transport import read_or_create_token, read_token

MIB = 1024 * 1024


@contextlib.asynccontextmanager
async def up(
    home: Path, *, local: bool, extra_config: str = ""
) -> AsyncIterator[tuple[Hub, LocalLink, WorkerConnection]]:
    """A hub and a worker in this event loop, as `agentworker up` assembles them; with
    `local`, the worker says its session is in this process, and its stream runs in it
    (worker.wire.inproc), else over gRPC. `extra_config` is added to config.toml."""
    write_config(home, f"127.0.0.1:{free_port()}", extra_config)
    paths = Paths(home, home)
    config = load(paths)
    running = await app.start_hub(paths, config)
    link = running.hub.link = LocalLink()
    dispatcher = app.build_dispatcher(paths, config)
    asyncio.get_running_loop().set_default_executor(dispatcher.threads)
    target = app.Target(
        address=running.address,
        token=read_token(paths.workers_token_file),
        worker_key=read_or_create_token(paths.worker_key_file),
    )
    worker = app.build_connection(
        dispatcher,
        target,
        config,
        link=link if local else None,
        dial=running.local.open_stream if local else None,
    )
    runner = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(worker.connected.wait(), 30)
        yield running.hub, link, worker
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
        await running.stop()
        dispatcher.close()


def write(path: str, blob: bytes) -> pb.DispatchRequest:
    args = json.dumps({"path": path, "mode": "overwrite"})
    return pb.DispatchRequest(
        agent_id="tester", surface="workerHost", action="fs_write", args_json=args, blob=blob
    )


def read(path: str, correlation_id: str = "") -> pb.DispatchRequest:
    return pb.DispatchRequest(
        correlation_id=correlation_id,
        agent_id="tester",
        surface="workerHost",
        action="fs_read",
        args_json=json.dumps({"path": path}),
    )


async def read_bytes(hub: Hub, request: pb.DispatchRequest) -> bytes:
    """The blob of an OK answer, as ControlService's caller gets it."""
    reply = pb.DispatchResponse.FromString(await hub.dispatch_serialized(request, None))
    assert reply.result.status == pb.ActionResult.OK, reply.result.error.message
    return reply.result.blob


def written(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every envelope the worker writes to its stream from now on."""
    sizes: list[int] = []
    real = connection.envelope_of

    def counted(parts: list[bytes]) -> bytes:
        envelope = real(parts)
        sizes.append(len(envelope))
        return envelope

    monkeypatch.setattr(connection, "envelope_of", counted)
    return sizes


def parts_built(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The offsets of every BlobPart the hub builds from now on."""
    built: list[int] = []
    real = delivery.blob_part

    def counted(correlation_id: str, offset: int, data: bytes | memoryview) -> bytes:
        built.append(offset)
        return real(correlation_id, offset, data)

    monkeypatch.setattr(delivery, "blob_part", counted)
    return built


def test_a_large_blob_reaches_the_local_worker_with_no_part_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = parts_built(monkeypatch)
    blobs = [os.urandom(3 * MIB + 7), os.urandom(2 * MIB)]

    async def scenario() -> None:
        async with up(tmp_path, local=True) as (hub, link, _worker):
            for i, blob in enumerate(blobs):
                reply = await hub.dispatch(write(f"big-{i}.bin", blob))
                assert reply.result.status == pb.ActionResult.OK, reply.result.error.message
            assert link.held == 0  # each taken by its request

    asyncio.run(scenario())
    assert built == []
    for i, blob in enumerate(blobs):
        assert (tmp_path / "workspace" / f"big-{i}.bin").read_bytes() == blob


def left_to_the_collector() -> list[object]:
    """What the cyclic collector would free now (found, kept aside to be looked at,
    then freed)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.collect()  # kept aside, not freed: now they go


def test_an_answered_call_leaves_its_blobs_to_reference_counting(tmp_path: Path) -> None:
    """Nothing of an answered call waits for the cyclic collector: its request blob (handed
    over by reference) and its result blob go as its answer is given. A call and its task
    referred to each other, so every fs_write's blob stayed until a collection ran: under
    a stream of 16 MiB writes `up` grew to some 750 MiB, and each new blob was received
    into fresh pages, faulted in on the event loop (docs/architecture.md, "Head of line")."""
    blob, page = os.urandom(3 * MIB + 11), os.urandom(MIB - 5)  # sizes no other test uses
    (tmp_path / "workspace").mkdir(parents=True, exist_ok=True)
    (tmp_path / "workspace" / "unique-page.bin").write_bytes(page)

    async def scenario() -> list[object]:
        async with up(tmp_path, local=True) as (hub, link, _worker):
            left_to_the_collector()  # what came before
            gc.disable()
            try:
                for i in range(3):
                    reply = await hub.dispatch(write(f"written-{i}.bin", blob))
                    assert reply.result.status == pb.ActionResult.OK, reply.result.error.message
                    assert await read_bytes(hub, read("unique-page.bin")) == page
                assert link.held == 0
                return left_to_the_collector()
            finally:
                gc.enable()

    left = asyncio.run(scenario())
    # Other tests' calls that failed may be in cycles of their errors' tracebacks (their
    # blobs were let go all the same), and a call of a test run before this one in the same
    # process may become garbage while this one runs: only this test's calls and buffers count.
    own = {write(f"written-{i}.bin", b"").args_json for i in range(3)} | {
        read("unique-page.bin").args_json
    }
    calls = [
        each.req.args_json
        for each in left
        if isinstance(each, pipeline.Call) and each.req.args_json in own
    ]
    buffers = [
        len(each)
        for each in left
        if isinstance(each, bytes | bytearray | memoryview) and len(each) in (len(blob), len(page))
    ]
    assert calls == [] and buffers == []
    assert (tmp_path / "workspace" / "written-2.bin").read_bytes() == blob


def test_a_worker_whose_session_is_not_local_gets_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = parts_built(monkeypatch)
    blob = os.urandom(3 * MIB)

    async def scenario() -> None:
        async with up(tmp_path, local=False) as (hub, link, _worker):
            reply = await hub.dispatch(write("parts.bin", blob))
            assert reply.result.status == pb.ActionResult.OK, reply.result.error.message
            assert link.held == 0  # nothing handed to a session nobody said was local

    asyncio.run(scenario())
    assert built == [0, MIB, 2 * MIB]
    assert (tmp_path / "workspace" / "parts.bin").read_bytes() == blob


def test_a_handed_blob_past_the_bound_of_parts_is_refused_and_nothing_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(blob_parts, "MAX_CALL_BYTES", 2 * MIB)

    async def scenario() -> pb.ActionResult:
        async with up(tmp_path, local=True) as (hub, link, _worker):
            reply = await hub.dispatch(write("refused.bin", os.urandom(3 * MIB)))
            assert link.held == 0
            return reply.result

    result = asyncio.run(scenario())
    assert result.error.code == "too_large" and "nothing was run" in result.error.message
    assert not (tmp_path / "workspace" / "refused.bin").exists()


def test_the_link_hands_a_blob_only_to_the_session_that_said_it_is_local() -> None:
    link = LocalLink()
    link.put("remote", "c1", b"x")  # never attached: nothing kept
    assert link.held == 0
    link.attach("s1")
    link.put("s1", "c2", b"y")
    assert link.take("s2", "c2") is None  # another session asks: not its blob
    assert link.take("s1", "c2") == b"y" and link.take("s1", "c2") is None
    link.put("s1", "c3", b"z")
    link.detach("s1")  # the stream ended: what was not taken goes
    assert link.held == 0 and not link.local("s1")


def test_a_result_blob_reaches_the_local_hub_by_reference_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = written(monkeypatch)
    blobs = [os.urandom(MIB), os.urandom(MIB - 3)]
    got: list[bytes] = []

    async def scenario() -> None:
        async with up(tmp_path, local=True) as (hub, link, _worker):
            for i, blob in enumerate(blobs):
                (tmp_path / "workspace" / f"page-{i}.bin").write_bytes(blob)
                got.append(await read_bytes(hub, read(f"page-{i}.bin")))
            assert link.held == 0  # each taken as its result was read

    asyncio.run(scenario())
    assert got == blobs
    assert sizes and max(sizes) < 64 * 1024  # no result carried its blob down the stream


def test_a_worker_whose_session_is_not_local_sends_result_blobs_inside_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = written(monkeypatch)
    blob = os.urandom(MIB)

    async def scenario() -> bytes:
        async with up(tmp_path, local=False) as (hub, link, _worker):
            (tmp_path / "workspace" / "page.bin").write_bytes(blob)
            got = await read_bytes(hub, read("page.bin"))
            assert link.held == 0 and not link.results_held  # nothing handed either way
            return got

    assert asyncio.run(scenario()) == blob
    assert max(sizes) > MIB  # the result's envelope, its blob in it


@pytest.mark.parametrize("local", [True, False])
@pytest.mark.parametrize("spilled", [False, True])
def test_a_page_read_from_the_cache_is_replayed_intact_from_memory_or_the_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, local: bool, spilled: bool
) -> None:
    """fs_read's cached page leaves as a read-only view of the buffer it was read into
    (sandbox.read_cached), not a copy: held with its result until the server acks it,
    handed to a hub in this process or framed down the stream, and written to the
    ledger when held results spill (a bound of 0 here: each at once). A retry of the
    id before any ack gets the same bytes, from memory or from the ledger."""
    blob = os.urandom(MIB - 5)
    if spilled:
        monkeypatch.setattr(ledger, "HELD_BYTES", 0)

    async def scenario() -> list[pb.ActionResult]:
        async with up(tmp_path, local=local) as (hub, link, _worker):
            (tmp_path / "workspace" / "page.bin").write_bytes(blob)
            monkeypatch.setattr(hub, "_store_soon", lambda: None)  # no ack: still held
            answers = [(await hub.dispatch(read("page.bin", "read-1"))).result for _ in "12"]
            assert link.held == 0 and not link.results_held
            return answers

    first, again = asyncio.run(scenario())
    assert first.status == pb.ActionResult.OK, first.error.message
    assert first.blob == blob and not first.replayed
    assert again.blob == blob and again.replayed  # the worker's answer to a duplicate


def listing(correlation_id: str) -> pb.DispatchRequest:
    return pb.DispatchRequest(
        correlation_id=correlation_id,
        agent_id="tester",
        surface="workerHost",
        action="fs_list",
        args_json=json.dumps({"path": "many", "limit": 3000}),
    )


@pytest.mark.parametrize("local", [True, False])
def test_a_large_result_reaches_the_hub_by_reference_on_a_local_session_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, local: bool
) -> None:
    """A listing of 3,000 entries (about 450 KB of JSON, no blob) goes to a hub in this
    process by reference, its stub down the stream; the caller's response, the hub's
    stored answer (a retry of the id) and the in-process answer are the very result a
    worker elsewhere sends down the stream whole."""
    sizes = written(monkeypatch)
    many = tmp_path / "workspace" / "many"
    many.mkdir(parents=True)
    for i in range(3000):
        (many / f"entry-{i:04d}.txt").write_bytes(b"x" * (i % 7))

    async def scenario() -> list[pb.ActionResult]:
        async with up(tmp_path, local=local) as (hub, link, _worker):
            first = pb.DispatchResponse.FromString(
                await hub.dispatch_serialized(listing("list-1"), None)
            ).result
            hub.store_results()  # stored now, as its group commit would
            again = (await hub.dispatch(listing("list-1"))).result
            other = (await hub.dispatch(listing("list-2"))).result
            assert link.held == 0
            return [first, again, other]

    first, again, other = asyncio.run(scenario())
    assert first.status == pb.ActionResult.OK, first.error.message
    entries = json.loads(first.result_json)["entries"]
    assert len(entries) == 3000 and entries[-1]["name"] == "entry-2999.txt"
    assert again.replayed and again.result_json == first.result_json
    assert again.invocation == first.invocation
    assert other.result_json == first.result_json and other.status == pb.ActionResult.OK
    if local:
        assert sizes and max(sizes) < 64 * 1024  # each result's stub only
    else:
        assert max(sizes) > len(first.result_json)  # the result down the stream


def test_a_result_whose_caller_left_is_taken_kept_and_replayed_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller goes away as the result leaves the worker: the hub takes the blob
    all the same (nothing stays handed), and a retry of the id gets the bytes; the hub
    stores nothing meanwhile, so the worker answers the retry as a duplicate, from the
    result it still holds, its blob handed over again."""
    blob = os.urandom(MIB)
    handed: list[str] = []

    async def scenario() -> bytes:
        async with up(tmp_path, local=True) as (hub, link, _worker):
            (tmp_path / "workspace" / "page.bin").write_bytes(blob)
            monkeypatch.setattr(hub, "_store_soon", lambda: None)  # no ack: still held
            taken = asyncio.Event()
            first = asyncio.create_task(read_bytes(hub, read("page.bin", "read-1")))
            hand, take = link.hand_result, link.take_result

            def hand_and_leave(session_id: str, result: HandedResult) -> bool:
                handed.append(result.key[0])
                first.cancel()  # the caller goes away as its result leaves the worker
                return hand(session_id, result)

            def take_and_tell(session_id: str, key: tuple[str, str, str]) -> HandedResult | None:
                result = take(session_id, key)
                taken.set()
                return result

            monkeypatch.setattr(link, "hand_result", hand_and_leave)
            monkeypatch.setattr(link, "take_result", take_and_tell)
            with pytest.raises(asyncio.CancelledError):
                await first
            await taken.wait()
            assert link.held == 0
            again = await read_bytes(hub, read("page.bin", "read-1"))
            assert link.held == 0
            return again

    assert asyncio.run(scenario()) == blob
    assert handed == ["read-1", "read-1"]  # the result, then the worker's replay of it


def test_a_result_handed_as_the_stream_drops_is_let_go_and_sent_again_inside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hub's stream ends with a result written and its blob handed, not read: the
    blob goes with the stream, and the worker sends the unacked result again on the
    next one (with its blob in it), which answers the waiting caller."""
    sizes = written(monkeypatch)
    blob = os.urandom(MIB)
    held_at_drop: list[int] = []

    async def scenario() -> bytes:
        async with up(tmp_path, local=True) as (hub, link, worker):
            (tmp_path / "workspace" / "page.bin").write_bytes(blob)
            handle = hub._handle

            def drop_at_first_result(
                session: Session, msg: pb.WorkerMessage, data: bytes | memoryview | None
            ) -> None:
                if msg.WhichOneof("kind") == "result" and not held_at_drop:
                    held_at_drop.append(link.held)
                    session.close()  # the stream ends with the result unread
                    return
                handle(session, msg, data)

            monkeypatch.setattr(hub, "_handle", drop_at_first_result)
            got = await read_bytes(hub, read("page.bin"))
            assert worker.sessions_started == 2
            assert link.held == 0
            return got

    assert asyncio.run(scenario()) == blob
    assert held_at_drop == [1]  # handed, then let go with its stream
    assert max(sizes) > MIB  # sent again inside the result


def test_the_link_hands_results_on_a_local_session_to_the_stub_they_came_with() -> None:
    link = LocalLink()
    done = pb.ActionResult(correlation_id="c1", status=pb.ActionResult.OK, result_json="{}")
    done.invocation.invocation_id = "i1"

    def handing(blob: bytes) -> HandedResult:
        return HandedResult(result_key(done), done.SerializeToString(), blob)

    x, y, z = handing(b"x"), handing(b"y"), handing(b"z")
    assert not link.hand_result("s1", x)  # not local: it goes whole
    link.attach("s1")
    assert link.hand_result("s1", x)
    assert link.hand_result("s1", x)  # a replay sent before it was read
    gone = pb.ActionResult(correlation_id="c1", status=pb.ActionResult.ERROR, replayed=True)
    gone.invocation.CopyFrom(done.invocation)
    gone.error.code = "blob_gone"
    assert link.take_result("s1", result_key(gone)) is None  # not the result it came with
    assert link.take_result("s2", result_key(done)) is None  # another session's
    assert link.take_result("s1", result_key(done)) is x
    link.detach("s1")  # the worker's end: the hub may still read what was written
    assert not link.hand_result("s1", y) and link.held == 1
    assert link.take_result("s1", result_key(done)) is x and link.held == 0
    link.attach("s2")
    assert link.hand_result("s2", z)
    link.end("s2")  # the hub's end: it reads no more of the session
    assert link.held == 0 and not link.results_held and not link.local("s2")
    # Down the stream: the stub (no result_json, no blob) once handed, else all of it.
    assert pb.WorkerEnvelope.FromString(x.part(True)).messages[0].result == pb.ActionResult(
        correlation_id="c1", status=pb.ActionResult.OK, invocation=done.invocation
    )
    whole = pb.WorkerEnvelope.FromString(x.part(False)).messages[0].result
    assert whole.result_json == "{}" and whole.blob == b"x"


@contextlib.asynccontextmanager
async def hub_and_worker_parts(home: Path) -> AsyncIterator[tuple[app.RunningHub, Any]]:
    """A started hub and what its worker in this process is built from (`connect`
    builds a connection to it over the in-process stream, with the given key)."""
    write_config(home, f"127.0.0.1:{free_port()}")
    paths = Paths(home, home)
    config = load(paths)
    running = await app.start_hub(paths, config)
    dispatcher = app.build_dispatcher(paths, config)
    asyncio.get_running_loop().set_default_executor(dispatcher.threads)

    def connect(worker_key: str) -> WorkerConnection:
        token = read_token(paths.workers_token_file)
        target = app.Target(address=running.address, token=token, worker_key=worker_key)
        return app.build_connection(
            dispatcher, target, config, link=LocalLink(), dial=running.local.open_stream
        )

    try:
        yield running, connect
    finally:
        if not running.local.stopped:  # not stopped by the test
            await running.stop()
        dispatcher.close()


def test_the_in_process_stream_binds_a_worker_to_its_key_as_grpc_does(tmp_path: Path) -> None:
    """The hub reads the worker's key from the in-process stream's metadata: another
    key for the same worker id is refused PERMISSION_DENIED, fatal for the worker."""

    async def scenario() -> None:
        async with hub_and_worker_parts(tmp_path) as (running, connect):
            first = connect("the-key")
            runner = asyncio.create_task(first.run())
            await asyncio.wait_for(first.connected.wait(), 30)
            assert list(running.hub.sessions) == [first.dispatcher.worker_id]
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
            with pytest.raises(connection.FatalConnectionError, match="belongs to another"):
                await asyncio.wait_for(connect("another-key").run(), 30)

    asyncio.run(scenario())


def test_the_hubs_stop_ends_the_in_process_session_and_the_worker_waits_to_dial(
    tmp_path: Path,
) -> None:
    """The hub's stop ends its worker's in-process session (a Drain, then the end of the
    stream); the worker is not refused for good: it backs off and dials again."""

    async def scenario() -> list[str]:
        async with hub_and_worker_parts(tmp_path) as (running, connect):
            worker = connect("the-key")
            states: list[str] = []
            backing_off = asyncio.Event()

            def on_state(state: connection.LinkState) -> None:
                states.append(state.state)
                if state.state == "backoff":
                    backing_off.set()

            worker.on_state = on_state
            runner = asyncio.create_task(worker.run())
            await asyncio.wait_for(worker.connected.wait(), 30)
            await running.stop()
            await asyncio.wait_for(backing_off.wait(), 30)
            assert not runner.done()
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
            return states

    states = asyncio.run(scenario())
    assert states[:3] == ["connecting", "ready", "backoff"]


def test_a_worker_cancelled_while_a_stopped_hub_refuses_its_dial_ends(tmp_path: Path) -> None:
    """A stopped hub refuses a dial at once (UNAVAILABLE). A cancel of the worker that
    comes at any turn of the loop around that refusal ends the worker; it is never
    lost in the refusal's read, leaving the worker to dial again, uncancellable (on
    Python 3.11, asyncio.wait_for lost it when it came as the read ended: one turn
    or a few after the dial, which a loaded machine hits by chance)."""

    async def cancelled_after(connect: Any, turns: int) -> bool:
        """Whether a cancel `turns` turns of the loop after the worker's dial ended it."""
        worker = connect("the-key")
        dialling, dialled_again = asyncio.Event(), asyncio.Event()
        cancelled = False

        def on_state(state: connection.LinkState) -> None:
            if state.state == "connecting":
                dialling.set()
            if cancelled and state.state == "backoff":
                dialled_again.set()  # the cancel was lost: it waits to dial again

        worker.on_state = on_state
        runner = asyncio.create_task(worker.run())
        await dialling.wait()
        for _ in range(turns):
            await asyncio.sleep(0)
        runner.cancel()
        cancelled = True
        again = asyncio.create_task(dialled_again.wait())
        await asyncio.wait({runner, again}, return_when=asyncio.FIRST_COMPLETED)
        again.cancel()
        ended = runner.done()
        if not ended:
            runner.cancel()  # in its backoff now, where a cancel is not lost
        with contextlib.suppress(asyncio.CancelledError):
            await runner
        return ended

    async def scenario() -> list[int]:
        async with hub_and_worker_parts(tmp_path) as (running, connect):
            await running.stop()
            return [turns for turns in range(12) if not await cancelled_after(connect, turns)]

    assert asyncio.run(scenario()) == []


def test_a_local_write_is_on_disk_before_the_hub_has_hashed_it_and_placed_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside `up` the request goes to the worker with its blob at once, and the digest
    follows by the link once the hub has hashed the blob and recorded the call: the
    worker writes and flushes the temporary file meanwhile, and claims and renames it
    only after. Here the hub's hash waits until the worker's file is on disk: then the
    name still holds the old content and the worker's ledger holds nothing of the call;
    the call ends OK, claimed with the hub's digest."""
    from worker.actions.host import fs_write

    blob = os.urandom(3 * MIB + 1)
    on_disk, seen = threading.Event(), []
    real_wait, real_hash = fs_write._Verdict.wait, delivery.blob_sha256
    (tmp_path / "workspace").mkdir(parents=True, exist_ok=True)
    (tmp_path / "workspace" / "late.bin").write_bytes(b"old")

    def wait(verdict: fs_write._Verdict) -> bool:
        on_disk.set()
        return real_wait(verdict)

    def digest(data: bytes | memoryview) -> bytes:  # the hash the digest is made from
        assert on_disk.wait(60), "the worker's temporary file is on disk first"
        temporary = [p for p in (tmp_path / "workspace").iterdir() if p.name.endswith("-tmp")]
        with contextlib.closing(sqlite3.connect(tmp_path / "state.db")) as db:
            rows = db.execute("SELECT COUNT(*) FROM calls").fetchone()[0]
        seen.append(([p.read_bytes() == blob for p in temporary], rows))
        seen.append((tmp_path / "workspace" / "late.bin").read_bytes())
        return real_hash(data)

    monkeypatch.setattr(fs_write._Verdict, "wait", wait)
    monkeypatch.setattr(delivery, "blob_sha256", digest)

    async def scenario() -> pb.ActionResult:
        async with up(tmp_path, local=True) as (hub, link, _worker):
            reply = await hub.dispatch(write("late.bin", blob))
            assert link.held == 0
            return reply.result

    result = asyncio.run(scenario())
    assert seen == [([True], 0), b"old"]
    assert result.status == pb.ActionResult.OK, result.error.message
    request = pb.ActionRequest(
        surface="workerHost",
        action="fs_write",
        agent_id="tester",
        args_json=write("late.bin", b"").args_json,
    )
    # Made from the blob's SHA-256, which the hub handed over with it: the answer's.
    assert result.invocation.args_digest == digest_of_sha256(request, hashlib.sha256(blob).digest())
    assert json.loads(result.result_json)["sha256"] == hashlib.sha256(blob).hexdigest()
    assert (tmp_path / "workspace" / "late.bin").read_bytes() == blob
    assert not [p for p in (tmp_path / "workspace").iterdir() if p.name.endswith("-tmp")]


def test_a_handed_write_repeated_under_its_id_is_checked_in_the_scheme_it_was_recorded_in(
    tmp_path: Path,
) -> None:
    """A write handed over inside `up` is recorded under the digest made from its blob's
    SHA-256. A caller repeating its id (a call whose id the caller names is hashed the
    usual way, BLAKE3 over the blob) is hashed again in the recorded scheme: with the
    same bytes it is answered as the same call (replayed, not written again), with other
    bytes `args_mismatch`; neither touches the file."""
    blob = os.urandom(2 * MIB + 3)
    target = tmp_path / "workspace" / "twice.bin"

    async def scenario() -> tuple[pb.ActionResult, pb.ActionResult, pb.ActionResult]:
        async with up(tmp_path, local=True) as (hub, link, _worker):
            first = (await hub.dispatch(write("twice.bin", blob))).result
            assert first.status == pb.ActionResult.OK, first.error.message
            target.write_bytes(b"changed since")
            again = write("twice.bin", blob)
            again.correlation_id = first.correlation_id
            repeat = (await hub.dispatch(again)).result
            other = write("twice.bin", blob[:-1] + bytes([blob[-1] ^ 1]))
            other.correlation_id = first.correlation_id
            mismatch = (await hub.dispatch(other)).result
            assert link.held == 0
            return first, repeat, mismatch

    first, repeat, mismatch = asyncio.run(scenario())
    assert first.invocation.args_digest.startswith(SHA256_SCHEME)
    assert repeat.status == pb.ActionResult.OK and repeat.replayed, repeat.error.message
    assert json.loads(repeat.result_json) == json.loads(first.result_json)
    assert mismatch.error.code == "args_mismatch", mismatch.error.message
    assert target.read_bytes() == b"changed since"
