"""Protocol 3: a request may come ahead of its blob, its parts after it and its digest
last (`ActionRequest.parts_follow`, `BlobPart.args_digest`). A real worker against a
scripted hub (real loopback gRPC): fs_write writes the parts to its temporary file as
they come and claims and places it only once the digest came; a blob that stops coming
(a Cancel, a dropped stream, parts that do not add up, a killed plan) places nothing,
leaves no temporary file and claims nothing; any other action is run once its whole
blob and digest came. And a real hub and worker over gRPC speak it, or protocol 2 with
a worker that does not."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import sqlite3
import threading
from pathlib import Path

import pytest

from tests.integration.test_local_link import up, write
from tests.integration.test_stream_rules import MIB, error_code, play
from tests.support.scripted_hub import ScriptedHub
from worker.actions.host import fs_write
from worker.core import blob_parts, connection
from worker.core.connection import WorkerConnection
from worker.wire.proto import agentworker_pb2 as pb

OLD = b"old content\n"
ARGS = json.dumps({"path": "target.bin", "mode": "overwrite"})
WRITE = {"surface": "workerHost", "action": "fs_write"}


def header(hub: ScriptedHub, cid: str, size: int, args: str = ARGS, **fields: object) -> None:
    fields = {**WRITE, **fields}
    hub.request(cid, args, blob_in_parts=size, parts_follow=True, **fields)


def parts(hub: ScriptedHub, cid: str, blob: bytes, start: int = 0, end: int | None = None) -> None:
    for at in range(start, len(blob) if end is None else end, MIB):
        hub.send(blob_part=pb.BlobPart(correlation_id=cid, data=blob[at : at + MIB], offset=at))


def digest(hub: ScriptedHub, cid: str, size: int, value: str = "") -> None:
    value = value or f"blake3:{cid}"
    hub.send(blob_part=pb.BlobPart(correlation_id=cid, offset=size, args_digest=value))


def send_whole(hub: ScriptedHub, cid: str, blob: bytes, value: str = "", **fields: object) -> None:
    header(hub, cid, len(blob), **fields)
    parts(hub, cid, blob)
    digest(hub, cid, len(blob), value)


def target(home: Path) -> Path:
    return home / "workspace" / "target.bin"


def temporary_files(home: Path) -> list[bytes]:
    return [p.read_bytes() for p in (home / "workspace").iterdir() if p.name.endswith("-tmp")]


def begun(
    hub: ScriptedHub, home: Path, cid: str, blob: bytes, end: int | None = None, **fields: object
) -> None:
    """target.bin holds OLD; a write of `blob` is announced, its parts up to `end` sent."""
    target(home).write_bytes(OLD)
    header(hub, cid, len(blob), **fields)
    parts(hub, cid, blob, end=end)


def check_placed(home: Path, content: bytes) -> None:
    """target.bin holds `content` (OLD: the write placed nothing), no temporary file left."""
    assert target(home).read_bytes() == content
    assert temporary_files(home) == []


def check_holds_nothing(link: WorkerConnection) -> None:
    """The worker holds no call's parts and waits for none."""
    assert link._follows == {}
    assert link._parts.held_bytes == 0


def ledger(home: Path, cid: str) -> tuple[str, str] | None:
    with contextlib.closing(sqlite3.connect(home / "state.db")) as db:
        row = db.execute(
            "SELECT state, args_digest FROM calls WHERE correlation_id = ?", (cid,)
        ).fetchone()
    return None if row is None else (row[0], row[1])


def results_so_far(hub: ScriptedHub) -> list[pb.ActionResult]:
    """The results the worker sent that no `next` took yet (taken off the inbox)."""
    taken = []
    while not hub.inbox.empty():
        msg = hub.inbox.get_nowait()
        if msg.WhichOneof("kind") == "result":
            taken.append(msg.result)
    return taken


@pytest.fixture
def on_disk(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set once a write's temporary file is on disk, waiting for its claim."""
    came = threading.Event()
    real = fs_write._Verdict.wait
    monkeypatch.setattr(fs_write._Verdict, "wait", lambda self: (came.set(), real(self))[1])
    return came


class Writes:
    """fs_write's writing threads that have ended: a call stopped before its claim is
    answered as soon as it stops, and its thread removes the temporary file as it ends
    (it may still be writing a part then)."""

    def __init__(self) -> None:
        self._ended = 0
        self._moved = threading.Condition()

    def ended(self) -> None:
        with self._moved:
            self._ended += 1
            self._moved.notify_all()

    async def until(self, count: int) -> None:
        def wait() -> None:
            with self._moved:
                assert self._moved.wait_for(lambda: self._ended >= count, 60)

        await asyncio.to_thread(wait)


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> Writes:
    seen = Writes()
    real = fs_write._write

    def write(*args: object) -> object:
        try:
            return real(*args)  # type: ignore[arg-type]
        finally:
            seen.ended()

    monkeypatch.setattr(fs_write, "_write", write)
    return seen


async def probe_runs(hub: ScriptedHub, cid: str) -> None:
    """A plain call answers: the stream goes on."""
    hub.request(cid, json.dumps({"mark": "after"}))
    assert error_code(await hub.next("result")) == "ok"


def test_a_write_is_on_disk_as_its_parts_came_and_placed_once_its_digest_came(
    tmp_path: Path, on_disk: threading.Event
) -> None:
    blob = os.urandom(3 * MIB + 5)

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        begun(hub, tmp_path, "w1", blob)
        await asyncio.to_thread(on_disk.wait)  # every part is in the temporary file
        assert temporary_files(tmp_path) == [blob] and target(tmp_path).read_bytes() == OLD
        assert ledger(tmp_path, "w1") is None and results_so_far(hub) == []
        digest(hub, "w1", len(blob))
        result = await hub.next("result")
        assert error_code(result) == "ok", result
        answer = json.loads(result.result_json)
        assert answer["sha256"] == hashlib.sha256(blob).hexdigest()
        assert answer["bytes_written"] == len(blob)
        assert result.invocation.args_digest == "blake3:w1"
        check_placed(tmp_path, blob)
        assert ledger(tmp_path, "w1") == ("DONE", "blake3:w1")
        check_holds_nothing(link)

        # The same id again: answered from the ledger, the file not written again; with
        # another digest, refused.
        target(tmp_path).write_bytes(OLD)
        send_whole(hub, "w1", blob)
        assert (await hub.next("ack")).kind == pb.ActionAck.DUPLICATE_DONE
        assert (await hub.next("result")).replayed
        send_whole(hub, "w1", blob, "blake3:another")
        assert (await hub.next("ack")).kind == pb.ActionAck.REJECTED_ARGS_MISMATCH
        check_placed(tmp_path, OLD)

    play(tmp_path, scenario, protocol=3)


def test_a_cancel_while_the_blob_comes_places_nothing_and_the_call_runs_when_sent_again(
    tmp_path: Path, writes: Writes
) -> None:
    blob = os.urandom(3 * MIB)

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        begun(hub, tmp_path, "c1", blob, end=MIB)
        hub.send(cancel=pb.Cancel(correlation_id="c1", reason="the caller left"))
        refused = await hub.next("result")
        assert error_code(refused) == "cancelled", refused
        parts(hub, "c1", blob, start=MIB)  # what was on its way already: dropped
        digest(hub, "c1", len(blob))
        await probe_runs(hub, "after")
        assert results_so_far(hub) == []  # no second answer
        await writes.until(1)
        check_placed(tmp_path, OLD)
        assert ledger(tmp_path, "c1") is None and link._parts.held_bytes == 0
        send_whole(hub, "c1", blob)  # sent again: it runs, once
        result = await hub.next("result")
        assert error_code(result) == "ok" and not result.replayed, result
        check_placed(tmp_path, blob)

    play(tmp_path, scenario, protocol=3)


def test_a_stream_that_ends_while_the_blob_comes_places_nothing_and_the_call_runs_again(
    tmp_path: Path, writes: Writes
) -> None:
    blob = os.urandom(3 * MIB)

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        begun(hub, tmp_path, "s1", blob, end=2 * MIB)
        await probe_runs(hub, "before")  # the parts went in ahead of it
        hub.hang_up()
        await hub.dials(2)
        send_whole(hub, "s1", blob)  # the hub sends an open call again
        # The first call's refusal is never sent (it would stand for this delivery).
        result = await hub.next("result")
        assert error_code(result) == "ok" and not result.replayed, result
        await probe_runs(hub, "after")
        await writes.until(2)
        check_placed(tmp_path, blob)
        assert ledger(tmp_path, "s1") == ("DONE", "blake3:s1")
        check_holds_nothing(link)

    play(tmp_path, scenario, protocol=3)


@pytest.mark.parametrize(
    "broken", ["out of order", "more than announced", "short", "digest with data"]
)
def test_a_blob_that_does_not_come_as_announced_places_nothing(
    tmp_path: Path, broken: str, writes: Writes
) -> None:
    blob = os.urandom(3 * MIB)

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        target(tmp_path).write_bytes(OLD)
        header(hub, "b1", len(blob))
        if broken == "out of order":
            parts(hub, "b1", blob, start=MIB)
        elif broken == "more than announced":
            parts(hub, "b1", blob + b"x" * MIB)
        elif broken == "short":
            parts(hub, "b1", blob, end=2 * MIB)
        else:
            parts(hub, "b1", blob)
        if broken == "digest with data":
            hub.send(
                blob_part=pb.BlobPart(
                    correlation_id="b1", offset=len(blob), data=b"x", args_digest="blake3:b1"
                )
            )
        else:
            digest(hub, "b1", len(blob))
        refused = await hub.next("result")
        assert error_code(refused) == "validation_error", refused
        await probe_runs(hub, "after")
        await writes.until(1)
        check_placed(tmp_path, OLD)
        assert ledger(tmp_path, "b1") is None
        check_holds_nothing(link)

    play(tmp_path, scenario, protocol=3)


def test_a_plan_killed_while_the_blob_comes_places_nothing(tmp_path: Path, writes: Writes) -> None:
    blob = os.urandom(3 * MIB)

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        begun(hub, tmp_path, "k1", blob, end=MIB, plan_id="plan-k")
        hub.send(kill_plan=pb.KillPlan(plan_id="plan-k", reason="stop"))
        parts(hub, "k1", blob, start=MIB)
        digest(hub, "k1", len(blob))
        result = await hub.next("result")
        assert error_code(result) in {"plan_killed", "cancelled"}, result
        await writes.until(1)
        check_placed(tmp_path, OLD)
        check_holds_nothing(link)

    play(tmp_path, scenario, protocol=3)


def test_another_action_runs_once_its_whole_blob_and_digest_came(tmp_path: Path) -> None:
    blob = os.urandom(2 * MIB + 3)
    echo = json.dumps({"blob_repeat": 1, "mark": "follow"})

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        header(hub, "e1", len(blob), echo, surface="workerDiag", action="probe")
        parts(hub, "e1", blob)
        await probe_runs(hub, "between")  # not run yet: no digest
        assert results_so_far(hub) == []
        digest(hub, "e1", len(blob))
        result = await hub.next("result")
        assert error_code(result) == "ok" and result.blob == blob, result
        assert result.invocation.args_digest == "blake3:e1"
        check_holds_nothing(link)

    play(tmp_path, scenario, protocol=3)


def test_a_blob_past_what_one_call_may_hold_is_refused_too_large_once_its_digest_came(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(blob_parts, "MAX_CALL_BYTES", MIB)
    blob = os.urandom(2 * MIB)

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        begun(hub, tmp_path, "t1", blob)
        await probe_runs(hub, "between")
        assert results_so_far(hub) == []  # answered only once the hub recorded it
        digest(hub, "t1", len(blob))
        refused = await hub.next("result")
        assert error_code(refused) == "too_large", refused
        check_placed(tmp_path, OLD)
        assert link._parts.held_bytes == 0

    play(tmp_path, scenario, protocol=3)


def test_a_request_followed_by_its_blob_on_protocol_2_runs_nothing(tmp_path: Path) -> None:
    blob = os.urandom(2 * MIB)

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        target(tmp_path).write_bytes(OLD)
        send_whole(hub, "p2", blob)
        refused = await hub.next("result")
        assert error_code(refused) == "validation_error", refused
        assert "protocol 2" in refused.error.message
        check_placed(tmp_path, OLD)

    play(tmp_path, scenario, protocol=2)


@pytest.mark.parametrize("worker_speaks", [3, 2])
def test_a_hub_and_worker_over_grpc_write_as_their_protocol_allows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, worker_speaks: int
) -> None:
    """A real hub and a real worker over loopback gRPC: protocol 3 when both speak it (the
    request ahead of its parts), 2 with a worker that speaks no more (parts first)."""
    monkeypatch.setattr(connection, "PROTOCOL_MAX", worker_speaks)
    blob = os.urandom(5 * MIB + 1)
    follows: list[bool] = []
    real = connection.WorkerConnection._handle

    def handle(self: WorkerConnection, msg: pb.ServerMessage, data: object = None) -> bool:
        if msg.WhichOneof("kind") == "request" and msg.request.blob_in_parts:
            follows.append(msg.request.parts_follow)
        return real(self, msg, data)  # type: ignore[arg-type]

    monkeypatch.setattr(connection.WorkerConnection, "_handle", handle)

    async def scenario() -> tuple[int, pb.ActionResult]:
        async with up(tmp_path, local=False) as (hub, _link, _worker):
            result = (await hub.dispatch(write("over.bin", blob))).result
            (session,) = hub.sessions.values()
            return session.protocol, result

    protocol, result = asyncio.run(scenario())
    assert protocol == worker_speaks and follows == [worker_speaks == 3]
    assert error_code(result) == "ok", result
    assert json.loads(result.result_json)["sha256"] == hashlib.sha256(blob).hexdigest()
    assert (tmp_path / "workspace" / "over.bin").read_bytes() == blob
    assert not [p for p in (tmp_path / "workspace").iterdir() if p.name.endswith("-tmp")]


@pytest.mark.parametrize("mode", ["append", "make_parents"])
def test_a_write_that_claims_first_waits_for_its_digest_then_writes_every_part(
    tmp_path: Path, mode: str
) -> None:
    """Appending, and a write that makes missing folders, change what others see as they
    go, so they claim first: such a call waits for its digest (after every part) before
    it writes a byte, then writes them all."""
    blob = os.urandom(2 * MIB + 9)
    name = "target.bin" if mode == "append" else "new/folder/target.bin"
    args = json.dumps(
        {"path": name, "mode": "append"}
        if mode == "append"
        else {"path": name, "mode": "create", "make_parents": True}
    )
    written = tmp_path / "workspace" / name

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        if mode == "append":
            written.write_bytes(OLD)
        header(hub, "a1", len(blob), args)
        parts(hub, "a1", blob)
        await probe_runs(hub, "between")
        assert results_so_far(hub) == [] and ledger(tmp_path, "a1") is None
        assert written.read_bytes() == OLD if mode == "append" else not written.parent.exists()
        digest(hub, "a1", len(blob))
        result = await hub.next("result")
        assert error_code(result) == "ok", result
        assert json.loads(result.result_json)["sha256"] == hashlib.sha256(blob).hexdigest()
        assert written.read_bytes() == (OLD + blob if mode == "append" else blob)
        assert ledger(tmp_path, "a1") == ("DONE", "blake3:a1")

    play(tmp_path, scenario, protocol=3)
