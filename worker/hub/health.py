"""gRPC health (`grpc.health.v1.Health`), open without the token: Check and Watch.

A service the hub serves ("" for the hub as a whole, and the names of its own services)
is SERVING while the hub serves; any other name is one it does not serve: Check answers
NOT_FOUND and Watch tells SERVICE_UNKNOWN, as the health protocol says. To know the name
the request is read, and gRPC reads a request whole, up to the server's 32 MiB limit,
before it hands it over (grpc_health's servicer, a unary one, had sixteen tokenless
31 MiB Checks at once take the hub from 62 MiB to 1.2 GB). So a call's request is read
when its turn comes, as ControlService's are (`worker.hub.turns`): two at once, one of
them per connection; a call waiting for its turn holds its request unread (what HTTP/2
took in of it, 64 KiB at most). A request longer than a service name needs is refused.

A turn is held until the request has come, so calls that never send theirs held both
turns 10 s each and filled the queue: one burst of 66 tokenless calls starved every
other health check for minutes (review11 finding 05). So, for calls without the token:
- a call has HEALTH_READ_WITHIN_S from its start, waiting and reading together;
- a connection has at most HEALTH_CALLS_PER_CONNECTION calls waiting or being read, and
  all callers HEALTH_WAITING waiting; another is answered busy at once, unread;
- a call that held a turn without its request coming makes its connection late for
  HEALTH_LATE_FOR_S, and its address too (an IPv6 one by its /64) while its connections
  go late faster than HEALTH_LATE_PER_ADDRESS in that time. Calls are ranked: 0, 1 if
  their address is late, 2 if their connection is; a call waits behind those of lower
  ranks, and of rank 2 HEALTH_WAITING_LATE wait at most;
- a call whose request has not come gives its turn up (busy) to a waiting call that
  could take it: at once if that call's rank is lower, HEALTH_PROMPT_S into the turn if
  it is the same.
This is worker.hub.turns.Gate, which worker streams' Hellos are read through too.
A health check sends its request with the call (gRPC's clients, probes and load
balancers do), so it is read as its turn comes and its connection is never late; one
on a connection of its own goes ahead of every connection that was.
A call presenting the callers' token (hub.token) is read on turns of its own, behind no
tokenless call; one presenting a token that is neither the callers' nor the workers' is
refused UNAUTHENTICATED, unread.

A Watch is told its status and then nothing until the hub stops (its services never
change), so the hub holds few of them open: HEALTH_WATCHES_HELD of all callers',
HEALTH_WATCHES_PER_CONNECTION of one connection's; any other is told its status and
ended, as a Check is (gRPC's health-checking clients watch again when a stream ends).
Held without a bound, 2,400 tokenless Watch calls took the hub from 63 to 255 MiB
(review9 finding 04).
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Final

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2

from worker.hub.turns import Gate, Turns, Unread, address_of

__all__ = ["HEALTH_SERVICE", "Health", "address_of"]
from worker.wire.auth import presented_token

HEALTH_SERVICE: Final = "grpc.health.v1.Health"
HEALTH_WATCHES_HELD: Final = 64
HEALTH_WATCHES_PER_CONNECTION: Final = 4
# Requests read at once, and of them one connection's; how long a call may take from its
# start to its request read, waiting for its turn included (a health request is a name:
# it comes with the call; 2 s from the turn failed a plain Check at load 22).
HEALTH_READS_AT_ONCE: Final = 2
HEALTH_READ_WITHIN_S: Final = 10.0
# Calls waiting for a turn to be read, at most; another is answered RESOURCE_EXHAUSTED.
HEALTH_WAITING: Final = 64
# Tokenless calls one connection may have waiting or being read; another is answered
# RESOURCE_EXHAUSTED at once (a health client has one at a time).
HEALTH_CALLS_PER_CONNECTION: Final = 4
# How long a call holds its turn without its request before a waiting call may take it,
# and within which its request comes or its connection goes late (a check sends it with
# the call: it is there as the turn comes). At 2 s, callers sending theirs 1.7 s into
# each turn were never late and kept every check out (review14 finding 03).
HEALTH_PROMPT_S: Final = 0.5
HEALTH_READY_S: Final = HEALTH_PROMPT_S
# A connection whose call held a turn and sent no request is late this long; the address
# it comes from is late while its connections go late faster than this many in that
# time. Of late connections' calls, this many wait at most.
HEALTH_LATE_FOR_S: Final = 60.0
HEALTH_LATE_PER_ADDRESS: Final = 3
HEALTH_WAITING_LATE: Final = 8
# The longest request taken: a HealthCheckRequest carries one service name.
HEALTH_REQUEST_BYTES: Final = 1024

_Status = health_pb2.HealthCheckResponse
_SERVING: Final = _Status(status=_Status.SERVING).SerializeToString()
_UNKNOWN: Final = _Status(status=_Status.SERVICE_UNKNOWN).SerializeToString()


class _Watches:
    """The Watch calls held open, by connection (gRPC's `context.peer()`)."""

    def __init__(self, most: int, per_connection: int) -> None:
        self.most = most
        self.per_connection = per_connection
        self.by_peer: dict[str, int] = {}
        self.held = 0

    async def hold(self, peer: str) -> None:
        """Until the call or the hub ends, if there is room to hold it; else at once."""
        if self.held >= self.most or self.by_peer.get(peer, 0) >= self.per_connection:
            return
        self.held += 1
        self.by_peer[peer] = self.by_peer.get(peer, 0) + 1
        try:
            await asyncio.Event().wait()  # no change to tell until the call or the hub ends
        finally:
            self.held -= 1
            left = self.by_peer[peer] - 1
            if left:
                self.by_peer[peer] = left
            else:
                del self.by_peer[peer]


class Health(Gate):
    """Check and Watch for the services named `served` (and "", the hub itself); its
    tokenless calls' requests are read through the Gate (worker.hub.turns)."""

    def __init__(
        self,
        served: Iterable[str],
        *,
        token: str | None = None,
        workers_token: str | None = None,
        watches_held: int = HEALTH_WATCHES_HELD,
        watches_per_connection: int = HEALTH_WATCHES_PER_CONNECTION,
        read: Callable[[int], None] = lambda _nbytes: None,
    ) -> None:
        """`read(nbytes)` is told each request's size once it was read (the hub gives
        the memory of large ones back once they stop: worker.memory.IdleGiveBack).
        `token`, the callers': a call that presents it is read on turns of its own."""
        super().__init__(  # the tokenless calls' reads (`reads`), a turn per connection
            HEALTH_READS_AT_ONCE,
            1,
            read_within_s=HEALTH_READ_WITHIN_S,
            prompt_s=HEALTH_PROMPT_S,
            ready_s=HEALTH_READY_S,
            waiting_most=HEALTH_WAITING,
            waiting_late=HEALTH_WAITING_LATE,
            calls_per_connection=HEALTH_CALLS_PER_CONNECTION,
            late_for_s=HEALTH_LATE_FOR_S,
            late_per_address=HEALTH_LATE_PER_ADDRESS,
        )
        self.served = frozenset({"", *served})
        self._read = read
        self._tokens = [f"Bearer {t}".encode() for t in (token, workers_token) if t]
        self.own_reads = Turns(HEALTH_READS_AT_ONCE, 1)  # calls with the callers' token
        self.watches = _Watches(watches_held, watches_per_connection)

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            HEALTH_SERVICE,
            {
                "Check": grpc.stream_stream_rpc_method_handler(self.check),
                "Watch": grpc.stream_stream_rpc_method_handler(self.watch),
            },
        )

    async def check(
        self, _requests: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        if await self._named(context) not in self.served:
            await context.abort(grpc.StatusCode.NOT_FOUND, self._unknown())
        yield _SERVING

    async def watch(
        self, _requests: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        if await self._named(context) not in self.served:
            yield _UNKNOWN  # and ended: the hub's services never change
            return
        yield _SERVING
        await self.watches.hold(context.peer())

    def _unknown(self) -> str:
        names = ", ".join(repr(name) for name in sorted(self.served))
        return f'the hub serves {names} ("": the hub itself), not the service this names'

    async def _own(self, context: grpc.aio.ServicerContext) -> bool:
        """Whether the call presents the callers' token; refused if it presents a token
        that is not the hub's."""
        presented = presented_token(context.invocation_metadata())
        if not presented:
            return False
        for index, token in enumerate(self._tokens):
            if hmac.compare_digest(presented, token):
                return index == 0  # the workers' token: read as a tokenless call is
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            "this health call presents a token the hub does not know; health needs none: "
            "send none, or hub.token (from the config dir) to be read ahead of tokenless calls",
        )
        raise AssertionError("unreachable: abort raises")

    async def _admit(self, context: grpc.aio.ServicerContext, peer: str, now: float) -> None:
        """Refuse a tokenless call of `peer` busy at once, unread, past the bounds."""
        past = self.admit(peer, address_of(peer), now)
        if past is None:
            return
        if past == "peer":
            busy = (
                f"{self.calls_per_connection} health calls of this connection already wait "
                "to be read; a health check sends its request with the call: wait for "
                "their answers"
            )
        elif past == "late":
            busy = (
                "this connection's health requests came late, and "
                f"{self.waiting_late} such calls already wait; send the request with the call"
            )
        else:
            busy = f"{self.waiting_most} health calls already wait to be read; ask again later"
        await self._abort_busy(context, busy)

    async def _named(self, context: grpc.aio.ServicerContext) -> str:
        """The service the call's request names, read in turn; a refusal otherwise."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        peer = context.peer()
        within_s = self.read_within_s
        request: Any = None
        if await self._own(context):
            if self.own_reads.waiting() >= self.waiting_most:
                await self._abort_busy(
                    context,
                    f"{self.waiting_most} health calls already wait to be read; ask again later",
                )
            turned = False
            try:
                async with asyncio.timeout_at(start + (within_s or 0.0)):
                    async with self.own_reads.turn(peer):
                        turned = True
                        request = await context.read()
            except TimeoutError:
                if not turned:
                    await self._abort_busy(
                        context,
                        f"waited {within_s:g} s for a turn to have the health request read "
                        "(others' calls held the turns); ask again",
                    )
                await context.abort(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"the health request did not arrive within {within_s:g} s of the call's "
                    "start; send it with the call",
                )
        else:
            await self._admit(context, peer, start)
            try:
                request = await self.read(peer, address_of(peer), context.read, start=start)
            except Unread as unread:
                if unread.why == "waited":
                    await self._abort_busy(
                        context,
                        f"waited {within_s:g} s for a turn to have the health request read "
                        "(others' calls held the turns); ask again",
                    )
                if unread.why == "pushed_out":
                    await self._abort_busy(
                        context,
                        "its place among the health calls waiting went to a caller with fewer "
                        "of them waiting; ask again",
                    )
                if unread.why == "gave_up":
                    await self._abort_busy(
                        context,
                        "the health request had not come when others waited for the turn to "
                        "be read; send the request with the call",
                    )
                await context.abort(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"the health request did not arrive within {within_s:g} s of the call's "
                    "start; send it with the call",
                )
        if request is grpc.aio.EOF:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call carried no request")
        size = len(request)
        self._read(size)
        if size > HEALTH_REQUEST_BYTES:
            del request  # the refusal's frames outlive the call: not with 32 MiB in them
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the health request is {size:,} bytes, over the {HEALTH_REQUEST_BYTES:,} "
                "a service name takes",
            )
        try:
            return str(health_pb2.HealthCheckRequest.FromString(request).service)
        except (DecodeError, UnicodeDecodeError):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "the health request is not a HealthCheckRequest"
            )
            raise  # unreachable: abort raises

    @staticmethod
    async def _abort_busy(context: grpc.aio.ServicerContext, why: str) -> None:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"busy: {why}")
