"""The dispatch pipeline: every ActionRequest passes the same stages (DESIGN.md §2).

    ledger (at most once) → parse + validate → kill switch → scope → handler
    → size cap → result (recorded, then sent, kept until the server acks it)
    → telemetry row (written just after the result leaves, always before its ack)

`Dispatcher.submit` is called by the connection's single reader and never blocks:
it claims the call in the ledger, acks it, and leaves execution to a task that
waits for one of `max_concurrency` slots. A plain-function handler, which never
waits, runs right there instead when a slot is free (see `_may_run_inline`): a
task would cost more than the call. Results and acks leave through `emit`,
which the connection points at its single writer (or nowhere while offline: the
result is durable and re-sent after the next handshake).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import sqlite3
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from sandbox import Root
from worker.clock import now_ms
from worker.config import Config
from worker.core.ledger import Seen, State
from worker.core.redaction import args_preview
from worker.core.registry import ActionSpec, Context, Outcome, Registry
from worker.core.scopes import ASK_PREFIX, ApprovalRequest, Scopes
from worker.core.telemetry import AUDITED_CODES, Telemetry
from worker.errors import WorkerError, as_worker_error
from worker.wire.framing import result_message
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.protocol import call_digest, error_pb
from worker.wire.transport import MAX_RESULT_BYTES

log = logging.getLogger(__name__)

# Structured args stay small; bulk data travels in the request blob.
MAX_ARGS_BYTES = 1024 * 1024
# How long a STARTED ack waits to share a message with others (or to be made moot).
ACK_DELAY_S = 0.005

# A message to the server: a WorkerMessage, or one already serialized (a result's
# bytes are made once, for the ledger and the wire alike).
Outgoing = pb.WorkerMessage | bytes
Emit = Callable[[Outgoing], None]


class CallWatcher(Protocol):
    """Who watches calls come and go (the person's live view); told, never asked."""

    def call_started(self, req: pb.ActionRequest) -> None: ...

    def call_finished(self, req: pb.ActionRequest, result: pb.ActionResult) -> None: ...


@dataclass(frozen=True)
class Limits:
    max_concurrency: int = 8
    # Calls accepted (running or waiting for a slot); past this a new call answers
    # `busy` at once, so a flooding server cannot exhaust the worker's memory.
    max_accepted: int = 4096
    default_timeout_s: float = 60.0


class _CallStoppedError(Exception):
    """Why a running call was cancelled: carries the error it should answer."""

    def __init__(self, error: WorkerError) -> None:
        super().__init__(error.message)
        self.error = error


# A handler's outcome as it goes out: result JSON, blob, truncated.
_Payload = tuple[str, bytes, bool]


def _payload(outcome: object) -> _Payload:
    """The outcome as it goes out, refused when it would not fit one message."""
    if not isinstance(outcome, Outcome):
        raise TypeError(f"the handler returned {type(outcome).__name__}, not an Outcome")
    result_json = outcome.result.model_dump_json()
    size = len(result_json) + len(outcome.blob)
    if size > MAX_RESULT_BYTES:
        raise WorkerError(
            "result_too_large",
            f"the result is {size:,} bytes, over the {MAX_RESULT_BYTES:,}-byte message "
            "limit; ask for less (page with offset/length or narrow the request)",
            {"bytes": size, "limit": MAX_RESULT_BYTES},
        )
    return result_json, outcome.blob, outcome.truncated


class Dispatcher:
    def __init__(
        self,
        *,
        worker_id: str,
        registry: Registry,
        state: State,
        telemetry: Telemetry,
        scopes: Scopes,
        roots: list[Root],
        data_dir: Path,
        limits: Limits = Limits(),
        config: Config | None = None,
    ) -> None:
        self.config = config or Config()
        self.worker_id = worker_id
        self.registry = registry
        self.state = state
        self.telemetry = telemetry
        self.scopes = scopes
        self.roots = roots
        self.data_dir = data_dir
        self.limits = limits
        self.emit: Emit = lambda _msg: None
        self.watcher: CallWatcher | None = None
        self.draining = False
        self.running = 0
        self.max_running_seen = 0
        self._slots = asyncio.Semaphore(limits.max_concurrency)
        self._tasks: dict[str, tuple[str, asyncio.Task[None]]] = {}  # id -> (plan, task)
        self._stop_reasons: dict[str, WorkerError] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        # STARTED acks wait a moment and leave together; a call whose result is out
        # by then needs none (the result says more than "started").
        self._started: dict[str, None] = {}
        self._started_timer: asyncio.TimerHandle | None = None
        # Of running calls, for their telemetry rows: args digest and request blob size.
        self._request_facts: dict[str, tuple[str, int]] = {}
        self._finished: list[pb.ActionResult] = []  # results waiting for flush_results
        self._intake: list[str] | None = None  # calls claimed in the open intake batch
        self._telemetry_scheduled = False
        # Sandbox mode: removes a plan's workspace (its result's JSON); None elsewhere.
        # Sandbox mode: takes a plan's workspace out of use when called, and returns
        # the removal to await (its answer's JSON); None elsewhere.
        self.on_teardown: Callable[[str], Awaitable[dict[str, Any]]] | None = None
        self._teardowns: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------- intake

    @contextlib.contextmanager
    def intake(self) -> Iterator[None]:
        """Claims made by `submit` inside commit together, when the block ends (one
        commit for a whole envelope of requests). Their calls start only after that: a
        task does not run until the event loop turns. Should the commit fail, the calls
        it claimed are cancelled before they start, so nothing runs unrecorded."""
        if self._intake is not None:
            yield
            return
        claimed: list[str] = []
        self._intake = claimed
        try:
            with self.state.batch():
                yield
        except sqlite3.Error:
            for cid in claimed:
                entry = self._tasks.pop(cid, None)
                if entry is not None:
                    entry[1].cancel()
            self._settle()
            raise
        finally:
            self._intake = None

    def submit(self, req: pb.ActionRequest) -> None:
        """Claim `req` in the ledger and start it, or answer a duplicate."""
        cid = req.correlation_id
        if not cid:
            log.warning("refusing a request without a correlation id (action %s)", req.action)
            error = WorkerError(
                "validation_error", "a request needs a correlation_id; nothing was run"
            )
            result = pb.ActionResult(status=pb.ActionResult.ERROR, error=error_pb(error))
            self.emit(pb.WorkerMessage(result=result))
            return
        if self.draining:
            self._ack(cid, pb.ActionAck.REJECTED_DRAINING, "the worker is shutting down")
            return
        request_blob = req.blob  # a copy each time it is read: read it once
        digest = call_digest(req, request_blob)
        begun = self.state.begin(cid, digest, req.plan_id)
        if begun.seen is Seen.NEW and len(self._tasks) >= self.limits.max_accepted:
            self.state.forget(cid)  # it never ran: a later delivery may run it
            self._refuse_busy(req)
        elif begun.seen is Seen.NEW:
            self._request_facts[cid] = (digest, len(request_blob))
            if self.watcher is not None:
                self.watcher.call_started(req)
            spec = self.registry.get(f"{req.surface}.{req.action}")
            if spec is not None and self._may_run_inline(spec, req):
                self._run_inline(spec, req, request_blob)
                return
            if self._started_timer is None:
                loop = asyncio.get_running_loop()
                self._started_timer = loop.call_later(ACK_DELAY_S, self._flush_started)
            self._started[cid] = None
            task = asyncio.create_task(self._run(req, request_blob), name=f"call-{cid}")
            self._tasks[cid] = (req.plan_id, task)
            if self._intake is not None:
                self._intake.append(cid)
            self._idle.clear()
        elif begun.seen is Seen.RUNNING:
            self._ack(cid, pb.ActionAck.DUPLICATE_RUNNING)
        elif begun.seen is Seen.DONE:
            self._ack(cid, pb.ActionAck.DUPLICATE_DONE)
            cached = pb.ActionResult.FromString(begun.result or b"")
            cached.replayed = True
            self.emit(pb.WorkerMessage(result=cached))
        else:
            message = (
                f"correlation id {cid} was already used for a call with different arguments; "
                "use a new id for a new call"
            )
            self._ack(cid, pb.ActionAck.REJECTED_ARGS_MISMATCH, message)
            self._audit("args_mismatch", req, {"message": message})

    def _refuse_busy(self, req: pb.ActionRequest) -> None:
        error = WorkerError(
            "busy",
            f"the worker already holds {len(self._tasks)} calls (limit "
            f"{self.limits.max_accepted}); nothing was run, send it again later",
        )
        result = pb.ActionResult(
            correlation_id=req.correlation_id,
            status=pb.ActionResult.ERROR,
            error=error_pb(error),
        )
        self.emit(pb.WorkerMessage(result=result))

    def in_flight(self) -> int:
        return self.running

    def queued(self) -> int:
        return len(self._tasks) - self.running

    # ------------------------------------------------------------- control

    def cancel(self, correlation_id: str, reason: str) -> bool:
        entry = self._tasks.get(correlation_id)
        if entry is None:
            return False
        self._stop(correlation_id, entry[1], WorkerError("cancelled", f"cancelled: {reason}"))
        return True

    def kill_plan(self, plan_id: str, reason: str, killed_by: str) -> int:
        """Refuse the plan's later calls (durably) and cancel its running ones."""
        if not plan_id:
            log.warning("ignoring a kill without a plan id (from %s)", killed_by)
            return 0
        self.state.kill_plan(plan_id, reason, killed_by)
        self.telemetry.audit("kill", plan_id=plan_id, detail={"reason": reason, "by": killed_by})
        error = WorkerError("plan_killed", f"plan {plan_id!r} was killed: {reason}")
        victims = [(cid, task) for cid, (plan, task) in self._tasks.items() if plan == plan_id]
        for cid, task in victims:
            self._stop(cid, task, error)
        return len(victims)

    def plans_running(self) -> set[str]:
        """Plans with a call accepted and not yet answered."""
        return {plan for plan, _task in self._tasks.values()}

    def teardown(self, plan_id: str, correlation_id: str) -> None:
        """Stop the plan's running calls and take its workspace out of use, now (so a
        call that comes after starts afresh); once the stopped calls have ended, remove
        the workspace and answer as a result for `correlation_id`. Idempotent, and not
        recorded in the ledger: running it again is harmless, so a lost answer is
        simply asked for again."""
        try:
            if self.on_teardown is None:
                raise WorkerError(
                    "not_supported",
                    "this worker keeps no per-plan workspaces; start it with --sandbox for those",
                )
            if not plan_id:
                raise WorkerError("validation_error", "a teardown needs a plan_id")
            error = WorkerError("cancelled", f"plan {plan_id!r} was torn down")
            victims = [task for plan, task in self._tasks.values() if plan == plan_id]
            for cid, (plan, task) in list(self._tasks.items()):
                if plan == plan_id:
                    self._stop(cid, task, error)
            removal = self.on_teardown(plan_id)  # takes the workspace out of use at once
        except Exception as exc:  # noqa: BLE001 - every failure becomes the answer
            self._answer_teardown(plan_id, correlation_id, exc)
            return
        task = asyncio.create_task(self._finish_teardown(plan_id, correlation_id, victims, removal))
        self._teardowns.add(task)
        task.add_done_callback(self._teardowns.discard)

    async def _finish_teardown(
        self,
        plan_id: str,
        correlation_id: str,
        victims: list[asyncio.Task[None]],
        removal: Awaitable[dict[str, Any]],
    ) -> None:
        try:
            if victims:
                await asyncio.wait(victims)
            answer: dict[str, Any] | Exception = await removal
        except Exception as exc:  # noqa: BLE001 - every failure becomes the answer
            answer = exc
        self._answer_teardown(plan_id, correlation_id, answer)

    def _answer_teardown(
        self, plan_id: str, correlation_id: str, answer: dict[str, Any] | Exception
    ) -> None:
        if isinstance(answer, Exception):
            failure = self._error_of(answer, pb.ActionRequest(correlation_id=correlation_id))
            result = pb.ActionResult(
                correlation_id=correlation_id,
                status=pb.ActionResult.ERROR,
                error=error_pb(failure),
            )
        else:
            event = self.telemetry.audit(
                "teardown", correlation_id=correlation_id, plan_id=plan_id, detail=answer
            )
            self.emit(pb.WorkerMessage(audit=event))
            result = pb.ActionResult(
                correlation_id=correlation_id,
                status=pb.ActionResult.OK,
                result_json=json.dumps(answer),
            )
        self.emit(pb.WorkerMessage(result=result))

    def enforce_kills(self) -> int:
        """Stop running calls of plans killed in the ledger meanwhile (by `agentworker
        kill` from another process, say); the intake refuses their new calls already."""
        stopped = 0
        for cid, (plan, task) in list(self._tasks.items()):
            reason = self.state.kill_reason(plan) if plan else None
            if reason is not None and cid not in self._stop_reasons:
                error = WorkerError("plan_killed", f"plan {plan!r} was killed: {reason}")
                self._stop(cid, task, error)
                stopped += 1
        return stopped

    async def drain(self, grace_s: float) -> None:
        """Take no new work; let running calls finish within `grace_s`, then cancel them."""
        self.draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), grace_s)
        except TimeoutError:
            for cid, (_plan, task) in list(self._tasks.items()):
                self._stop(cid, task, WorkerError("cancelled", "the worker shut down"))
            await self._idle.wait()

    def close(self) -> None:
        """Record what finished, then close the stores."""
        self.flush_results()
        self._write_telemetry()
        self.state.close()  # the telemetry tables share its connection

    def recover(self) -> list[str]:
        """After a crash: calls left RUNNING may or may not have happened. Never re-run them.
        Results recorded whose telemetry rows were not yet written get them now."""
        self._restore_telemetry()
        lost = self.state.running_ids()
        for cid in lost:
            error = WorkerError(
                "outcome_unknown",
                "the worker stopped while this call was running; it may or may not have "
                "taken effect and will not be run again. Check its effect before retrying.",
            )
            req = pb.ActionRequest(correlation_id=cid)
            now = now_ms()
            invocation = self._invocation(req, None, now, "not_checked", error, 0, 0, False)
            self._audit("outcome_unknown", req, {})
            result = pb.ActionResult(
                correlation_id=cid,
                status=pb.ActionResult.ERROR,
                error=error_pb(error),
                invocation=invocation,
            )
            with self.state.batch():
                self.telemetry.record(invocation)
                self.state.finish(cid, result.SerializeToString())
        return lost

    def _restore_telemetry(self) -> None:
        # Rows are written just after their results and before their acks, so a row
        # can be missing only for a result still unacked, which carries the row.
        missing = []
        for cid, data in self.state.unacked_results():
            invocation = pb.ActionResult.FromString(data).invocation
            if invocation.invocation_id and not self.telemetry.has(cid):
                missing.append(invocation)
        if missing:
            log.info("writing %d telemetry row(s) the last run left unwritten", len(missing))
            self.telemetry.record_many(missing)

    def _stop(self, cid: str, task: asyncio.Task[None], error: WorkerError) -> None:
        self._stop_reasons.setdefault(cid, error)
        task.cancel()

    # ------------------------------------------------------------- execution

    def _may_run_inline(self, spec: ActionSpec[Any, Any], req: pb.ActionRequest) -> bool:
        """A plain-function handler runs at once, in this turn, when that changes
        nothing: its claim is committed (no open intake), a slot is free and the scope
        is granted without asking anyone."""
        return (
            spec.inline
            and self._intake is None
            and not self._slots.locked()
            and self.scopes.allowed(req.agent_id, spec.scope, req.plan_id)
        )

    def _run_inline(
        self, spec: ActionSpec[Any, Any], req: pb.ActionRequest, request_blob: bytes
    ) -> None:
        """The pipeline of `_run` for a handler that never waits, without a task of its
        own: a task, a deadline timer and a loop turn would cost more than the call."""
        started, started_clock = now_ms(), time.monotonic()
        decision = "not_checked"  # as `_run` reports a call refused before its scope check
        payload: _Payload | None = None
        error: WorkerError | None = None
        try:
            args = self._parse(spec, req, request_blob)
            self._check_plan(req)
            decision = "granted"
            self._enter_handler()
            try:
                outcome = spec.handler(self._context(req, request_blob), args)
            finally:
                self.running -= 1
            payload = _payload(outcome)
        except Exception as exc:  # noqa: BLE001 - every failure becomes the call's answer
            error = self._error_of(exc, req)
        self._conclude(req, spec, started, started_clock, decision, payload, error)

    async def _run(self, req: pb.ActionRequest, request_blob: bytes) -> None:
        started, started_clock = now_ms(), time.monotonic()
        timeout_s = req.timeout_ms / 1000 if req.timeout_ms else self.limits.default_timeout_s
        spec: ActionSpec[Any, Any] | None = None
        decision = "not_checked"
        payload: _Payload | None = None
        error: WorkerError | None = None
        try:
            try:
                async with asyncio.timeout(timeout_s):
                    spec = self._lookup(req)
                    args = self._parse(spec, req, request_blob)
                    self._check_plan(req)
                    decision = await self._check_scope(spec, req)
                    async with self._slots:
                        self._enter_handler()
                        try:
                            outcome = spec.handler(self._context(req, request_blob), args)
                            if inspect.isawaitable(outcome):
                                outcome = await outcome
                        finally:
                            self.running -= 1
                    payload = _payload(outcome)
            except TimeoutError:
                raise WorkerError(
                    "timeout",
                    f"the call did not finish within its {timeout_s:g} s deadline and was stopped",
                ) from None
            except asyncio.CancelledError:
                stopped = self._stop_reasons.pop(req.correlation_id, None)
                if stopped is None:
                    raise
                raise _CallStoppedError(stopped) from None
        except Exception as exc:  # noqa: BLE001 - every failure becomes the call's answer
            error = self._error_of(exc, req)
        except BaseException:  # cancelled with no reason of ours: the loop is going away
            self._tasks.pop(req.correlation_id, None)
            self._settle()
            raise
        self._tasks.pop(req.correlation_id, None)
        self._conclude(req, spec, started, started_clock, decision, payload, error)

    def _enter_handler(self) -> None:
        self.running += 1
        self.max_running_seen = max(self.max_running_seen, self.running)

    def _error_of(self, exc: Exception, req: pb.ActionRequest) -> WorkerError:
        """What a failure answers (see worker.errors.as_worker_error)."""
        if isinstance(exc, _CallStoppedError):
            return exc.error
        doing = f"running {req.surface}.{req.action}"
        return as_worker_error(exc, doing=doing, call=req.correlation_id)

    def _conclude(
        self,
        req: pb.ActionRequest,
        spec: ActionSpec[Any, Any] | None,
        started: int,
        started_clock: float,
        decision: str,
        payload: _Payload | None,
        error: WorkerError | None,
    ) -> None:
        result_json, blob, truncated = payload or ("", b"", False)  # None after a failure
        duration = int((time.monotonic() - started_clock) * 1000)
        invocation = self._invocation(
            req, spec, started, decision, error, len(result_json) + len(blob), duration, truncated
        )
        self._finish(req, invocation, result_json, blob, error)

    def _lookup(self, req: pb.ActionRequest) -> ActionSpec[Any, Any]:
        spec = self.registry.get(f"{req.surface}.{req.action}")
        if spec is None:
            known = ", ".join(sorted(self.registry))
            raise WorkerError(
                "unknown_action",
                f"this worker has no action {req.surface}.{req.action}; it offers: {known}",
                {"surface": req.surface, "action": req.action},
            )
        return spec

    def _parse(self, spec: ActionSpec[Any, Any], req: pb.ActionRequest, blob: bytes) -> Any:
        if len(req.args_json) > MAX_ARGS_BYTES:
            raise WorkerError(
                "validation_error",
                f"args_json is {len(req.args_json):,} bytes, over the {MAX_ARGS_BYTES:,}-byte "
                "limit; send bulk data in the request blob",
                {"errors": [{"loc": [], "msg": "args too large", "type": "too_long"}]},
            )
        if blob and not spec.takes_blob:
            raise WorkerError(
                "validation_error",
                f"{spec.scope} takes no blob, but {len(blob):,} bytes came with the call",
                {"errors": [{"loc": ["blob"], "msg": "unexpected blob", "type": "extra"}]},
            )
        try:
            return spec.args.model_validate_json(req.args_json or "{}")
        except ValidationError as exc:
            errors = [
                {"loc": list(err["loc"]), "msg": err["msg"], "type": err["type"]}
                for err in exc.errors(include_url=False, include_input=False)
            ]
            summary = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'args'}: {e['msg']}" for e in errors[:5]
            )
            raise WorkerError(
                "validation_error",
                f"invalid arguments for {spec.scope}: {summary}",
                {"errors": errors},
            ) from None

    def _check_plan(self, req: pb.ActionRequest) -> None:
        reason = self.state.kill_reason(req.plan_id)
        if reason is not None:
            raise WorkerError(
                "plan_killed",
                f"plan {req.plan_id!r} was killed: {reason}. Only the person at this worker can "
                f"lift it (`agentworker lift {req.plan_id}`).",
                {"plan_id": req.plan_id},
            )

    async def _check_scope(self, spec: ActionSpec[Any, Any], req: pb.ActionRequest) -> str:
        if self.scopes.allowed(req.agent_id, spec.scope, req.plan_id):
            return "granted"
        request = ApprovalRequest(
            correlation_id=req.correlation_id,
            agent_id=req.agent_id,
            plan_id=req.plan_id,
            scope=spec.scope,
            preview=args_preview(req.args_json),
            reason="a call outside the agent's grants",
        )
        return await self.scopes.require(request)

    def _context(self, req: pb.ActionRequest, blob: bytes) -> Context:
        return Context(
            correlation_id=req.correlation_id,
            plan_id=req.plan_id,
            agent_id=req.agent_id,
            blob=blob,
            roots=self.roots,
            data_dir=self.data_dir,
            config=self.config,
            in_flight=self.in_flight,
            approve=lambda what, preview: self._approve(req, what, preview),
        )

    async def _approve(self, req: pb.ActionRequest, what: str, preview: str) -> None:
        """An action's own ask (an allowlist rule): passes if the person approved this
        very ask for the plan or agent before, else asks them."""
        key = ASK_PREFIX + what
        if self.scopes.allowed(req.agent_id, key, req.plan_id):
            return
        request = ApprovalRequest(
            correlation_id=req.correlation_id,
            agent_id=req.agent_id,
            plan_id=req.plan_id,
            scope=key,
            preview=preview,
            reason="an allowlist rule asks the person each time",
        )
        if self.scopes.approver is None:
            raise WorkerError(
                "scope_required",
                f"{what} needs the approval of the person at this worker, and this worker "
                "runs headless (it never prompts)",
                {"needs_approval": what},
            )
        if await self.scopes.approver.ask(request) is None:
            raise WorkerError("scope_denied", f"the person denied {what}", {"denied": what})

    # ------------------------------------------------------------- results

    def _finish(
        self,
        req: pb.ActionRequest,
        invocation: pb.Invocation,
        result_json: str,
        blob: bytes,
        error: WorkerError | None,
    ) -> None:
        result = pb.ActionResult(
            correlation_id=req.correlation_id,
            status=pb.ActionResult.ERROR if error else pb.ActionResult.OK,
            result_json=result_json,
            blob=blob,
            invocation=invocation,
        )
        if error is not None:
            result.error.CopyFrom(error_pb(error))
            if error.code in AUDITED_CODES:
                self._audit(error.code, req, {"message": error.message})
        if self.telemetry.recordings.active(req.plan_id):  # `agentworker record start`
            self.telemetry.recordings.keep_later(req, req.blob, result_json, blob)
        self._finished.append(result)
        if self.watcher is not None:
            self.watcher.call_finished(req, result)
        if not self._tasks:  # nothing else running that could share the commit
            self.flush_results()
        elif len(self._finished) == 1:
            asyncio.get_running_loop().call_soon(self.flush_results)

    def flush_results(self) -> None:
        """Record the results finished since the last flush (one commit for all of
        them, not one per call), then send them: none leaves unrecorded. Their telemetry
        rows are written just after, off the caller's path (see `ack`)."""
        finished, self._finished = self._finished, []
        try:
            encoded = [(r.correlation_id, r.SerializeToString()) for r in finished]
            if finished:
                self.state.finish_many(encoded)
        except Exception:
            # Left RUNNING in the ledger: after a restart they answer outcome_unknown.
            log.exception("could not record %d result(s); they were not sent", len(finished))
            encoded = []
        for cid, data in encoded:
            self._started.pop(cid, None)
            self.emit(result_message(data))
        if not self._started and self._started_timer is not None:
            # Every call it was for has answered: no wake-up for nothing.
            self._started_timer.cancel()
            self._started_timer = None
        if encoded:
            self.telemetry.record_later([result.invocation for result in finished])
            self._write_telemetry_soon()
        self._settle()

    def _write_telemetry_soon(self) -> None:
        """Write the queued telemetry rows once the results ahead of them are on their
        way (the writer task runs first), or at once with no loop running."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._write_telemetry()
            return
        if not self._telemetry_scheduled:
            self._telemetry_scheduled = True
            loop.call_soon(self._write_telemetry)

    def _write_telemetry(self) -> bool:
        """Write the queued telemetry rows; False if they could not be (they stay
        queued, their results unacked, and recover() writes them should the worker
        stop first)."""
        self._telemetry_scheduled = False
        try:
            self.telemetry.flush()
        except sqlite3.Error:
            log.exception("could not write telemetry rows; will try again")
            return False
        return True

    def ack(self, correlation_ids: list[str]) -> None:
        """The server stored these results: the ledger may forget them after its TTL.
        Their telemetry rows are written first, so a result is never both acked and
        missing its row (recover() restores rows from unacked results only); if they
        cannot be, the acks wait for the server to ack a re-send."""
        if self._write_telemetry():
            self.state.ack(correlation_ids)

    def _settle(self) -> None:
        """Idle once no call runs and no result waits to be recorded."""
        if not self._tasks and not self._finished:
            self._idle.set()

    def _invocation(
        self,
        req: pb.ActionRequest,
        spec: ActionSpec[Any, Any] | None,
        started: int,
        decision: str,
        error: WorkerError | None,
        bytes_out: int,
        duration_ms: int,
        truncated: bool,
    ) -> pb.Invocation:
        if error is not None and error.code in ("scope_required", "scope_denied"):
            decision = "denied"
        known = self._request_facts.pop(req.correlation_id, None)
        digest, blob_bytes = known if known is not None else (call_digest(req), len(req.blob))
        return pb.Invocation(
            invocation_id=uuid.uuid4().hex,
            correlation_id=req.correlation_id,
            worker_id=self.worker_id,
            owner_user_id=req.owner_user_id,
            agent_id=req.agent_id,
            plan_id=req.plan_id,
            task_id=req.task_id,
            surface=req.surface,
            action=req.action,
            scope=spec.scope if spec else f"{req.surface}.{req.action}",
            decision=decision,
            status="error" if error else "ok",
            error_code=error.code if error else "",
            started_unix_ms=started,
            finished_unix_ms=now_ms(),
            duration_ms=duration_ms,
            bytes_in=len(req.args_json) + blob_bytes,
            bytes_out=bytes_out,
            truncated=truncated,
            sandboxed=bool(spec and spec.sandboxed),
            args_digest=digest,
            args_preview=args_preview(req.args_json),
        )

    def _ack(self, cid: str, kind: pb.ActionAck.Kind, message: str = "") -> None:
        ack = pb.ActionAck(correlation_ids=[cid], kind=kind, message=message)
        self.emit(pb.WorkerMessage(ack=ack))

    def _flush_started(self) -> None:
        self._started_timer = None
        if self._started:
            ack = pb.ActionAck(correlation_ids=list(self._started), kind=pb.ActionAck.STARTED)
            self.emit(pb.WorkerMessage(ack=ack))
        self._started = {}

    def _audit(self, kind: str, req: pb.ActionRequest, detail: dict[str, Any]) -> None:
        event = self.telemetry.audit(
            kind,
            correlation_id=req.correlation_id,
            plan_id=req.plan_id,
            agent_id=req.agent_id,
            detail={"action": f"{req.surface}.{req.action}", **detail},
        )
        self.emit(pb.WorkerMessage(audit=event))
