"""The reference hub: the server side of the worker stream plus a control API.

It stands in for the agent server (docs/architecture.md, "The protocol and its
guarantees"): workers dial its WorkerService, callers use its ControlService to dispatch
actions, list workers, ask for scopes and kill plans. `agentworker up` runs it beside a
worker in one process. Each worker stream has one writer: the servicer is a generator
that yields from the session's outbox, while a reader task handles what the worker
sends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import secrets
import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final, cast

import grpc

from worker import db
from worker.clock import now_ms
from worker.config import PROMPT_TIMEOUT_MAX_S
from worker.errors import WorkerError
from worker.hub import delivery, reads, upload
from worker.hub.admission import Admission, enrolment_info, superseded_message
from worker.hub.audit_log import AuditLines, shown
from worker.hub.delivery import too_large
from worker.hub.envelopes import Answer, EnvelopeRefused, Incoming
from worker.hub.hellos import (
    HELLO_RESENT_IDS,
    HELLO_RETRY_MIN_S,
    UNSOLICITED_PER_STREAM,
    BusyStream,
    Hellos,
    PacedLines,
    hello_description,
    hello_refusal,
    stream_key,
)
from worker.hub.outbox import PROGRESS_BYTES
from worker.hub.placement import Placements
from worker.hub.reads import UnaryReads, control_reads, hello_reads, later_reads
from worker.hub.session import HOLD_S, Session
from worker.hub.store import HubStore, StoredCall
from worker.hub.turns import Unread, address_of
from worker.ids import id_problem, name_problem, ordered_id
from worker.memory import IdleGiveBack
from worker.wire.framing import (
    BATCH_BYTES,
    PART_BYTES,
    Batcher,
    Buffer,
    Chunked,
    announced,
    digest_part,
    envelope_of,
    message_part,
    outgoing_size,
    pending_parts,
    spread_parts,
)
from worker.wire.inproc import LOCAL_PEER
from worker.wire.local import LocalLink, result_key
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.protocol import (
    BLOB_CAP_HINTS,
    DIGEST_KILL_PROTOCOL,
    ENROLMENT_KEY,
    FOLLOW_PROTOCOL,
    MAX_TIMEOUT_MS,
    PARTS_PROTOCOL,
    PROTOCOL_MAX,
    PROTOCOL_MIN,
    RETRY_AFTER_KEY,
    VERSION,
    WORKBENCH_SURFACE,
    blob_cap,
    blob_gone,
    error_pb,
    for_caller,
    same_call,
    schemes_differ,
)
from worker.wire.transport import fingerprint_of_digest

log = logging.getLogger(__name__)

# A caller waits this much longer than the call's own deadline: the worker enforces
# the deadline and answers `timeout` itself; the slack covers the trip back.
RESULT_SLACK_S = 5.0
HANDSHAKE_TIMEOUT_S = 10.0


# Calls sent and results received are stored together, at most one commit per this
# long (a group commit): never on a caller's path (it has its answer already), and
# under load one commit for many calls. Each stored result is then acked, so until
# its commit the worker keeps it and re-sends it to a hub that died meanwhile. A
# commit holds the loop for a while (the calls' rows in SQLite's B-trees and log),
# and a call on its way meanwhile waits for it: the rarer the commits, the fewer
# calls do (at 10 ms, a fifth of the calls of a caller calling one at a time did).
STORE_DELAY_S = 0.05
# How long a teardown waits for the worker (it stops the plan's calls, then removes files).
TEARDOWN_TIMEOUT_S = 60.0
# RequestScopes waiting at once for one worker's person, at most (more answer "busy"),
# and the longest reason and preview relayed (a prompt shows 500 and 2,000 of them).
SCOPE_REQUESTS_PER_WORKER: Final = 64
# ... of them for one agent, at most: one agent's flood must not leave the others no room.
SCOPE_REQUESTS_PER_AGENT: Final = 16
# The ids a call names, each checked by worker.ids.id_problem (see `bad_id`), and its
# names, by worker.ids.name_problem.
CALL_IDS: Final = ("correlation_id", "plan_id", "agent_id", "owner_user_id", "task_id")
CALL_NAMES: Final = ("surface", "action")
SCOPE_REASON_CHARS: Final = 4096
SCOPE_PREVIEW_CHARS: Final = 64 * 1024
# How long a RequestScope waits for the worker's answer unless it says (timeout_ms 0),
# and the longest it may: the longest a prompt waits for its person (`[ui]
# prompt_timeout_s`, at most PROMPT_TIMEOUT_MAX_S; a prompt unanswered by then is a
# denial) and a minute for the answer to come back. A longer wait could end in no
# other answer, and held its place among the worker's SCOPE_REQUESTS_PER_WORKER
# meanwhile: timeout_ms up to 2**32 - 1 ms, 49.7 days. Cut to it, with a line in the
# log, as a call's deadline is cut to MAX_TIMEOUT_MS.
SCOPE_WAIT_DEFAULT_MS: Final = 120_000
SCOPE_WAIT_MAX_MS: Final = (PROMPT_TIMEOUT_MAX_S + 60) * 1000
# A RequestScope whose worker's stream ended before its answer came: no answer comes
# on that stream, and one held until its timeout kept its place among the worker's
# SCOPE_REQUESTS_PER_WORKER after the worker came back (review25, noticed). The worker
# withdraws the question from its person as the stream ends (an answer given later
# went down its next stream, to no request there: review26).
SCOPE_STREAM_ENDED: Final = (
    "cancelled: the worker's stream ended before its answer came, and the worker "
    "withdrew the question from its person (a grant they made before stays); ask again "
    "once the worker is connected"
)


@dataclass(frozen=True)
class _ScopeAsk:
    """A RequestScope sent to a worker's person and waited for."""

    worker_id: str
    agent_id: str
    session_id: str  # of the stream it went on: it ends with it
    waiter: asyncio.Future[pb.ScopeDecision]


_NOT_RECORDED: Final = WorkerError(
    "internal_error",
    "the hub could not record the call in its database (its log says why); nothing was "
    "sent to the worker: retry it with the same correlation id",
)


_HUB_DB_HELD: Final = WorkerError(
    "busy",
    "another process held hub.db's write lock (a backup, an sqlite3 shell?) for longer "
    "than the hub waits to record a call; nothing was sent to the worker: retry it with "
    "the same correlation id once that process lets hub.db go",
)


def error_result(correlation_id: str, error: WorkerError) -> pb.ActionResult:
    return pb.ActionResult(
        correlation_id=correlation_id,
        status=pb.ActionResult.ERROR,
        error=error_pb(error),
    )


def bad_id(what: str, message: Any, *names: str) -> WorkerError | None:
    """`validation_error` for the first of `message`'s ids (`names`) that
    worker.ids.id_problem refuses (for a surface or action: name_problem), or None:
    what a caller names is kept (hub.db) and relayed to workers, which refuse the same;
    refused here, nothing of it is."""
    for name in names:
        value = getattr(message, name)
        problem = name_problem(name, value) if name in CALL_NAMES else id_problem(name, value)
        if problem is not None:
            kind, text = problem
            return WorkerError(
                "validation_error",
                f"{what}'s {text}; nothing was sent",
                {"errors": [{"loc": [name], "msg": text, "type": kind}]},
            )
    return None


def _blob_refusal(req: pb.DispatchRequest, size: int) -> WorkerError | None:
    """Why a call announcing a blob of `size` bytes is refused before any of it is read
    (`too_large`: past its action's cap, or past what a message to the worker carries),
    or None."""
    cap = blob_cap(req.surface, req.action)
    if cap is not None and size > cap:
        hint = BLOB_CAP_HINTS.get(req.action, "Send less.")
        return WorkerError(
            "too_large",
            f"the blob is {size:,} bytes; {req.action} takes at most {cap:,} bytes per "
            f"call (nothing of it was read or run). {hint}",
            {"bytes": size, "limit": cap},
        )
    return too_large(size + req.ByteSize() + PART_BYTES)


# A worker's backlog of kills (those it has not confirmed) goes a page at a time: at
# most this many kills and bytes (plan ids and reasons, UTF-8; one kill at least), the
# next once it confirmed the page. What a stream that never reads pins of it is one page.
KILL_PAGE: Final = 64
KILL_PAGE_BYTES: Final = 16 * 1024

# Calls a worker may have waiting for it in hub.db (their requests whole, args included,
# to send when it is back, or until it answers), and their requests' bytes: past either,
# a call to it is answered `busy` (Hub._room_for), connected or away. Counted in memory
# by worker id (worker.hub.pending), at every Dispatch.
PENDING_AWAY_CALLS: Final = 1024
PENDING_AWAY_BYTES: Final = 64 * 1024 * 1024
# And the requests waiting for every worker together (a caller holding hub-workers.token
# too remembers up to 1,024 made-up workers away).
PENDING_BYTES: Final = 256 * 1024 * 1024

# A stream whose last envelope gRPC has not taken for this long does not read what the
# hub writes it (its HTTP/2 window shut): the hub lets go of its session (Hub._deaf). A
# worker reads its stream at once; one envelope is a part of a blob at most, which
# takes this long only below ~9 KB/s.
WRITE_STUCK_S: Final = 120.0
# A stream that takes each envelope in time may still read slower than the hub writes
# it (its window opened a little at a time): once the oldest message in its outbox
# waited this long while the stream took less than PROGRESS_BYTES (~9 KB/s), its
# session is let go too (Hub._behind). By progress, not age: a worker reading a slow
# link steadily may be minutes behind its backlog of calls, and is kept. A worker let
# go dials again and is sent its calls and kills from hub.db. Kills, which go to every
# session as callers make them, wait there KILL_PAGE_BYTES at most (`_kills_behind`);
# what else waits is bounded per worker (its calls, scope requests) or by this.
OUTBOX_WAIT_S: Final = WRITE_STUCK_S


# Unsolicited messages logged one by one on a stream; the rest are counted.
UNSOLICITED_LOGGED: Final = 8


# The request blobs a hub holds at once for calls not yet answered (each up to 16 MiB):
# past this a new call with a blob is answered `busy` at once, so callers that outpace
# a slow or absent worker cannot grow the hub without bound ([hub] held_blobs_mib).
HELD_BLOB_BYTES: Final = 256 * 1024 * 1024


class Hub:
    def __init__(
        self,
        store: HubStore,
        *,
        heartbeat_s: float = 5.0,
        default_timeout_s: float = 60.0,
        held_blob_bytes: int = HELD_BLOB_BYTES,
        placement_key: bytes | None = None,
        own_worker_key: Callable[[], str] = str,
        accept_new_workers: bool = False,
    ) -> None:
        self.store = store
        self.admission = Admission(store.enrolments, own_worker_key, accept_new=accept_new_workers)
        self.heartbeat_s = heartbeat_s
        self.write_stuck_s = WRITE_STUCK_S  # an attribute, so that a test may make it small
        self.outbox_wait_s = OUTBOX_WAIT_S  # and this
        self.default_timeout_s = default_timeout_s
        self.held_blob_bytes = held_blob_bytes
        self._holding = 0  # request blob bytes of Dispatch calls under way
        self.sessions: dict[str, Session] = {}
        self._waiters: dict[str, list[asyncio.Future[Answer]]] = {}  # by call id
        # What tells each waiting caller its call waits for the worker's person, by id.
        self._asked: dict[str, list[Callable[[], None]]] = {}
        # Scope requests and teardowns awaiting answers, by id, with the worker asked:
        # only that worker's answer counts (see _from_its_worker).
        # request id -> (worker id, agent id, the caller's waiter)
        self._scope_waiters: dict[str, _ScopeAsk] = {}
        # (session, answer, delivered to a caller?) not yet stored; see store_results.
        self._unstored: list[tuple[Session, Answer, bool]] = []
        # Request blobs of pending calls, by call id: held while the call may have to
        # be sent again (a reconnect), never written to the store; see _dispatch_to.
        self._blobs: dict[str, Buffer | upload.Pieces] = {}
        self._store_timer: asyncio.TimerHandle | None = None  # the next store_results
        self._stopped = False
        # The calls each worker has open (its load, as this hub sees it); sandbox mode's
        # placements of plans (worker.hub.placement) and teardowns awaiting answers.
        self._open_calls: dict[str, int] = {}
        # The key of sandbox plans' placement tokens: hub-placements.key (start_hub),
        # kept apart from hub.db so that a hub that lost hub.db still knows its own
        # tokens; a hub made without one (a test's) makes one for its life.
        key = secrets.token_bytes(32) if placement_key is None else placement_key
        self.placements = Placements(store, self.sessions, self._open_calls, key)
        # Of those, calls carrying a blob of more than a part: slow (see `_hold`).
        self._open_large: dict[str, int] = {}
        self._teardowns: dict[str, tuple[str, asyncio.Future[pb.ActionResult]]] = {}
        # The memory a burst of large calls freed goes back once they stop.
        self.memory = IdleGiveBack()
        # Turns to read ControlService requests, by kind ("" for the methods without
        # turns of their own), see CONTROL_READS_AT_ONCE.
        self.reads = control_reads()
        # Dispatches read as unary calls' (gRPC reads them before the handler runs),
        # see DISPATCH_UNARY_READS.
        self.unary_reads = UnaryReads()
        # Hands request blobs to a worker in this process (`up`), and takes its result
        # blobs, see worker.wire.local.
        self.link: LocalLink | None = None
        self.audit_lines = AuditLines(shown=shown)
        # How often worker streams may say Hello (HELLO_BURST_PER_WORKER and below).
        self.hellos = Hellos()
        # Streams refused before their Hello are logged a few lines a minute at most.
        self.stream_refusals = PacedLines()
        self.kill_marks_refused = PacedLines()  # Hellos' marks past the kills numbered
        # Turns to read worker streams' first messages (HELLO_READS_AT_ONCE): of keys a
        # worker remembered here is bound to, and of the others.
        self.known_hello_reads = hello_reads(known=True)
        self.hello_reads = hello_reads(known=False)
        # Turns to read worker streams' later messages while no answer is expected of
        # them (LATER_READS_AT_ONCE).
        self.later_reads = later_reads()

    # ------------------------------------------------------------- worker stream

    async def stream(
        self,
        requests: AsyncIterator[Incoming | EnvelopeRefused],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[bytes]:
        """The worker's stream, read by `worker_envelope`; what it yields are
        serialized ServerEnvelopes."""
        try:
            first = await self._first_message(requests, context)
        except (TimeoutError, Unread, StopAsyncIteration) as exc:
            late = not isinstance(exc, StopAsyncIteration)
            if isinstance(exc, Unread) and exc.why == "gave_up":
                why = (
                    "no Hello came in its turn to be read, and other streams waited for the "
                    "turn: a worker says Hello first, at once; the hub closed the stream"
                )
            elif late:
                why = (
                    f"no Hello came within {HANDSHAKE_TIMEOUT_S:g} s of its turn to be read: a "
                    "worker says Hello first, at once; the hub closed the stream"
                )
            else:
                why = "the stream ended before its Hello: a worker says Hello first"
            first = EnvelopeRefused(
                why,
                grpc.StatusCode.DEADLINE_EXCEEDED if late else grpc.StatusCode.INVALID_ARGUMENT,
            )
        except BusyStream as refused:
            self.stream_refusals.log(
                "refused a worker stream before its Hello: %s", refused.message
            )
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                refused.message,
                trailing_metadata=((RETRY_AFTER_KEY, str(int(HELLO_RETRY_MIN_S * 1000))),),
            )
            return  # unreachable: abort raises
        if isinstance(first, EnvelopeRefused):
            self.stream_refusals.log("refused a worker stream before its Hello: %s", first.message)
            await context.abort(first.code, first.message)
            return  # unreachable: abort raises
        opening = first[0][0] if first else pb.WorkerMessage()
        if opening.WhichOneof("kind") != "hello" or not opening.hello.worker_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be Hello")
        hello = opening.hello
        # An id the hub would refuse in a call (worker.ids.id_problem) is refused here
        # too: it went into the hub's log as it came, a line break in it forging lines,
        # and no call, kill or decision (DecideWorker) could name it (review28 r7).
        bad = id_problem("worker_id", hello.worker_id)
        if bad is not None:
            self.stream_refusals.log("refused a worker Hello: its %s", bad[1])
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the Hello's {bad[1]}: set another worker id (the worker_id file in the "
                "worker's data folder)",
            )
        refusal = hello_refusal(hello)
        if refusal is not None:
            log.warning("refused a Hello for worker %s: %s", shown(hello.worker_id), refusal)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)
        if hello.protocol_max < PROTOCOL_MIN or hello.protocol_min > PROTOCOL_MAX:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"protocol mismatch: the worker speaks {hello.protocol_min}..{hello.protocol_max}, "
                f"this hub {PROTOCOL_MIN}..{PROTOCOL_MAX}; upgrade the older side",
            )
        key = stream_key(context)
        key_digest = key.digest
        known = self.store.knows_worker(hello.worker_id)
        local = context.peer() == LOCAL_PEER
        if not local:  # `up`'s own worker is not counted
            verdict = self.store.enrolments.verdict(hello.worker_id, key_digest)
            # A Hello under an id accepted with another key costs that worker nothing;
            # one the operator accepted is not new, whatever the Hellos of new ids
            # (a flood of them kept an accepted worker busy till its first session:
            # review28 L2).
            other = verdict.taken
            busy = self.hellos.admit(
                hello.worker_id,
                new=(not known and verdict.state != "accepted") or other,
                other_key=(key_digest or "none") if other else "",
            )
            if busy is not None:
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    busy.message,
                    trailing_metadata=((RETRY_AFTER_KEY, str(busy.retry_ms)),),
                )
        # Served only with the key the operator accepted for the id (worker.hub.admission).
        unserved = self.admission.admit(hello, key, local=local)
        if unserved is not None:
            if unserved.ends_older:
                self._end_superseded(hello.worker_id)
            await context.abort(
                unserved.code, unserved.message, trailing_metadata=((ENROLMENT_KEY, unserved.why),)
            )
        session = Session(
            hello=hello_description(hello),
            session_id=uuid.uuid4().hex,
            key_digest=key_digest,
            protocol=min(PROTOCOL_MAX, hello.protocol_max),
        )
        resent = [*hello.running_ids, *hello.unacked_ids]
        session.resent = set(resent[:HELLO_RESENT_IDS])
        if session.resent:
            session.owed = {
                call.correlation_id
                for call in self.store.open_calls(hello.worker_id)
                if call.correlation_id in session.resent
            }
        if hello.kills_epoch == self.store.kills_epoch:
            issued = self.store.kills_issued()
            if hello.kills_through <= issued:
                session.kills_through = hello.kills_through
            else:
                # Kills this hub.db never numbered: not taken (the stream is sent every
                # kill kept; the worker keeps lifted what it recorded before), and the
                # next kills are numbered past them, so that none of them is one the
                # worker takes as recorded before (review17 E2: the whole folder put
                # back). No new epoch: anyone with hub-workers.token could say this,
                # and an epoch undid the person's lifts at every worker (review16 E3).
                numbered = self.store.number_kills_past(hello.kills_through)
                self.kill_marks_refused.log(
                    "worker %s says it confirmed kills through %d, past the %d this hub "
                    "numbered: not taken, it is sent every kill kept; kills are numbered "
                    "from %d on",
                    hello.worker_id,
                    hello.kills_through,
                    issued,
                    numbered + 1,
                )
        previous = self.sessions.get(hello.worker_id)
        if previous is not None:
            log.info("worker %s reconnected; closing its old stream", hello.worker_id)
            previous.close()
        self.sessions[hello.worker_id] = session
        self.store.seen_worker(session.hello, key_digest)
        if not known:
            self._forget_workers()
        self.placements.learn(session, hello.plans)
        log.info("worker %s connected (instance %s)", hello.worker_id, hello.instance_id)
        self._handle_all(session, first[1:])
        # Let go of the first envelope (its messages and any blob): this generator's
        # frame lives as long as the stream, and held it all along.
        del first, opening, hello, resent
        reader = asyncio.create_task(self._read(session, requests, context.peer()))
        beats = asyncio.create_task(self._beat(session, reader))
        batches: Batcher[bytes | Chunked] = Batcher(
            session.outbox,
            outgoing_size,
            lambda: self._hold(session),
            spread_parts,
            pending_parts,
            batch_bytes=BATCH_BYTES,  # the worker hears each (see BATCH_BYTES)
        )
        try:
            session.send(self._welcome(session))
            # Kills first: a re-sent call of a killed plan is then refused, not run. Every
            # kill the worker has not confirmed, whether it was away at the kill or it was
            # sent and the stream ended before the worker read it: a page now, the next
            # once the worker confirmed it (see KILL_PAGE).
            session.kills_sent = session.kills_through
            stop = self.store.stop_owed(session.worker_id, session.kills_through)
            if stop is not None:
                # Owed for kills that went before it confirmed them (store.KILLS_HELD): it
                # stops every plan at once, unnumbered (the worker's mark stays); the
                # numbered one comes in its turn.
                session.send(
                    pb.ServerMessage(
                        kill_plan=pb.KillPlan(plan_id=stop.plan_id, reason=stop.reason, in_use=True)
                    )
                )
            self._send_kill_page(session)
            # Teardowns asked for while it was away, before any call of those plans.
            for plan_id in self.store.take_teardowns(session.worker_id):
                self._send_teardown(session, plan_id).add_done_callback(_log_teardown)
            self._resend_open_calls(session)
            while (batch := await batches.next_batch()) is not None:
                # spread_parts leaves envelope parts only: a transfer goes a part at a time.
                session.writes()
                envelope = envelope_of(cast(list[bytes], batch))
                yield envelope
                session.wrote()
                session.outbox.took(len(envelope))
                del envelope
            if session.refusal is not None:
                await context.abort(*session.refusal)
        finally:
            session.close()
            reader.cancel()
            beats.cancel()
            self._ended(session)

    def _ended(self, session: Session) -> None:
        """Let go of a stream's session (once): as it ends, or as it is found deaf."""
        if session.ended:
            return
        session.ended = True
        worker_id = session.worker_id
        if self.link is not None:  # its reader stopped: what was handed and not taken goes
            self.link.end(session.session_id)
        if self.sessions.get(worker_id) is session:
            del self.sessions[worker_id]
            self.placements.held.pop(worker_id, None)
            self.placements.claimed.pop(worker_id, None)
        self.store.touch_worker(worker_id, now_ms() - session.started_ms, session.kills_through)
        self._end_scope_asks(session)
        log.info("worker %s disconnected", worker_id)

    def _end_scope_asks(self, session: Session) -> None:
        """The RequestScopes sent on `session`'s stream, now ended, are answered: no
        decision will come on it (see SCOPE_STREAM_ENDED)."""
        for request_id, asked in list(self._scope_waiters.items()):
            if asked.session_id != session.session_id:
                continue
            del self._scope_waiters[request_id]
            if not asked.waiter.done():
                asked.waiter.set_result(
                    pb.ScopeDecision(
                        request_id=request_id, granted=False, reason=SCOPE_STREAM_ENDED
                    )
                )

    def _behind(self, session: Session) -> str | None:
        """Why the hub lets go of `session`'s stream (`_deaf`), or None: it takes nothing
        written to it, or it reads slower than the hub writes it and next to nothing
        (OUTBOX_WAIT_S, PROGRESS_BYTES)."""
        if session.stuck_for() > self.write_stuck_s:
            return (
                f"its stream took nothing the hub wrote for {session.stuck_for():.0f} s (it "
                "does not read it)"
            )
        stalled_s = session.outbox.stalled_s()
        if stalled_s > self.outbox_wait_s:
            return (
                f"the oldest message queued for its stream waited {stalled_s:.0f} s while it "
                f"took less than {PROGRESS_BYTES:,} bytes (it reads slower than the hub "
                "writes it)"
            )
        return None

    def _deaf(self, session: Session, reader: asyncio.Task[None], why: str) -> None:
        """The stream does not read what the hub writes it, or reads it slower than it
        is written (`_behind`: `why`): the hub lets go of its session. gRPC offers no way
        to end the call itself from here (the handler is held in its write), but the
        session leaves the workers connected, takes no message more (each KillPlan went
        to every session: one such stream per made-up id held them all, review17 E5;
        one that opened its window 24 KB every 2 s, review18 F7), asks for no read, and
        what was queued for it goes; its worker, if any, hears nothing and dials again,
        and is sent its calls and kills anew."""
        log.warning("worker %s: %s: the hub lets go of it", session.worker_id, why)
        session.refusal = (grpc.StatusCode.UNAVAILABLE, f"the hub let go of the stream: {why}")
        session.drop_queued()
        session.close()
        reader.cancel()
        self._ended(session)

    async def _first_message(
        self, requests: AsyncIterator[Incoming | EnvelopeRefused], context: Any
    ) -> Incoming | EnvelopeRefused:
        """A stream's first message, read in its turn: on `known_hello_reads` a turn of
        its key's if a worker remembered here is bound to its key, else on `hello_reads`
        a turn of its connection's (`up`'s own worker, whose messages are in memory
        already, takes none). BusyStream past the bounds (HELLO_STREAMS_PER_ADDRESS...)."""
        peer = context.peer()
        if peer == LOCAL_PEER:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                return await anext(requests)
        address = address_of(peer)
        key_digest = stream_key(context).digest
        if self.store.knows_key(key_digest):
            gate, who, whose = self.known_hello_reads, key_digest, "this worker key"
        else:
            gate, who, whose = self.hello_reads, peer, "this connection"
        past = gate.admit(who, address, asyncio.get_running_loop().time())
        if past is not None:
            raise BusyStream(
                "busy: "
                + {
                    "peer": f"{gate.calls_per_connection} streams of {whose} already wait to "
                    "say Hello",
                    "address": "streams from this address already wait to say Hello "
                    f"({gate.calls_per_address} at most, {gate.calls_per_late_address} while "
                    "its streams' Hellos come late)",
                    "all": f"{gate.waiting_most} worker streams already wait to say Hello",
                    "late": "this connection's Hellos came late, and "
                    f"{gate.waiting_late} such streams already wait",
                }[past]
                + f"; retry in {HELLO_RETRY_MIN_S:g} s"
            )
        try:
            first: Incoming | EnvelopeRefused = await gate.read(
                who, address, lambda: anext(requests), turn_within_s=HANDSHAKE_TIMEOUT_S
            )
        except Unread as unread:
            if unread.why != "pushed_out":
                raise
            raise BusyStream(
                "busy: its place among the streams waiting to say Hello went to a stream of "
                f"an address or {whose} with fewer waiting; retry in {HELLO_RETRY_MIN_S:g} s"
            ) from None
        return first

    def forget_workers(self, now: int | None = None) -> int:
        """worker.hub.store.HubStore.forget_workers, and the placements on the workers
        forgotten with them. How many were forgotten."""
        forgotten = self.store.forget_workers(self.sessions, now)
        if forgotten:
            self.placements.reload()
        return forgotten

    def _forget_workers(self) -> None:
        """A new worker's row came: past the workers away remembered, forget some
        (worker.hub.store.WORKERS_AWAY_KEPT)."""
        if self.store.known_workers() - len(self.sessions) <= self.store.workers_away_kept:
            return
        forgotten = self.forget_workers()
        log.info(
            "hub: forgot %d worker(s) away, past the %d remembered (those connected the least)",
            forgotten,
            self.store.workers_away_kept,
        )

    def _welcome(self, session: Session) -> pb.ServerMessage:
        abandoned = [
            c.correlation_id
            for c in self.store.open_calls(session.worker_id)
            if c.state == "ABANDONED"
        ]
        return pb.ServerMessage(
            welcome=pb.Welcome(
                session_id=session.session_id,
                protocol=session.protocol,
                heartbeat_interval_ms=int(self.heartbeat_s * 1000),
                abandoned_ids=abandoned,
                kills_epoch=self.store.kills_epoch,
            )
        )

    def _send_kill_page(self, session: Session) -> None:
        """Queue the next page of the kills `session`'s worker has not confirmed (at most
        KILL_PAGE kills and KILL_PAGE_BYTES); the next goes once the worker confirmed
        this one (Heartbeat.kills_through). A page short of full is the last: then kills
        go to it as they are made (Hub.kill_plan), and the resent calls held back for
        their plan's kill go. Whole, every Hello queued the backlog (up to 1,000 kills,
        4 MiB) for a stream that need never read it (review14 finding 06: 200 such
        Hellos held 839 MiB)."""
        page = self.store.kills_after(
            session.worker_id,
            session.kills_sent,
            KILL_PAGE,
            KILL_PAGE_BYTES,
            by_digest=session.protocol >= DIGEST_KILL_PROTOCOL,
        )
        for kill in page:
            session.send(pb.ServerMessage(kill_plan=kill))
        if page:
            session.kills_sent = page[-1].seq
            if self.store.kills_after(session.worker_id, session.kills_sent, 1):
                return  # more: after this page is confirmed
        session.kills_paging = False
        if session.held_resends:
            held, session.held_resends = session.held_resends, set()
            self._resend_open_calls(session, held)

    def _kill_to_come(self, session: Session, plan_id: str) -> bool:
        """Whether a kill of the plan for `session`'s worker is in a page of its backlog
        not yet sent: a call of the plan must not go ahead of it."""
        return session.kills_paging and self.store.killed(
            plan_id, session.worker_id, session.kills_sent
        )

    def _resend_open_calls(self, session: Session, only: set[str] | None = None) -> None:
        """Send again what the worker may never have received; it answers duplicates
        itself. A call whose plan's kill is still to come waits for it (`only`: those)."""
        known = session.resent
        now = now_ms()
        for call in self.store.open_calls(session.worker_id):
            cid = call.correlation_id
            if call.state != "PENDING" or cid in known or (only is not None and cid not in only):
                continue
            if self._kill_to_come(session, call.request.plan_id):
                session.held_resends.add(cid)
                continue
            if call.deadline_ms <= now:
                self._abandon(cid, session)
                continue
            request = pb.ActionRequest()
            request.CopyFrom(call.request)
            held = self._blobs.get(cid, b"")
            # An upload's parts, joined on the loop: rare, as below.
            blob = held.joined() if isinstance(held, upload.Pieces) else held
            if call.blob_bytes and not blob and not request.blob:
                # Its blob was in the memory of a hub that stopped: only the caller has
                # it now, and its retry with the same id brings it (and is sent then).
                log.info("call %s waits for its caller to send its blob again", cid)
                continue
            request.attempt += 1
            request.timeout_ms = call.deadline_ms - now
            # Rare (a reconnect): built on the loop.
            part = delivery.digest_and_part(request, blob, session.protocol >= PARTS_PROTOCOL)
            if self._refused_too_large(cid, delivery.size_of(part)):
                continue
            session.owed.add(cid)
            session.send(part)

    def _refused_too_large(self, correlation_id: str, part_bytes: int) -> bool:
        """Answer `too_large` for a stored call that could never be sent (stored by a
        hub that did not check), rather than drop the stream with it on every dial."""
        error = too_large(part_bytes, framed=True)
        if error is None:
            return False
        log.warning("call %s cannot be sent: %s", correlation_id, error.message)
        result = error_result(correlation_id, error)
        self.store.complete(result)
        self._answer(correlation_id, Answer(result))
        return True

    def _expects(self, session: Session) -> bool:
        """Whether the hub waits for answers of `session`'s worker: results of calls
        open there (a caller waiting, or owed: a call it said is running, one its Hello
        named or one sent again then, whose caller may have left), a scope decision, a
        teardown's result. An owed result is one of a call stored for that worker: a
        stream's Hello alone makes none (review15 finding 02: a call running when the
        link dropped, its caller gone, was read in turns, and its worker's heartbeats
        confirming the kill backlog with it)."""
        worker_id = session.worker_id
        if self._open_calls.get(worker_id, 0) or session.running or session.owed:
            return True
        return any(asked.worker_id == worker_id for asked in self._scope_waiters.values()) or any(
            asked[0] == worker_id for asked in self._teardowns.values()
        )

    async def _next(
        self, session: Session, requests: AsyncIterator[Incoming | EnvelopeRefused], peer: str
    ) -> Incoming | EnvelopeRefused | None:
        """The stream's next message (None once it ended): asked for at once while the
        hub expects answers of its worker (or for `up`'s own worker, whose messages are
        in memory), else in a turn of `later_reads` (LATER_READS_AT_ONCE); a reader
        waiting for one asks at once as soon as the hub sends something it expects an
        answer to. A turn held LATER_SILENT_S without the message coming while another
        stream waits for one ends this stream (`_silent`)."""
        address = address_of(peer)
        while True:
            if peer == LOCAL_PEER or self._expects(session):
                return await anext(requests, None)
            if session.writing is not None:
                # A stream that does not take what the hub writes it (a worker reads its
                # stream at once) asks for no turn: a read asked for in a turn stays asked
                # for after the turn is given up, and such a stream cannot be ended (its
                # handler waits for gRPC to take the envelope): each would take in a
                # message whole outside the bound (review16 F1: 16 streams of HTTP/2
                # window 0, +376..501 MB).
                await session.writing
                continue
            # One future to wait on, for the turn or for a send that wakes it, and no
            # task: an idle stream waits so (1,000 idle workers took the hub 5 KB more
            # each with a task for each of the two and asyncio.wait over them).
            turn = self.later_reads.ask(peer, address)
            if turn is not None:
                session.waiting = turn
                try:
                    handed = await turn
                except asyncio.CancelledError:
                    self.later_reads.withdraw(peer, turn)
                    raise
                finally:
                    session.waiting = None
                if not handed:  # woken by a send: look again, the hub may expect answers
                    self.later_reads.withdraw(peer, turn)
                    continue
            holder = self.later_reads.hold(peer, address, lambda: self._silent(session))
            try:  # in its turn: the message is asked of gRPC, and awaited whatever is sent
                return await anext(requests, None)
            finally:
                self.later_reads.give_back(holder)

    def _silent(self, session: Session) -> None:
        """`session`'s stream held a later-read turn LATER_SILENT_S with no message while
        another stream waited for one: it ends (its worker dials again)."""
        self._refuse(
            session,
            f"no message within {self.later_reads.silent_s:g} s of its turn to be read while "
            "other streams waited for one (a worker sends a heartbeat every few seconds); "
            "its stream ends",
            grpc.StatusCode.UNAVAILABLE,
        )

    async def _read(
        self,
        session: Session,
        requests: AsyncIterator[Incoming | EnvelopeRefused],
        peer: str = "",
    ) -> None:
        try:
            while (envelope := await self._next(session, requests, peer)) is not None:
                if isinstance(envelope, EnvelopeRefused):
                    self._refuse(session, envelope.message, envelope.code)
                    return
                self._handle_all(session, envelope)
                if session.refusal is not None:
                    return
                session.settle()  # results came: what waited goes before the loop sleeps
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        except Exception:
            log.exception("worker %s: reading its stream failed", session.worker_id)
        finally:
            session.close()

    def _handle_all(self, session: Session, envelope: Incoming) -> None:
        """The messages of one envelope, in order; then one Ack for the results not kept."""
        for msg, blob in envelope:
            self._handle(session, msg, blob)
            if session.refusal is not None:
                return
        self._acks_now(session)

    def _handle(self, session: Session, msg: pb.WorkerMessage, blob: Buffer | None) -> None:
        kind = msg.WhichOneof("kind")
        if kind == "result":
            result = msg.result
            link = self.link
            if blob is None and link is not None and link.results_held and not result.blob:
                # From the worker of this process: its stub, the result by reference
                # (worker.wire.local).
                handed = link.take_result(session.session_id, result_key(result))
                if handed is not None:
                    self._on_result(session, Answer(result, handed.blob, handed.result))
                    return
            self._on_result(session, Answer(result, blob))
        elif kind == "ack":
            self._on_ack(session, msg.ack)
        elif kind == "heartbeat":
            # A copy: the message itself would keep its whole envelope in memory.
            session.heartbeat = pb.Heartbeat()
            session.heartbeat.CopyFrom(msg.heartbeat)
            # Never past what this hub numbered: a worker's word for kills it never sent
            # counted the next ones as confirmed, and their plans' calls went (review17 E2).
            confirmed = min(msg.heartbeat.kills_through, self.store.kills_issued())
            session.kills_through = max(session.kills_through, confirmed)
            if session.kills_paging and not _kills_behind(session, paging=True):
                self._send_kill_page(session)  # the page went and is confirmed: the next
        elif kind == "scope_decision":
            request_id = msg.scope_decision.request_id
            asked = self._scope_waiters.get(request_id)
            if asked is None or not self._from_its_worker(session, asked.worker_id, request_id):
                self._unsolicited(session, "a decision on no scope request of this hub's")
                return
            del self._scope_waiters[request_id]
            if not asked.waiter.done():
                decision = pb.ScopeDecision()
                decision.CopyFrom(msg.scope_decision)
                asked.waiter.set_result(decision)
        elif kind == "audit":  # counted: the worker's audit table has each (review10 12)
            self.audit_lines.event(session.worker_id, msg.audit)
        elif kind == "goodbye":
            log.info("worker %s says goodbye: %s", session.worker_id, shown(msg.goodbye.reason))
        else:
            self._unsolicited(session, f"a message of kind {kind or 'none'}")

    def _hold(self, session: Session) -> asyncio.Future[None] | None:
        """What the writer of `session`'s stream waits for before it sends the batch it
        started (Nagle's rule, for calls): while the worker has calls of this hub's in
        hand, their results are on their way, and new requests wait for them (or
        HOLD_S) so that everything queued meanwhile leaves as one stream message. Once
        they came, the batch still waits for the loop to run out of other work
        (`framing.when_idle`): the Dispatches gRPC hands over one loop turn at a time
        join it meanwhile, as do the worker's own in `up`, where it shares the loop.
        Under load, a stream message per call costs more CPU than the call itself on both
        sides, and holding makes the worker answer a batch in one message too. With no
        other call open (one caller, one call at a time) nothing waits, nor for calls
        the worker said are running (a long exec): their results are not on their way.
        Nor for a call carrying a blob of more than a part, from the moment it enters:
        moving and handling its bytes takes longer than HOLD_S, and until its STARTED
        ack came (ACK_DELAY_S) a 16 MiB fs_write held each fs_stat beside it for HOLD_S,
        longer while the loop was busy. (One acked STARTED counts twice here: a batch
        then goes without a hold a little more often than it could.)"""
        queued = session.outbox.qsize() + 1  # this batch, at most: every message waiting
        worker_id = session.worker_id
        slow = len(session.running) + self._open_large.get(worker_id, 0)
        if self._open_calls.get(worker_id, 0) - slow <= queued:
            return None  # no quick call elsewhere: no result is on its way to release it
        held = session.held = asyncio.get_running_loop().create_future()
        timer = asyncio.get_running_loop().call_later(HOLD_S, session.release)
        held.add_done_callback(lambda _: timer.cancel())
        return held

    def _on_result(self, session: Session, answer: Answer) -> None:
        result = answer.result
        cid = result.correlation_id
        session.running.discard(cid)
        session.owed.discard(cid)
        teardown = self._teardowns.get(cid)
        if teardown is not None:  # not a call: nothing to store or ack
            if self._from_its_worker(session, teardown[0], cid):
                del self._teardowns[cid]
                if not teardown[1].done():
                    teardown[1].set_result(answer.message())
            else:
                self._unsolicited(session, f"the result of another worker's teardown {cid}")
            return
        if not self._solicited(session, cid):
            # Neither handed on nor stored, nor held: acked at the end of its envelope, so
            # that a worker holding it lets it go.
            session.acks.append(cid)
            return
        delivered = self._answer(cid, answer)
        if result.error.code == "busy" and not result.HasField("invocation"):
            # Refused before it ran: not an outcome to keep. The caller may retry the id
            # (with its blob, which is let go meanwhile).
            self._blobs.pop(cid, None)
            self._let_go(cid)
            self.store.abandon(cid)
            return
        self._blobs.pop(cid, None)  # answered: never sent again
        self._let_go(cid)
        # Stored with the others of the next group commit (see STORE_DELAY_S); acked
        # only once stored, so until then the worker keeps the result and re-sends it
        # should this hub die. Its blob is stored only if no caller took it.
        self._unstored.append((session, answer, delivered))
        self._store_soon()

    def _solicited(self, session: Session, cid: str) -> bool:
        """Whether a result for `cid` that came on `session` is one the hub takes: a call
        sent to that worker and not answered yet, or a result the worker's Hello said
        it would send again (its call answered here already, or unknown here: a hub
        that lost its record of it). Any other is counted against the stream (see
        UNSOLICITED_PER_STREAM)."""
        called = self.store.call_state(cid)
        resent = cid in session.resent
        session.resent.discard(cid)
        if called is None:  # unknown here: acked and let go, as ever
            if not resent:
                self._unsolicited(session, f"a result for call {shown(cid)}, unknown here")
            return False
        sent_to, state = called
        if not self._from_its_worker(session, sent_to, cid):
            self._unsolicited(session, f"a result for call {shown(cid)} sent to another worker")
            return False
        if state == "DONE" and not resent and cid not in self._waiters:
            # A caller waiting for it is a repeat of the call sent again to its worker
            # (the hub had not committed the first answer yet when the repeat came: see
            # `_dispatch_to`); with no one waiting, it was answered already.
            self._unsolicited(session, f"a result for call {shown(cid)}, answered already")
            return False
        return True

    def _unsolicited(self, session: Session, what: str) -> None:
        """Count a message the hub did not ask for; past the stream's allowance (its
        Hello's re-sent ids are not counted), end the stream."""
        session.unsolicited += 1
        if session.unsolicited <= UNSOLICITED_LOGGED:
            log.warning("worker %s sent %s: ignored", session.worker_id, what)
        if session.unsolicited <= UNSOLICITED_PER_STREAM or session.refusal is not None:
            return
        self._refuse(
            session,
            f"this stream sent more than {UNSOLICITED_PER_STREAM:,} messages the hub did not "
            f"ask for (the last: {what}); results come for calls the hub sent this worker, "
            "once each, and decisions for its scope requests. The hub closed the stream",
        )

    @staticmethod
    def _refuse(
        session: Session,
        refusal: str,
        code: grpc.StatusCode = grpc.StatusCode.RESOURCE_EXHAUSTED,
    ) -> None:
        """End the stream with `code` and `refusal`, and log it."""
        log.warning("worker %s: %s", session.worker_id, refusal)
        session.refusal = (code, refusal)
        session.close()

    def _acks_now(self, session: Session) -> None:
        """Ack the results of an envelope that were not kept (one Ack message)."""
        if session.acks:
            session.send(pb.ServerMessage(ack=pb.Ack(correlation_ids=session.acks)))
            session.acks = []

    @staticmethod
    def _from_its_worker(session: Session, sent_to: str | None, cid: str) -> bool:
        """Whether an answer keyed by `cid` (a result, an ack, a scope decision), which
        came on `session`, may count: the call, scope request or teardown was sent to
        that session's worker (`sent_to`), or is unknown here (a result for an unknown
        call is acked and let go). A worker answering for another's is logged and
        ignored: the workers' token lets a machine serve, not answer for its peers."""
        if sent_to is None or sent_to == session.worker_id:
            return True
        log.warning(
            "worker %s answered %s, sent to worker %s: ignored",
            session.worker_id,
            shown(cid),
            sent_to,
        )
        return False

    def _takes_parts(self, worker_id: str) -> bool:
        """Whether the worker's stream takes a large blob in parts (protocol 2)."""
        session = self.sessions.get(worker_id)
        return session is not None and session.protocol >= PARTS_PROTOCOL

    async def _written_down_then_sent(
        self,
        correlation_id: str,
        worker_id: str,
        outgoing: delivery.Outgoing,
        committing: concurrent.futures.Future[list[bool]],
        waiter: asyncio.Future[Answer],
        plan_id: str,
    ) -> WorkerError | None:
        """Once `committing` (`HubStore.record_off_loop`) wrote down a call whose id the
        caller chose, send it to its worker's stream (if connected); or why not. The
        caller may retry that id after a hub restart, and the restarted hub must know the
        call to keep its result for the retry: the worker re-sends it, and a result for
        an unknown call is acked and let go. (A call the hub named itself is written
        with the next group commit: no caller knows its id before the answer.)

        The commit is made in the store's writer thread and waited for here: on the loop
        it held every call, Status and Hello for as long as another process held hub.db
        (SQLite's busy timeout, 10 s), then refused this one (review29 h1)."""
        await db.ended(committing)
        self.store.reap()  # a failed commit's calls are back, but this one
        failure = committing.exception()
        if failure is None:
            session = self.sessions.get(worker_id)
            if session is not None and plan_id and self._kill_to_come(session, plan_id):
                # A kill of its plan came during the commit and waits in a page: the
                # call follows it (`_send_kill_page` resends it from hub.db then), as
                # it never goes ahead of one (review14 02 B; review30 on h1x).
                session.held_resends.add(correlation_id)
            elif session is not None:
                session.send(outgoing)
            return None
        log.error("could not record call %s; it was not sent: %s", correlation_id, failure)
        # Another caller of the id, come meanwhile, records it anew and waits on: its
        # blob and its wait stay.
        self._caller_left(correlation_id, waiter)
        if correlation_id not in self._waiters:
            self._let_go(correlation_id)
        # (an extended code, SQLITE_BUSY_SNAPSHOT..., is busy too: its low byte)
        if isinstance(failure, sqlite3.OperationalError) and (
            failure.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY
        ):
            return _HUB_DB_HELD
        return _NOT_RECORDED

    def _caller_left(self, correlation_id: str, waiter: asyncio.Future[Answer]) -> None:
        """A caller of the call went away; others may still wait."""
        waiters = self._waiters.get(correlation_id, [])
        if waiter in waiters:
            waiters.remove(waiter)
        if not waiters:
            self._waiters.pop(correlation_id, None)
            # No caller waits: the blob would stay in memory, no longer counted in
            # held_blobs_mib, until the call was answered or the worker came back,
            # up to its deadline (24 x 16 MiB: +400 MB, for a worker away, review17
            # E7, or one connected that answers nothing, review18 F3). It goes; the
            # call is kept, and should it have to be sent again, a retry of its id
            # brings the blob and is sent then (as after a hub restart).
            self._blobs.pop(correlation_id, None)

    def _answer(self, correlation_id: str, answer: Answer) -> bool:
        """Wake every caller waiting for the call; True if one was."""
        woken = False
        for waiter in self._waiters.pop(correlation_id, ()):
            if not waiter.done():
                waiter.set_result(answer)
                woken = True
        return woken

    def _store_soon(self) -> None:
        if self._store_timer is None and not self._stopped:
            loop = asyncio.get_running_loop()
            self._store_timer = loop.call_later(STORE_DELAY_S, self.store_results)

    def store_results(self, *, off_loop: bool = True) -> None:
        """Store the calls sent and the results received since the last call (one
        commit), then ack the results: one Ack message per worker. A commit carrying a
        large result (a 10,000-entry listing's 1.5 MB) is made in the store's writer
        thread, and the acks go once it committed: the worker keeps each result until
        then, as it does while the commit waits for STORE_DELAY_S."""
        if self._store_timer is not None:
            self._store_timer.cancel()
            self._store_timer = None
        unstored, self._unstored = self._unstored, []
        if not unstored:
            if off_loop:
                # Calls added and not answered yet (a worker slow to answer: rare) are
                # written in the writer thread, behind any commit under way there: on
                # the loop, the commit would wait for that one, or for hub.db held by
                # another process (SQLite's busy timeout, 10 s), and every call with it.
                loop = asyncio.get_running_loop()
                committing = self.store.complete_off_loop([])
                committing.add_done_callback(lambda _: _on_loop(loop, self.store.reap))
                return
            self.store.flush()
            return
        rows = [
            (answer.result, answer.blob, not taken, answer.serialized)
            for _, answer, taken in unstored
        ]
        # Behind a commit still under way in the writer thread, a small one goes there
        # too (after it, in order) rather than wait for it on the loop.
        if off_loop and (self.store.committing or _stored_bytes(unstored) >= db.OFF_LOOP_BYTES):
            loop = asyncio.get_running_loop()
            committing = self.store.complete_off_loop(rows)
            committing.add_done_callback(lambda done: _on_loop(loop, self._stored, unstored, done))
            return
        self._ack_stored(unstored, self.store.complete_many(rows))
        if self.store.has_unwritten:  # calls it left for the next commit: there is one
            self._store_soon()

    def _stored(
        self,
        unstored: list[tuple[Session, Answer, bool]],
        done: concurrent.futures.Future[list[bool]],
    ) -> None:
        """A commit made in the store's writer thread ended: ack what it stored. One
        that failed acks nothing: its workers keep the results and send them again."""
        self.store.reap()
        try:
            stored = done.result()
        except Exception:
            log.exception("could not store %d result(s); they were not acked", len(unstored))
            return
        self._ack_stored(unstored, stored)

    def _ack_stored(self, unstored: list[tuple[Session, Answer, bool]], stored: list[bool]) -> None:
        acks: dict[str, tuple[Session, list[str]]] = {}
        for (session, answer, _taken), new in zip(unstored, stored, strict=True):
            cid = answer.result.correlation_id
            if not new and self.store.get(cid) is None:
                log.warning(
                    "result for unknown call %s from %s (acked anyway)", cid, session.worker_id
                )
            acks.setdefault(session.session_id, (session, []))[1].append(cid)
        for session, cids in acks.values():
            session.send(pb.ServerMessage(ack=pb.Ack(correlation_ids=cids)))

    def _on_ack(self, session: Session, ack: pb.ActionAck) -> None:
        if ack.kind == pb.ActionAck.AWAITING_APPROVAL:
            for cid in ack.correlation_ids:
                if cid in self._asked and self.store.worker_of(cid) == session.worker_id:
                    for tell in self._asked[cid]:
                        tell()
            return
        if ack.kind in (pb.ActionAck.STARTED, pb.ActionAck.DUPLICATE_RUNNING):
            # Not answered at once: slow. Only calls a caller waits for count (see
            # `_hold`), and only they are kept.
            waited = self._waiters
            session.running.update(cid for cid in ack.correlation_ids if cid in waited)
            return
        if ack.kind != pb.ActionAck.REJECTED_ARGS_MISMATCH:
            return  # DUPLICATE_DONE needs nothing; DRAINING calls wait for a reconnect
        for cid in ack.correlation_ids:
            sent_to = self.store.worker_of(cid)
            if sent_to is None or not self._from_its_worker(session, sent_to, cid):
                self._unsolicited(session, f"a refusal of call {shown(cid)}, not sent to it")
                continue
            self._blobs.pop(cid, None)
            self._let_go(cid)
            result = error_result(cid, WorkerError("args_mismatch", ack.message))
            self.store.complete(result)
            self._answer(cid, Answer(result))

    async def _beat(self, session: Session, reader: asyncio.Task[None]) -> None:
        # A timer by nature: the protocol's heartbeat says "alive" every heartbeat_s; and
        # a stream that takes nothing written to it, or too slowly, is let go (`_deaf`).
        while not session.closed:
            await asyncio.sleep(self.heartbeat_s)
            why = self._behind(session)
            if why is not None:
                self._deaf(session, reader, why)
                return
            session.send(pb.ServerMessage(heartbeat=pb.Heartbeat(unix_ms=now_ms())))

    def _let_go(self, correlation_id: str) -> None:
        """A blob handed to the local worker and not taken goes with its call."""
        if self.link is not None:
            self.link.drop(correlation_id)

    def _abandon(self, correlation_id: str, session: Session | None) -> None:
        if session is not None:
            session.running.discard(correlation_id)
            session.owed.discard(correlation_id)
        self._blobs.pop(correlation_id, None)
        self._let_go(correlation_id)
        self.store.abandon(correlation_id)
        if session is not None:
            session.send(
                pb.ServerMessage(
                    cancel=pb.Cancel(correlation_id=correlation_id, reason="deadline passed")
                )
            )

    # ------------------------------------------------------------- control API

    def pick_worker(self, worker_id: str) -> str:
        if worker_id:
            if worker_id not in self.sessions and not self.store.knows_worker(worker_id):
                raise LookupError(f"no worker {worker_id!r} has ever connected to this hub")
            return worker_id
        connected = list(self.sessions)
        if len(connected) == 1:
            return connected[0]
        if not connected:
            raise LookupError(
                "no worker is connected to this hub; start one with `agentworker run` "
                "(or use `agentworker up`, which runs both)" + self.store.enrolments.waiting_hint()
            )
        raise LookupError(
            f"{len(connected)} workers are connected ({', '.join(sorted(connected))}); "
            "name one with --worker"
        )

    # ------------------------------------------------------------- sandbox mode

    async def teardown(self, req: pb.TeardownRequest) -> pb.DispatchResponse:
        """Remove a plan's workspace at the worker holding it (stopping its calls).
        Idempotent: a plan with no workspace anywhere is torn down already."""
        if not req.plan_id:
            raise WorkerError("validation_error", "a teardown needs a plan_id")
        refused = bad_id("the teardown", req, "plan_id")
        if refused is not None:
            raise refused
        placed = self.placements.by_plan.get(req.plan_id)
        if req.worker_id:
            if req.worker_id not in self.sessions and not self.store.knows_worker(req.worker_id):
                raise WorkerError(
                    "validation_error", f"no worker {req.worker_id!r} has ever joined this hub"
                )
            targets = [req.worker_id]
        elif placed is not None:  # and any other connected worker holding a copy
            targets = [placed, *sorted(self.placements.holders(req.plan_id) - {placed})]
        else:  # no record here (a hub.db lost, say): every sandbox worker checks
            targets = [session.worker_id for session in self.placements.sandbox_workers()]
        # A worker that is away is told when it next connects (before any call); the
        # plan is no longer placed, so its next call starts afresh wherever it lands.
        away = [worker_id for worker_id in targets if worker_id not in self.sessions]
        for worker_id in away:
            self.store.queue_teardown(worker_id, req.plan_id)
        here = [worker_id for worker_id in targets if worker_id in self.sessions]
        answers = await asyncio.gather(*(self._teardown_at(w, req.plan_id) for w in here))
        removed = False
        for worker_id, result in zip(here, answers, strict=True):
            if result.status != pb.ActionResult.OK:
                return pb.DispatchResponse(worker_id=worker_id, result=result)
            self.placements.held.get(worker_id, {}).pop(req.plan_id, None)
            removed = removed or bool(json.loads(result.result_json or "{}").get("removed"))
        if placed is None or self.placements.by_plan.get(req.plan_id) in targets:
            # The plan is gone: every token given for it so far proves nothing now, so a
            # new plan of that id is another (worker.hub.epochs). One no worker here held
            # and never placed here may be a made-up id: kept under a bound of its own.
            self.placements.ended(req.plan_id, placed=placed is not None or removed)
        if self.placements.by_plan.get(req.plan_id) in targets:
            self.placements.unplace(req.plan_id)
        worker_id = targets[0] if len(targets) == 1 else ""
        answer: dict[str, Any] = {"plan_id": req.plan_id, "removed": removed}
        if away:
            answer["queued_worker_ids"] = away
        result = pb.ActionResult(status=pb.ActionResult.OK, result_json=json.dumps(answer))
        return pb.DispatchResponse(worker_id=worker_id, result=result)

    def _send_teardown(self, session: Session, plan_id: str) -> asyncio.Future[pb.ActionResult]:
        cid = uuid.uuid4().hex
        waiter: asyncio.Future[pb.ActionResult] = asyncio.get_running_loop().create_future()
        self._teardowns[cid] = (session.worker_id, waiter)
        waiter.add_done_callback(lambda _: self._teardowns.pop(cid, None))
        session.send(pb.ServerMessage(teardown=pb.Teardown(plan_id=plan_id, correlation_id=cid)))
        return waiter

    async def _teardown_at(self, worker_id: str, plan_id: str) -> pb.ActionResult:
        waiter = self._send_teardown(self.sessions[worker_id], plan_id)
        try:
            async with asyncio.timeout(TEARDOWN_TIMEOUT_S):
                return await waiter
        except TimeoutError:
            error = WorkerError(
                "timeout",
                f"worker {worker_id!r} did not confirm the teardown of plan {plan_id!r} within "
                f"{TEARDOWN_TIMEOUT_S:g} s; try again (a teardown may be repeated safely)",
            )
            return error_result("", error)
        finally:
            waiter.cancel()  # answered or not: no longer awaited

    # ------------------------------------------------------------- dispatch

    async def dispatch(
        self, req: pb.DispatchRequest, blob: Buffer | None = None
    ) -> pb.DispatchResponse:
        """Send a call to its worker and wait for the result. `blob`, when given, is the
        request's blob read apart from `req` (see `_dispatch_request`)."""
        worker_id, answer = await self._dispatch(req, blob)
        return pb.DispatchResponse(worker_id=worker_id, result=answer.message())

    async def dispatch_serialized(
        self,
        req: pb.DispatchRequest,
        blob: Buffer | None,
        asked: Callable[[], None] | None = None,
    ) -> bytes:
        """`dispatch`, its response serialized (for ControlService): a result blob the
        worker sent is copied once, from the worker's envelope into the response.
        `asked` is called if the call waits for the worker's person (AWAITING_APPROVAL)."""
        worker_id, answer = await self._dispatch(req, blob, asked)
        return answer.response(worker_id)

    async def _dispatch(
        self, req: pb.DispatchRequest, blob: Buffer | None, asked: Callable[[], None] | None = None
    ) -> tuple[str, Answer]:
        """A call whose blob would take the hub past `held_blob_bytes` is answered `busy`."""
        blob = req.blob if blob is None else blob
        size = len(blob)
        try:
            worker_id = self._admitted(req, size)
        except WorkerError as exc:
            return req.worker_id, Answer(error_result(req.correlation_id, exc))
        with self._counted(worker_id, size):
            return await self._dispatch_to(worker_id, req, blob, asked)

    def _admitted(self, req: pb.DispatchRequest, size: int) -> str:
        """The worker a call with a blob of `size` bytes goes to; a WorkerError when it
        is refused before anything of it is sent (its ids, the blobs held, its route, a
        kill its worker has not confirmed)."""
        refused = bad_id("the call", req, *CALL_IDS, *CALL_NAMES)
        if refused is not None:
            raise refused
        if size and self._holding + size > self.held_blob_bytes:
            raise WorkerError(
                "busy",
                f"the hub already holds {self._holding:,} bytes of request blobs for "
                f"calls not yet answered, and this call's {size:,} would pass its limit "
                f"of {self.held_blob_bytes:,} ([hub] held_blobs_mib); retry once some "
                "finish",
                {"holding_bytes": self._holding, "limit_bytes": self.held_blob_bytes},
            )
        worker_id = self.placements.route(req, self.pick_worker)
        self._room_for(worker_id, len(req.args_json))
        if req.plan_id and self._killed_there(req, worker_id):
            raise WorkerError(
                "plan_killed",
                f"plan {req.plan_id!r} was killed at this hub "
                f"({self.store.kill_reason(req.plan_id, worker_id)}), and worker "
                f"{worker_id!r} has not confirmed the kill yet: none of the plan's calls go "
                "there until it has (then the worker answers; only its person lifts a kill "
                "there)",
            )
        return worker_id

    def _room_for(self, worker_id: str, args_bytes: int) -> None:
        """`busy` past PENDING_AWAY_CALLS calls, or PENDING_AWAY_BYTES of their requests,
        recorded for a worker and not answered, or PENDING_BYTES for every worker: each
        waits in hub.db, args whole (it is sent when the worker is back), until its
        deadline (up to 24 h) and a day more. One caller's 1 MiB args to a worker away,
        hung up at once, grew hub.db 17 MB/s with no bound (review17 E4); to one
        connected that answered none, 105 MB for 100 (review18's r7). The counts are
        kept in memory by worker id (worker.hub.pending): counted by a query they were
        skipped, and passed without bound (review19 A4)."""
        count, size = self.store.pending.of(worker_id)
        if count < PENDING_AWAY_CALLS and size + args_bytes <= PENDING_AWAY_BYTES:
            everyones = self.store.pending.total_bytes
            if everyones + args_bytes <= PENDING_BYTES:
                return
            raise WorkerError(
                "busy",
                f"{everyones:,} bytes of requests already wait in hub.db for their workers; "
                f"past {PENDING_BYTES // 2**20} MiB the hub takes no more calls for worker "
                f"{worker_id!r} while they wait: retry once some of them end",
                {"waiting_bytes": everyones},
            )
        which = "has answered none" if worker_id in self.sessions else "is away"
        raise WorkerError(
            "busy",
            f"{count:,} calls ({size:,} bytes of requests) already wait for worker "
            f"{worker_id!r}, which {which}; "
            f"past {PENDING_AWAY_CALLS:,} calls or "
            f"{PENDING_AWAY_BYTES // 2**20} MiB the hub takes no more for it: retry once it "
            "is back, or once some of them end",
            {"waiting_calls": count, "waiting_bytes": size},
        )

    @contextlib.contextmanager
    def _counted(self, worker_id: str, size: int) -> Iterator[None]:
        """A call open at its worker, holding a blob of `size` bytes, while inside."""
        self._open_calls[worker_id] = self._open_calls.get(worker_id, 0) + 1
        large = int(size > PART_BYTES)
        self._open_large[worker_id] = self._open_large.get(worker_id, 0) + large
        self._holding += size
        try:
            yield
        finally:
            self._open_calls[worker_id] -= 1
            self._open_large[worker_id] -= large
            self._holding -= size

    def _action_request(self, req: pb.DispatchRequest, worker_id: str) -> pb.ActionRequest:
        """The request a Dispatch sends worker `worker_id` (without its blob and digest);
        a sandbox plan's carries its placement token there (`Placements.token`)."""
        if req.timeout_ms > MAX_TIMEOUT_MS:
            log.warning(
                "a call asks for a %d ms deadline; cut to %d", req.timeout_ms, MAX_TIMEOUT_MS
            )
        timeout_ms = min(req.timeout_ms, MAX_TIMEOUT_MS)
        timeout_s = timeout_ms / 1000 if timeout_ms else self.default_timeout_s
        return pb.ActionRequest(
            correlation_id=req.correlation_id or ordered_id(),
            plan_id=req.plan_id,
            agent_id=req.agent_id,
            owner_user_id=req.owner_user_id,
            task_id=req.task_id,
            surface=req.surface,
            action=req.action,
            args_json=req.args_json,
            timeout_ms=int(timeout_s * 1000),
            attempt=1,
            placement_token=(
                self.placements.token(worker_id, req.plan_id)
                if req.surface == WORKBENCH_SURFACE and req.plan_id
                else ""
            ),
        )

    async def _dispatch_to(
        self,
        worker_id: str,
        req: pb.DispatchRequest,
        blob: Buffer,
        asked: Callable[[], None] | None = None,
    ) -> tuple[str, Answer]:
        request = self._action_request(req, worker_id)
        if asked is None:
            return await self._sent(worker_id, req, request, blob)
        cid = request.correlation_id
        self._asked.setdefault(cid, []).append(asked)
        try:
            return await self._sent(worker_id, req, request, blob)
        finally:
            told = self._asked.get(cid, [])
            if asked in told:
                told.remove(asked)
            if not told:
                self._asked.pop(cid, None)

    async def _sent(
        self, worker_id: str, req: pb.DispatchRequest, request: pb.ActionRequest, blob: Buffer
    ) -> tuple[str, Answer]:
        # `blob` is held while the call is pending (a view of the bytes received: the
        # hub never copies it but once, into the message to the worker).
        # The digest, computed once here and carried to the worker in the request, and
        # the request's envelope part: a large blob's bytes are read off the loop. A new
        # call's parts go while its digest is computed (`delivery.send_early`).
        early = None
        if not req.correlation_id:
            session = self.sessions.get(worker_id)
            early = await delivery.send_early(session, self.link, request, blob)
        if early is None:
            return await self._recorded_and_sent(worker_id, req, request, blob, None)
        try:
            return await self._recorded_and_sent(worker_id, req, request, blob, early)
        finally:
            early.cancel_handed()

    async def _recorded_and_sent(
        self,
        worker_id: str,
        req: pb.DispatchRequest,
        request: pb.ActionRequest,
        blob: Buffer | upload.Pieces,
        early: delivery.Early | None,
    ) -> tuple[str, Answer]:
        """`_dispatch_to`, once the call's digest is known: record it, send it (unless it
        went early) and wait for its answer."""
        cid = request.correlation_id
        timeout_s = request.timeout_ms / 1000
        # The digest handed to the worker in this process, whose request went without it
        # (`delivery.send_early`): resolved once the call is recorded and waited for, so
        # that nothing the worker answers comes before the hub knows the call.
        handed = None if early is None else early.handed
        if early is not None and self.sessions.get(worker_id) is early.session:
            outgoing: delivery.Outgoing = early.transfer
        else:  # not sent early, or to a stream the worker has left since
            early = None
            blob = await delivery.whole(blob)
            outgoing = await delivery.prepared(request, blob, self._takes_parts(worker_id))
        digest = request.args_digest
        refusal = too_large(delivery.size_of(outgoing), framed=True)
        if refusal is not None:  # neither stored nor sent: it could never be delivered
            if early is not None:  # not reached: `send_early` leaves a call this large out
                delivery.stop_transfer(early.session, early.transfer)
            return worker_id, Answer(error_result(cid, refusal))
        if req.correlation_id:
            # Looked up once the writer thread is idle, waited for here, not on the loop
            # (`add` and `get` would wait there: its commit may wait for hub.db held by
            # another process, review29 h1); no await between this and the lookup.
            await self.store.settled()
        deadline_ms = now_ms() + int(timeout_s * 1000)
        is_new = self.store.add(
            worker_id, digest, request, len(blob), deadline_ms, fresh=not req.correlation_id
        )
        existing = None if is_new else self.store.get(cid)
        if existing is not None:
            blob = await delivery.whole(blob)  # (an upload's is recorded new: it has a new id)
            recorded = existing.args_digest
            # A digest of another scheme (an earlier version's, or today's other: see
            # `same_call`) is compared in its own: the call is at hand here.
            if recorded != digest and schemes_differ(recorded, digest):
                same = recorded == await delivery.recorded_digest(recorded, request, blob)
            else:
                same = same_call(recorded, digest)
            if not same:
                error = WorkerError(
                    "args_mismatch",
                    f"correlation id {cid} was already used for a call with different arguments; "
                    "use a new id for a new call",
                )
                return existing.worker_id, Answer(error_result(cid, error))
            if existing.result is not None:
                return existing.worker_id, Answer(self._replay(existing))
            worker_id = existing.worker_id
            remaining_ms = max(0, existing.deadline_ms - now_ms())
            timeout_s = remaining_ms / 1000
            args_json = request.args_json  # the caller's: the same args, by the digest
            request = pb.ActionRequest()
            request.CopyFrom(existing.request)
            if existing.state == "ABANDONED":  # it keeps no args (store.abandon)
                request.args_json = args_json
            request.attempt += 1
            request.timeout_ms = remaining_ms
            # The same call, under the digest it was recorded with (the worker may have
            # it so in its ledger: a row of an earlier version's scheme); a legacy row
            # may lack it.
            request.args_digest = recorded or digest
            if not blob and request.blob:  # a legacy row: its blob is in the request
                blob = request.blob
                request.ClearField("blob")
            outgoing = await delivery.prepared(request, blob, self._takes_parts(worker_id))
            if self._refused_too_large(cid, delivery.size_of(outgoing)):
                refused = self.store.get(cid)
                assert refused is not None and refused.result is not None
                return worker_id, Answer(refused.result)
        if is_new and req.correlation_id:  # a caller of its id whose record failed
            self._blobs.pop(cid, None)  # may have left its blob (`_written_down_then_sent`)
        if blob and self._blobs.get(cid) is None:
            self._blobs[cid] = blob  # until answered, in case it must be sent again
        # Each caller waits on a future of its own (several may wait for one id), so a
        # caller that gives up cancels only its own, with no shield between the result
        # and the caller (a shield costs a loop turn).
        waiter: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(cid, []).append(waiter)
        sent = False
        if is_new and req.correlation_id:
            # Handed to the writer thread now, in the step that added it: no other
            # commit (the store timer's) takes it first, to fail while this one, empty,
            # went through and the call with it, unrecorded.
            committing = self.store.record_off_loop(cid)
            # Shielded: a caller that leaves meanwhile leaves the call to be recorded
            # and sent, as one sent before it left is (and answered, not kept pending).
            try:
                unrecorded = await asyncio.shield(
                    self._written_down_then_sent(
                        cid, worker_id, outgoing, committing, waiter, request.plan_id
                    )
                )
            except asyncio.CancelledError:
                self._caller_left(cid, waiter)
                raise
            if unrecorded is not None:
                return worker_id, Answer(error_result(cid, unrecorded))
            sent = True
        session = self.sessions.get(worker_id)
        if handed is not None:  # the request went already; now its digest
            handed.set_result(digest)
        if early is not None and handed is None:  # its parts are on their way: the request
            assert isinstance(outgoing, Chunked)  # follows them (or went first: its digest)
            if outgoing.follow:
                outgoing.add(digest_part(cid, len(blob), digest))
            else:
                outgoing.add(announced(request, len(blob)))
        elif early is None and session is not None and not sent:
            if request.plan_id and self._kill_to_come(session, request.plan_id):
                session.held_resends.add(cid)  # (a repeat: admitted before an await)
            else:
                session.send(outgoing)
        if is_new:
            self._store_soon()
        try:
            # asyncio.timeout (never wait_for, see pyproject's banned-api): no extra
            # task per call either.
            async with asyncio.timeout(timeout_s + RESULT_SLACK_S):
                answer = await waiter
        except asyncio.CancelledError:  # the caller went away; others may still wait
            self._caller_left(cid, waiter)
            raise
        except TimeoutError:
            self._waiters.pop(cid, None)
            self._abandon(cid, self.sessions.get(worker_id))
            where = "was not answered" if session else f"could not reach worker {worker_id}"
            timeout = WorkerError(
                "timeout", f"the call {where} within its {timeout_s:g} s deadline"
            )
            answer = Answer(error_result(cid, timeout))
        return worker_id, answer

    async def dispatch_upload(
        self, req: pb.DispatchRequest, size: int, next_part: upload.NextPart
    ) -> bytes:
        """Dispatch of a call whose blob of `size` bytes comes in parts (`next_part`,
        ControlService.DispatchUpload), its response serialized. A call the hub names
        itself, to a worker that speaks protocol 3, goes to the worker at once and its
        parts as they come (the worker writes them meanwhile), its digest (computed here
        as they pass) once the blob came whole and the call is recorded. Any other (an
        id the caller chose: it is committed before the worker gets it, and that takes
        its digest; an older worker; a blob of one part) is sent as a Dispatch with
        that blob once all of it came. Either way a blob that does not come as
        announced is refused, and nothing of it runs (the worker removes what it wrote,
        claims nothing)."""
        try:
            refused = bad_id("the call", req, *CALL_IDS, *CALL_NAMES) or _blob_refusal(req, size)
            if refused is not None:
                raise refused
            worker_id = self._admitted(req, size)
        except WorkerError as exc:
            return Answer(error_result(req.correlation_id, exc)).response(req.worker_id)
        with self._counted(worker_id, size):
            worker_id, answer = await self._upload_to(worker_id, req, size, next_part)
        return answer.response(worker_id)

    async def _upload_to(
        self, worker_id: str, req: pb.DispatchRequest, size: int, next_part: upload.NextPart
    ) -> tuple[str, Answer]:
        request = self._action_request(req, worker_id)
        read_within_s = reads.CONTROL_READ_WITHIN_S.get(
            "Dispatch", reads.CONTROL_READ_WITHIN_S_OTHERWISE
        )
        within_s = min(request.timeout_ms / 1000, read_within_s)
        session = self.sessions.get(worker_id)
        coming = delivery.Coming(size, next_part, within_s)
        # As `delivery.send_early`: only a call the hub names itself goes before it is
        # recorded.
        if session is not None and not req.correlation_id and size > PART_BYTES:
            local = self.link is not None and self.link.local(session.session_id)
            if local or session.protocol >= FOLLOW_PROTOCOL:
                return await self._upload_early(worker_id, session, req, request, coming)
        try:
            pieces = await upload.receive(next_part, size, within_s=within_s)
        except WorkerError as exc:
            return worker_id, Answer(error_result(request.correlation_id, exc))
        return await self._dispatch_to(worker_id, req, await delivery.whole(pieces))

    async def _sent_anew(
        self,
        worker_id: str,
        req: pb.DispatchRequest,
        request: pb.ActionRequest,
        pieces: upload.Pieces,
    ) -> tuple[str, Answer]:
        """An upload whose worker stream ended while it came: recorded and sent whole, as
        a Dispatch's, under an id of its own. The delivery begun on the stream that ended
        went under another (the hub named both, no caller knows either): should the
        worker answer that one after all (it refuses a request whose handed blob went
        with its stream), the answer is to a call unknown here, never to this one."""
        request.correlation_id = ordered_id()
        blob = await delivery.whole(pieces)
        return await self._recorded_and_sent(worker_id, req, request, blob, None)

    async def _upload_early(
        self,
        worker_id: str,
        session: Session,
        req: pb.DispatchRequest,
        request: pb.ActionRequest,
        coming: delivery.Coming,
    ) -> tuple[str, Answer]:
        """An upload that goes to its worker as it comes (`delivery.hand_upload` to the
        worker of this process, `delivery.relay_upload` down a protocol 3 stream), its
        digest once the call is recorded."""
        try:
            if self.link is not None and self.link.local(session.session_id):
                went = await delivery.hand_upload(session, self.link, request, coming)
            else:
                went = await delivery.relay_upload(session, request, coming)
        except WorkerError as exc:
            return worker_id, Answer(error_result(request.correlation_id, exc))
        if self.sessions.get(worker_id) is not session:
            # The worker's stream ended meanwhile, and its worker let go of what came on
            # it (the call it started stopped): the call goes whole, recorded first, on
            # the worker's next stream (or waits for it).
            went.abandon()
            return await self._sent_anew(worker_id, req, request, went.pieces)
        try:
            return await self._recorded_and_sent(worker_id, req, request, went.pieces, went.early)
        finally:
            went.early.cancel_handed()

    def _replay(self, call: StoredCall) -> pb.ActionResult:
        """A finished call's stored answer, for a caller repeating its id. A result blob
        kept because no caller had taken it goes to this one and is then let go; one
        already delivered is gone, and the answer says so (`blob_gone`), as it does for
        secrets kept masked since a caller had them (review26 H7)."""
        assert call.result is not None
        if call.result_blob_gone or call.result.masked:
            return blob_gone(call.result, call.result_blob_bytes)
        replay = pb.ActionResult()
        replay.CopyFrom(call.result)
        replay.replayed = True
        if call.result_blob_bytes or call.result.result_json_at_rest:
            self.store.delivered(call)  # this caller has it: the blob and secrets go
        return for_caller(replay)

    async def request_scope(self, req: pb.RequestScopeRequest) -> pb.ScopeDecision:
        session = self.sessions.get(self.pick_worker(req.worker_id))
        if session is None:
            raise LookupError(f"worker {req.worker_id} is not connected")
        refusal = self._scope_refusal(session, req)
        if refusal is not None:
            return pb.ScopeDecision(granted=False, scopes=req.scopes, reason=refusal)
        request_id = uuid.uuid4().hex
        waiter: asyncio.Future[pb.ScopeDecision] = asyncio.get_running_loop().create_future()
        self._scope_waiters[request_id] = _ScopeAsk(
            session.worker_id, req.agent_id, session.session_id, waiter
        )
        session.send(
            pb.ServerMessage(
                scope_request=pb.ScopeRequest(
                    request_id=request_id,
                    agent_id=req.agent_id,
                    plan_id=req.plan_id,
                    scopes=req.scopes,
                    reason=req.reason,
                    preview=req.preview,
                )
            )
        )
        timeout_ms = req.timeout_ms or SCOPE_WAIT_DEFAULT_MS
        if timeout_ms > SCOPE_WAIT_MAX_MS:
            log.info(
                "a scope request asks to wait %d ms for an answer; cut to %d",
                timeout_ms,
                SCOPE_WAIT_MAX_MS,
            )
            timeout_ms = SCOPE_WAIT_MAX_MS
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                return await waiter
        except TimeoutError:
            return pb.ScopeDecision(
                request_id=request_id,
                granted=False,
                reason=f"no answer in time (waited {timeout_ms / 1000:g} s)",
            )
        finally:  # answered, timed out, or the caller went away: no longer waited for
            self._scope_waiters.pop(request_id, None)

    def _scope_refusal(self, session: Session, req: pb.RequestScopeRequest) -> str | None:
        """Why a RequestScope is answered at once, without asking the worker, or None."""
        refused = bad_id("the scope request", req, "agent_id", "plan_id")
        if refused is not None:
            return f"validation_error: {refused.message}"
        if len(req.reason) > SCOPE_REASON_CHARS or len(req.preview) > SCOPE_PREVIEW_CHARS:
            return (
                f"too_large: a scope request's reason is at most {SCOPE_REASON_CHARS:,} "
                f"characters and its preview {SCOPE_PREVIEW_CHARS:,} (this one: "
                f"{len(req.reason):,} and {len(req.preview):,}); the person is shown 500 "
                "and 2,000 of them"
            )
        waiting = [
            asked.agent_id
            for asked in self._scope_waiters.values()
            if asked.worker_id == session.worker_id
        ]
        if len(waiting) >= SCOPE_REQUESTS_PER_WORKER:
            return (
                f"busy: {len(waiting)} scope requests already wait for the person at worker "
                f"{session.worker_id!r} (the most the hub relays); ask again once they are "
                "answered"
            )
        if waiting.count(req.agent_id) >= SCOPE_REQUESTS_PER_AGENT:
            return (
                f"busy: {SCOPE_REQUESTS_PER_AGENT} scope requests of agent {req.agent_id!r} "
                f"already wait for the person at worker {session.worker_id!r} (the most the "
                "hub relays for one agent); ask again once they are answered"
            )
        return None

    def _killed_there(self, req: pb.DispatchRequest, worker_id: str) -> bool:
        """Whether this hub killed the call's plan for `worker_id` and the kill has not
        gone ahead of the call: for a worker away, one it had not confirmed in its last
        session; for one connected, one not yet sent on its stream. A repeat of a call
        recorded before goes on: the worker answers it from its ledger, or refuses it,
        the kill being sent ahead of it."""
        if not self.store.killed(req.plan_id, worker_id, 0):
            return False
        session = self.sessions.get(worker_id)
        if session is not None:
            # A kill sent on this stream goes ahead of the call, which the worker then
            # refuses itself, and so learns the plan is in use (ledger.MAX_SERVER_KILLS):
            # refused here before the worker confirmed the kill, a flood of kills of
            # made-up plans later pruned it there, and the plan ran (review14 finding 02,
            # its variant B). One in a page still to come goes first: refused here.
            return self._kill_to_come(session, req.plan_id)
        through = self.store.kills_confirmed(worker_id)
        if not self.store.killed(req.plan_id, worker_id, through):
            return False
        return not (req.correlation_id and self.store.call_state(req.correlation_id))

    def kill_plan(self, req: pb.KillPlanRequest) -> pb.KillPlanResponse:
        """Keep the kill in hub.db (committed before the answer; see store.KILLS_KEPT),
        send it to each target worker connected, and to every other at its next Hello,
        again at each Hello until the worker confirms it (Heartbeat.kills_through), so
        that neither a stream that ends before the worker read it, nor a hub restart,
        nor a worker away, new or not, loses it; until then the plan's calls to that
        worker are refused here. With no worker named, the targets are every worker,
        those to come too. Before, a connected worker was sent the kill and nothing was
        kept (lost with its stream), and of those away only the ones the plan ran on
        were queued (review12 findings 02, 08)."""
        named = self.pick_worker(req.worker_id) if req.worker_id else ""
        kept = self.store.kill(
            req.plan_id,
            req.reason,
            named,
            {worker_id: s.kills_through for worker_id, s in self.sessions.items()},
        )
        reply = pb.KillPlanResponse()
        # One envelope part for every worker: built once, not once a worker.
        part = message_part(pb.ServerMessage(kill_plan=kept.kill).SerializeToString())
        for worker_id in [named] if named else sorted({*self.sessions, *self.store.worker_ids()}):
            session = self.sessions.get(worker_id)
            if session is not None:
                self._send_kill(session, part, kept.kill.seq)
                reply.worker_ids.append(worker_id)
            else:
                reply.queued_worker_ids.append(worker_id)
        # Then the kills of every plan it made owed (kills not confirmed went), after it
        # as numbered: sent first, a stop's seq passed the kill's, and a worker took the
        # kill as one recorded before and lifted since (review17's report).
        for worker_id, stop in kept.stops.items():
            session = self.sessions.get(worker_id)
            if session is not None:
                stop_part = message_part(pb.ServerMessage(kill_plan=stop).SerializeToString())
                self._send_kill(session, stop_part, stop.seq)
        return reply

    @staticmethod
    def _send_kill(session: Session, part: bytes, seq: int) -> None:
        """Send a kill numbered `seq` (its envelope part) as it is made, unless the
        worker pages through its backlog, or is behind (`_kills_behind`): then a page
        brings it, in order (`_handle`). Sent to a stream that read a trickle and never
        confirmed, every kill waited in its outbox, without bound (review18 F7)."""
        if not session.kills_paging and _kills_behind(session):
            session.kills_paging = True
        if not session.kills_paging:
            session.send(part, answered=False)
            session.kills_sent = seq

    def worker_infos(self) -> list[pb.WorkerInfo]:
        infos = []
        enrolments = self.store.enrolments.all()
        accepted = {row.worker_id: row for row in enrolments if row.state == "accepted"}
        for hello, last_seen in self.store.workers():
            session = self.sessions.get(hello.worker_id)
            live = session.hello if session else hello
            enrolled = accepted.pop(live.worker_id, None)
            infos.append(
                pb.WorkerInfo(
                    worker_id=live.worker_id,
                    instance_id=live.instance_id,
                    version=live.version,
                    connected=session is not None,
                    in_flight=session.heartbeat.in_flight if session else 0,
                    state=session.heartbeat.state if session else pb.Heartbeat.STATE_UNSPECIFIED,
                    actions=live.actions,
                    gui_available=live.gui_available,
                    last_seen_unix_ms=now_ms() if session else last_seen,
                    max_concurrency=live.max_concurrency,
                    enrolment=enrolled.state if enrolled else "",
                    fingerprint=enrolled.fingerprint if enrolled else "",
                )
            )
        # Accepted and not seen since (or forgotten away), waiting, refused: by their rows.
        infos.extend(enrolment_info(row) for row in accepted.values())
        infos.extend(enrolment_info(row) for row in enrolments if row.state != "accepted")
        return infos

    def decide_worker(self, request: pb.DecideWorkerRequest) -> pb.DecideWorkerResponse:
        """The operator's decision (worker.hub.admission.decide); a worker no longer
        served loses its stream at once (refused: it stops; forgotten: it says Hello
        again, and waits)."""
        session = self.sessions.get(request.worker_id)
        connected = None if session is None else session.key_digest
        response, unserved = self.admission.decide(request, connected)
        # Its Hellos are read on the turns of the key served from now on (knows_key).
        self.store.bind_key(
            request.worker_id, self.store.enrolments.accepted_key(request.worker_id)
        )
        if unserved is not None and session is not None:
            log.warning("worker %s: %s", session.worker_id, response.message)
            session.refusal = unserved
            session.drop_queued()
            session.close()
            self._ended(session)
        return response

    def _end_superseded(self, worker_id: str) -> None:
        """End the stream connected under `worker_id` with the key an older version of
        the worker sent, now that a key made for this hub came under the id: whoever
        holds the older key (every server the worker dialled) is served no more."""
        session = self.sessions.get(worker_id)
        if session is None:
            return
        if not self.store.enrolments.verdict(worker_id, session.key_digest).superseded:
            return
        shown_key = fingerprint_of_digest(session.key_digest) or "none"
        log.warning(
            "worker %s: its stream with the key an older version sent (fingerprint %s) "
            "ends: a key made for this hub came under the id",
            shown(worker_id),
            shown_key,
        )
        session.refusal = (
            grpc.StatusCode.PERMISSION_DENIED,
            superseded_message(worker_id, shown_key),
            ((ENROLMENT_KEY, "pending"),),
        )
        session.drop_queued()
        session.close()
        self._ended(session)

    def status(self) -> pb.StatusResponse:
        known = self.store.known_workers()
        connected = len(self.sessions)
        if connected:
            state = pb.StatusResponse.CONNECTED
        elif known:
            state = pb.StatusResponse.DISCONNECTED
        else:
            state = pb.StatusResponse.UNCONFIGURED
        return pb.StatusResponse(
            state=state, connected_workers=connected, known_workers=known, version=VERSION
        )

    def shutdown(self) -> None:
        """Store what is unstored, now, and schedule no more: hub.db closes next (a
        store scheduled before fired after it, "Cannot operate on a closed database")."""
        self.memory.close()
        self.audit_lines.close()
        self.store_results(off_loop=False)
        self._stopped = True
        for session in list(self.sessions.values()):
            session.send(pb.ServerMessage(drain=pb.Drain(reason="the hub is stopping")))
            session.close()


def _on_loop(loop: asyncio.AbstractEventLoop, callback: Any, *args: Any) -> None:
    """Call `callback(*args)` on `loop` from another thread; nothing if it closed (the
    hub stopped: its workers send unacked results again to the next one)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback, *args)


def _kills_behind(session: Session, *, paging: bool = False) -> bool:
    """Whether `session`'s worker is too far behind for a kill to go to it now: it has
    not confirmed KILL_PAGE of those sent it (`paging`: the last page), or KILL_PAGE_BYTES
    of kills and heartbeats wait in its outbox (a stream may say it recorded kills it
    never read: it is sent no more than it reads)."""
    if session.outbox.unasked_bytes >= KILL_PAGE_BYTES:
        return True
    if paging:
        return session.kills_through < session.kills_sent
    return session.kills_sent - session.kills_through >= KILL_PAGE


def _stored_bytes(unstored: list[tuple[Session, Answer, bool]]) -> int:
    """About what storing these answers writes: each result, and a blob kept."""
    size = 0
    for _session, answer, taken in unstored:
        size += (
            len(answer.serialized) if answer.serialized is not None else answer.result.ByteSize()
        )
        if not taken and answer.blob is not None:
            size += len(answer.blob)
    return size


def _log_teardown(done: asyncio.Future[pb.ActionResult]) -> None:
    if done.cancelled():
        return
    result = done.result()
    if result.status == pb.ActionResult.OK:
        log.info("a teardown queued for a worker that was away is done: %s", result.result_json)
    else:
        log.warning("a teardown queued for a worker that was away failed: %s", result.error.message)
