"""Every claimed call gets exactly one answer, whatever happens to it — and the ledger
keeps no RUNNING row for a call that no longer runs (issue 11, D1 and D2)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from worker import app
from worker.config import Config, GrantSection, Paths, RootSection, WorkerSection
from worker.core.pipeline import Dispatcher, Outgoing, _payload
from worker.core.registry import ActionSpec, Args, Context, Effect, Json, Outcome, Result
from worker.core.threads import looking
from worker.errors import WorkerError
from worker.ids import MAX_ID_CHARS
from worker.wire.framing import worker_message_of
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.protocol import MAX_TIMEOUT_MS

NESTED = "[" * 1000 + "]" * 1000


class Answers:
    """The far side of the outbox: every result the dispatcher sends, by id."""

    def __init__(self) -> None:
        self.results: list[pb.ActionResult] = []

    def __call__(self, out: Outgoing) -> None:
        msg = worker_message_of(out) if isinstance(out, bytes) else out
        if msg.WhichOneof("kind") == "result":
            self.results.append(msg.result)

    def by_id(self) -> dict[str, list[pb.ActionResult]]:
        found: dict[str, list[pb.ActionResult]] = {}
        for result in self.results:
            found.setdefault(result.correlation_id, []).append(result)
        return found

    def codes(self) -> dict[str, str]:
        return {cid: found[0].error.code for cid, found in self.by_id().items()}


@contextlib.contextmanager
def dispatcher_at(tmp_path: Path, max_concurrency: int = 8) -> Iterator[tuple[Dispatcher, Answers]]:
    paths = Paths(config_dir=tmp_path, data_dir=tmp_path)
    (tmp_path / "files").mkdir(exist_ok=True)
    config = Config(
        root=[RootSection(path=tmp_path / "files", mode="rw")],
        grant=[GrantSection(agent="t", scopes=["workerHost.*", "workerDiag.*"])],
        worker=WorkerSection(diagnostics=True, max_concurrency=max_concurrency),
    )
    dispatcher = app.build_dispatcher(paths, config)
    answers = Answers()
    dispatcher.outbox.attach(answers)
    try:
        yield dispatcher, answers
    finally:
        dispatcher.close()
    with contextlib.closing(sqlite3.connect(tmp_path / "state.db")) as db:
        running = db.execute("SELECT correlation_id FROM calls WHERE state = 'RUNNING'")
        assert running.fetchall() == [], "a RUNNING row for a call that no longer runs"


def probe(cid: str, args: str = '{"sleep_ms": 1}', plan: str = "p") -> pb.ActionRequest:
    return pb.ActionRequest(
        correlation_id=cid,
        agent_id="t",
        plan_id=plan,
        surface="workerDiag",
        action="probe",
        args_json=args,
    )


def stat(cid: str, args: str = '{"path": "."}') -> pb.ActionRequest:
    return pb.ActionRequest(
        correlation_id=cid, agent_id="t", surface="workerHost", action="fs_stat", args_json=args
    )


def test_a_call_cancelled_before_its_task_starts_is_answered(tmp_path: Path) -> None:
    with dispatcher_at(tmp_path) as (dispatcher, answers):

        async def run() -> None:
            dispatcher.submit(probe("c1", '{"mark": "never"}'))
            assert dispatcher.cancel("c1", "changed my mind")  # its task has not stepped yet
            await dispatcher.drain(5)

        asyncio.run(run())
    assert answers.codes() == {"c1": "cancelled"}
    assert "changed my mind" in answers.results[0].error.message
    assert not (tmp_path / "diag" / "never.marks").exists(), "the handler never ran"


def test_a_request_and_its_cancel_in_one_envelope(tmp_path: Path) -> None:
    with dispatcher_at(tmp_path) as (dispatcher, answers):

        async def run() -> None:
            with dispatcher.intake():
                dispatcher.submit(stat("inline"))
                dispatcher.submit(probe("queued", '{"mark": "never"}'))
                dispatcher.cancel("inline", "at once")
                dispatcher.cancel("queued", "at once")
            await dispatcher.drain(5)

        asyncio.run(run())
    assert answers.codes() == {"inline": "cancelled", "queued": "cancelled"}
    assert not (tmp_path / "diag" / "never.marks").exists()


def test_a_kill_racing_a_flood_of_its_calls_leaves_none_unanswered(tmp_path: Path) -> None:
    """1,000 calls of a plan: claimed in envelopes, some running, most waiting for a
    slot or for their task's first step, when the kill lands — each answered once."""
    with dispatcher_at(tmp_path, max_concurrency=64) as (dispatcher, answers):

        async def run() -> None:
            for start in range(0, 1000, 100):
                with dispatcher.intake():
                    for i in range(start, start + 100):
                        dispatcher.submit(probe(f"c{i}", '{"sleep_ms": 5}'))
                await asyncio.sleep(0)  # one loop turn: the tasks take their first step
                if start == 500:
                    dispatcher.kill_plan("p", "enough", "test")
            await dispatcher.drain(10)

        asyncio.run(run())
    found = answers.by_id()
    assert sorted(found) == sorted(f"c{i}" for i in range(1000))
    assert all(len(results) == 1 for results in found.values())
    assert set(answers.codes().values()) <= {"", "plan_killed"}
    assert answers.codes()["c999"] == "plan_killed"


@pytest.mark.parametrize("request_of", [stat, probe], ids=["inline", "task"])
def test_json_nested_past_the_stack_is_refused_not_fatal(
    tmp_path: Path, request_of: object
) -> None:
    with dispatcher_at(tmp_path) as (dispatcher, answers):

        async def run() -> None:
            assert callable(request_of)
            dispatcher.submit(request_of("deep", NESTED))
            dispatcher.submit(request_of("after"))
            await dispatcher.drain(5)

        asyncio.run(run())
    assert answers.codes() == {"deep": "validation_error", "after": ""}
    deep = answers.by_id()["deep"][0]
    assert deep.invocation.args_preview == "<json nested too deeply>"


def test_drain_returns_within_its_bound_when_a_handler_ignores_cancellation(
    tmp_path: Path,
) -> None:
    with dispatcher_at(tmp_path) as (dispatcher, answers):

        async def run() -> float:
            dispatcher.submit(probe("stubborn", '{"stubborn_ms": 2000}'))
            dispatcher.submit(probe("polite", '{"sleep_ms": 60000}'))
            begun = time.monotonic()
            await dispatcher.drain(0.2, stop_s=0.3)
            took = time.monotonic() - begun
            assert [task.get_name() for task in dispatcher.stragglers()] == ["call-stubborn"]
            for task in dispatcher.stragglers():
                await task  # it ends by itself, its answer already given
            return took

        took = asyncio.run(run())
    assert took < 1.5
    assert answers.codes() == {"stubborn": "outcome_unknown", "polite": "cancelled"}
    assert len(answers.results) == 2


class GateArgs(Args):
    pass


@pytest.mark.parametrize(
    ("effect", "in_thread", "answer"),
    [
        (Effect.ANY, asyncio.to_thread, "outcome_unknown"),
        # Only looks: its work cannot take effect, whatever the thread does.
        (Effect.NONE, asyncio.to_thread, "cancelled"),
        # A job that only looks, within an action that may change things (a quota
        # count before a program starts) is not the call's work.
        (Effect.ANY, looking, "cancelled"),
    ],
    ids=["effect", "no-effect", "looking"],
)
def test_a_call_stopped_while_its_work_runs_in_a_thread_answers_outcome_unknown(
    tmp_path: Path, effect: Effect, in_thread: Any, answer: str
) -> None:
    """A thread cannot be interrupted: the cancel reaches the task, the work goes on and
    may yet take effect, so the answer may not say `cancelled` — unless that work only
    looks. Work still queued for a thread is cancelled for real (it never runs), and
    nothing of it is left counted."""
    entered, release = threading.Event(), threading.Event()

    def blocking(_ctx: Context, _args: GateArgs) -> Outcome[Result]:
        entered.set()
        release.wait(60)
        return Outcome(Result())

    async def gate(ctx: Context, args: GateArgs) -> Outcome[Result]:
        return cast(Outcome[Result], await in_thread(blocking, ctx, args))

    spec = ActionSpec(
        surface="workerDiag", name="gate", args=GateArgs, result=Result, handler=gate, effect=effect
    )
    counted = {"stuck": 1} if in_thread is asyncio.to_thread else {"": 1}
    with dispatcher_at(tmp_path) as (dispatcher, answers):
        dispatcher.registry[spec.scope] = spec
        threads = dispatcher.threads

        async def run() -> None:
            asyncio.get_running_loop().set_default_executor(threads)
            request = probe("stuck", "{}")
            request.action = "gate"
            dispatcher.submit(request)
            await asyncio.to_thread(entered.wait, 60)
            assert threads.unfinished() == counted
            dispatcher.cancel("stuck", "changed my mind")
            await dispatcher.drain(5)
            assert threads.unfinished() == counted, "the thread runs on"
            release.set()

        asyncio.run(run())  # joins the executor: the thread has ended
    assert threads.unfinished() == {}
    [result] = answers.results
    assert result.error.code == answer
    assert "changed my mind" in result.error.message
    assert ("in a thread" in result.error.message) == (answer == "outcome_unknown")


def test_deadlines_past_the_ceiling_are_cut_to_it(tmp_path: Path) -> None:
    with dispatcher_at(tmp_path) as (dispatcher, answers):

        async def run() -> None:
            request = probe("long", '{"sleep_ms": 60000}')
            request.timeout_ms = 2**32 - 1  # -1 sent as uint32: 49.7 days
            dispatcher.submit(request)
            [call] = dispatcher.unanswered()
            assert call.timeout_s == MAX_TIMEOUT_MS / 1000
            dispatcher.cancel("long", "test over")
            await dispatcher.drain(5)

        asyncio.run(run())
    assert answers.codes() == {"long": "cancelled"}


def test_an_absurd_correlation_id_is_refused_unclaimed(tmp_path: Path) -> None:
    with dispatcher_at(tmp_path) as (dispatcher, answers):

        async def run() -> None:
            dispatcher.submit(stat("x" * (MAX_ID_CHARS + 1)))
            await dispatcher.drain(5)

        asyncio.run(run())
    [result] = answers.results
    assert result.error.code == "validation_error"


def test_a_result_is_measured_in_bytes_not_characters() -> None:
    """11 M characters of CJK text are 33 MB on the wire: over the message limit,
    though their count is not (sent, it would fail the stream at every resend)."""
    text = "字" * (11 * 1024 * 1024)
    with pytest.raises(WorkerError) as refused:
        _payload(Outcome(Json(f'"{text}"')))
    assert refused.value.code == "result_too_large"
    assert refused.value.details["bytes"] == len(text.encode()) + 2
    assert _payload(Outcome(Json('"字"')))[0] == '"字"'


def test_a_correlation_id_that_is_not_printable_is_refused_unclaimed(tmp_path: Path) -> None:
    """The id is written where people read it (telemetry, `agentworker record`'s
    comments): a line break or an escape in it could forge a line there."""
    refused = ["c1\n{}", "c2\x1b[2J", "c3\u2028", "c4\u202e", "c5\x85", "c6\x00"]
    kept = ["plan 7: étape ✓ (retry)", "字-1"]
    with dispatcher_at(tmp_path) as (dispatcher, answers):

        async def run() -> None:
            for cid in refused + kept:
                dispatcher.submit(stat(cid))
            await dispatcher.drain(5)

        asyncio.run(run())
    codes = answers.codes()
    assert all(codes[cid] == "validation_error" for cid in refused), codes
    assert all(codes[cid] == "" for cid in kept), codes  # "": answered ok
