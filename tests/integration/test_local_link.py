"""`agentworker up`: hub and worker in one process hand request blobs over by
reference (worker.wire.local), not as BlobParts down their stream; a worker that did
not open its session in this process is never handed anything, and a handed blob is
held to the bounds parts are."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.cluster import free_port, write_config
from worker import app
from worker.config import Paths, load
from worker.core import blob_parts
from worker.hub import server
from worker.hub.server import Hub
from worker.wire.local import LocalLink
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.transport import read_or_create_token, read_token

MIB = 1024 * 1024


@contextlib.asynccontextmanager
async def up(home: Path, *, local: bool) -> AsyncIterator[tuple[Hub, LocalLink]]:
    """A hub and a worker in this event loop, as `agentworker up` assembles them; with
    `local`, the worker says its session is in this process."""
    write_config(home, f"127.0.0.1:{free_port()}")
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
    worker = app.build_connection(dispatcher, target, config, link=link if local else None)
    runner = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(worker.connected.wait(), 30)
        yield running.hub, link
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


def parts_built(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The offsets of every BlobPart the hub builds from now on."""
    built: list[int] = []
    real = server.blob_part

    def counted(correlation_id: str, offset: int, data: bytes | memoryview) -> bytes:
        built.append(offset)
        return real(correlation_id, offset, data)

    monkeypatch.setattr(server, "blob_part", counted)
    return built


def test_a_large_blob_reaches_the_local_worker_with_no_part_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = parts_built(monkeypatch)
    blobs = [os.urandom(3 * MIB + 7), os.urandom(2 * MIB)]

    async def scenario() -> None:
        async with up(tmp_path, local=True) as (hub, link):
            for i, blob in enumerate(blobs):
                reply = await hub.dispatch(write(f"big-{i}.bin", blob))
                assert reply.result.status == pb.ActionResult.OK, reply.result.error.message
            assert link.held == 0  # each taken by its request

    asyncio.run(scenario())
    assert built == []
    for i, blob in enumerate(blobs):
        assert (tmp_path / "workspace" / f"big-{i}.bin").read_bytes() == blob


def test_a_worker_whose_session_is_not_local_gets_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = parts_built(monkeypatch)
    blob = os.urandom(3 * MIB)

    async def scenario() -> None:
        async with up(tmp_path, local=False) as (hub, link):
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
        async with up(tmp_path, local=True) as (hub, link):
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
