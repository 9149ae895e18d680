"""fs_read answers a page the kernel holds in its page cache in the turn that received
the call, as fs_stat does; a page it let go, and a page to decode, are read in a thread.
Either way the answer is the same."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from sandbox import ConfinedDir, open_regular, read_cached
from worker import app
from worker.config import Config, GrantSection, Paths, RootSection
from worker.core.pipeline import Dispatcher, Outgoing
from worker.wire.framing import worker_message_of
from worker.wire.local import HandedResult
from worker.wire.proto import agentworker_pb2 as pb


def _dispatcher(tmp_path: Path) -> tuple[Dispatcher, list[tuple[pb.ActionResult, bytes]]]:
    """A worker whose agent "t" may read its one read-only root, and the results it
    sends (each with its blob, handed apart as `up` hands it)."""
    (tmp_path / "files").mkdir()
    config = Config(
        root=[RootSection(path=tmp_path / "files", mode="ro")],
        grant=[GrantSection(agent="t", scopes=["workerHost.fs_read"])],
    )
    dispatcher = app.build_dispatcher(Paths(config_dir=tmp_path, data_dir=tmp_path), config)
    sent: list[tuple[pb.ActionResult, bytes]] = []

    def send(out: Outgoing) -> None:
        message = worker_message_of(out) if isinstance(out, bytes) else out
        if message.WhichOneof("kind") == "result":
            sent.append((message.result, message.result.blob))

    def hand(result: HandedResult) -> None:
        sent.append((pb.ActionResult.FromString(result.result), result.blob))

    dispatcher.outbox.attach(send, hand)
    return dispatcher, sent


def _read(cid: str, **args: object) -> pb.ActionRequest:
    return pb.ActionRequest(
        correlation_id=cid,
        agent_id="t",
        surface="workerHost",
        action="fs_read",
        args_json=json.dumps({"path": "f.bin", **args}),
    )


def _drop_from_the_cache(path: Path) -> None:
    """Ask the kernel to let the file's pages go (clean ones: written to disk first)."""
    with open(path, "rb+") as file:
        os.fsync(file.fileno())
        os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def _drops_pages(folder: Path) -> bool:
    """Whether this file system lets a file's pages go when asked (tmpfs keeps them),
    tried on a file of its own: reading one, even without waiting, may read ahead."""
    probe = folder / "probe.bin"
    probe.write_bytes(os.urandom(1 << 16))
    _drop_from_the_cache(probe)
    with ConfinedDir(folder) as root:
        fd = open_regular(root, probe.name)
        try:
            return read_cached(fd, 0, 1) is None
        finally:
            os.close(fd)


def test_a_cached_page_is_answered_within_submit(tmp_path: Path) -> None:
    dispatcher, sent = _dispatcher(tmp_path)
    data = os.urandom(1 << 20)
    (tmp_path / "files" / "f.bin").write_bytes(data)

    async def run() -> None:
        dispatcher.submit(_read("whole"))
        dispatcher.submit(_read("page", offset=1000, length=10))
        dispatcher.submit(_read("past", offset=2 << 20))
        assert [result.correlation_id for result, _ in sent] == ["whole", "page", "past"]

    asyncio.run(run())
    dispatcher.close()
    (whole, blob), (page, page_blob), (past, past_blob) = sent
    assert blob == data and json.loads(whole.result_json)["eof"] is True
    assert page_blob == data[1000:1010]
    assert json.loads(page.result_json)["next_offset"] == 1010
    assert past_blob == b"" and json.loads(past.result_json)["length"] == 0


def test_a_page_the_kernel_let_go_is_read_in_a_thread(tmp_path: Path) -> None:
    dispatcher, sent = _dispatcher(tmp_path)
    path = tmp_path / "files" / "f.bin"
    data = os.urandom(1 << 20)
    path.write_bytes(data)
    if not _drops_pages(tmp_path):
        dispatcher.close()
        pytest.skip("this file system keeps files in memory: every page is cached")
    _drop_from_the_cache(path)

    async def run() -> None:
        dispatcher.submit(_read("cold"))
        assert sent == []  # not answered in this turn: its task reads it in a thread
        await dispatcher.drain(30)

    asyncio.run(run())
    dispatcher.close()
    ((result, blob),) = sent
    assert result.status == pb.ActionResult.OK and blob == data


def test_a_page_to_decode_is_read_in_a_thread(tmp_path: Path) -> None:
    dispatcher, sent = _dispatcher(tmp_path)
    (tmp_path / "files" / "f.bin").write_text("héllo")

    async def run() -> None:
        dispatcher.submit(_read("text", encoding="utf-8"))
        assert sent == []
        await dispatcher.drain(30)

    asyncio.run(run())
    dispatcher.close()
    ((result, blob),) = sent
    assert json.loads(result.result_json)["text"] == "héllo" and blob == b""
