"""The dispatch pipeline: every ActionRequest passes the same stages (docs/architecture.md,
"The life of one call").

    intake:    ledger claim (at most once; duplicates answered from the ledger)
    execution: parse + validate → kill switch → scope → slot → handler → size cap
    results:   result (recorded, then sent, kept until the server acks it)
               → telemetry row (written just after the result leaves, before its ack)

A call is one `Call` value, built once when it is claimed; `Dispatcher.stages` is the
one ordered list of execution stages, each a function of the call. A stage either
finishes in the turn it is run in (returns None) or returns the rest of its work to
be awaited (`Later`): the stages run right away, in the reader's turn, until one has
to wait — from there on the call's own task runs the rest. So a plain-function
handler whose scope is granted and whose slot is free answers within `submit`, with
no task, and an `async` one costs one task; both ran the same stages.

One place owns a call from its claim to its answer: `_answer`, which every ending
reaches (a failing stage, a deadline, a cancel before or after the task's first
step — through the task's done callback —, a kill, a drain that runs out of time)
and which answers once. A call is in `_calls` exactly while it is unanswered, so
the ledger keeps no RUNNING row for a call that no longer runs.

Results and acks leave through the `Outbox` passed in (see results.py).
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextlib
import inspect
import json
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final, Protocol

from pydantic import ValidationError

from allowlist import PolicyFile
from sandbox import Arriving, Containment, Root
from worker.clock import now_ms
from worker.config import Config, Paths
from worker.core.blob_parts import Following
from worker.core.ledger import UNRECORDED_SERVER, Seen, State
from worker.core.pause import PauseSwitch
from worker.core.prompt_text import call_text
from worker.core.recording import FULL_KIND
from worker.core.redaction import args_preview, argv_secrets, masked_detail, masked_message
from worker.core.refused_asks import RefusedAsks
from worker.core.registry import (
    MIB,
    ActionSpec,
    Context,
    Effect,
    Json,
    Outcome,
    Registry,
    Services,
    claimed_already,
    digest_known,
)
from worker.core.results import Finished, Outbox, Outgoing, Results
from worker.core.scopes import ASK_PREFIX, ApprovalRequest, Scopes
from worker.core.telemetry import AUDITED_CODES, Telemetry
from worker.core.threads import CURRENT_CALL, CallThreads
from worker.errors import WorkerError, as_worker_error
from worker.ids import MAX_ID_CHARS, id_problem, name_problem, new_id
from worker.memory import IdleGiveBack
from worker.wire.framing import Buffer
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.protocol import (
    HASH_OFF_LOOP_BYTES,
    MAX_ARGS_BYTES,
    MAX_TIMEOUT_MS,
    blob_gone,
    call_digest,
    carried_digest,
    digest_feed,
    error_pb,
    fed_digest,
    plan_digest,
    result_gone,
    stream_ended,
)
from worker.wire.transport import MAX_RESULT_BYTES

__all__ = ["Call", "Dispatcher", "Limits", "Outbox", "Outgoing", "stream_ended"]

log = logging.getLogger(__name__)

# The most of a server's reason for a cancel or a kill that is kept (in the ledger).
MAX_REASON_CHARS: Final = 1000
# A request's ids, refused unclaimed unless worker.ids.id_problem passes them (at most
# MAX_ID_CHARS printable characters; the correlation id is required).
_IDS: Final = ("correlation_id", "plan_id", "agent_id", "owner_user_id", "task_id")
# A request's names, refused unclaimed unless worker.ids.name_problem passes them.
_NAMES: Final = ("surface", "action")
# After a drain's grace, how long cancelled calls get to stop before they are answered
# anyway (`outcome_unknown`) and the drain returns: a handler that ignores its
# cancellation cannot hold the worker up longer than grace + this.
DRAIN_STOP_S = 3.0


def _args_problems(errors: list[dict[str, Any]]) -> tuple[str, list[str]]:
    """What is wrong with a call's args, in one line, and the required fields it lacks:
    every one of those is named (the caller adds them all at once), then up to five
    other problems."""
    missing = [".".join(map(str, e["loc"])) for e in errors if e["type"] == "missing"]
    said = [
        f"{'.'.join(map(str, e['loc'])) or 'args'}: {e['msg']}"
        for e in errors
        if e["type"] != "missing"
    ][:5]
    if missing:
        plural = "s" if len(missing) > 1 else ""
        said.insert(0, f"missing required field{plural} {', '.join(missing)}")
    return "; ".join(said), missing


class CallWatcher(Protocol):
    """Who watches calls come and go (the person's live view); told, never asked."""

    def call_started(self, req: pb.ActionRequest) -> None: ...

    def call_finished(
        self, req: pb.ActionRequest, result: pb.ActionResult, blob_bytes: int
    ) -> None: ...

    def plans_changed(self, plans: Iterable[str]) -> None:
        """These plans were killed or lifted."""
        ...


@dataclass(frozen=True)
class Limits:
    max_concurrency: int = 8
    # Calls accepted (running or waiting for a slot); past this a new call answers
    # `busy` at once, so a flooding server cannot exhaust the worker's memory.
    max_accepted: int = 4096
    # Results the server has not acked (kept on disk until it does): past this no new
    # call runs (`busy`), so a server that never acks cannot fill the person's disk.
    max_unacked_bytes: int = 256 * 1024 * 1024
    # The request blobs of accepted calls (running or waiting for a slot), together:
    # past this a new call answers `busy` at once, as past `max_accepted`, so queued
    # calls cannot hold max_accepted x 32 MiB. A call alone is never refused by it.
    max_accepted_blob_bytes: int = 256 * 1024 * 1024
    default_timeout_s: float = 60.0


# A piece of a request's blob: bytes, a view of the message it came in, or a blob still
# coming after its request (protocol 3, `Following`).
Piece = bytes | memoryview | Arriving

# A handler's outcome as it goes out: result JSON, blob, truncated, the blob's check, and
# the result JSON as it is kept once delivered ("" when kept whole: Outcome.at_rest).
_Payload = tuple[str, Buffer, bool, bytes | None, str]


def _digest(req: pb.ActionRequest, blob: bytes, pieces: tuple[Piece, ...]) -> str:
    """The call's digest over its blob, or over the pieces it came in."""
    if not pieces:
        return call_digest(req, blob)
    hasher = digest_feed(req)
    for piece in pieces:
        for part in _came_parts(piece):
            hasher.update(part)
    return fed_digest(hasher)


def _unrecorded() -> WorkerError:
    """The answer to a call whose digest the hub was to hand over and never did: its
    caller left before the hub recorded it, so no one waits for the answer."""
    return WorkerError(
        "cancelled",
        "the hub did not record this call (its caller left first); nothing of it was run",
        retryable=True,
    )


def _came(handed: asyncio.Future[str]) -> str:
    """The digest a resolved future handed over; empty when it never came."""
    if handed.cancelled() or handed.exception() is not None:
        return ""
    return handed.result()


def _digest_came(call: Call) -> None:
    """The hub's digest of a call started before it came, once its future is done (its
    callbacks may not have run yet): now the call's digest, or, when the hub did not
    record the call, a call refused (never claimed, so nothing of it ran)."""
    soon = call.digest_soon
    if soon is None or not soon.done() or call.digest:
        return
    call.digest = _came(soon)
    if not call.digest:
        call.refused = True


def _unsendable(error: WorkerError | None) -> bool:
    return error is not None and error.code == "cancelled" and "stream_ended" in error.details


def _no_digest(soon: asyncio.Future[str]) -> WorkerError:
    """Why a digest on its way never came: what the future was failed with (a blob that
    stopped coming after its request, protocol 3), or the hub's cancel."""
    if not soon.cancelled() and isinstance(soon.exception(), WorkerError):
        error = soon.exception()
        assert isinstance(error, WorkerError)
        return error
    return _unrecorded()


async def _digest_ready(call: Call) -> None:
    """Context.digest_ready of a call started before its digest came."""
    soon = call.digest_soon
    if soon is not None and not soon.done():
        await asyncio.wait((soon,))
    _digest_came(call)
    if not call.digest:
        raise _unrecorded() if soon is None else _no_digest(soon)


def _came_parts(piece: Piece) -> tuple[bytes | memoryview, ...]:
    """A piece of a blob as parts: a blob still coming (protocol 3), what came of it."""
    return piece.came() if isinstance(piece, Arriving) else (piece,)


async def _arrived(call: Call) -> None:
    """Before a call's blob is shown (a prompt): a blob still coming after its request
    (protocol 3) is waited for, and the call holds its parts from then on; a blob that
    stopped coming stops the call."""
    for piece in call.pieces:
        if isinstance(piece, Following):
            await asyncio.wait((piece.settled,))
            if not piece.complete:
                stopped = piece.stopped
                if isinstance(stopped, WorkerError):
                    raise stopped
                raise WorkerError("cancelled", "the blob stopped coming; nothing was run")
    call.pieces = tuple(part for piece in call.pieces for part in _came_parts(piece))


async def _sha256_came(call: Call) -> str | None:
    """Context.blob_sha256: the hub's SHA-256 of the blob it handed over (hex), once it
    came; None if it never will (the handler then hashes the blob itself)."""
    soon = call.sha256_soon
    if soon is None:
        return None
    if not soon.done():
        await asyncio.wait((soon,))
    return _came(soon) or None


@dataclass(eq=False)
class Call:
    """One call from its claim to its answer: what came in, and what became of it."""

    req: pb.ActionRequest
    blob: bytes  # the request blob, read out of `req` once
    digest: str
    timeout_s: float
    deadline: float  # time.monotonic() (the event loop's clock) when it times out
    started_ms: int
    started_clock: float
    spec: ActionSpec[Any, Any] | None = None
    args: Any = None
    decision: str = "not_checked"
    outcome: object = None
    payload: _Payload | None = None
    error: WorkerError | None = None
    stop: WorkerError | None = None  # why it was cancelled, if it was
    task: asyncio.Task[None] | None = None  # once it waits for something
    holds_slot: bool = False
    answered: bool = False
    claimed: bool = True  # False: effect-free, run without a claim in the ledger
    # Its handler claims it (Context.claim) right before its effect: until then it is
    # not `claimed`, and answered as an effect-free call is (see ActionSpec.claims_late).
    claims_late: bool = False
    # The blob as the parts it came in, unjoined (`blob` is then empty): for an
    # action whose spec says `blob_in_pieces`.
    pieces: tuple[Piece, ...] = ()
    refused: bool = False  # refused before its handler: its claim goes, nothing recorded
    ran: bool = False  # its handler was called: it may have had an effect
    # Stopped when a job of its own had finished in a thread and the task had not yet
    # taken its result: that work is done, whatever the task does next.
    done_in_thread: bool = False
    # A call started before its digest came (see `Dispatcher.submit`): the hub's future
    # of it. `digest` is set when it resolves; the call claims (Context.digest_ready)
    # and is answered only after that.
    digest_soon: asyncio.Future[str] | None = None
    # With `digest_soon`: the blob's SHA-256 (hex) the same hub hands over as it hashes
    # the blob for the digest (Context.blob_sha256).
    sha256_soon: asyncio.Future[str] | None = None

    @property
    def cid(self) -> str:
        return self.req.correlation_id

    @property
    def blob_bytes(self) -> int:
        return sum(len(piece) for piece in self.pieces) if self.pieces else len(self.blob)

    def whole_blob(self) -> bytes:
        if not self.pieces:
            return self.blob
        return b"".join(part for piece in self.pieces for part in _came_parts(piece))

    def let_go(self) -> None:
        """Once answered: drop the request's blob, the outcome (and its result blob,
        which the answer carries on) and the task. The task refers to the call (its
        coroutine and its done callback do), so the two were a cycle that only the
        cyclic collector freed: every answered 16 MiB fs_write kept its blob until
        then, `up` grew to some 750 MiB under a stream of them, and each new blob
        landed in fresh pages, faulted in on the event loop (docs/architecture.md,
        "Head of line"). A thread job still running keeps its own reference."""
        self.blob = b""
        self.pieces = ()
        self.outcome = None
        self.payload = None
        self.task = None


class _Steps(collections.abc.Coroutine[Any, Any, None]):
    """A call's task coroutine, noting each step of it: a step that resumes it takes
    what its thread jobs returned (`CallThreads.seen`); one that throws a cancel in
    while a job has finished unseen marks the call `done_in_thread`, since that
    job's result, and the fact that its work completed, would otherwise be lost."""

    def __init__(self, coro: Coroutine[Any, Any, None], call: Call, threads: CallThreads) -> None:
        self._coro = coro
        self._call = call
        self._threads = threads

    def send(self, value: Any) -> Any:
        self._threads.seen(self._call.cid)
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        cid = self._call.cid
        if self._threads.finished_unseen(cid):
            self._call.done_in_thread = True
        self._threads.seen(cid)
        if val is None and tb is None:
            return self._coro.throw(typ)
        return self._coro.throw(typ, val, tb)  # pragma: no cover - asyncio throws one

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, None, None]:  # pragma: no cover - a task's own
        return self._coro.__await__()


# The rest of a stage that has to wait, awaited in the call's task.
Later = Callable[[], Awaitable[None]]
# Why the person is asked about a call's own scope (a prompt's "Why").
OUTSIDE_GRANTS: Final = "a call outside the agent's grants"
# A stage: does its part of the call now and returns None, or returns its rest (Later).
Stage = Callable[[Call], "Later | None"]


def _payload(outcome: object) -> _Payload:
    """The outcome as it goes out, refused when it would not fit one message."""
    if not isinstance(outcome, Outcome):
        raise TypeError(f"the handler returned {type(outcome).__name__}, not an Outcome")
    result = outcome.result
    result_json = result.text if isinstance(result, Json) else result.model_dump_json()
    at_rest = "" if outcome.at_rest is None else outcome.at_rest.model_dump_json()
    texts = len(result_json) + len(at_rest)
    size = texts + len(outcome.blob)
    if size + 3 * texts > MAX_RESULT_BYTES:  # up to 4 bytes a character: count
        size = len(result_json.encode()) + len(at_rest.encode()) + len(outcome.blob)
    if size > MAX_RESULT_BYTES:
        raise WorkerError(
            "result_too_large",
            f"the result is {size:,} bytes, over the {MAX_RESULT_BYTES:,}-byte message "
            "limit; ask for less (page with offset/length or narrow the request)",
            {"bytes": size, "limit": MAX_RESULT_BYTES},
        )
    return result_json, outcome.blob, outcome.truncated, outcome.blob_check, at_rest


class _Slots:
    """`size` handler slots, handed out in arrival order. A slot belongs to a call
    (`Call.holds_slot`) until the call is answered, whatever ends it."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.used = 0
        self.most = 0
        self._waiting: dict[str, tuple[Call, asyncio.Future[None]]] = {}

    def take(self, call: Call) -> bool:
        if self.used < self.size and not self._waiting:
            self._grant(call)
            return True
        return False

    def wait(self, call: Call) -> asyncio.Future[None]:
        waiter = asyncio.get_running_loop().create_future()
        self._waiting[call.cid] = (call, waiter)
        return waiter

    def release(self, call: Call) -> None:
        self._waiting.pop(call.cid, None)
        if not call.holds_slot:
            return
        call.holds_slot = False
        self.used -= 1
        while self._waiting and self.used < self.size:
            following, waiter = self._waiting.pop(next(iter(self._waiting)))
            self._grant(following)
            if not waiter.done():
                waiter.set_result(None)

    def _grant(self, call: Call) -> None:
        call.holds_slot = True
        self.used += 1
        self.most = max(self.most, self.used)


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
        paths: Paths,
        limits: Limits = Limits(),
        config: Config | None = None,
        outbox: Outbox | None = None,
        pause: PauseSwitch | None = None,
        services: Services | None = None,
    ) -> None:
        self.config = config or Config()
        self.services = services or Services()  # what the worker owns for its handlers
        self.pause = pause  # the person's stop and desktop takeover (None: never paused)
        self.worker_id = worker_id
        self.registry = registry
        self.state = state
        self.telemetry = telemetry
        # Its rows are of the server this ledger serves (the connection names it).
        telemetry.server = lambda: state.server
        self.scopes = scopes
        self.roots = roots
        self.paths = paths
        self.limits = limits
        self.outbox = outbox if outbox is not None else Outbox()
        self.watcher: CallWatcher | None = None
        # The memory a burst of large calls freed goes back once they stop.
        self.memory = IdleGiveBack()
        self.results = Results(state, telemetry, self.outbox)
        self.refused_asks = RefusedAsks(state.connection)  # for `agentworker grant`
        self.results.on_flushed = self._settle
        self.policies = PolicyFile()  # the exec allowlist, for every call's Context
        self.containment = Containment()  # what the sandbox keeps between calls
        # The loop's default executor once the app installs it: knows whose work
        # still runs in a thread (see worker.core.threads).
        self.threads = CallThreads()
        # The execution stages, in order (the ledger claim comes before, in `submit`;
        # the answer after, in `_answer`). A gate is one more entry here.
        self.stages: list[tuple[str, Stage]] = [
            ("parse", self._parse),
            ("kill_switch", self._check_plan),
            ("pause", self._check_paused),
            ("scope", self._check_scope),
            ("slot", self._take_slot),
            ("unacked", self._check_unacked),
            ("handler", self._call_handler),
            ("size_cap", self._size_cap),
        ]
        self._draining = False
        self._slots = _Slots(limits.max_concurrency)
        self._calls: dict[str, Call] = {}  # claimed and not yet answered
        self._stragglers: set[asyncio.Task[None]] = set()  # answered, would not stop
        self._idle = asyncio.Event()
        self._idle.set()
        self._intake: list[Call] | None = None  # calls claimed in the open intake batch
        self._batching = False  # answering an intake batch: one flush at its end
        # Sandbox mode: takes a plan's workspace out of use when called, and returns
        # the removal to await (its answer's JSON); None elsewhere.
        self.on_teardown: Callable[[str], Awaitable[dict[str, Any]]] | None = None
        # Sandbox mode: the plans whose workspaces this worker holds, with when each was
        # last used (unix ms) and its placement token, told to the server in every
        # Hello; None elsewhere.
        self.held_plans: Callable[[], list[tuple[str, int, str]]] | None = None
        self._teardowns: set[asyncio.Task[None]] = set()
        self._hashing: set[asyncio.Task[None]] = set()  # requests whose digest is computed
        # The ids of those requests (how many of each), and why those cancelled while
        # hashed were: refused, unclaimed, once hashed (see `cancel`).
        self._hashing_ids: dict[str, int] = {}
        # Deliveries of an id whose call, started before its digest, was refused as the
        # digest never came: taken once that call is answered (see `_claim`).
        self._after_answer: dict[str, Callable[[], None]] = {}
        self._hashing_stops: dict[str, WorkerError] = {}
        self._blob_bytes = 0  # the request blobs of the calls in `_calls`, together

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def running(self) -> int:
        return self._slots.used

    @property
    def max_running_seen(self) -> int:
        return self._slots.most

    def in_flight(self) -> int:
        return self._slots.used

    def queued(self) -> int:
        return len(self._calls) - self._slots.used

    def unanswered(self) -> list[Call]:
        """The calls claimed and not yet answered."""
        return list(self._calls.values())

    # ------------------------------------------------------------- intake

    @contextlib.contextmanager
    def intake(self) -> Iterator[None]:
        """Claims made by `submit` inside commit together, when the block ends (one
        commit for a whole envelope of requests), and only then do their calls run.
        Should the commit fail, the calls it claimed never run (nothing runs
        unrecorded); the server sends them again."""
        if self._intake is not None:
            yield
            return
        claimed: list[Call] = []
        self._intake = claimed
        try:
            with self.state.batch():
                yield
        except sqlite3.Error:
            for call in claimed:
                held = self._calls.pop(call.cid, None)
                if held is not None:
                    self._blob_bytes -= held.blob_bytes
            claimed.clear()
            self._settle()
            raise
        finally:
            self._intake = None
            self._run_claimed(claimed)

    def _run_claimed(self, claimed: list[Call]) -> None:
        """Run a committed batch of calls, their results recorded in one commit."""
        if not claimed:
            return
        self._batching = True
        try:
            for call in claimed:
                self._advance(call)
        finally:
            self._batching = False
        if self.results.pending:
            self.results.flush()

    def submit(
        self,
        req: pb.ActionRequest,
        blob: bytes | None = None,
        pieces: tuple[Piece, ...] = (),
        *,
        handed: asyncio.Future[str] | None = None,
        handed_sha256: asyncio.Future[str] | None = None,
    ) -> None:
        """Claim `req` in the ledger and run it, or answer a duplicate. `blob`, when
        given, is the request's blob, read apart from it; `pieces`, when given, is the
        blob in the parts it came in (for an action that takes them unjoined).

        `handed`, for a request that carries no digest, is the hub's future of it (a hub in
        this process hands it over once it has recorded the call: worker.wire.local).
        A call whose handler claims it late (fs_write) and whose id is new here starts
        at once, its digest still on its way: it claims once the digest came, and is
        answered only then, so nothing of it is answered before the hub knows it.
        Any other such request waits for the digest first (nothing is answered before
        it either), then goes on as one that carried it. `handed_sha256`, with `handed`,
        is the same hub's SHA-256 of the blob (Context.blob_sha256), given to a call that
        starts before its digest."""
        if handed is not None and not carried_digest(req):
            if not self._starts_before_digest(req, blob, pieces, handed, handed_sha256):
                self._later(req, req.blob if blob is None else blob, pieces, handed)
            return
        cid = req.correlation_id
        # Ids are kept (the ledger, telemetry, audit rows), echoed in answers and shown
        # (the TUI, `agentworker record`'s comments): printable only, since a line break
        # or an escape in one could forge a line there, and bounded, since a server
        # could otherwise have each request store megabytes of them for 90 days.
        for field in (*_IDS, *_NAMES):
            problem = (
                id_problem(field, getattr(req, field), required=field == "correlation_id")
                if field in _IDS
                else name_problem(field, getattr(req, field))
            )
            if problem is not None:
                kind, text = problem
                log.warning("refusing a request (action %r): %s", req.action[:64], text)
                error = WorkerError(
                    "validation_error",
                    f"a request's {text}; nothing was run",
                    {"errors": [{"loc": [field], "msg": text, "type": kind}]},
                )
                self.refuse(req, error)
                return
        if self._draining:
            self.results.ack_request(
                cid, pb.ActionAck.REJECTED_DRAINING, "the worker is shutting down"
            )
            return
        request_blob = req.blob if blob is None else blob  # each read copies: read it once
        digest = carried_digest(req)  # computed once, where the call entered
        size = sum(len(piece) for piece in pieces) if pieces else len(request_blob)
        if digest is None and size >= HASH_OFF_LOOP_BYTES:
            # A server that sends no digest: hash a large blob in a thread, then claim.
            self._hashing_ids[cid] = self._hashing_ids.get(cid, 0) + 1
            task = asyncio.create_task(self._hash_then_claim(req, request_blob, pieces))
            self._hashing.add(task)
            task.add_done_callback(self._hashing.discard)
            return
        digest = digest or _digest(req, request_blob, pieces)
        self._claim(req, request_blob, digest, pieces)

    def _starts_before_digest(
        self,
        req: pb.ActionRequest,
        blob: bytes | None,
        pieces: tuple[Piece, ...],
        digest: asyncio.Future[str],
        sha256: asyncio.Future[str] | None = None,
    ) -> bool:
        """Start `req` with its digest on its way (see `submit`), if it may: its ids
        pass, its handler claims it late, its id is new here (running nor known to the
        ledger, which answers anything but NEW for a known id asked with no digest), and
        it would not be refused busy. False, having done nothing, otherwise."""
        cid = req.correlation_id
        spec = self.registry.get(f"{req.surface}.{req.action}")
        if (
            self._draining
            or spec is None
            or spec.effect is Effect.NONE
            or not spec.claims_late
            or cid in self._calls
            or any(id_problem(f, getattr(req, f), required=f == "correlation_id") for f in _IDS)
            or any(name_problem(field, getattr(req, field)) for field in _NAMES)
        ):
            return False
        if self.state.begin(cid, "", req.plan_id, claim=False).seen is not Seen.NEW:
            return False
        request_blob = req.blob if blob is None else blob
        size = sum(len(piece) for piece in pieces) if pieces else len(request_blob)
        if self._busy(size) is not None:
            return False
        self._claim(req, request_blob, "", pieces, digest, sha256)
        return True

    def _later(
        self,
        req: pb.ActionRequest,
        blob: bytes,
        pieces: tuple[Piece, ...],
        digest: asyncio.Future[str],
    ) -> None:
        """`req`, submitted once the hub's digest of it came (see `submit`)."""
        cid = req.correlation_id
        self._hashing_ids[cid] = self._hashing_ids.get(cid, 0) + 1
        task = asyncio.create_task(self._hash_then_claim(req, blob, pieces, digest))
        self._hashing.add(task)
        task.add_done_callback(self._hashing.discard)

    async def _hash_then_claim(
        self,
        req: pb.ActionRequest,
        blob: bytes,
        pieces: tuple[Piece, ...],
        handed: asyncio.Future[str] | None = None,
    ) -> None:
        """Claim `req` once its digest is known: computed here in a thread, or the hub's
        `handed` one. Should the hub not record the call (`handed` cancelled), it is
        refused: nothing of it ran."""
        cid = req.correlation_id
        try:
            if handed is None:
                digest = await asyncio.to_thread(_digest, req, blob, pieces)
            else:
                await asyncio.wait((handed,))
                digest = _came(handed)
        finally:
            stop = self._hashing_stops.get(cid)
            self._hashing_ids[cid] -= 1
            if not self._hashing_ids[cid]:
                del self._hashing_ids[cid]
                self._hashing_stops.pop(cid, None)
        if handed is not None and digest:
            req.args_digest = digest  # as if it had come with it
        if stop is not None:  # cancelled while it was hashed: nothing of it ran
            self.refuse_unless_known(req, stop)
            return
        if handed is not None:
            if digest:
                self.submit(req, blob, pieces)
            else:
                self.refuse(req, _no_digest(handed))
            return
        if self._draining:
            self.results.ack_request(
                req.correlation_id, pb.ActionAck.REJECTED_DRAINING, "the worker is shutting down"
            )
            return
        self._claim(req, blob, digest, pieces)

    def _claim(
        self,
        req: pb.ActionRequest,
        request_blob: bytes,
        digest: str,
        pieces: tuple[Piece, ...] = (),
        digest_soon: asyncio.Future[str] | None = None,
        sha256_soon: asyncio.Future[str] | None = None,
    ) -> None:
        """Claim the call in the ledger and run it, or answer a duplicate. An
        effect-free call is not claimed (see worker.core.ledger): the ledger is only
        asked whether it knows the id. With `digest_soon` (and `digest` empty), the call
        is new here and starts before its digest came (see `submit`)."""
        cid = req.correlation_id
        running = self._calls.get(cid)
        soon = None if running is None else running.digest_soon
        if soon is not None and not soon.done():  # compared once its digest came
            soon.add_done_callback(lambda _f: self._claim(req, request_blob, digest, pieces))
            return
        if running is not None:  # claimed or not, it runs now
            _digest_came(running)
            if running.refused and soon is not None:
                # Started before its digest, which never came (its stream ended, or the
                # hub stopped sending it): it ran nothing and is on its way out, refused.
                # This delivery (the hub's again) is taken once that one is answered.
                self._after_answer[cid] = lambda: self._claim(
                    req, request_blob, digest, pieces, digest_soon, sha256_soon
                )
                return
            seen = Seen.RUNNING if running.digest == digest else Seen.MISMATCH
            self._answer_duplicate(req, seen)
            return
        spec = self.registry.get(f"{req.surface}.{req.action}")
        effectful = spec is None or spec.effect is not Effect.NONE
        late = effectful and spec is not None and spec.claims_late
        claim = effectful and not late  # a late one is only looked up here
        begun = self.state.begin(cid, digest, req.plan_id, claim=claim)
        size = sum(len(piece) for piece in pieces) if pieces else len(request_blob)
        busy = self._busy(size) if begun.seen is Seen.NEW else None
        if busy is not None:
            if claim:
                self.state.forget(cid)  # it never ran: a later delivery may run it
            self.refuse(req, busy)
        elif begun.seen is Seen.NEW:
            call = self._new_call(req, request_blob, digest)
            call.pieces = pieces
            call.claimed = claim
            call.claims_late = late
            if digest_soon is not None:
                call.digest_soon = digest_soon
                call.sha256_soon = sha256_soon
                digest_soon.add_done_callback(lambda _soon: _digest_came(call))
            self._calls[cid] = call
            self._blob_bytes += size
            if self.watcher is not None:
                self.watcher.call_started(req)
            self._idle.clear()
            if self._intake is not None:
                self._intake.append(call)
            else:
                self._advance(call)
        elif begun.seen is Seen.DONE:
            self.results.ack_request(cid, pb.ActionAck.DUPLICATE_DONE)
            if begun.result_gone:  # effect-free, too large to keep past its ack
                self.results.send(pb.WorkerMessage(result=result_gone(cid)))
                return
            cached = pb.ActionResult.FromString(begun.result or b"")
            if begun.blob_gone or cached.masked:  # delivered, acked, let go or masked
                self.results.send(pb.WorkerMessage(result=blob_gone(cached, begun.blob_bytes)))
                return
            cached.replayed = True
            self.results.replay(cached, begun.blob or b"")
        else:
            self._answer_duplicate(req, begun.seen)

    def _answer_duplicate(self, req: pb.ActionRequest, seen: Seen) -> None:
        """A delivery of an id that runs now (RUNNING), or was used for another call:
        with other args, or by another server (OTHER_SERVER: refused as a mismatch,
        whatever its args, so nothing of that server's call is told to this one)."""
        cid = req.correlation_id
        if seen is Seen.RUNNING:
            self.results.ack_request(cid, pb.ActionAck.DUPLICATE_RUNNING)
        else:
            message = (
                f"correlation id {cid} was already used here for a call another server sent; "
                "nothing was run. Use a new id for a new call"
                if seen is Seen.OTHER_SERVER
                else f"correlation id {cid} was already used for a call with different "
                "arguments; use a new id for a new call"
            )
            self.results.ack_request(cid, pb.ActionAck.REJECTED_ARGS_MISMATCH, message)
            self.results.audit("args_mismatch", req, {"message": message})

    def _new_call(self, req: pb.ActionRequest, blob: bytes, digest: str) -> Call:
        if req.timeout_ms > MAX_TIMEOUT_MS:
            log.warning(
                "call %s asks for a %d ms deadline; cut to the %d ms ceiling",
                req.correlation_id,
                req.timeout_ms,
                MAX_TIMEOUT_MS,
            )
        timeout_ms = min(req.timeout_ms, MAX_TIMEOUT_MS)
        timeout_s = timeout_ms / 1000 if timeout_ms else self.limits.default_timeout_s
        clock = time.monotonic()
        return Call(
            req=req,
            blob=blob,
            digest=digest,
            timeout_s=timeout_s,
            deadline=clock + timeout_s,
            started_ms=now_ms(),
            started_clock=clock,
        )

    def _busy(self, blob_bytes: int) -> WorkerError | None:
        """Why a new call with a blob of `blob_bytes` cannot be taken now (nothing of
        it runs), or None."""
        if len(self._calls) >= self.limits.max_accepted:
            return WorkerError(
                "busy",
                f"the worker already holds {len(self._calls)} calls (limit "
                f"{self.limits.max_accepted}); nothing was run, send it again later",
            )
        limit = self.limits.max_accepted_blob_bytes
        if self._blob_bytes and self._blob_bytes + blob_bytes > limit:
            return WorkerError(
                "busy",
                f"the worker already holds {self._blob_bytes:,} bytes of accepted calls' "
                f"blobs (limit {limit:,}); this call's {blob_bytes:,} would pass it. "
                "Nothing was run, send it again later",
                {"blob_bytes": self._blob_bytes, "limit": limit},
            )
        if self._over_unacked():
            return self._over_budget()
        return None

    def _over_unacked(self) -> bool:
        """Whether the results the server has not acked (those just finished and not
        yet recorded too) take the budget of [worker] max_unacked_mib."""
        budget = self.limits.max_unacked_bytes - self.results.pending_bytes
        return self.state.over_unacked_budget(budget)

    def _over_budget(self) -> WorkerError:
        others = sum(held.bytes for held in self.state.held_for_others())
        held = (
            f" ({others // MIB} MiB of them are another server's, held for it: they go "
            f"{self.state.ttl_s / 3600:.0f} h after they finished)"
            if others
            else ""
        )
        return WorkerError(
            "busy",
            f"the server has not acknowledged {self.state.unacked_bytes // MIB} MiB of "
            f"results{held} (limit {self.limits.max_unacked_bytes // MIB} MiB, [worker] "
            "max_unacked_mib); nothing was run, send it again once it has",
        )

    def refuse_unless_known(
        self,
        req: pb.ActionRequest,
        error: WorkerError,
        handed: asyncio.Future[str] | None = None,
    ) -> None:
        """Refuse a request that could not be taken (its blob's parts were refused or
        did not add up, or it was cancelled before it was claimed) with `error`, unless
        it repeats a call this worker knows: that is answered as a duplicate (RUNNING
        or DONE, from memory or the ledger), so a refusal never stands in for a call's
        real outcome. With `handed`, the hub's digest on its way (see `submit`), only
        once it came: before, the hub does not know the call and drops any answer."""
        if handed is not None and not carried_digest(req):
            if not handed.done():
                handed.add_done_callback(lambda _f: self.refuse_unless_known(req, error, handed))
                return
            if _came(handed):
                req.args_digest = _came(handed)
        cid = req.correlation_id
        if cid in self._calls:
            self.results.ack_request(cid, pb.ActionAck.DUPLICATE_RUNNING)
            return
        digest = carried_digest(req)
        known = (
            digest is not None
            and 0 < len(cid) <= MAX_ID_CHARS
            and self.state.begin(cid, digest, req.plan_id, claim=False).seen is not Seen.NEW
        )
        if known and digest is not None:
            self._claim(req, b"", digest)  # answered as the duplicate it is, never run
            return
        self.refuse(req, error)

    def refuse(self, req: pb.ActionRequest, error: WorkerError) -> None:
        """Answer a request that was never claimed (so never ran) with `error`."""
        if _unsendable(error):  # see stream_ended
            return
        result = pb.ActionResult(
            correlation_id=req.correlation_id,
            status=pb.ActionResult.ERROR,
            error=error_pb(error),
        )
        self.results.send(pb.WorkerMessage(result=result))

    # ------------------------------------------------------------- control

    def cancel(self, correlation_id: str, reason: str) -> bool:
        call = self._calls.get(correlation_id)
        if call is None:
            if correlation_id in self._hashing_ids:  # not claimed yet: refused once hashed
                self._hashing_stops[correlation_id] = WorkerError(
                    "cancelled", f"cancelled before it started: {reason[:MAX_REASON_CHARS]}"
                )
                return True
            return False
        self._stop(call, WorkerError("cancelled", f"cancelled: {reason[:MAX_REASON_CHARS]}"))
        return True

    def kill_plan(self, plan_id: str, reason: str, killed_by: str, in_use: bool = False) -> int:
        """Refuse the plan's later calls (durably) and cancel its running ones. `in_use`:
        the server says the plan is in use (KillPlan.in_use; see ledger.MAX_SERVER_KILLS)."""
        problem = id_problem("plan_id", plan_id, required=True)
        if problem is not None:
            # No call of such a plan can run here (a request's plan_id is as bounded).
            log.warning("ignoring a kill (from %s): %s", killed_by, problem[1])
            return 0
        reason = reason[:MAX_REASON_CHARS]
        pruned = self.state.kill_plan(plan_id, reason, killed_by, in_use)
        self.containment.warm.discard(plan_id)  # its sandbox built ahead: never used now
        if self.watcher is not None:
            self.watcher.plans_changed([plan_id, *pruned])
        self.telemetry.audit("kill", plan_id=plan_id, detail={"reason": reason, "by": killed_by})
        # Every running call the kills now bind, not only the plan's: a kill of every
        # plan ('*', the hub's or the one recorded past MAX_SERVER_KILLS) stops them all.
        return self._stop_killed(self.state.killed)

    def kill_digest(self, digest: int, reason: str, killed_by: str) -> int:
        """A server's kill of the plan whose id has `digest` (KillPlan.plan_digest: its
        hub could no longer keep the id): recorded apart (ledger.kill_apart), and the
        running calls it binds stopped, as kill_plan does."""
        reason = reason[:MAX_REASON_CHARS]
        self.state.kill_apart(digest)
        self.telemetry.audit(
            "kill",
            plan_id="",
            detail={"reason": reason, "by": killed_by, "plan_digest": digest},
        )

        def reason_of(plan: str) -> str | None:
            if plan_digest(plan) == digest:
                return f"{reason} (by {killed_by}, named by digest)"
            return self.state.killed(plan)  # the overflow's stop of every plan, if made

        return self._stop_killed(reason_of)

    def plans_running(self) -> set[str]:
        """Plans with a call accepted and not yet answered."""
        return {call.req.plan_id for call in self._calls.values()}

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
            problem = id_problem("plan_id", plan_id)
            if problem is not None:  # no call of such a plan can have run here
                raise WorkerError("validation_error", f"a teardown's {problem[1]}")
            error = WorkerError("cancelled", f"plan {plan_id!r} was torn down")
            stopped = [call for call in self._calls.values() if call.req.plan_id == plan_id]
            for call in stopped:
                self._stop(call, error)
            victims = [call.task for call in stopped if call.task is not None]
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
            failure = as_worker_error(
                answer, doing=f"tearing down plan {plan_id}", call=correlation_id
            )
            result = pb.ActionResult(
                correlation_id=correlation_id,
                status=pb.ActionResult.ERROR,
                error=error_pb(failure),
            )
        else:
            event = self.telemetry.audit(
                "teardown", correlation_id=correlation_id, plan_id=plan_id, detail=answer
            )
            self.results.send(pb.WorkerMessage(audit=event))
            result = pb.ActionResult(
                correlation_id=correlation_id,
                status=pb.ActionResult.OK,
                result_json=json.dumps(answer),
            )
        self.results.send(pb.WorkerMessage(result=result))

    def enforce_kills(self) -> int:
        """Stop running calls of plans killed in the ledger meanwhile (by `agentworker
        kill` from another process, say); the intake refuses their new calls already."""
        moved = self.state.kills_moved()
        if moved and self.watcher is not None:
            self.watcher.plans_changed(moved)
        for plan in moved:
            self.containment.warm.discard(plan)
        return self._stop_killed(self.state.kill_reason)

    def _stop_killed(self, reason_of: Callable[[str], str | None]) -> int:
        """Stop each running call whose plan the ledger says is killed (`reason_of`: why,
        or None); how many."""
        stopped = 0
        for call in list(self._calls.values()):
            plan = call.req.plan_id
            # A call with no plan too: a kill of every plan ('*') binds it, as it refuses
            # a new one (review18 F2: a long call sent with no plan id outran a '*' stop).
            reason = reason_of(plan)
            if reason is not None and call.stop is None:
                self._stop(call, WorkerError("plan_killed", f"plan {plan!r} was killed: {reason}"))
                stopped += 1
        return stopped

    def enforce_pause(self) -> int:
        """Stop running calls the pause switch now refuses (the person pressed the stop
        hotkey, ran `agentworker pause`, or took the desktop back)."""
        if self.pause is None or not self.pause.current().active:
            return 0
        self.containment.warm.discard()  # no sandbox built ahead outlives a pause
        stopped = 0
        for call in list(self._calls.values()):
            if call.stop is not None:
                continue
            try:
                self.pause.check(call.req.surface)
            except WorkerError as error:
                self._stop(call, error)
                stopped += 1
        return stopped

    def stop_intake(self) -> None:
        """Take no new calls (they are refused REJECTED_DRAINING); running ones go on."""
        self._draining = True

    async def drain(self, grace_s: float, stop_s: float = DRAIN_STOP_S) -> None:
        """Take no new work; let running calls finish within `grace_s`, then cancel
        them; a call still not stopped `stop_s` later is answered `outcome_unknown`
        and left behind (see `stragglers`). Returns within grace_s + stop_s."""
        self._draining = True
        self.containment.warm.close()  # the sandboxes built ahead: killed, none built again
        if await self._idle_within(grace_s):
            return
        self.stop_all(WorkerError("cancelled", "cancelled: the worker shut down"))
        if await self._idle_within(stop_s):
            return
        for call in list(self._calls.values()):
            log.error(
                "call %s (%s.%s) did not stop within %g s of being cancelled; "
                "answering outcome_unknown",
                call.cid,
                call.req.surface,
                call.req.action,
                stop_s,
            )
            call.error = WorkerError(
                "outcome_unknown",
                "the worker shut down and this call did not stop when cancelled; it may or "
                "may not have taken effect. Check its effect before retrying.",
            )
            if call.task is not None:
                self._stragglers.add(call.task)
            self._answer(call)
        self.results.flush()

    def stragglers(self) -> list[asyncio.Task[None]]:
        """Calls answered by a drain that ran out of time whose handlers still run."""
        return [task for task in self._stragglers if not task.done()]

    def stop_all(self, error: WorkerError) -> int:
        """Cancel every call not yet answered, each answering `error` (a drain's grace
        over, or cut short by the person); how many there were."""
        calls = list(self._calls.values())
        for call in calls:
            self._stop(call, error)
        return len(calls)

    async def _idle_within(self, seconds: float) -> bool:
        try:
            async with asyncio.timeout(seconds):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        """Record what finished, then close the stores."""
        self.containment.warm.close()
        self.memory.close()
        self.results.flush()
        self.results.write_telemetry()
        self.state.close()  # the telemetry tables share its connection

    def ack(self, correlation_ids: list[str]) -> None:
        self.results.ack(correlation_ids)

    def flush_results(self) -> None:
        self.results.flush()

    def recover(self) -> list[str]:
        """After a crash: calls left RUNNING may or may not have happened. Never re-run them.
        Results recorded whose telemetry rows were not yet written get them now."""
        self._restore_telemetry()
        self.state.sweep_blob_files()
        # Every server's: each is answered outcome_unknown, told to its own server only.
        lost = self.state.running_ids(every_server=True)
        servers = self.state.servers_of_calls(lost)  # each row is its own server's
        for cid in lost:
            req = pb.ActionRequest(correlation_id=cid)
            call = self._new_call(req, b"", call_digest(req))
            call.error = WorkerError(
                "outcome_unknown",
                "the worker stopped while this call was running; it may or may not have "
                "taken effect and will not be run again. Check its effect before retrying.",
            )
            result, _blob, _check = self._result_of(call)
            with self.state.batch():
                self.telemetry.record(result.invocation, servers.get(cid, UNRECORDED_SERVER))
                self.state.finish(cid, result.SerializeToString())
        return lost

    def _restore_telemetry(self) -> None:
        # Rows are written just after their results and before their acks, so a row
        # can be missing only for a result still unacked, which carries the row.
        missing = []
        for unacked in self.state.unacked_results(every_server=True):
            cid = unacked.correlation_id
            invocation = pb.ActionResult.FromString(unacked.result).invocation
            if invocation.invocation_id and not self.telemetry.has(cid):
                missing.append(invocation)
        if missing:
            log.info("writing %d telemetry row(s) the last run left unwritten", len(missing))
            servers = self.state.servers_of_calls([row.correlation_id for row in missing])
            whose = {
                row.correlation_id: servers.get(row.correlation_id, UNRECORDED_SERVER)
                for row in missing
            }
            for server in sorted(set(whose.values())):
                self.telemetry.record_many(
                    [row for row in missing if whose[row.correlation_id] == server], server
                )

    def _stop(self, call: Call, error: WorkerError) -> None:
        """Cancel a call; it answers `error`. A call with no task yet is waiting for its
        intake batch to commit, and `_advance` stops it before its first stage."""
        if call.stop is None:
            call.stop = error
        if call.task is not None:
            call.task.cancel()

    # ------------------------------------------------------------- execution

    def _advance(self, call: Call, stage: int = 0) -> None:
        """Run the call's stages from `stage` in this turn until one has to wait; its
        rest, and the stages after it, go to a task of the call's own."""
        try:
            while stage < len(self.stages) and call.stop is None:
                later = self.stages[stage][1](call)
                stage += 1
                if later is not None:
                    self._continue_in_task(call, later, stage)
                    return
        except Exception as exc:  # noqa: BLE001 - every failure becomes the call's answer
            call.error = self._error_of(exc, call)
        self._answer(call)

    def _continue_in_task(self, call: Call, later: Later, stage: int) -> None:
        self.results.started(call.cid)
        self.threads.watch(call.cid)  # until `_answer`
        steps = _Steps(self._rest(call, later, stage), call, self.threads)
        task = asyncio.create_task(steps, name=f"call-{call.cid}")
        call.task = task
        # Whatever ends the task — even a cancel before its first step, which runs
        # neither its body nor its `finally` — answers the call.
        task.add_done_callback(lambda _task: self._answer(call))

    async def _rest(self, call: Call, later: Later, stage: int) -> None:
        CURRENT_CALL.set(call.cid)  # the task's own context: its thread jobs are counted
        deadline = asyncio.timeout_at(call.deadline)
        try:
            async with deadline:
                await later()
                while stage < len(self.stages) and call.stop is None:
                    rest = self.stages[stage][1](call)
                    stage += 1
                    if rest is not None:
                        await rest()
        except asyncio.CancelledError:
            # Answered below with its stop reason; the task ends here.
            call.error = self._left_running(call, call.stop)
        except TimeoutError as exc:
            timeout = WorkerError(
                "timeout",
                f"the call did not finish within its {call.timeout_s:g} s deadline and was stopped",
            )
            call.error = (
                self._left_running(call, timeout) or timeout
                if deadline.expired()
                else self._error_of(exc, call)
            )
        except Exception as exc:  # noqa: BLE001 - every failure becomes the call's answer
            call.error = self._error_of(exc, call)
        self._answer(call)

    def _left_running(self, call: Call, stop: WorkerError | None) -> WorkerError | None:
        """A call stopped while its work runs in a thread: a thread cannot be stopped,
        so the work may yet take effect, and the answer says so (`outcome_unknown`)
        instead of claiming it was stopped. So too when such work had just finished and
        its result had not reached the task yet. None if nothing of it ran so, or if
        the action only looks (its work can take no effect)."""
        if call.spec is not None and call.spec.effect is Effect.NONE:
            return None
        if call.claims_late and not call.claimed:  # its effect was never let start
            return None
        why = stop.message if stop is not None else "cancelled"
        if self.threads.running(call.cid):
            effect = (
                "was still running in a thread, which cannot be interrupted, "
                "so it may or may not take effect"
            )
        elif call.done_in_thread:
            effect = "in a thread had just finished, and may have taken effect"
        else:
            return None
        log.warning("call %s was stopped (%s); its work %s", call.cid, why, effect)
        return WorkerError(
            "outcome_unknown",
            f"{why}; but its work {effect}. Check its effect before retrying.",
            {"stopped": stop.code if stop is not None else "cancelled"},
        )

    def _error_of(self, exc: Exception, call: Call) -> WorkerError:
        """What a failure answers (see worker.errors.as_worker_error)."""
        req = call.req
        doing = f"running {req.surface}.{req.action}"
        return as_worker_error(exc, doing=doing, call=req.correlation_id)

    # The stages, in their order in `stages`.

    def _parse(self, call: Call) -> None:
        req = call.req
        spec = self.registry.get(f"{req.surface}.{req.action}")
        if spec is None:
            known = ", ".join(sorted(self.registry))
            raise WorkerError(
                "unknown_action",
                f"this worker has no action {req.surface}.{req.action}; it offers: {known}",
                {"surface": req.surface, "action": req.action},
            )
        call.spec = spec
        if len(req.args_json) > MAX_ARGS_BYTES:
            raise WorkerError(
                "validation_error",
                f"args_json is {len(req.args_json):,} bytes, over the {MAX_ARGS_BYTES:,}-byte "
                "limit; send bulk data in the request blob",
                {"errors": [{"loc": [], "msg": "args too large", "type": "too_long"}]},
            )
        if call.blob_bytes and not spec.takes_blob:
            raise WorkerError(
                "validation_error",
                f"{spec.scope} takes no blob, but {call.blob_bytes:,} bytes came with the call",
                {"errors": [{"loc": ["blob"], "msg": "unexpected blob", "type": "extra"}]},
            )
        try:
            call.args = spec.args.model_validate_json(req.args_json or "{}")
        except ValidationError as exc:
            errors = [
                {"loc": list(err["loc"]), "msg": err["msg"], "type": err["type"]}
                for err in exc.errors(include_url=False, include_input=False)
            ]
            summary, missing = _args_problems(errors)
            details: dict[str, Any] = {"errors": errors}
            if missing:
                details["missing_fields"] = missing
            if any(e["type"] == "extra_forbidden" for e in errors):
                # Name what it does take: the caller misspelt a field or guessed one.
                accepted = sorted(spec.args.model_fields)
                details["accepted_fields"] = accepted
                summary += f". {spec.scope} accepts: {', '.join(accepted)}"
            raise WorkerError(
                "validation_error",
                f"invalid arguments for {spec.scope}: {summary}",
                details,
            ) from None
        except RecursionError:
            raise WorkerError(
                "validation_error",
                f"invalid arguments for {spec.scope}: args_json nests too deeply",
                {"errors": [{"loc": [], "msg": "nested too deeply", "type": "recursion_loop"}]},
            ) from None

    def _check_plan(self, call: Call) -> None:
        plan = call.req.plan_id
        reason = self.state.kill_reason(plan)
        if reason is not None:
            raise WorkerError(
                "plan_killed",
                f"plan {plan!r} was killed: {reason}. Only the person at this worker can "
                f"lift it (`agentworker lift {plan}`).",
                {"plan_id": plan},
            )

    def _check_paused(self, call: Call) -> None:
        if self.pause is not None:
            self.pause.check(call.req.surface)

    def _check_scope(self, call: Call) -> Later | None:
        req, spec = call.req, call.spec
        assert spec is not None  # parse found it
        also = {} if spec.also_needs is None else spec.also_needs(call.args)
        missing = {
            scope: why
            for scope, why in ((spec.scope, OUTSIDE_GRANTS), *also.items())
            if not self.scopes.allowed(req.agent_id, scope, req.plan_id)
        }
        if not missing:
            call.decision = "granted"
            return None

        async def ask() -> None:
            await _arrived(call)
            decisions = []
            for scope, why in missing.items():  # in turn: each prompt names one scope
                request = self._approval_request(call, scope, why)
                try:
                    decisions.append(await self.scopes.require(request))
                except WorkerError as exc:
                    if scope not in also:
                        raise
                    # The refusal says why this call needs a scope not its action's.
                    message = f"{exc.message} This {spec.scope} needs it: {why}."
                    raise WorkerError(exc.code, message, {**exc.details, "why": why}) from None
            call.decision = decisions[-1]

        return ask

    def _take_slot(self, call: Call) -> Later | None:
        if self._slots.take(call):
            return None
        # In line now, not once the task starts: a slot freed meanwhile comes to it.
        waiter = self._slots.wait(call)

        async def wait() -> None:
            await waiter

        return wait

    def _check_unacked(self, call: Call) -> None:
        """Checked again once the call has its slot: calls accepted in one burst before
        the unacked results reached their budget would otherwise all run past it."""
        if self._over_unacked():
            call.refused = True
            raise self._over_budget()

    def _call_handler(self, call: Call) -> Later | None:
        spec = call.spec
        assert spec is not None
        call.ran = True
        context = self._context(call)
        if spec.inline:
            outcome = spec.handler(context, call.args)
            if not inspect.isawaitable(outcome):
                call.outcome = outcome
                return None

            async def finish() -> None:
                call.outcome = await outcome

            return finish

        async def run() -> None:
            outcome = spec.handler(context, call.args)
            call.outcome = await outcome if inspect.isawaitable(outcome) else outcome

        return run

    def _size_cap(self, call: Call) -> None:
        call.payload = _payload(call.outcome)

    def _context(self, call: Call) -> Context:
        req = call.req
        return Context(
            correlation_id=req.correlation_id,
            plan_id=req.plan_id,
            agent_id=req.agent_id,
            blob=call.blob,
            pieces=call.pieces,
            roots=self.roots,
            paths=self.paths,
            config=self.config,
            policies=self.policies,
            containment=self.containment,
            services=self.services,
            threads=self.threads,
            in_flight=self.in_flight,
            approve=lambda what, preview: self._approve(call, what, preview),
            claim=(lambda: self._claim_late(call)) if call.claims_late else claimed_already,
            digest_ready=(lambda: _digest_ready(call)) if call.digest_soon else digest_known,
            blob_sha256=None if call.sha256_soon is None else (lambda: _sha256_came(call)),
            placement_token=req.placement_token,
        )

    def _claim_late(self, call: Call) -> None:
        """Context.claim of a call whose handler claims it (ActionSpec.claims_late):
        committed here, before its effect may start. Raises WorkerError when it cannot
        be: stopped meanwhile, the ledger's commit failed, or the id is claimed already
        (another process sharing this ledger); its handler then starts nothing."""
        if call.claimed:
            return
        if call.stop is not None:
            raise call.stop
        try:
            begun = self.state.claim(call.cid, call.digest, call.req.plan_id)
        except sqlite3.Error as exc:
            log.error("could not claim call %s before running it: %s", call.cid, exc)
            call.refused = True  # never ran, nothing recorded: a later delivery may run it
            raise WorkerError(
                "internal_error",
                f"the worker could not record this call before running it ({exc}); nothing "
                "was run. Send it again once the worker's disk has room",
                retryable=True,
            ) from None
        if begun is not Seen.NEW:
            call.refused = True
            raise WorkerError(
                "internal_error",
                f"call {call.cid} was claimed in this worker's ledger by another process "
                "meanwhile; nothing was run here",
            )
        call.claimed = True

    def _approval_request(
        self, call: Call, scope: str, reason: str, note: str = ""
    ) -> ApprovalRequest:
        """The question put to the person about `call`: the whole call, never the
        telemetry's cut and masked preview (worker.core.prompt_text)."""
        req = call.req
        pieces = tuple(part for piece in call.pieces for part in _came_parts(piece)) or (
            (call.blob,) if call.blob else ()
        )
        shown = call_text(req.surface, call.args, self.roots, pieces)
        return ApprovalRequest(
            correlation_id=req.correlation_id,
            agent_id=req.agent_id,
            plan_id=req.plan_id,
            scope=scope,
            preview=f"{note}\n\n{shown}" if note else shown,
            reason=reason,
            blob=pieces,
        )

    async def _approve(self, call: Call, what: str, preview: str) -> None:
        """An action's own ask (an allowlist rule): passes if the person approved this
        very ask for the plan or agent before, else asks them."""
        req = call.req
        key = ASK_PREFIX + what
        if self.scopes.allowed(req.agent_id, key, req.plan_id):
            return
        await _arrived(call)
        request = self._approval_request(
            call, key, "an allowlist rule asks the person each time", preview
        )
        try:
            if self.scopes.approver is None:
                raise WorkerError(
                    "scope_required",
                    f"{what} needs the approval of the person at this worker, and this worker "
                    "runs headless (it never prompts)",
                    {"needs_approval": what},
                )
            granted = await self.scopes.approver.ask(request)
        except WorkerError as exc:
            # What was refused, kept for `agentworker grant` to show and check the name
            # against (the agent relays the name to the person: review21 B7).
            if exc.code == "scope_required":
                try:
                    self.refused_asks.record(what, preview, req.args_json)
                except sqlite3.Error as why:  # the refusal stands; only its record is lost
                    log.warning("refused ask not kept for `agentworker grant`: %s", why)
            raise
        if granted is None:
            raise WorkerError("scope_denied", f"the person denied {what}", {"denied": what})

    # ------------------------------------------------------------- the answer

    def _answer(self, call: Call) -> None:
        """The one place a claimed call ends: answered once, its slot given back, its
        result recorded and sent (with others finishing in the same turn)."""
        if call.answered:
            return
        soon = call.digest_soon
        if soon is not None and not soon.done():  # answered once the hub recorded it
            soon.add_done_callback(lambda _f: self._answer(call))
            return
        _digest_came(call)
        call.answered = True
        self.threads.unwatch(call.cid)
        gone = self._calls.pop(call.cid, None)
        if gone is not None:
            self._blob_bytes -= gone.blob_bytes
        self._slots.release(call)
        try:
            result, blob, check = self._result_of(call)
        except Exception:
            log.exception("could not build the result of call %s", call.cid)
            error = WorkerError(
                "internal_error",
                f"the worker could not build this call's result; its log has the details "
                f"(call {call.cid})",
            )
            result = pb.ActionResult(
                correlation_id=call.cid, status=pb.ActionResult.ERROR, error=error_pb(error)
            )
            blob, check = b"", None
        if self.watcher is not None:
            self.watcher.call_finished(call.req, result, len(blob))
        self.memory.ended(max(call.blob_bytes, len(blob)))
        call.let_go()
        if call.refused:  # never ran: a later delivery may run it
            if call.claimed:
                self.state.forget(call.cid)
            soon = call.digest_soon
            if soon is None or not soon.done() or not _unsendable(_no_digest(soon)):
                self.results.send(pb.WorkerMessage(result=result))
            self._settle()
            later = self._after_answer.pop(call.cid, None)
            if later is not None:  # a delivery of the same id that waited for this answer
                later()
            return
        held = None if call.claimed else (call.digest, call.req.plan_id)
        self.results.add(
            Finished(result, blob, held, check), now=not self._batching and not self._calls
        )
        self._settle()

    def _result_of(self, call: Call) -> tuple[pb.ActionResult, Buffer, bytes | None]:
        """The call's result (without its blob), its blob and the blob's check (None
        when the handler did not compute it)."""
        error = call.error
        if error is None and call.payload is None:
            error = call.stop or WorkerError("cancelled", "cancelled before it finished")
        result_json, blob, truncated, check, at_rest = (
            ("", b"", False, None, "") if error else (call.payload or ("", b"", False, None, ""))
        )
        invocation = self._invocation(call, error, len(result_json) + len(blob), truncated)
        result = pb.ActionResult(
            correlation_id=call.cid,
            status=pb.ActionResult.ERROR if error else pb.ActionResult.OK,
            result_json=result_json,
            invocation=invocation,
            result_json_at_rest=at_rest,
        )
        if error is not None:
            result.error.CopyFrom(error_pb(error))
            # A refusal quotes the call (the URL, the argv): what the ledger, the hub's
            # store, recordings and the audit row keep of it is masked as previews are
            # (review10 01). The agent knows what it sent.
            # The passwords its argv holds are masked wherever the message quotes them,
            # in the allowlist's words too (review14 01).
            known = argv_secrets(call.req.args_json)
            masked = masked_message(error.message, known)
            if masked != error.message:
                result.error.message = masked
            if error.details and result.error.details_json:
                details = masked_detail(error.details, known)
                result.error.details_json = json.dumps(details, default=str)
            if error.code in AUDITED_CODES:
                self.results.audit(error.code, call.req, {"message": masked})
        # `agentworker record start`: this server's plan of the id, not another's.
        if self.telemetry.recordings.active(self.state.server, call.req.plan_id):
            # A recorded plan's blob goes whole into the recording (on the loop, as its
            # row does): recording is for debugging, not for speed. Not a refused
            # call's, nor past the recordings' bound (worker.core.recording).
            recordings = self.telemetry.recordings
            # Its result as kept at rest (secrets masked), as the args are.
            kept_full = recordings.keep_later(
                self.state.server,
                call.req,
                call.whole_blob(),
                at_rest or result_json,
                blob,
                ran=call.ran,
            )
            if kept_full:
                message = (
                    "the recordings reached their bound "
                    f"({recordings.max_blob_bytes // MIB} MiB of request blobs, "
                    f"{recordings.max_text_bytes // MIB} MiB of args and results, "
                    f"{recordings.max_calls:,} calls): this "
                    "call and later ones of recorded plans are kept without what passes "
                    "it until older recorded calls are pruned"
                )
                log.warning("%s", message)
                self.results.audit(FULL_KIND, call.req, {"message": message})
        return result, blob, check

    def _invocation(
        self, call: Call, error: WorkerError | None, bytes_out: int, truncated: bool
    ) -> pb.Invocation:
        req, spec = call.req, call.spec
        decision = call.decision
        if error is not None and error.code in ("scope_required", "scope_denied"):
            decision = "denied"
        return pb.Invocation(
            invocation_id=new_id(),
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
            started_unix_ms=call.started_ms,
            finished_unix_ms=now_ms(),
            duration_ms=int((time.monotonic() - call.started_clock) * 1000),
            bytes_in=len(req.args_json) + call.blob_bytes,
            bytes_out=bytes_out,
            truncated=truncated,
            sandboxed=bool(spec and spec.sandboxed),
            args_digest=call.digest,
            args_preview=args_preview(req.args_json, parsed=call.args is not None),
        )

    def _settle(self) -> None:
        """Idle once no call is unanswered and no result waits to be recorded."""
        if not self._calls and not self.results.pending:
            self._idle.set()
