"""The dispatcher groups ledger writes into shared commits without ever letting a
call run unclaimed or a result leave unrecorded; telemetry rows follow the results,
and none is lost should the worker stop in between. Plain-function handlers, run at
once without a task, keep every one of those rules."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import blake3
import pytest

from worker import app
from worker.config import Config, ExecSection, GrantSection, Paths, RootSection, WorkerSection
from worker.core import results
from worker.core.ledger import FILE_BLOB_BYTES
from worker.core.pipeline import Dispatcher, Outgoing
from worker.core.registry import Context, Effect
from worker.wire.framing import worker_message_of
from worker.wire.proto import agentworker_pb2 as pb


def _dispatcher(
    tmp_path: Path, worker: WorkerSection | None = None, effect: Effect = Effect.ANY
) -> Dispatcher:
    """Agent "t" may stat and read a.txt in a read-only root (and probe, with
    diagnostics on)."""
    paths = Paths(config_dir=tmp_path, data_dir=tmp_path)
    (tmp_path / "files").mkdir(exist_ok=True)
    (tmp_path / "files" / "a.txt").write_text("a")
    config = Config(
        root=[RootSection(path=tmp_path / "files", mode="ro")],
        grant=[
            GrantSection(
                agent="t", scopes=["workerHost.fs_stat", "workerHost.fs_read", "workerDiag.probe"]
            )
        ],
        worker=worker or WorkerSection(),
    )
    dispatcher = app.build_dispatcher(paths, config)
    # fs_stat stands in for an action with effects here (claimed before it runs) unless
    # a test asks for its own class: `effect`.
    spec = dispatcher.registry["workerHost.fs_stat"]
    dispatcher.registry[spec.scope] = dataclasses.replace(spec, effect=effect)
    return dispatcher


def _decoded(out: Outgoing) -> pb.WorkerMessage:
    """What the server will read: results leave already serialized."""
    return worker_message_of(out) if isinstance(out, bytes) else out


class _Sent:
    """What `dispatcher` sends, as the server reads it; a wait for its results wakes as
    each comes (a STARTED ack is not one)."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self.messages: list[pb.WorkerMessage] = []
        self._came: asyncio.Event | None = None  # made in the loop that waits (one a run)
        dispatcher.outbox.attach(self._emit)

    def _emit(self, out: Outgoing) -> None:
        self.messages.append(_decoded(out))
        if self._came is not None and self.messages[-1].WhichOneof("kind") == "result":
            self._came.set()

    def results(self) -> list[pb.ActionResult]:
        return _results(self.messages)

    async def until_results(self, count: int) -> None:
        self._came = asyncio.Event()
        while len(self.results()) < count:
            self._came.clear()
            await self._came.wait()

    async def answer(self, request: pb.ActionRequest) -> pb.ActionResult:
        """Submit `request` and wait for the result it brings."""
        before = len(self.results())
        self.dispatcher.submit(request)
        await self.until_results(before + 1)
        return self.results()[-1]


def _asked(cid: str, scope: str, args_json: str = "", **fields: Any) -> pb.ActionRequest:
    """Agent "t"'s request of `scope` (surface.action)."""
    surface, action = scope.split(".")
    return pb.ActionRequest(
        correlation_id=cid,
        agent_id="t",
        surface=surface,
        action=action,
        args_json=args_json,
        **fields,
    )


def _request(cid: str) -> pb.ActionRequest:
    return _asked(cid, "workerHost.fs_stat", '{"path": "a.txt"}')


def _ledger_state(tmp_path: Path, cid: str) -> str | None:
    """The call's ledger state, with "+row" once its telemetry row exists too."""
    with contextlib.closing(sqlite3.connect(tmp_path / "state.db")) as db:
        row = db.execute("SELECT state FROM calls WHERE correlation_id = ?", (cid,)).fetchone()
        logged = db.execute(
            "SELECT COUNT(*) FROM invocations WHERE correlation_id = ?", (cid,)
        ).fetchone()[0]
    if row is None:
        return None
    return f"{row[0]}+row" if logged == 1 else str(row[0])


def test_every_result_is_in_the_ledger_before_it_is_sent_and_its_row_follows(
    tmp_path: Path,
) -> None:
    dispatcher = _dispatcher(tmp_path)
    seen_by_handler = _stat_looks_at_its_ledger_row(dispatcher, tmp_path)
    sent: dict[str, str | None] = {}

    def emit(out: Outgoing) -> None:
        msg = _decoded(out)
        if msg.WhichOneof("kind") == "result":
            sent[msg.result.correlation_id] = _ledger_state(tmp_path, msg.result.correlation_id)

    dispatcher.outbox.attach(emit)

    async def run() -> None:
        with dispatcher.intake():  # one envelope of 50 requests
            for i in range(50):
                dispatcher.submit(_request(f"c{i}"))
                assert seen_by_handler == []  # none runs before the envelope's commit
        # Each ran once its claim was committed (another connection saw it).
        assert seen_by_handler == ["RUNNING"] * 50
        await dispatcher.drain(10)
        await asyncio.sleep(0)
        # The rows wait for the server's ack (or TELEMETRY_DELAY_S), not a commit each.
        assert all(_ledger_state(tmp_path, f"c{i}") == "DONE" for i in range(50))
        dispatcher.ack([f"c{i}" for i in range(50)])  # written first, then the acks
        assert all(_ledger_state(tmp_path, f"c{i}") == "DONE+row" for i in range(50))

    asyncio.run(run())
    dispatcher.close()
    assert set(sent.values()) == {"DONE"} and len(sent) == 50


def test_rows_are_written_a_moment_after_their_results_when_no_ack_comes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(results, "TELEMETRY_DELAY_S", 0.0)
    dispatcher = _dispatcher(tmp_path, effect=Effect.NONE)
    dispatcher.outbox.attach(lambda _out: None)
    written = asyncio.Event()
    flush = dispatcher.telemetry.flush

    def flush_and_tell() -> None:
        flush()
        written.set()

    dispatcher.telemetry.flush = flush_and_tell  # type: ignore[method-assign]

    async def run() -> None:
        for i in range(3):
            dispatcher.submit(_request(f"c{i}"))
        await dispatcher.drain(10)
        await asyncio.wait_for(written.wait(), 10)  # the timer's write, no ack sent
        with contextlib.closing(sqlite3.connect(tmp_path / "state.db")) as db:
            assert db.execute("SELECT COUNT(*) FROM invocations").fetchone()[0] == 3

    asyncio.run(run())
    dispatcher.close()


class _FailingCommit:
    """The far side of the ledger: a disk that refuses the intake's commit."""

    def __init__(self, real: object) -> None:
        self._real = real

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        yield
        raise sqlite3.OperationalError("disk I/O error")

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)


def test_calls_whose_claims_did_not_commit_never_run(tmp_path: Path) -> None:
    dispatcher = _dispatcher(tmp_path)
    real_state = dispatcher.state
    dispatcher.state = _FailingCommit(real_state)  # type: ignore[assignment]
    sent = _Sent(dispatcher)

    async def run() -> None:
        with pytest.raises(sqlite3.OperationalError), dispatcher.intake():
            dispatcher.submit(_request("lost-1"))
            dispatcher.submit(_request("lost-2"))
        assert dispatcher.unanswered() == []  # dropped before any stage ran
        await dispatcher.drain(1)

    asyncio.run(run())
    dispatcher.state = real_state
    dispatcher.close()
    assert sent.results() == []
    with contextlib.closing(sqlite3.connect(tmp_path / "state.db")) as db:
        assert db.execute("SELECT COUNT(*) FROM invocations").fetchone()[0] == 0


def _fail(*_args: object) -> None:
    raise sqlite3.OperationalError("database or disk is full")


def test_rows_unwritten_at_a_stop_are_restored_from_the_ledger(tmp_path: Path) -> None:
    dispatcher = _dispatcher(tmp_path)
    results: list[pb.ActionResult] = []
    dispatcher.outbox.attach(lambda out: results.append(_decoded(out).result))
    dispatcher.telemetry.flush = _fail  # type: ignore[method-assign]  # a full disk

    async def run() -> None:
        dispatcher.submit(_request("c1"))
        await dispatcher.drain(10)
        await asyncio.sleep(0)

    asyncio.run(run())
    assert _ledger_state(tmp_path, "c1") == "DONE"
    dispatcher.ack(["c1"])  # no ack while its row is unwritten
    assert [u.correlation_id for u in dispatcher.state.unacked_results()] == ["c1"]
    dispatcher.state.close()  # the worker stops here, rows unwritten

    restarted = _dispatcher(tmp_path)
    assert restarted.recover() == []
    assert _ledger_state(tmp_path, "c1") == "DONE+row"
    row = restarted.telemetry.rows("c1")[0]
    assert row["invocation_id"] == results[0].invocation.invocation_id
    assert row["status"] == "ok" and row["action"] == "fs_stat"
    restarted.recover()  # twice: still one row
    assert len(restarted.telemetry.rows("c1")) == 1
    restarted.ack(["c1"])
    assert restarted.state.unacked_results() == []
    restarted.close()


# --- plain-function handlers run in the turn that received them -----------------------


def _stat_looks_at_its_ledger_row(dispatcher: Dispatcher, tmp_path: Path) -> list[str | None]:
    """fs_stat's handler made to note its call's ledger state (as `_ledger_state` reads
    it from another connection) before it runs: the list it appends to."""
    stat = dispatcher.registry["workerHost.fs_stat"].handler
    seen_by_handler: list[str | None] = []

    def stat_and_look(ctx: Context, args: Any) -> Any:
        seen_by_handler.append(_ledger_state(tmp_path, ctx.correlation_id))
        return stat(ctx, args)

    _replace_handler(dispatcher, stat_and_look)
    return seen_by_handler


def _replace_handler(dispatcher: Dispatcher, handler: object) -> None:
    spec = dispatcher.registry["workerHost.fs_stat"]
    dispatcher.registry[spec.scope] = dataclasses.replace(spec, handler=handler)


def _results(emitted: list[pb.WorkerMessage]) -> list[pb.ActionResult]:
    return [m.result for m in emitted if m.WhichOneof("kind") == "result"]


def test_a_plain_handler_answers_within_submit_and_only_after_its_claim_committed(
    tmp_path: Path,
) -> None:
    dispatcher = _dispatcher(tmp_path)
    seen_by_handler = _stat_looks_at_its_ledger_row(dispatcher, tmp_path)
    sent = _Sent(dispatcher)

    async def run() -> None:
        dispatcher.submit(_request("c1"))
        assert [r.correlation_id for r in sent.results()] == ["c1"]  # no loop turn taken

    asyncio.run(run())
    dispatcher.close()
    assert seen_by_handler == ["RUNNING"]  # another connection saw the claim: committed
    result = sent.results()[0]
    assert result.status == pb.ActionResult.OK and json.loads(result.result_json)["type"] == "file"
    assert result.invocation.decision == "granted"
    assert _ledger_state(tmp_path, "c1") == "DONE+row"


def test_a_plain_handler_waits_for_a_slot_like_any_other_call(tmp_path: Path) -> None:
    dispatcher = _dispatcher(tmp_path, WorkerSection(max_concurrency=1, diagnostics=True))
    sent = _Sent(dispatcher)
    slow = _asked("slow", "workerDiag.probe", '{"sleep_ms": 200}')

    async def run() -> None:
        dispatcher.submit(slow)
        assert dispatcher.running == 1  # the probe took the only slot as it was claimed
        dispatcher.submit(_request("quick"))
        assert sent.results() == []  # not run past the limit
        await dispatcher.drain(10)

    asyncio.run(run())
    dispatcher.close()
    assert [r.correlation_id for r in sent.results()] == ["slow", "quick"]
    assert all(r.status == pb.ActionResult.OK for r in sent.results())
    assert dispatcher.max_running_seen == 1


@pytest.mark.parametrize(
    ("failure", "code"),
    [
        (RuntimeError("a bug"), "internal_error"),
        (PermissionError(errno.EACCES, "Permission denied"), "permission_denied"),
        (None, "internal_error"),  # returns something that is not an Outcome
    ],
    ids=["bug", "os-error", "not-an-outcome"],
)
def test_a_plain_handlers_failure_is_its_answer(
    tmp_path: Path, failure: Exception | None, code: str
) -> None:
    dispatcher = _dispatcher(tmp_path)

    def failing(ctx: Context, args: Any) -> Any:
        if failure is not None:
            raise failure
        return {"type": "file"}

    _replace_handler(dispatcher, failing)
    sent = _Sent(dispatcher)

    async def run() -> None:
        dispatcher.submit(_request("c1"))

    asyncio.run(run())
    dispatcher.close()
    [result] = sent.results()
    assert result.status == pb.ActionResult.ERROR and result.error.code == code
    assert "Traceback" not in result.error.message
    assert _ledger_state(tmp_path, "c1") == "DONE+row"


def test_a_plain_handler_without_a_grant_is_still_refused(tmp_path: Path) -> None:
    dispatcher = _dispatcher(tmp_path)
    sent = _Sent(dispatcher)
    request = _request("c1")
    request.agent_id = "stranger"

    async def run() -> None:
        dispatcher.submit(request)
        await dispatcher.drain(10)

    asyncio.run(run())
    dispatcher.close()
    [result] = sent.results()
    assert result.error.code == "scope_required"
    assert result.invocation.decision == "denied"


# --- effect-free calls: no claim before they run, still answered once -------------------


def test_an_effect_free_call_runs_unclaimed_and_is_still_answered_once(tmp_path: Path) -> None:
    """No commit before it runs and none before its answer leaves: its result is held
    in memory until acked, then written without its blob. Every duplicate meanwhile and
    after is answered, never run again; one with other args is refused."""
    dispatcher = _dispatcher(tmp_path, effect=Effect.NONE)
    seen_by_handler = _stat_looks_at_its_ledger_row(dispatcher, tmp_path)
    sent = _Sent(dispatcher)
    other = _request("c1")
    other.args_json = '{"path": "."}'

    async def run() -> None:
        dispatcher.submit(_request("c1"))
        assert _ledger_state(tmp_path, "c1") is None  # sent, held, not written
        dispatcher.submit(_request("c1"))  # a duplicate while held: the same answer
        dispatcher.submit(other)  # the same id for another call
        await asyncio.sleep(0)
        dispatcher.ack(["c1"])
        dispatcher.submit(_request("c1"))  # after the ack: from the ledger

    asyncio.run(run())
    assert seen_by_handler == [None]  # ran once, with nothing claimed
    first, held, acked = sent.results()
    assert first.status == pb.ActionResult.OK and not first.replayed
    assert held.replayed and held.result_json == first.result_json
    assert acked.replayed and acked.result_json == first.result_json
    kinds = [m.ack.kind for m in sent.messages if m.WhichOneof("kind") == "ack"]
    assert pb.ActionAck.REJECTED_ARGS_MISMATCH in kinds
    assert _ledger_state(tmp_path, "c1") == "DONE+row"
    dispatcher.close()


def test_an_effect_free_result_blob_goes_with_the_ack_and_a_repeat_says_so(
    tmp_path: Path,
) -> None:
    dispatcher = _dispatcher(tmp_path)
    sent = _Sent(dispatcher)
    read = _request("r1")
    read.action = "fs_read"

    async def run() -> None:
        await sent.answer(read)  # fs_read reads in a thread: its answer comes later
        assert [u.blob for u in dispatcher.state.unacked_results()] == [b"a"]
        dispatcher.ack(["r1"])
        dispatcher.submit(read)

    asyncio.run(run())
    first, repeat = sent.results()
    assert first.blob == b"a"
    assert repeat.replayed and repeat.error.code == "blob_gone" and repeat.blob == b""
    details = json.loads(repeat.error.details_json)
    assert details["status"] == "ok" and details["blob_bytes"] == 1
    assert details["result"]["length"] == 1
    with contextlib.closing(sqlite3.connect(tmp_path / "state.db")) as db:
        row = db.execute("SELECT result_blob, blob_bytes, acked FROM calls").fetchone()
    assert row == (None, 1, 1)
    dispatcher.close()


def test_an_effectful_result_blob_is_kept_until_acked_then_let_go(tmp_path: Path) -> None:
    """A probe (it has effects) echoing its blob: recorded with the blob before it is
    sent, re-sent with it while unacked, answered `blob_gone` once acked."""
    dispatcher = _dispatcher(tmp_path, WorkerSection(diagnostics=True))
    sent = _Sent(dispatcher)
    echo = _asked("e1", "workerDiag.probe", '{"blob_repeat": 2}', blob=b"xyz")

    async def run() -> None:
        await sent.answer(echo)
        with contextlib.closing(sqlite3.connect(tmp_path / "state.db")) as db:
            row = db.execute("SELECT state, result_blob, blob_bytes FROM calls").fetchone()
        assert row == ("DONE", b"xyzxyz", 6)
        dispatcher.submit(echo)  # unacked: the stored result, blob and all
        dispatcher.ack(["e1"])
        dispatcher.submit(echo)

    asyncio.run(run())
    first, stored, gone = sent.results()
    assert first.blob == stored.blob == b"xyzxyz" and stored.replayed
    assert gone.error.code == "blob_gone" and gone.replayed
    dispatcher.close()


def test_a_large_effectful_result_blob_waits_for_its_ack_in_a_file(tmp_path: Path) -> None:
    """Over FILE_BLOB_BYTES the blob goes to a file written before its row commits (one
    write, not a log frame per page), is sent again from it while unacked, and goes
    with the ack; a file no unacked row names is swept at the next start, and one a
    power cut left short, or the right length but never written, is answered
    blob_gone, never sent cut or as zeros."""
    dispatcher = _dispatcher(tmp_path, WorkerSection(diagnostics=True))
    half = os.urandom(FILE_BLOB_BYTES // 2 + 1)
    sent = _Sent(dispatcher)

    def echo(cid: str) -> pb.ActionRequest:
        return _asked(cid, "workerDiag.probe", '{"blob_repeat": 2}', blob=half)

    async def run() -> None:
        for cid in ("big-1", "big-2", "big-3"):
            await sent.answer(echo(cid))

    asyncio.run(run())
    state = dispatcher.state
    with contextlib.closing(sqlite3.connect(tmp_path / "state.db")) as db:
        rows = db.execute("SELECT result_blob, blob_bytes, blob_file FROM calls").fetchall()
    assert rows == [(None, 2 * len(half), 1)] * 3  # the rows name the files: no bytes
    whole = state.blob_path("big-1").read_bytes()
    assert whole == half * 2 + blake3.blake3(half * 2).digest()  # the blob, then its check
    dispatcher.submit(echo("big-1"))  # unacked: answered from its file
    state.blob_path("big-2").write_bytes(half)  # what a power cut may leave: short
    state.blob_path("big-3").write_bytes(bytes(len(whole)))  # or its length, unwritten
    dispatcher.results.resend_unacked()  # after a reconnect
    dispatcher.ack(["big-1"])
    assert not state.blob_path("big-1").exists()
    dispatcher.submit(echo("big-1"))
    orphan = state.blob_path("never-committed")
    orphan.write_bytes(b"x")
    assert state.sweep_blob_files() == 1 and not orphan.exists()
    assert state.blob_path("big-2").exists()  # still unacked: kept
    first, _second, _third, from_file, resent, gone_short, gone_zeros, gone_acked = sent.results()
    assert first.blob == from_file.blob == resent.blob == half * 2 and from_file.replayed
    assert resent.correlation_id == "big-1" and gone_short.correlation_id == "big-2"
    assert gone_zeros.correlation_id == "big-3"
    assert gone_short.error.code == gone_zeros.error.code == gone_acked.error.code == "blob_gone"
    dispatcher.close()


def test_execs_large_output_is_kept_in_a_file_with_the_check_made_as_it_was_read(
    tmp_path: Path,
) -> None:
    """exec hashes its output while the program runs (sandbox.process `hash_output`)
    and the ledger's file takes that check instead of hashing the blob again: the file
    still ends with the BLAKE3 of exactly the blob sent, stdout then stderr, so it is
    sent again from the file while unacked."""
    (tmp_path / "files").mkdir()
    content = os.urandom(3 * FILE_BLOB_BYTES + 5)
    (tmp_path / "files" / "big.bin").write_bytes(content)
    config = Config(
        root=[RootSection(path=tmp_path / "files", mode="ro")],
        grant=[GrantSection(agent="t", scopes=["workerHost.exec"])],
    )
    dispatcher = app.build_dispatcher(Paths(config_dir=tmp_path, data_dir=tmp_path), config)
    sent = _Sent(dispatcher)

    async def run() -> None:
        for cid, argv in (("cat", ["cat", "big.bin"]), ("both", ["cat", "big.bin", "absent"])):
            await sent.answer(_asked(cid, "workerHost.exec", json.dumps({"argv": argv})))

    asyncio.run(run())
    cat, both = sent.results()
    assert cat.status == both.status == pb.ActionResult.OK, (cat.error, both.error)
    assert cat.blob == content and both.blob.startswith(content) and len(both.blob) > len(content)
    for result in (cat, both):
        kept = dispatcher.state.blob_path(result.correlation_id).read_bytes()
        assert kept == result.blob + blake3.blake3(result.blob).digest()
    dispatcher.results.resend_unacked()
    assert [r.blob for r in sent.results()[2:]] == [cat.blob, both.blob]
    dispatcher.close()


PYTHON_POLICY = """
[program.python3]
paths = ["/usr/bin/python3"]
[[program.python3.rule]]
id = "test-python"
reason = "tests: a program that leaves a mark"
any_args = true
"""


def test_an_exec_whose_claim_cannot_commit_runs_nothing_and_runs_once_when_sent_again(
    tmp_path: Path,
) -> None:
    """exec claims its call itself, while bubblewrap builds the sandbox that waits for
    the claim: with the ledger locked by another connection the commit fails, the
    held sandbox is killed before the program ran, the call is refused (not recorded,
    so it may be sent again), and sent again once the lock is gone it runs, once."""
    (tmp_path / "files").mkdir()
    policy = tmp_path / "allowlist.toml"
    policy.write_text(PYTHON_POLICY)
    config = Config(
        root=[RootSection(path=tmp_path / "files", mode="rw")],
        grant=[GrantSection(agent="t", scopes=["workerHost.exec"])],
        # None built ahead: each delivery is its own event loop (asyncio.run), and a
        # plan's next sandbox would still be building when one ends.
        exec=ExecSection(policy=policy, ahead_plans=0),
    )
    dispatcher = app.build_dispatcher(Paths(config_dir=tmp_path, data_dir=tmp_path), config)
    dispatcher.state.connection.execute("PRAGMA busy_timeout = 50")  # not 10 s
    mark = "open('ran', 'a').write('ran\\n')"
    request = _asked("once", "workerHost.exec", json.dumps({"argv": ["python3", "-c", mark]}))
    sent = _Sent(dispatcher)

    with contextlib.closing(sqlite3.connect(tmp_path / "state.db")) as other:
        other.execute("BEGIN IMMEDIATE")  # holds the write lock: the claim cannot commit
        refused = asyncio.run(sent.answer(request))
        other.rollback()
    assert refused.status == pb.ActionResult.ERROR and refused.error.code == "internal_error"
    assert "nothing was run" in refused.error.message and refused.error.retryable
    assert not (tmp_path / "files" / "ran").exists()
    assert _ledger_state(tmp_path, "once") is None  # never claimed: free to run later
    ran = asyncio.run(sent.answer(request))
    assert ran.status == pb.ActionResult.OK and json.loads(ran.result_json)["exit_code"] == 0
    again = asyncio.run(sent.answer(request))  # a repeat: answered from the ledger, not run
    assert again.replayed and again.invocation.invocation_id == ran.invocation.invocation_id
    assert (tmp_path / "files" / "ran").read_text() == "ran\n"
    dispatcher.close()
    assert _ledger_state(tmp_path, "once") == "DONE+row"


def test_the_digest_is_taken_from_the_request_or_computed_off_the_loop(tmp_path: Path) -> None:
    """A carried digest is used as it is; with none, a large blob is hashed in a thread
    before the call is claimed (and a small one at once)."""
    from worker.wire.protocol import HASH_OFF_LOOP_BYTES, call_digest

    dispatcher = _dispatcher(tmp_path, WorkerSection(diagnostics=True))
    big = b"b" * HASH_OFF_LOOP_BYTES
    carried = _asked("carried", "workerDiag.probe", "{}", args_digest="f" * 64)
    hashed = _asked("hashed", "workerDiag.probe", blob=big)
    sent = _Sent(dispatcher)

    async def run() -> None:
        dispatcher.submit(carried)
        dispatcher.submit(hashed)
        assert _ledger_state(tmp_path, "hashed") is None  # hashing, not yet claimed
        await sent.until_results(2)

    asyncio.run(run())
    digests = {r.correlation_id: r.invocation.args_digest for r in sent.results()}
    assert digests == {"carried": "f" * 64, "hashed": call_digest(hashed, big)}
    dispatcher.close()


def test_an_intake_of_effect_free_calls_sends_the_ledger_no_statement(tmp_path: Path) -> None:
    """Effect-free calls with new ids need nothing of the ledger before they run: their
    intake sends it no BEGIN and no COMMIT (two statements a call on the loop), while
    an intake that claims a call still commits it before it runs."""
    dispatcher = _dispatcher(tmp_path, effect=Effect.NONE)
    sent = _Sent(dispatcher)
    statements: list[str] = []
    dispatcher.state._db.set_trace_callback(statements.append)

    async def run() -> None:
        with dispatcher.intake():
            dispatcher.submit(_request("c1"))
            dispatcher.submit(_request("c2"))
        await sent.until_results(2)

    asyncio.run(run())
    # (A look whether a recording is on follows each result: reads outside it.)
    assert "BEGIN" not in statements and "COMMIT" not in statements
    assert [r.status for r in sent.results()] == [pb.ActionResult.OK] * 2
    dispatcher.close()
    (tmp_path / "claims").mkdir()
    claiming = _dispatcher(tmp_path / "claims", effect=Effect.ANY)
    claimed = _Sent(claiming)
    statements.clear()
    claiming.state._db.set_trace_callback(statements.append)

    async def claim() -> None:
        with claiming.intake():
            claiming.submit(_request("c3"))
        await claimed.until_results(1)

    asyncio.run(claim())
    assert statements[0] == "BEGIN" and "INSERT INTO calls" in statements[1]
    assert statements[2] == "COMMIT"
    claiming.close()


def test_args_pydantic_parsed_are_not_parsed_again_for_their_preview(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call's telemetry preview of short plain args that its model took is the args
    as they are, not parsed a second time; args that did not parse still are."""
    from worker.core import redaction

    parsed_again: list[str] = []
    preview = redaction._preview_parsed
    monkeypatch.setattr(
        redaction, "_preview_parsed", lambda text: parsed_again.append(text) or preview(text)
    )
    dispatcher = _dispatcher(tmp_path, effect=Effect.NONE)
    sent = _Sent(dispatcher)
    bad = _asked("c2", "workerHost.fs_stat", '{"path": ')

    async def run() -> None:
        await sent.answer(_request("c1"))
        await sent.answer(bad)

    asyncio.run(run())
    ok, refused = sent.results()
    assert ok.invocation.args_preview == '{"path": "a.txt"}'
    assert refused.invocation.args_preview == "<invalid json>"
    assert parsed_again == ['{"path": ']
    dispatcher.close()
