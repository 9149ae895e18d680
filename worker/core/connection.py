"""The worker's side of `WorkerService.Stream`: dial, hold, and dial again.

One session is one stream: Hello → Welcome, then a single reader hands requests
to the dispatcher while a single writer (the generator gRPC consumes) sends what
the outbox holds. A dropped stream is redialled with full-jitter exponential
backoff capped at 30 s; a refusal that retrying cannot fix (bad token, permission,
unknown service, protocol mismatch) ends the worker with the reason. A dropped
stream does not cancel running calls: their results wait in the ledger and are
re-sent after the next handshake, to that server only (`Target.server_key`): the
results of another server the worker served before are held for it, not sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import uuid
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import grpc
from google.protobuf.message import DecodeError

from sandbox import ArrivalStopped, Arriving, each_part
from worker.clock import now_ms
from worker.core.blob_parts import BlobParts, Following
from worker.core.pipeline import Dispatcher, stream_ended
from worker.core.registry import Effect
from worker.core.results import Outgoing
from worker.errors import NotYourHubError, StartupError, WorkerError
from worker.ids import id_problem
from worker.wire.framing import (
    Batcher,
    Buffer,
    envelope_of,
    fields_of,
    message_part,
    read_varint,
    split_field,
)
from worker.wire.inproc import LocalCall
from worker.wire.local import HandedResult, LocalLink
from worker.wire.own_hub import OwnHub
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.protocol import (
    ENROLMENT_KEY,
    ENROLMENT_RETRIED,
    FOLLOW_PROTOCOL,
    HASH_OFF_LOOP_BYTES,
    MAX_DIGEST_CHARS,
    PROTOCOL_MAX,
    PROTOCOL_MIN,
    RETRY_AFTER_KEY,
    STREAM_METHOD,
    VERSION,
    error_pb,
)
from worker.wire.transport import Keepalive, open_channel, server_name, worker_metadata

log = logging.getLogger(__name__)

FATAL_CODES = frozenset(
    {
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.FAILED_PRECONDITION,  # the hub's protocol-mismatch answer
    }
)
HANDSHAKE_TIMEOUT_S = 15.0
# A worker the hub's operator has not accepted yet tries again at least this often.
ENROLMENT_RETRY_S: Final = 5.0
# A session that completed its handshake and stayed up this long was healthy: the
# next redial starts the backoff over (a hub restart after a long outage is then
# redialled in well under a second, not at the outage's 30 s ceiling).
STABLE_S = 2.0
MIN_SILENCE_S = 1.0
# The silence limit is counted in this many looks (see _Silence): a look that comes
# late, the worker's own loop held up, counts as one look's time at most.
SILENCE_LOOKS = 4
FLUSH_TIMEOUT_S = 5.0


# Odd server messages (undecodable, of an unknown kind) logged one by one; past
# this many, every 1000th: a hostile server cannot fill the log.
BAD_INPUT_LOG_LINES = 20


class FatalConnectionError(Exception):
    """The server refused us in a way that retrying cannot fix."""


class _StreamEndedError(Exception):
    """The stream ended; why, for the log."""


class _NotDialledError(Exception):
    """This machine's hub was not dialled: none answers where it serves, or what holds
    its socket or its port is another user's (`refused`; worker.wire.own_hub)."""

    def __init__(self, message: str, *, refused: bool) -> None:
        super().__init__(message)
        self.refused = refused


@dataclass(frozen=True)
class Backoff:
    """How long to wait before the next dial, given how long the link has been down.

    Full jitter over [0, min(cap, base + down/2)], with a floor against spinning: the
    wait is never more than half the time the link has been down, so a server back
    after an outage of T is redialled within about T/2 + base (a 1 s restart: well
    under 2 s), while the dials thin out geometrically (the time down grows by a
    quarter per dial on average, as with exponential backoff). "Down" counts from the
    end of the last healthy session, so a session that fails its handshake or drops
    at once does not start it over.
    """

    base_s: float = 0.5
    cap_s: float = 30.0

    def delay(self, down_s: float) -> float:
        ceiling = min(self.cap_s, self.base_s + max(0.0, down_s) / 2)
        return max(self.base_s / 10, random.uniform(0, ceiling))


@dataclass(frozen=True)
class LinkState:
    """The link to the server, as a person's view shows it."""

    state: str  # connecting / ready / backoff / fatal / stopped
    detail: str = ""
    retry_at_ms: int | None = None  # backoff: when the next dial happens

    def to_dict(self) -> dict[str, object]:
        return {"state": self.state, "detail": self.detail, "retry_at_ms": self.retry_at_ms}


# Why a ScopeRequest's prompt closed unanswered as its stream ended (its prompt's close
# reason, after "withdrawn: "; see _withdraw_scope_requests).
SCOPE_REQUEST_EXPIRED: Final = (
    "the server's stream ended, and with it the server's wait for this answer; it was "
    "told to ask again once the worker is connected"
)


# The server key of this data folder's own hub (`agentworker up`, or `run` with no
# server named), before its token's digest: see local_hub_key.
LOCAL_HUB: Final = "local-hub"


def _token_digest(token: str) -> str:
    """A digest of a server's token that says which token it was, never what it is."""
    return hashlib.sha256(b"agentworker server token\0" + token.encode()).hexdigest()[:16]


def server_key(address: str, token: str, *, tls: bool) -> str:
    """Which server a worker serves: the address it dials (its scheme and spelling
    made one: `dns:///Host:443` is `host:443`), whether over TLS, and a digest of the
    token (another token at the same address is another server, or another account of
    it). The ledger stamps each call with it (worker.core.ledger): only that server
    is told of the call and sent its result. The CA file is left out: renewing it
    leaves the server the same."""
    return f"{'tls' if tls else 'plain'}://{server_name(address)}#{_token_digest(token)}"


def local_hub_key(token: str) -> str:
    """The key of this data folder's own hub (`up`'s in-process one, or the one `run`
    dials with no server named): known by its workers' token, which it made and keeps
    beside hub.db, not by the port it listens on this time (`[hub] listen` with port 0
    gives another each start). Only this user's hub is ever dialled under it: `run`
    reaches it on its Unix socket, or on a port the kernel says this user holds
    (`Target.own_hub`), never another user's listener on its port (review11 06)."""
    return f"{LOCAL_HUB}#{_token_digest(token)}"


@dataclass(frozen=True)
class Target:
    address: str
    token: str
    tls_ca: Path | None = None
    # Its key for this server (transport.key_for_server; never worker.key itself).
    worker_key: str = ""
    # Which server this is, for the ledger; empty: server_key of the address and token.
    key: str = ""
    # This machine's hub (`run` with no server named): dialled on its Unix socket, or
    # at `address` only when the kernel says its port is this user's (worker.wire.own_hub).
    own_hub: OwnHub | None = None

    @property
    def server_key(self) -> str:
        return self.key or server_key(self.address, self.token, tls=self.tls_ca is not None)


class WorkerConnection:
    def __init__(
        self,
        dispatcher: Dispatcher,
        target: Target,
        *,
        keepalive: Keepalive = Keepalive(),
        heartbeat_s: float = 5.0,
        backoff: Backoff = Backoff(),
        gui_available: bool = False,
        link: LocalLink | None = None,
        dial: Callable[[Sequence[tuple[str, str]]], LocalCall] | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.target = target
        # The ledger tells, sends and answers this server only its own calls (one
        # connection per dispatcher: the worker serves one server for its lifetime).
        dispatcher.state.server = target.server_key
        dispatcher.state.record_served()  # the person's `grant` is for it by default
        self.keepalive = keepalive
        self.heartbeat_s = heartbeat_s
        self.backoff = backoff
        self.gui_available = gui_available
        self.instance_id = uuid.uuid4().hex
        self.connected = asyncio.Event()
        self.sessions_started = 0
        # Serialized WorkerMessages framed as envelope parts (see framing.py).
        self._outbox: _Outbox | None = None
        self._stopping = False
        self._session_task: asyncio.Task[None] | None = None
        self._healthy_at: float | None = None  # when the current session counts as healthy
        self._dialled = target.address  # where the current session was dialled
        self._bad_inputs = 0  # server messages that could not be decoded
        # Blobs coming in parts ahead of their requests (protocol 2), and the requests
        # whose parts are being joined (in a thread) before they are submitted.
        self._parts = BlobParts()
        # A hub in this process hands blobs over by reference (worker.wire.local), on
        # the session this worker opened (its id: `_session_id`).
        self._link = link
        self._session_id = ""
        # The silence of the server on the stream being read (None: no limit, or none yet).
        self._silence: _Silence | None = None
        # A hub in this process opens the stream itself, without gRPC (`up`, see
        # worker.wire.inproc); None: the stream is dialled over gRPC.
        self._dial = dial
        self._joins: dict[str, asyncio.Task[None]] = {}
        # Cancels for requests whose parts came and which are not claimed yet.
        self._cancelled_early: dict[str, str] = {}
        # Requests whose blobs follow them (protocol 3), until their digest came.
        self._follows: dict[str, _Follow] = {}
        self._protocol = PROTOCOL_MIN  # the session's, from its Welcome
        # The sequence the server numbers its kills in (the session's Welcome; empty: it
        # numbers none), and whether a heartbeat confirming kills is on its way.
        self._kills_epoch = ""
        self._kills_seen = 0  # the last numbered kill recorded, not yet written as seen
        self._confirming_kills = False
        self.on_state: Callable[[LinkState], None] = lambda _state: None
        # Who answers a server's ScopeRequest (the approval broker); None: refuse it.
        self.answer_scopes: Callable[[pb.ScopeRequest], Awaitable[pb.ScopeDecision]] | None = None
        # The ScopeRequests of this session that wait for the person: withdrawn when it
        # ends (`_withdraw_scope_requests`).
        self._answering: set[asyncio.Task[None]] = set()
        # Set when the server acks results, or the session ends: what `_flushed` waits on.
        self._acks_or_offline = asyncio.Event()

    # ------------------------------------------------------------- lifecycle

    async def run(self) -> None:
        """Hold a session until `shutdown`; raises FatalConnectionError on a hard refusal."""
        loop = asyncio.get_running_loop()
        this = asyncio.current_task()
        assert this is not None
        down_since: float | None = None  # the end of the last healthy session
        waited = False  # the last try was refused as not accepted yet (ENROLMENT_KEY)
        while not self._stopping:
            self.on_state(LinkState("connecting", self.target.address))
            self._healthy_at = None
            clean_end = False
            self._session_task = asyncio.create_task(self._session())
            why = "the server ended the session"
            retry_after_s = 0.0  # what a server that refused us busy asked us to wait
            said, waited = waited, False
            try:
                await self._session_task
                clean_end = True  # Drain/Goodbye: come back soon
            except FatalConnectionError as exc:
                self.on_state(LinkState("fatal", str(exc)))
                raise
            except asyncio.CancelledError:
                if self._stopping:
                    return
                raise
            except _NotDialledError as exc:
                why = str(exc)
                if exc.refused:  # nothing was sent; said each time, the person must act
                    log.error("not dialling this machine's hub: %s", why)
                else:
                    log.info("no hub to dial yet: %s", why)
            except (grpc.aio.AioRpcError, _StreamEndedError, OSError, TimeoutError) as exc:
                if self._stopping:
                    return
                why = _describe(exc)
                waiting = isinstance(exc, grpc.aio.AioRpcError) and (
                    enrolment_of(exc) in ENROLMENT_RETRIED
                )
                if waiting and said:  # said once in full; the person has it
                    log.info("still not accepted by %s; trying again", self._dialled)
                else:
                    log.warning("connection to %s lost: %s", self._dialled, why)
                waited = waiting
                if isinstance(exc, grpc.aio.AioRpcError):
                    retry_after_s = retry_after(exc)
            finally:
                self._detach()
            if self._stopping:
                return
            if this.cancelling():
                # Cancelled as the session ended: the session's own end (the stream's
                # error, say) came out of it, not the cancel. Leave all the same; a
                # cancelled worker that went on dialling would never end.
                raise asyncio.CancelledError
            now = loop.time()
            healthy = self._healthy_at is not None and now >= self._healthy_at
            if down_since is None or clean_end or healthy:
                down_since = now  # the backoff starts over
            delay = self.backoff.delay(now - down_since)
            if waited:  # the operator may accept it any moment: not the backoff's 30 s
                delay = min(delay, ENROLMENT_RETRY_S)
            if retry_after_s:
                # As told, spread over as long again: a fleet refused together does not
                # come back together.
                spread = min(RETRY_AFTER_MAX_S, retry_after_s * random.uniform(1.0, 2.0))
                delay = max(delay, spread)
            self.on_state(LinkState("backoff", why, now_ms() + int(delay * 1000)))
            log.info("reconnecting to %s in %.1f s", self.target.address, delay)
            await asyncio.sleep(delay)  # the backoff itself: waiting is the point

    async def shutdown(self, grace_s: float) -> None:
        """Drain: take no new work, let running calls finish, flush results, say goodbye."""
        self.dispatcher.stop_intake()
        self._send_heartbeat()
        await self.dispatcher.drain(grace_s)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FLUSH_TIMEOUT_S):
                await self._flushed()
        self._stopping = True
        if self._outbox is not None:
            goodbye = pb.WorkerMessage(goodbye=pb.Goodbye(reason="shutting down"))
            self._outbox.put_nowait(message_part(goodbye.SerializeToString()))
            self._outbox.put_nowait(None)
        if self._session_task is not None:
            try:
                async with asyncio.timeout(FLUSH_TIMEOUT_S):
                    await asyncio.shield(self._session_task)
            except (TimeoutError, Exception):  # noqa: BLE001 - leaving anyway
                self._session_task.cancel()

    async def _flushed(self) -> None:
        """Wait until the server has acked every result (or we are offline): woken by
        each ack the reader records, and by the session's end."""
        while self._outbox is not None and self.dispatcher.state.has_unacked():
            self._acks_or_offline.clear()
            await self._acks_or_offline.wait()

    # ------------------------------------------------------------- one session

    async def _session(self) -> None:
        channel = None
        if self._dial is None:
            address, tls_ca = self._where()
            channel = open_channel(address, self.keepalive, tls_ca, own_connection=True)
        outbox = _Outbox()
        outbox.put_nowait(message_part(pb.WorkerMessage(hello=self._hello()).SerializeToString()))
        tasks: list[asyncio.Task[None]] = []
        healthy: asyncio.TimerHandle | None = None
        metadata = worker_metadata(self.target.token, self.target.worker_key)
        call: grpc.aio.StreamStreamCall | LocalCall
        local_call: LocalCall | None = None
        try:
            # Requests go out as bytes this side frames itself (see envelopes.py).
            # Envelopes come as bytes and are decoded here: a message that does not
            # decode is answered or dropped, never the end of the worker (see _decode).
            if channel is None:
                assert self._dial is not None
                call = local_call = self._dial(metadata)
            else:
                call = channel.stream_stream(STREAM_METHOD)(metadata=metadata)
            tasks.append(asyncio.create_task(_write_outbox(call, outbox, self._hand_result)))
            try:
                # Not asyncio.wait_for (see pyproject's banned-api): on Python 3.11 a
                # cancel that comes as the read ends (a refusal read at once: a stopped
                # hub's) is lost in it.
                async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                    first = await call.read()
            except grpc.aio.AioRpcError as exc:
                _raise_if_fatal(exc)
                raise
            welcome = self._check_welcome(first)
            self._protocol = welcome.protocol
            # The sequence this server numbers its kills in: another than the one kept
            # starts the count of those recorded over (the server sends them all).
            self._kills_epoch = welcome.kills_epoch
            self._kills_seen = 0
            # The same hub under a new key (its workers' token rotated): its kills
            # recorded under the old key bind this one (see carry_kills_over).
            self.dispatcher.state.carry_kills_over(welcome.kills_epoch)
            self.dispatcher.state.mark_kills(welcome.kills_epoch, 0)
            if self._link is not None:
                self._session_id = welcome.session_id
                self._link.attach(welcome.session_id)
            loop = asyncio.get_running_loop()
            self._healthy_at = loop.time() + STABLE_S
            healthy = loop.call_later(
                STABLE_S,
                log.debug,
                "session %s is healthy (the backoff starts over)",
                welcome.session_id,
            )
            self.sessions_started += 1
            self._outbox = outbox
            local = self._link is not None
            self.dispatcher.outbox.attach(self._send, self._send_handed if local else None)
            for cid in welcome.abandoned_ids:
                self.dispatcher.cancel(cid, "the server abandoned the call")
            tasks.append(asyncio.create_task(self._resend_unacked(outbox)))
            self.connected.set()
            self.on_state(LinkState("ready", f"session {welcome.session_id}"))
            log.info("connected to %s (session %s)", self._dialled, welcome.session_id)
            self._log_held_for_others()
            tasks.append(asyncio.create_task(self._heartbeats()))
            if self._handle_all(self._decode(first)[1:]):
                return
            interval_s = welcome.heartbeat_interval_ms / 1000
            silence_s = max(3 * interval_s, MIN_SILENCE_S) if interval_s else None
            await self._read(call, outbox, silence_s)
        finally:
            if healthy is not None:
                healthy.cancel()
            for task in tasks:
                task.cancel()
            # Blobs still following their requests stop: their calls are refused
            # (nothing of them took effect), and the hub sends them again.
            for follow in list(self._follows.values()):
                self._stop_follow(follow, stream_ended())
            self._parts.clear()  # parts of requests that never came: sent again whole
            if self._link is not None and self._session_id:
                self._link.detach(self._session_id)
            self._cancelled_early = {
                cid: why for cid, why in self._cancelled_early.items() if cid in self._joins
            }
            if channel is not None:
                await channel.close(grace=None)
            if local_call is not None:
                local_call.cancel()  # the hub's handler ends, as on a closed channel

    def _where(self) -> tuple[str, Path | None]:
        """The address to dial and the CA to trust there: the target's, or for this
        machine's hub its socket (no TLS on it), or its port once the kernel says the
        listener is this user's. Nothing is dialled otherwise (_NotDialledError)."""
        own = self.target.own_hub
        if own is None:
            self._dialled = self.target.address
            return self.target.address, self.target.tls_ca
        try:
            dial = own.dial()
        except StartupError as exc:
            raise _NotDialledError(exc.message, refused=isinstance(exc, NotYourHubError)) from None
        self._dialled = dial.target
        return dial.target, None if dial.local_socket else self.target.tls_ca

    async def _resend_unacked(self, outbox: _Outbox) -> None:
        """Every result the server has not acked goes out again, no faster than the
        stream takes them: after a long time offline they may be many, and large."""
        for message in self.dispatcher.results.unacked_messages():
            await outbox.room()
            self._send(message)

    def _log_held_for_others(self) -> None:
        """Say, once per session, which other servers' results the ledger holds (never
        sent here; they go when their server is dialled again, or at their age)."""
        state = self.dispatcher.state
        for held in state.held_for_others():
            log.warning(
                "holding %d result(s) (%s bytes) of another server, %s, that it has not "
                "acked: not sent to %s; kept for it until %.0f h after they finished",
                held.count,
                f"{held.bytes:,}",
                held.server,
                self.target.address,
                state.ttl_s / 3600,
            )

    def _hello(self) -> pb.Hello:
        state = self.dispatcher.state
        registry = self.dispatcher.registry
        held = self.dispatcher.held_plans() if self.dispatcher.held_plans else []
        kills_epoch, kills_through = state.kill_mark()
        return pb.Hello(
            worker_id=self.dispatcher.worker_id,
            instance_id=self.instance_id,
            version=VERSION,
            protocol_min=PROTOCOL_MIN,
            protocol_max=PROTOCOL_MAX,
            surfaces=sorted({spec.surface for spec in registry.values() if spec.advertised}),
            actions=sorted(name for name, spec in registry.items() if spec.advertised),
            gui_available=self.gui_available,
            max_concurrency=self.dispatcher.limits.max_concurrency,
            running_ids=state.running_ids(),  # this server's calls only, as below
            unacked_ids=state.unacked_ids(),
            plans=[
                pb.HeldPlan(plan_id=plan, last_used_unix_ms=used, placement_token=token)
                for plan, used, token in held
            ],
            kills_epoch=kills_epoch,
            kills_through=kills_through,
        )

    def _check_welcome(self, envelope: object) -> pb.Welcome:
        if envelope is grpc.aio.EOF or not isinstance(envelope, bytes):
            raise _StreamEndedError("the server closed the stream during the handshake")
        messages = self._decode(envelope)
        if not messages or messages[0].WhichOneof("kind") != "welcome":
            raise FatalConnectionError("the server did not answer Hello with Welcome")
        welcome = messages[0].welcome
        if not PROTOCOL_MIN <= welcome.protocol <= PROTOCOL_MAX:
            raise FatalConnectionError(
                f"protocol mismatch: the server chose {welcome.protocol}, this worker speaks "
                f"{PROTOCOL_MIN}..{PROTOCOL_MAX}; upgrade agentworker"
            )
        return welcome

    async def _read(
        self,
        call: grpc.aio.StreamStreamCall[pb.WorkerEnvelope, pb.ServerEnvelope] | LocalCall,
        outbox: _Outbox,
        silence_limit_s: float | None,
    ) -> None:
        """Hand each server message on; a server that goes quiet for longer than three
        of its heartbeats is treated as gone (keepalive alone misses a hung server,
        because the transport answers pings without it). While the outbox is full, the
        server's next messages wait: it takes what it asked for before it asks again."""
        loop = asyncio.get_running_loop()
        silence: _Silence | None = None
        try:
            async with asyncio.timeout(None) as deadline:
                if silence_limit_s is not None:
                    silence = self._silence = _Silence(
                        silence_limit_s, lambda: deadline.reschedule(loop.time())
                    )

                async def room() -> None:
                    # While our own backlog drains, the server's heartbeats wait unread
                    # behind it: that is no silence of the server's (nor is the time
                    # spent on what it sent: the silence counts while a read waits).
                    if not outbox.has_room:
                        await outbox.room()

                while True:
                    await room()
                    if silence is not None:
                        silence.listening = True
                    envelope = await call.read()
                    if silence is not None:
                        silence.listening = False
                        silence.heard = True
                    if envelope is grpc.aio.EOF:
                        raise _StreamEndedError("the server ended the stream")
                    if not isinstance(envelope, bytes):
                        raise _StreamEndedError(f"the stream gave a {type(envelope).__name__}")
                    if len(envelope) >= HASH_OFF_LOOP_BYTES:
                        # Large: each blob read apart as a view of the envelope (no copy;
                        # a part stays one until its request comes, see _join_then_submit).
                        with_blobs = decode_with_blobs(envelope)
                        if with_blobs is not None:
                            messages = [message for message, _blob in with_blobs]
                            blobs = await _owned(with_blobs, len(envelope))
                            if await self._handle_paced(messages, blobs, outbox, room):
                                return
                            continue
                    if await self._handle_paced(self._decode(envelope), (), outbox, room):
                        return
        except TimeoutError:
            raise _StreamEndedError(f"no word from the server for {silence_limit_s:g} s") from None
        except grpc.aio.AioRpcError as exc:
            _raise_if_fatal(exc)
            raise
        finally:
            if silence is not None:
                silence.close()

    def _decode(self, envelope: bytes) -> list[pb.ServerMessage]:
        """The envelope's messages. One that does not decode (invalid UTF-8 in a string
        field, a truncated or corrupt message) is dropped with a line in the log — and,
        when it is a request whose correlation id can still be read, answered — and
        the messages around it are kept. gRPC delimits each envelope, so a bad one
        leaves the stream itself intact."""
        try:
            return list(pb.ServerEnvelope.FromString(envelope).messages)
        except DecodeError:
            pass
        parts, intact = split_messages(envelope)
        messages = []
        for part in parts:
            try:
                messages.append(pb.ServerMessage.FromString(part))
            except DecodeError:
                self._undecodable(request_id_of(part), len(part))
        if not intact:
            self._undecodable(None, len(envelope))
        return messages

    def _undecodable(self, correlation_id: str | None, size: int) -> None:
        self._bad_inputs += 1
        if self._bad_inputs <= BAD_INPUT_LOG_LINES or self._bad_inputs % 1000 == 0:
            log.warning(
                "the server sent a message that does not decode (%d bytes%s; %d so far): %s",
                size,
                f", call {correlation_id}" if correlation_id else "",
                self._bad_inputs,
                "answered" if correlation_id else "dropped",
            )
        if correlation_id:
            error = WorkerError(
                "validation_error",
                "the request could not be decoded (invalid UTF-8 in a string field, or a "
                "truncated message); nothing was run",
            )
            result = pb.ActionResult(
                correlation_id=correlation_id, status=pb.ActionResult.ERROR, error=error_pb(error)
            )
            self._send(pb.WorkerMessage(result=result))

    def _handle_all(
        self, messages: Sequence[pb.ServerMessage], blobs: Sequence[bytes | None] = ()
    ) -> bool:
        """Handle every message (all of an envelope counts); True if one ends the session.
        `blobs`, when given, holds each request's blob, read apart from its message."""
        return self._handle_some(messages, blobs, None)[0]

    async def _handle_paced(
        self,
        messages: Sequence[pb.ServerMessage],
        blobs: Sequence[Buffer | None],
        outbox: _Outbox,
        room: Callable[[], Awaitable[None]],
    ) -> bool:
        """`_handle_all`, pausing whenever the outbox fills until it has room again: one
        envelope of duplicates, each answered with a large result, cannot outgrow it."""
        end = False
        while messages:
            ended, handled = self._handle_some(messages, blobs, outbox)
            end = end or ended
            messages, blobs = messages[handled:], blobs[handled:]
            if messages:
                await room()
        return end

    def _handle_some(
        self,
        messages: Sequence[pb.ServerMessage],
        blobs: Sequence[Buffer | None],
        outbox: _Outbox | None,
    ) -> tuple[bool, int]:
        """Handle messages in order, stopping early once `outbox` is full; whether one
        ends the session, and how many were handled."""
        end = False
        handled = 0
        # Several requests: their claims share one commit. One commits by itself.
        with self.dispatcher.intake() if len(messages) > 1 else contextlib.nullcontext():
            for i, msg in enumerate(messages):
                end = self._handle(msg, blobs[i] if blobs else None) or end
                handled = i + 1
                if outbox is not None and not outbox.has_room:
                    break
        return end, handled

    def _handle(self, msg: pb.ServerMessage, blob: Buffer | None = None) -> bool:
        """Act on one server message; True when the session should end. `blob` is a
        request's own blob (bytes), or a part's data (a view of its envelope)."""
        kind = msg.WhichOneof("kind")
        if kind == "request":
            if msg.request.parts_follow:
                self._request_before_parts(msg.request)
            elif msg.request.blob_in_parts:
                self._submit_from_parts(msg.request)
            else:
                assert not isinstance(blob, memoryview)  # _owned made it bytes
                self.dispatcher.submit(msg.request, blob)
        elif kind == "blob_part":
            part = msg.blob_part
            data = part.data if blob is None else blob  # read apart when large
            follow = self._follows.get(part.correlation_id)
            if follow is not None:
                self._follow_part(follow, part, data)
            elif part.args_digest:
                pass  # the end of a blob whose call was stopped already: nothing to do
            elif not self._parts.add(part.correlation_id, data, part.offset):
                self._count_bad_input("a blob part without a usable correlation id")
        elif kind == "ack":
            self.dispatcher.ack(list(msg.ack.correlation_ids))
            self._acks_or_offline.set()
        elif kind == "cancel":
            cid = msg.cancel.correlation_id
            reason = msg.cancel.reason or "by the server"
            follow = self._follows.get(cid)
            if follow is not None:
                # Its blob is still coming, its digest too: the hub stopped sending the
                # call (its caller left before it was recorded), or abandons it. Refused,
                # nothing of it took effect (a temporary file written goes).
                self._stop_follow(follow, _cancelled(reason))
            if self._parts.holds(cid):
                # Its request has not come: its parts go now, and it is refused if it does.
                self._parts.refuse(cid, _cancelled(reason))
            elif cid in self._joins:  # its request came, and is not claimed yet
                self._cancelled_early[cid] = reason
            self.dispatcher.cancel(cid, reason)
        elif kind == "kill_plan":
            kill = msg.kill_plan
            if not self._replayed_kill_lifted(kill):
                self._record_kill(kill)
            if kill.seq and self._kills_epoch:
                # Recorded: confirmed to the server by a heartbeat sent at once, one for
                # all the kills read in this turn (and one write of how far). Until then
                # it sends the kill again at each Hello.
                self._kills_seen = max(self._kills_seen, kill.seq)
                if not self._confirming_kills:
                    self._confirming_kills = True
                    asyncio.get_running_loop().call_soon(self._confirm_kills, self._kills_epoch)
        elif kind == "scope_request":
            self._scope_request(msg.scope_request)
        elif kind == "teardown":
            self._torn_down_while_coming(msg.teardown.plan_id)
            self.dispatcher.teardown(msg.teardown.plan_id, msg.teardown.correlation_id)
        elif kind == "drain":
            log.info("the server asks us to drain: %s", msg.drain.reason)
            return True
        elif kind == "heartbeat":
            pass
        else:  # a welcome mid-stream, or a kind this worker does not know (None)
            self._count_bad_input(f"kind {kind}" if kind else "a kind this worker does not know")
        return False

    def _count_bad_input(self, what: str) -> None:
        self._bad_inputs += 1
        if self._bad_inputs <= BAD_INPUT_LOG_LINES or self._bad_inputs % 1000 == 0:
            log.warning(
                "ignoring a server message of %s (%d odd messages so far)", what, self._bad_inputs
            )

    def _request_before_parts(self, req: pb.ActionRequest) -> None:
        """A request whose blob follows it (protocol 3), its digest after the blob. An
        action that writes its blob as it comes and claims its call late (fs_write)
        starts at once, its parts handed to it as they come (`Following`), and claims
        (and answers) only once the digest came, as inside `up` (worker.wire.local).
        Any other keeps its parts as protocol 2 does and is submitted, as one whose
        parts came ahead of it, once the digest came. Within the bounds of parts held
        (`BlobParts.reserve`; past them, the parts are held and bounded as protocol 2's)."""
        cid = req.correlation_id
        if (
            cid in self._follows
            or self._parts.holds(cid)
            or len(self._follows) >= MAX_FOLLOWING
            or id_problem("correlation_id", cid, required=True) is not None
        ):
            # One transfer of a call at a time; a hub sends few at once.
            self._count_bad_input("a request whose blob follows it, not taken")
            return
        size = req.blob_in_parts
        req.ClearField("args_digest")  # it comes last, once the hub recorded the call
        spec = self.dispatcher.registry.get(f"{req.surface}.{req.action}")
        streamed: Following | None = None
        if self._protocol < FOLLOW_PROTOCOL:
            self._parts.refuse(cid, _follow_refused(f"protocol {self._protocol} was chosen"))
        elif (
            spec is not None
            and spec.blob_in_pieces
            and spec.claims_late
            and spec.effect is not Effect.NONE
            and self._parts.reserve(cid, size) is None
        ):
            streamed = Following(size)
        loop = asyncio.get_running_loop()
        follow = _Follow(req, streamed, loop.create_future())
        self._follows[cid] = follow
        if streamed is not None:
            self.dispatcher.submit(req, b"", (streamed,), handed=follow.digest)

    def _follow_part(self, follow: _Follow, part: pb.BlobPart, data: Buffer) -> None:
        """A part of a blob that follows its request, or its end (the digest)."""
        cid = part.correlation_id
        req, size = follow.request, follow.request.blob_in_parts
        if part.args_digest:  # the end: the digest, once the hub recorded the call
            del self._follows[cid]
            self._parts.release(cid)
            digest = part.args_digest
            if len(digest) > MAX_DIGEST_CHARS or data or part.offset != size:
                error = _follow_refused("its last part was not the blob's end with its digest")
                if follow.streamed is not None:
                    self._stop_follow(follow, error)
                    return
                self._parts.refuse(cid, error)
            elif follow.received != size:
                error = _follow_refused(f"{follow.received:,} bytes of {size:,} came")
                if follow.streamed is not None:
                    self._stop_follow(follow, error)
                    return
                self._parts.refuse(cid, error)
            if follow.streamed is None:  # submitted as one whose parts came ahead of it
                req.parts_follow = False
                req.args_digest = digest
                if follow.torn_down is not None:
                    self._parts.refuse(cid, follow.torn_down)
                    self.dispatcher.refuse_unless_known(req, follow.torn_down)
                    return
                self._submit_from_parts(req)
                return
            follow.streamed.settle()
            if not follow.digest.done():
                follow.digest.set_result(digest)
            return
        if part.offset != follow.received:
            error = _follow_refused(
                f"a part starts at byte {part.offset:,}, where byte {follow.received:,} was next"
            )
        elif follow.received + len(data) > size:
            error = _follow_refused(f"its parts came to more than the {size:,} bytes announced")
        else:
            follow.received += len(data)
            if follow.streamed is not None:
                follow.streamed.add(data)
            else:
                self._parts.add(cid, data, part.offset)
            return
        if follow.streamed is not None:
            self._stop_follow(follow, error)
        else:
            self._parts.refuse(cid, error)

    def _torn_down_while_coming(self, plan_id: str) -> None:
        """The plan's calls whose blob still comes and that are not started (an action
        that takes its blob whole): each is refused, once its digest came (before, the
        hub drops an answer), instead of running after the teardown and making the
        plan's workspace anew (review13 finding 08). A started one (fs_write) is one of
        the plan's running calls: the teardown stops it."""
        error = WorkerError("cancelled", f"plan {plan_id!r} was torn down")
        for follow in self._follows.values():
            if plan_id and follow.request.plan_id == plan_id and follow.streamed is None:
                follow.torn_down = error

    def _stop_follow(self, follow: _Follow, error: WorkerError) -> None:
        """A blob that follows its request stops coming before its digest: the call,
        started, is refused (never claimed: its temporary file goes), and its parts
        held so far go."""
        cid = follow.request.correlation_id
        if self._follows.get(cid) is follow:
            del self._follows[cid]
        self._parts.release(cid)
        if follow.streamed is not None:
            follow.streamed.stop(error)
            follow.streamed.settle()
            if not follow.digest.done():  # the call's answer: why (see pipeline._no_digest)
                follow.digest.set_exception(error)
        else:
            self._parts.refuse(cid, error)
            follow.digest.cancel()

    def _submit_from_parts(self, req: pb.ActionRequest) -> None:
        """Submit a request whose blob came ahead of it in parts, joined in a thread
        (one copy, off the loop). One whose parts were refused, or do not add up, is
        refused, unless it repeats a call the worker knows (answered as a duplicate)."""
        cid = req.correlation_id
        digest: asyncio.Future[str] | None = None  # the hub's, when handed with the blob
        sha256: asyncio.Future[str] | None = None  # the blob's, the same way
        if self._link is not None and not self._parts.holds(cid):
            handed = self._link.take(self._session_id, cid)
            if handed is not None:  # held to the bounds of parts that came on the stream
                self._parts.add(cid, handed, 0)
                digest = self._link.take_digest(self._session_id, cid)
                sha256 = self._link.take_sha256(self._session_id, cid)
        try:
            parts = self._parts.take(cid, req.blob_in_parts)
        except WorkerError as error:
            self._cancelled_early.pop(cid, None)
            self.dispatcher.refuse_unless_known(req, error, digest)
            return
        if len(parts) == 1 and len(parts[0]) < HASH_OFF_LOOP_BYTES:
            assert not isinstance(parts[0], Arriving)  # a hub hands only a large blob so
            self._submit_unless_cancelled(req, bytes(parts[0]), digest=digest)
            return
        spec = self.dispatcher.registry.get(f"{req.surface}.{req.action}")
        if spec is not None and spec.blob_in_pieces:  # written out as they are: no join
            self._submit_unless_cancelled(req, b"", tuple(parts), digest=digest, sha256=sha256)
            return
        task = asyncio.create_task(self._join_then_submit(req, parts, digest))
        self._joins[cid] = task
        task.add_done_callback(lambda _task: self._joins.pop(cid, None))

    async def _join_then_submit(
        self,
        req: pb.ActionRequest,
        parts: list[Buffer | Arriving],
        digest: asyncio.Future[str] | None,
    ) -> None:
        try:
            # The blob's one copy: each part is a view of the envelope it came in; the
            # stream's copy thread joins them. A blob handed inside `up` as it comes (a
            # DispatchUpload's) is waited for, part by part, in a thread of its own: never
            # the stream's copy thread (its jobs never wait) nor the pool (review12
            # finding 01: calls waiting for bytes there held the threads others needed).
            if any(isinstance(part, Arriving) for part in parts):
                blob = await self.dispatcher.threads.apart(_joined, parts)
            else:
                whole = [part for part in parts if not isinstance(part, Arriving)]
                loop = asyncio.get_running_loop()
                blob = await loop.run_in_executor(_STREAM_COPIES, b"".join, whole)
        except ArrivalStopped as stopped:  # the hub stopped handing it: why
            self._cancelled_early.pop(req.correlation_id, None)
            reason = stopped.reason
            error = (
                reason
                if isinstance(reason, WorkerError)
                else WorkerError("cancelled", "the blob stopped coming; nothing was run")
            )
            self.dispatcher.refuse_unless_known(req, error, digest)
            return
        except BaseException as exc:
            self._cancelled_early.pop(req.correlation_id, None)
            if not isinstance(exc, Exception):
                raise
            log.exception("could not join the parts of call %s", req.correlation_id)
            error = WorkerError("internal_error", "the worker could not put the blob together")
            self.dispatcher.refuse_unless_known(req, error, digest)
            return
        self._submit_unless_cancelled(req, blob, digest=digest)

    def _submit_unless_cancelled(
        self,
        req: pb.ActionRequest,
        blob: bytes,
        pieces: tuple[Buffer | Arriving, ...] = (),
        *,
        digest: asyncio.Future[str] | None = None,
        sha256: asyncio.Future[str] | None = None,
    ) -> None:
        reason = self._cancelled_early.pop(req.correlation_id, None)
        if reason is None:
            self.dispatcher.submit(req, blob, pieces, handed=digest, handed_sha256=sha256)
            return
        self.dispatcher.refuse_unless_known(req, _cancelled(reason), digest)

    def _scope_request(self, request: pb.ScopeRequest) -> None:
        """Ask the person (the answer may take a while: the stream goes on meanwhile)."""
        if self.answer_scopes is None:
            self._send(pb.WorkerMessage(scope_decision=self._refuse_scopes(request)))
            return
        task = asyncio.create_task(self._answer_scopes(self.answer_scopes, request))
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)

    async def _answer_scopes(
        self,
        answer: Callable[[pb.ScopeRequest], Awaitable[pb.ScopeDecision]],
        request: pb.ScopeRequest,
    ) -> None:
        try:
            decision = await answer(request)
        except asyncio.CancelledError:
            log.info("scope request %r withdrawn: %s", request.request_id, SCOPE_REQUEST_EXPIRED)
            raise
        except Exception:
            log.exception("answering scope request %s failed", request.request_id)
            decision = self._refuse_scopes(request)
        self._send(pb.WorkerMessage(scope_decision=decision))

    def _refuse_scopes(self, request: pb.ScopeRequest) -> pb.ScopeDecision:
        # Grants come only from the person at this machine; with no one to ask, the answer is no.
        return pb.ScopeDecision(
            request_id=request.request_id,
            granted=False,
            scopes=request.scopes,
            reason="this worker runs headless: grants are made locally (config.toml or "
            "`agentworker grant`), never by the server",
        )

    # ------------------------------------------------------------- writing

    def _send(self, msg: Outgoing) -> None:
        """Queue a message, or an envelope part already built (bytes: a result)."""
        if self._outbox is not None:
            part = msg if isinstance(msg, bytes) else message_part(msg.SerializeToString())
            self._outbox.put_nowait(part)

    def _send_handed(self, result: HandedResult) -> None:
        """Queue a result that goes to the hub of this process by reference (as the
        writer sends its stub, `_hand_result`)."""
        if self._outbox is not None:
            self._outbox.put_nowait(result)

    def _hand_result(self, result: HandedResult) -> bool:
        """Hand the result to the hub of this process, as the writer sends its stub;
        False when this session is not (or no longer) local."""
        link = self._link
        return link is not None and link.hand_result(self._session_id, result)

    @property
    def outgoing_bytes(self) -> int:
        """Bytes waiting to go to the server on this session (0 offline)."""
        return 0 if self._outbox is None else self._outbox.waiting_bytes

    def _detach(self) -> None:
        self._outbox = None
        self._acks_or_offline.set()
        self.dispatcher.outbox.detach()
        self.connected.clear()
        self._withdraw_scope_requests()

    def _withdraw_scope_requests(self) -> None:
        """The session ended: its ScopeRequests still waiting for the person are
        withdrawn from their prompts, which close saying why. The hub answered each
        caller as the stream ended ("ask again once the worker is connected"), and a
        hub that started again knows none of them: an answer given later went down the
        next stream as a decision on no request there (review26). A grant the person
        made before this stays."""
        for task in list(self._answering):
            task.cancel(SCOPE_REQUEST_EXPIRED)
        self._answering.clear()

    async def _heartbeats(self) -> None:
        # A timer by nature: the protocol's heartbeat says "alive" every heartbeat_s.
        while True:
            self._send_heartbeat()
            await asyncio.sleep(self.heartbeat_s)

    def _kills_through(self) -> int:
        """The server's numbered kills recorded here, through which (0: none of the
        session's epoch)."""
        epoch, through = self.dispatcher.state.kill_mark()
        return through if epoch and epoch == self._kills_epoch else 0

    def _record_kill(self, kill: pb.KillPlan) -> None:
        if kill.plan_id or not kill.plan_digest:
            self.dispatcher.kill_plan(kill.plan_id, kill.reason, "server", kill.in_use)
        else:  # one its hub keeps by digest only (protocol 4: KillPlan.plan_digest)
            self.dispatcher.kill_digest(kill.plan_digest, kill.reason, "server")

    def _replayed_kill_lifted(self, kill: pb.KillPlan) -> bool:
        """Whether `kill` is one of this hub's kills (its epoch, its seq) recorded here
        before, under another key of the same address, that is no longer here: the
        person lifted it. The hub sends every kill again to a worker whose key changed
        (hub-workers.token rotated): one still in force is recorded anew (so it binds
        the new key too), one lifted stays lifted (review14 finding 07: the rotation
        undid every lift)."""
        state = self.dispatcher.state
        if not kill.seq or not self._kills_epoch:
            return False
        if kill.seq > state.hub_kills_recorded(self._kills_epoch):
            return False
        if kill.plan_id or not kill.plan_digest:
            if state.server_kill_of(kill.plan_id):
                return False
        elif state.kept_apart(kill.plan_digest):
            return False
        log.info(
            "kill of plan %r recorded here before and lifted since: stays lifted",
            kill.plan_id or f"(digest {kill.plan_digest})",
        )
        return True

    def _confirm_kills(self, epoch: str) -> None:
        self._confirming_kills = False
        if epoch != self._kills_epoch:
            return  # read in a session since ended: its kills come again
        self.dispatcher.state.mark_kills(epoch, self._kills_seen)
        if self._outbox is not None:
            self._send_heartbeat()

    def _send_heartbeat(self) -> None:
        d = self.dispatcher
        if d.draining:
            state = pb.Heartbeat.DRAINING
        elif d.in_flight() >= d.limits.max_concurrency:
            state = pb.Heartbeat.FULL
        else:
            state = pb.Heartbeat.AVAILABLE
        self._send(
            pb.WorkerMessage(
                heartbeat=pb.Heartbeat(
                    in_flight=d.in_flight(),
                    queued=d.queued(),
                    state=state,
                    unix_ms=now_ms(),
                    kills_through=self._kills_through(),
                )
            )
        )


# While this many bytes wait to go to the server, its messages wait to be read (until
# half have gone): a server that keeps asking for large answers (a finished call's
# result, replayed for each duplicate) and does not read them cannot grow the worker's
# memory beyond this; it stalls its own stream instead.
OUTBOX_HIGH_BYTES = 64 * 1024 * 1024


class _Outbox(asyncio.Queue[bytes | HandedResult | None]):
    """The stream's outgoing envelope parts (and results whose blobs go by reference,
    counted with them), and how many bytes of them wait."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting_bytes = 0
        self._has_room = asyncio.Event()
        self._has_room.set()

    def _put(self, item: bytes | HandedResult | None) -> None:
        super()._put(item)
        self.waiting_bytes += 0 if item is None else len(item)
        if self.waiting_bytes > OUTBOX_HIGH_BYTES:
            self._has_room.clear()

    def _get(self) -> bytes | HandedResult | None:
        item = super()._get()
        self.waiting_bytes -= 0 if item is None else len(item)
        if self.waiting_bytes <= OUTBOX_HIGH_BYTES // 2:
            self._has_room.set()
        return item

    @property
    def has_room(self) -> bool:
        return self._has_room.is_set()

    async def room(self) -> None:
        """Return once the outbox is below its bound (at once, nearly always)."""
        if not self._has_room.is_set():
            await self._has_room.wait()


async def _write_outbox(
    call: grpc.aio.StreamStreamCall | LocalCall,
    outbox: asyncio.Queue[bytes | HandedResult | None],
    hand: Callable[[HandedResult], bool],
) -> None:
    """The stream's only writer (concurrent writes would kill the stream), sending
    whatever queued up meanwhile as one envelope. A result is handed to the hub of
    this process (`hand`) just before its stub goes, in the order the results go; if
    it cannot be, the result goes whole."""
    batches: Batcher[bytes | HandedResult] = Batcher(outbox, len)
    try:
        while (batch := await batches.next_batch()) is not None:
            parts = [m if isinstance(m, bytes) else m.part(hand(m)) for m in batch]
            await call.write(envelope_of(parts))
        await call.done_writing()
    except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
        pass  # the stream is gone; the reader sees why and the session ends


# ------------------------------------------------------------- salvaging bad input

_LENGTH_DELIMITED = 2
_MESSAGES_FIELD = pb.ServerEnvelope.DESCRIPTOR.fields_by_name["messages"].number
_REQUEST_FIELD = pb.ServerMessage.DESCRIPTOR.fields_by_name["request"].number
_CORRELATION_FIELD = pb.ActionRequest.DESCRIPTOR.fields_by_name["correlation_id"].number
_BLOB_FIELD = pb.ActionRequest.DESCRIPTOR.fields_by_name["blob"].number
_BLOB_PART_FIELD = pb.ServerMessage.DESCRIPTOR.fields_by_name["blob_part"].number
_PART_DATA_FIELD = pb.BlobPart.DESCRIPTOR.fields_by_name["data"].number


def _fields(data: bytes) -> tuple[list[tuple[int, int, bytes | int]], bool]:
    """The top-level fields of a serialized message as (number, wire type, value), and
    whether the whole of `data` was read (False: it breaks off after those)."""
    fields: list[tuple[int, int, bytes | int]] = []
    pos = 0
    try:
        while pos < len(data):
            key, pos = read_varint(data, pos)
            number, wire_type = key >> 3, key & 7
            value: bytes | int
            if wire_type == 0:
                value, pos = read_varint(data, pos)
            elif wire_type == 1 or wire_type == 5:
                width = 8 if wire_type == 1 else 4
                if pos + width > len(data):
                    return fields, False
                value, pos = int.from_bytes(data[pos : pos + width], "little"), pos + width
            elif wire_type == _LENGTH_DELIMITED:
                length, pos = read_varint(data, pos)
                if pos + length > len(data):
                    return fields, False
                value, pos = data[pos : pos + length], pos + length
            else:
                return fields, False
            fields.append((number, wire_type, value))
    except ValueError:
        return fields, False
    return fields, True


def decode_with_blobs(
    envelope: bytes,
) -> list[tuple[pb.ServerMessage, memoryview | None]] | None:
    """A ServerEnvelope's messages, each request's blob and each blob part's data read
    apart from it as a view of the envelope (no copy: parsing the message and reading
    the field would copy it twice or more; see `_owned`); None when the envelope is
    anything but well formed, for the careful reading of `WorkerConnection._decode`."""
    try:
        decoded: list[tuple[pb.ServerMessage, memoryview | None]] = []
        for message in fields_of(envelope, _MESSAGES_FIELD):
            rest, part = split_field(message, _BLOB_PART_FIELD)
            if part is not None and not rest:  # a blob part: its data read apart too
                header, data = split_field(part, _PART_DATA_FIELD)
                msg = pb.ServerMessage(blob_part=pb.BlobPart.FromString(header))
                decoded.append((msg, _EMPTY if data is None else data))
                continue
            rest, request = split_field(message, _REQUEST_FIELD)
            if request is None or rest:  # not a request (alone): parsed as it is
                decoded.append((pb.ServerMessage.FromString(bytes(message)), None))
                continue
            bare, blob = split_field(request, _BLOB_FIELD)
            msg = pb.ServerMessage(request=pb.ActionRequest.FromString(bare))
            decoded.append((msg, _EMPTY if blob is None else blob))
        return decoded
    except (ValueError, DecodeError):
        return None


_EMPTY: Final = memoryview(b"")


class _Silence:
    """The server's silence on one stream, as far as the worker can tell it: looks
    `limit_s / SILENCE_LOOKS` apart, and the server taken for gone once
    SILENCE_LOOKS looks in a row found the worker waiting on a read (`listening`)
    and nothing come since the look before (`heard`).

    A look that finds something came, or the worker busy elsewhere (its own backlog
    draining ahead of what the server sent, or handling what came), starts the count
    over. A look that comes late, after the worker's own loop was held up (a loaded
    machine, a thread holding the GIL, a suspend), counts as one look all the same,
    never as the time it missed: what the server sent meanwhile waits unread in the
    transport and is read before the next look. So a stall of the worker's own is
    not taken for the server's silence (a deadline pushed back on each envelope took
    a stall past it for silence, though heartbeats waited to be read), while a
    server that says nothing is taken for gone after `limit_s` to
    `limit_s * (1 + 1 / SILENCE_LOOKS)`. One timer a look, none per envelope."""

    def __init__(self, limit_s: float, expire: Callable[[], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._look_s = limit_s / SILENCE_LOOKS
        self._expire = expire
        self.listening = False  # a read of the stream waits
        self.heard = False  # something came since the last look
        self.silent_looks = 0  # looks in a row that found nothing come
        self.busy_looks = 0  # looks that found the worker not reading (tests wait on it)
        self.looked = asyncio.Event()  # set at each look, and at the end (tests wait on it)
        self.closed = False  # the stream's reading ended
        self._timer = self._loop.call_later(self._look_s, self._look)

    def _look(self) -> None:
        if not self.listening:
            self.busy_looks += 1
        if self.heard or not self.listening:
            self.heard = False
            self.silent_looks = 0
        else:
            self.silent_looks += 1
        self.looked.set()
        if self.silent_looks >= SILENCE_LOOKS:
            self._expire()
            return
        self._timer = self._loop.call_later(self._look_s, self._look)

    def close(self) -> None:
        self._timer.cancel()
        self.closed = True
        self.looked.set()


async def _owned(
    decoded: list[tuple[pb.ServerMessage, memoryview | None]], envelope_bytes: int
) -> list[Buffer | None]:
    """The blobs of `decode_with_blobs` (of an envelope of `envelope_bytes`), each
    request's copied into bytes of its own (its call keeps it), and a part's data left
    a view of its envelope when that part alone is at least half of it: copied once,
    when joined, it keeps alive no more than twice the bytes it is counted as. Judged
    part by part: a tiny part beside a large one (refused, or another call's) would
    otherwise pin the whole envelope while counted as a few bytes. Large copies are
    made in a thread."""
    kept = [_kept_as_view(msg, blob, envelope_bytes) for msg, blob in decoded]
    copied = sum(
        len(blob) for (_msg, blob), view in zip(decoded, kept, strict=True) if blob and not view
    )
    if copied < HASH_OFF_LOOP_BYTES:
        return _copies(decoded, kept)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_STREAM_COPIES, _copies, decoded, kept)


# The stream's own copies (a large envelope's blobs, a blob's parts joined): a thread
# apart from the worker's pool. In the pool, the reader's copy waited behind calls
# whose threads wait for parts only the reader can bring: nothing more was read (no
# part, Cancel, KillPlan or heartbeat) until the silence limit dropped the stream
# (review12 finding 01). Its jobs only copy: they never wait on anything.
_STREAM_COPIES: Final = ThreadPoolExecutor(1, thread_name_prefix="agentworker-stream")


def _kept_as_view(msg: pb.ServerMessage, blob: memoryview | None, envelope_bytes: int) -> bool:
    return blob is not None and msg.HasField("blob_part") and len(blob) * 2 >= envelope_bytes


def _copies(
    decoded: list[tuple[pb.ServerMessage, memoryview | None]], kept: list[bool]
) -> list[Buffer | None]:
    return [
        blob if blob is None or view else bytes(blob)
        for (_msg, blob), view in zip(decoded, kept, strict=True)
    ]


def split_messages(envelope: bytes) -> tuple[list[bytes], bool]:
    """A ServerEnvelope's messages, each still serialized, and whether its framing was
    whole (what follows a break cannot be told apart from noise, and is dropped)."""
    fields, intact = _fields(envelope)
    parts = []
    for number, wire_type, value in fields:
        if number == _MESSAGES_FIELD and wire_type == _LENGTH_DELIMITED:
            assert isinstance(value, bytes)
            parts.append(value)
    return parts, intact


def request_id_of(message: bytes) -> str | None:
    """The correlation id of a serialized ServerMessage that is a request, when it can
    be read as a sane id even though the message as a whole does not decode."""
    for number, wire_type, value in _fields(message)[0]:
        if number != _REQUEST_FIELD or wire_type != _LENGTH_DELIMITED:
            continue
        assert isinstance(value, bytes)
        for inner, inner_type, raw in _fields(value)[0]:
            if inner == _CORRELATION_FIELD and inner_type == _LENGTH_DELIMITED:
                assert isinstance(raw, bytes)
                try:
                    cid = raw.decode("utf-8")
                except UnicodeDecodeError:
                    return None
                return None if id_problem("correlation_id", cid, required=True) else cid
    return None


# Requests whose blobs follow them (protocol 3) held at once: a hub sends a call's
# transfer whole before the next (one or two at a time); past this one is not taken.
MAX_FOLLOWING: Final = 64


@dataclass(eq=False)
class _Follow:
    """A request whose blob follows it (protocol 3), until the blob's end came with the
    call's digest: `streamed`, the blob as it comes, handed to the call already started
    (None: its parts are held as protocol 2's, in `BlobParts`), and `digest`, the future
    the call waits on (resolved by the end, cancelled if the blob stops coming)."""

    request: pb.ActionRequest
    streamed: Following | None
    digest: asyncio.Future[str]
    received: int = 0
    torn_down: WorkerError | None = None  # its plan's teardown came meanwhile


def _follow_refused(why: str) -> WorkerError:
    return WorkerError(
        "validation_error",
        f"the request's blob, sent after it, did not come as it must: {why}; nothing was "
        "run: send the call again",
    )


def _cancelled(reason: str) -> WorkerError:
    return WorkerError("cancelled", f"cancelled before it started: {reason}")


# The longest wait a server's retry-after-ms makes the worker take.
RETRY_AFTER_MAX_S: Final = 60.0


def retry_after(exc: grpc.aio.AioRpcError) -> float:
    """How long a server that refused the stream busy (RESOURCE_EXHAUSTED, with
    RETRY_AFTER_KEY in its trailing metadata) asked this worker to wait, in seconds
    (at most RETRY_AFTER_MAX_S); 0 when it did not ask."""
    if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return 0.0
    for key, value in exc.trailing_metadata() or ():
        if key == RETRY_AFTER_KEY:
            text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
            try:
                return min(RETRY_AFTER_MAX_S, max(0.0, int(text) / 1000))
            except ValueError:
                return 0.0
    return 0.0


def enrolment_of(exc: grpc.aio.AioRpcError) -> str:
    """Why a hub did not serve this worker's Hello (ENROLMENT_KEY), '' if it did not say."""
    for key, value in exc.trailing_metadata() or ():
        if key == ENROLMENT_KEY:
            return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return ""


def _raise_if_fatal(exc: grpc.aio.AioRpcError) -> None:
    if exc.code() == grpc.StatusCode.PERMISSION_DENIED and enrolment_of(exc) in ENROLMENT_RETRIED:
        return  # waits for the hub's operator: tried again (see ENROLMENT_KEY)
    if exc.code() in FATAL_CODES:
        raise FatalConnectionError(
            f"the server refused this worker ({exc.code().name}): {exc.details()}"
        ) from exc


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc) or type(exc).__name__


def _joined(parts: list[Buffer | Arriving]) -> bytes:
    """A blob's parts joined (in a thread: a part still coming is waited for)."""
    return b"".join(each_part(parts))
