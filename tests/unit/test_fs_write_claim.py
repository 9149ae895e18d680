"""fs_write claims its call itself (ActionSpec.claims_late): the temporary file is
written and flushed while the claim is made (and while the hub's digest, which the
claim needs, is on its way), and renamed into place only once the claim committed.
Nothing visible happens before the claim: a claim that fails, a digest that never
comes or a stop before the claim leave the old content and no temporary file, and
no ledger row, so the call may run (once) when sent again; a repeat is answered from
the ledger, and one that comes while the digest is on its way is answered once it
came."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import sqlite3
import threading
from pathlib import Path

import pytest

from worker import app
from worker.actions.host import fs_write
from worker.config import Config, GrantSection, Paths, RootSection
from worker.core.pipeline import Dispatcher, Outgoing
from worker.wire.framing import worker_message_of
from worker.wire.proto import agentworker_pb2 as pb

OLD, NEW = b"old content\n" * 100, b"new content\n" * 200


def _dispatcher(tmp_path: Path) -> Dispatcher:
    """Agent "t" may write in the read-write root `files`, which holds `target` (OLD)."""
    (tmp_path / "files").mkdir(exist_ok=True)
    (tmp_path / "files" / "target").write_bytes(OLD)
    config = Config(
        root=[RootSection(path=tmp_path / "files", mode="rw")],
        grant=[GrantSection(agent="t", scopes=["workerHost.fs_write"])],
    )
    return app.build_dispatcher(Paths(config_dir=tmp_path, data_dir=tmp_path), config)


def _request(cid: str, digest: str = "", path: str = "target") -> pb.ActionRequest:
    return pb.ActionRequest(
        correlation_id=cid,
        agent_id="t",
        surface="workerHost",
        action="fs_write",
        args_json=json.dumps({"path": path, "mode": "overwrite"}),
        args_digest=digest,
    )


def _ledger(tmp_path: Path, cid: str) -> tuple[str, str] | None:
    """The call's ledger row: (state, args_digest)."""
    with contextlib.closing(sqlite3.connect(tmp_path / "state.db")) as db:
        row = db.execute(
            "SELECT state, args_digest FROM calls WHERE correlation_id = ?", (cid,)
        ).fetchone()
    return None if row is None else (row[0], row[1])


def _temporary_files(tmp_path: Path) -> list[bytes]:
    return [p.read_bytes() for p in (tmp_path / "files").iterdir() if p.name.endswith("-tmp")]


class _Out:
    """What the dispatcher sends, as the server reads it; `result` waits for the next."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.messages: list[pb.WorkerMessage] = []
        self._came = asyncio.Event()
        self._taken = 0  # results `result` returned so far
        dispatcher.outbox.attach(self._emit)

    def _emit(self, out: Outgoing) -> None:
        self.messages.append(worker_message_of(out) if isinstance(out, bytes) else out)
        self._came.set()

    def results(self) -> list[pb.ActionResult]:
        return [m.result for m in self.messages if m.WhichOneof("kind") == "result"]

    def acks(self) -> list[pb.ActionAck.Kind.ValueType]:
        return [m.ack.kind for m in self.messages if m.WhichOneof("kind") == "ack"]

    async def result(self) -> pb.ActionResult:
        """The next result not returned yet (waited for, if none came)."""
        while len(self.results()) <= self._taken:
            self._came.clear()
            await self._came.wait()
        self._taken += 1
        return self.results()[self._taken - 1]


def test_the_temporary_file_is_on_disk_before_the_claim_and_placed_only_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request comes with its digest on its way (the hub in this process hands it
    over once it recorded the call): the new content is written and flushed to its
    temporary file, the name keeps the old, nothing is claimed and nothing answered;
    once the digest comes the call is claimed with it, the file is renamed into place,
    and the answer and the ledger carry that digest."""
    dispatcher = _dispatcher(tmp_path)
    came = threading.Event()
    real = fs_write._Verdict.wait
    monkeypatch.setattr(fs_write._Verdict, "wait", lambda self: (came.set(), real(self))[1])

    async def scenario() -> tuple[list[bytes], bytes, tuple[str, str] | None, pb.ActionResult]:
        out = _Out(dispatcher)
        handed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        dispatcher.submit(_request("w1"), NEW, handed=handed)
        await asyncio.to_thread(came.wait)  # the temporary file is on disk
        before = (_temporary_files(tmp_path), (tmp_path / "files" / "target").read_bytes())
        assert _ledger(tmp_path, "w1") is None and out.results() == []
        handed.set_result("blake3:handed")
        return *before, _ledger(tmp_path, "w1"), await out.result()

    temporary, target, unclaimed, result = asyncio.run(scenario())
    assert temporary == [NEW] and target == OLD and unclaimed is None
    assert result.status == pb.ActionResult.OK, result.error.message
    assert result.invocation.args_digest == "blake3:handed"
    assert (tmp_path / "files" / "target").read_bytes() == NEW and _temporary_files(tmp_path) == []
    dispatcher.close()
    assert _ledger(tmp_path, "w1") == ("DONE", "blake3:handed")


@pytest.mark.parametrize("handed_hash", ["given", "never given"])
def test_a_write_takes_the_hubs_sha256_of_the_blob_it_handed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handed_hash: str
) -> None:
    """Inside `up` the hub hashes the blob it hands over (its digest is made from the
    blob's SHA-256) and hands that hash over too: the write answers with it, hashing
    nothing itself. Should the hash not come (cancelled), the write hashes the blob."""
    dispatcher = _dispatcher(tmp_path)
    hashed: list[int] = []
    real_hash = fs_write._sha256
    monkeypatch.setattr(fs_write, "_sha256", lambda d, p: (hashed.append(1), real_hash(d, p))[1])
    real_whole = fs_write._sha256_of
    monkeypatch.setattr(fs_write, "_sha256_of", lambda d: (hashed.append(2), real_whole(d))[1])
    came = threading.Event()
    real = fs_write._Verdict.wait
    monkeypatch.setattr(fs_write._Verdict, "wait", lambda self: (came.set(), real(self))[1])
    by_hub = hashlib.sha256(NEW).hexdigest()

    async def scenario() -> pb.ActionResult:
        out = _Out(dispatcher)
        loop = asyncio.get_running_loop()
        handed: asyncio.Future[str] = loop.create_future()
        sha256: asyncio.Future[str] = loop.create_future()
        dispatcher.submit(_request("w0"), NEW, handed=handed, handed_sha256=sha256)
        await asyncio.to_thread(came.wait)  # the temporary file is on disk
        if handed_hash == "given":
            sha256.set_result(by_hub)
        else:
            sha256.cancel()
        handed.set_result("blake3+sha256:handed")
        return await out.result()

    result = asyncio.run(scenario())
    assert result.status == pb.ActionResult.OK, result.error.message
    assert json.loads(result.result_json)["sha256"] == by_hub
    assert hashed == ([] if handed_hash == "given" else [2])
    assert (tmp_path / "files" / "target").read_bytes() == NEW and _temporary_files(tmp_path) == []
    dispatcher.close()
    assert _ledger(tmp_path, "w0") == ("DONE", "blake3+sha256:handed")


def test_a_write_whose_digest_never_comes_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hub cancels the digest (its caller left before it recorded the call): the
    call is refused, never claimed, its temporary file removed, the old content kept."""
    dispatcher = _dispatcher(tmp_path)
    came = threading.Event()
    real = fs_write._Verdict.wait
    monkeypatch.setattr(fs_write._Verdict, "wait", lambda self: (came.set(), real(self))[1])

    async def scenario() -> pb.ActionResult:
        out = _Out(dispatcher)
        handed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        dispatcher.submit(_request("w2"), NEW, handed=handed)
        await asyncio.to_thread(came.wait)
        handed.cancel()
        return await out.result()

    result = asyncio.run(scenario())  # returns once the writing thread is done too
    assert result.error.code == "cancelled" and "nothing of it was run" in result.error.message
    assert (tmp_path / "files" / "target").read_bytes() == OLD and _temporary_files(tmp_path) == []
    dispatcher.close()
    assert _ledger(tmp_path, "w2") is None


def test_a_write_stopped_before_its_claim_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Cancel while the temporary file waits for its claim: answered `cancelled` (not
    outcome_unknown: its effect was never let start) once the hub's digest came, nothing
    placed, nothing claimed."""
    dispatcher = _dispatcher(tmp_path)
    came = threading.Event()
    real = fs_write._Verdict.wait
    monkeypatch.setattr(fs_write._Verdict, "wait", lambda self: (came.set(), real(self))[1])

    async def scenario() -> pb.ActionResult:
        out = _Out(dispatcher)
        handed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        dispatcher.submit(_request("w3"), NEW, handed=handed)
        await asyncio.to_thread(came.wait)
        assert dispatcher.cancel("w3", "the caller asked")
        await asyncio.sleep(0)
        assert out.results() == []  # answered once the hub knows the call
        handed.set_result("blake3:late")
        return await out.result()

    result = asyncio.run(scenario())
    assert result.error.code == "cancelled", result.error.message
    assert (tmp_path / "files" / "target").read_bytes() == OLD and _temporary_files(tmp_path) == []
    dispatcher.close()
    # Unclaimed, its answer was held as an effect-free call's is, and written at the close.
    assert _ledger(tmp_path, "w3") == ("DONE", "blake3:late")


def test_a_write_whose_claim_cannot_commit_changes_nothing_and_runs_once_when_sent_again(
    tmp_path: Path,
) -> None:
    """With the ledger locked by another connection the claim's commit fails: the call
    is refused (retryable, not recorded), its temporary file removed, the old content
    kept; sent again it runs, once, and a repeat is answered from the ledger."""
    dispatcher = _dispatcher(tmp_path)
    dispatcher.state.connection.execute("PRAGMA busy_timeout = 50")  # not 10 s

    async def deliver(out: _Out | None = None) -> pb.ActionResult:
        out = out or _Out(dispatcher)
        dispatcher.submit(_request("w4", "blake3:w4"), NEW)
        return await out.result()

    with contextlib.closing(sqlite3.connect(tmp_path / "state.db")) as other:
        other.execute("BEGIN IMMEDIATE")  # holds the write lock: the claim cannot commit
        refused = asyncio.run(deliver())
        other.rollback()
    assert refused.error.code == "internal_error" and refused.error.retryable
    assert "nothing was run" in refused.error.message
    assert (tmp_path / "files" / "target").read_bytes() == OLD and _temporary_files(tmp_path) == []
    assert _ledger(tmp_path, "w4") is None
    ran = asyncio.run(deliver())
    assert ran.status == pb.ActionResult.OK and json.loads(ran.result_json)["bytes_written"] == len(
        NEW
    )
    (tmp_path / "files" / "target").write_bytes(b"changed since")
    again = asyncio.run(deliver())  # a repeat: answered from the ledger, not run
    assert again.replayed and again.invocation.invocation_id == ran.invocation.invocation_id
    assert (tmp_path / "files" / "target").read_bytes() == b"changed since"
    dispatcher.close()
    assert _ledger(tmp_path, "w4") == ("DONE", "blake3:w4")


def test_a_repeat_while_the_digest_is_on_its_way_is_answered_once_it_came(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Repeats of a call started before its digest came are compared with it once it
    came: the same call is acked as running (and runs once), another call under the same
    id is refused as an args mismatch; a refusal of a request whose digest is on its way
    (its parts did not add up) waits for it too, since until then the hub does not know
    the call and would drop the answer."""
    from worker.errors import WorkerError

    dispatcher = _dispatcher(tmp_path)
    came = threading.Event()
    real = fs_write._Verdict.wait
    monkeypatch.setattr(fs_write._Verdict, "wait", lambda self: (came.set(), real(self))[1])

    async def scenario() -> _Out:
        out = _Out(dispatcher)
        handed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        dispatcher.submit(_request("w5"), NEW, handed=handed)
        await asyncio.to_thread(came.wait)
        dispatcher.submit(_request("w5", "blake3:same"), NEW)
        dispatcher.submit(_request("w5", "blake3:other", path="other"), b"x")
        refused: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        error = WorkerError("too_large", "its parts did not add up; nothing was run")
        dispatcher.refuse_unless_known(_request("w6"), error, refused)
        await asyncio.sleep(0)
        assert out.results() == []  # nothing answered before the hub knows the calls
        handed.set_result("blake3:same")
        refused.set_result("blake3:w6")
        await out.result()
        await out.result()
        return out

    out = asyncio.run(scenario())
    repeats = [kind for kind in out.acks() if kind != pb.ActionAck.STARTED]
    assert repeats == [pb.ActionAck.DUPLICATE_RUNNING, pb.ActionAck.REJECTED_ARGS_MISMATCH]
    by_id = {r.correlation_id: r for r in out.results()}
    assert by_id["w5"].status == pb.ActionResult.OK and by_id["w6"].error.code == "too_large"
    assert (tmp_path / "files" / "target").read_bytes() == NEW
    assert not (tmp_path / "files" / "other").exists()
    dispatcher.close()
    assert _ledger(tmp_path, "w5") == ("DONE", "blake3:same") and _ledger(tmp_path, "w6") is None


def test_the_hash_trails_the_write_slice_by_slice_and_stops_where_it_stopped() -> None:
    """The hashing thread hashes a slice only once the writing thread said it is in the
    file: told the bytes went in a slice at a time it gives the SHA-256 of them all;
    when the write stops part-way it gives none, and reads nothing past what went in."""
    import hashlib
    import os

    data = [os.urandom(fs_write.HASH_SLICE_BYTES + 3), memoryview(os.urandom(2_000_001))]
    whole = b"".join(data)

    def hashed(steps: list[int], stop: bool) -> tuple[str | None, list[int]]:
        progress = fs_write._Progress()
        read: list[int] = []
        real_update = hashlib.sha256

        class Counting:
            def __init__(self) -> None:
                self._h = real_update()

            def update(self, part: memoryview) -> None:
                read.append(len(part))
                self._h.update(part)

            def hexdigest(self) -> str:
                return self._h.hexdigest()

        answer: list[str | None] = []
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(fs_write.hashlib, "sha256", Counting)
            thread = threading.Thread(
                target=lambda: answer.append(fs_write._sha256(data, progress))
            )
            thread.start()
            for count in steps:
                progress.wrote(count)
            if stop:
                progress.stop()
            thread.join()
        return answer[0], read

    steps = [*range(1_000_000, len(whole), 1_000_000), len(whole)]
    digest, read = hashed(steps, stop=False)
    assert digest == hashlib.sha256(whole).hexdigest() and sum(read) == len(whole)
    digest, read = hashed([fs_write.HASH_SLICE_BYTES + 10], stop=True)
    assert digest is None and sum(read) <= fs_write.HASH_SLICE_BYTES + 10
