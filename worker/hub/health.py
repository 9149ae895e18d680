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
import functools
import hmac
import ipaddress
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2

from worker.hub.rates import Rate
from worker.hub.turns import Turns
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
# How long a call holds its turn without its request before a waiting call may take it.
HEALTH_PROMPT_S: Final = 2.0
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


@dataclass(eq=False)
class _Holder:
    """A call holding a turn, its request not read yet."""

    budget: asyncio.Timeout
    since: float
    rank: int
    gave_up: bool = False  # its turn went to a waiting call
    timer: asyncio.TimerHandle | None = None


@functools.lru_cache(maxsize=4096)
def address_of(peer: str) -> str:
    """Where a connection comes from, as gRPC names it (`context.peer()`): its address
    without the port ("ipv4:10.0.0.7"); for IPv6 its /64, which one host or site holds
    whole ("ipv6:2001:db8::/64"), an IPv4 one mapped into IPv6 as IPv4; any other peer
    (a Unix socket's "unix:") as it is."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return peer
    host = urllib.parse.unquote(rest.rsplit(":", 1)[0]).strip("[]").split("%", 1)[0]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return peer
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return f"ipv4:{ip.ipv4_mapped}"
        return f"ipv6:{ipaddress.IPv6Network((ip, 64), strict=False)}"
    return f"ipv4:{ip}"


class Health:
    """Check and Watch for the services named `served` (and "", the hub itself)."""

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
        self.served = frozenset({"", *served})
        self._read = read
        self._tokens = [f"Bearer {t}".encode() for t in (token, workers_token) if t]
        self.reads = Turns(HEALTH_READS_AT_ONCE, 1)  # tokenless calls'
        self.own_reads = Turns(HEALTH_READS_AT_ONCE, 1)  # calls with the callers' token
        self.watches = _Watches(watches_held, watches_per_connection)
        # The bounds, attributes so that a test may make them small.
        self.read_within_s = HEALTH_READ_WITHIN_S
        self.prompt_s = HEALTH_PROMPT_S
        self.waiting_most = HEALTH_WAITING
        self.waiting_late = HEALTH_WAITING_LATE
        self.calls_per_connection = HEALTH_CALLS_PER_CONNECTION
        self.calls: dict[str, int] = {}  # connection -> tokenless calls waiting or read
        self.late_connections = Rate(1, 1 / HEALTH_LATE_FOR_S)
        self.late_addresses = Rate(
            HEALTH_LATE_PER_ADDRESS, HEALTH_LATE_PER_ADDRESS / HEALTH_LATE_FOR_S
        )
        self._holders: set[_Holder] = set()

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

    def rank(self, peer: str, now: float) -> int:
        """2 if `peer`'s (a connection's) requests came late, 1 if its address's did, else
        0: a call waits behind those of lower ranks."""
        if self.late_connections.wait_s(peer, now) > 0:
            return 2
        return int(self.late_addresses.wait_s(address_of(peer), now) > 0)

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

    async def _admit(self, context: grpc.aio.ServicerContext, peer: str, now: float) -> int:
        """The rank a tokenless call of `peer` waits with; refused busy at once, unread,
        past the bounds."""
        busy = None
        rank = self.rank(peer, now)
        if self.calls.get(peer, 0) >= self.calls_per_connection:
            busy = (
                f"{self.calls_per_connection} health calls of this connection already wait "
                "to be read; a health check sends its request with the call: wait for "
                "their answers"
            )
        elif self.reads.waiting() >= self.waiting_most:
            busy = f"{self.waiting_most} health calls already wait to be read; ask again later"
        elif rank == 2 and self.reads.waiting(2) >= self.waiting_late:
            busy = (
                "this connection's health requests came late, and "
                f"{self.waiting_late} such calls already wait; send the request with the call"
            )
        if busy is not None:
            await self._abort_busy(context, busy)
        return rank

    async def _named(self, context: grpc.aio.ServicerContext) -> str:
        """The service the call's request names, read in turn; a refusal otherwise."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        peer = context.peer()
        within_s = self.read_within_s
        if await self._own(context):
            reads, rank = self.own_reads, 0
            if reads.waiting() >= self.waiting_most:
                await self._abort_busy(
                    context,
                    f"{self.waiting_most} health calls already wait to be read; ask again later",
                )
        else:
            reads, rank = self.reads, await self._admit(context, peer, start)
            self.calls[peer] = self.calls.get(peer, 0) + 1
        request: Any = None
        holder: _Holder | None = None
        try:
            async with asyncio.timeout_at(start + within_s) as budget:
                if reads is self.reads:
                    loop.call_soon(self._give_turns)  # once this call waits, if it does
                async with reads.turn(peer, rank=rank):
                    now = loop.time()  # its rank now: its connection may have gone late
                    holder = _Holder(budget, now, self.rank(peer, now))
                    if reads is self.reads:
                        self._holders.add(holder)
                        holder.timer = loop.call_at(now + self.prompt_s, self._give_turns)
                    try:
                        request = await context.read()
                    finally:
                        if reads is self.reads:  # before its turn is handed on
                            self._let_go(peer, holder, request is None)
        except TimeoutError:
            request = None
        finally:
            if reads is self.reads:
                self._leave(peer)
        if request is None and holder is None:
            await self._abort_busy(
                context,
                f"waited {within_s:g} s for a turn to have the health request read (others' "
                "calls held the turns); ask again",
            )
        if request is None and holder is not None and holder.gave_up:
            await self._abort_busy(
                context,
                "the health request had not come when others waited for the turn to be read; "
                "send the request with the call",
            )
        if request is None:
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

    def _leave(self, peer: str) -> None:
        left = self.calls[peer] - 1
        if left:
            self.calls[peer] = left
        else:
            del self.calls[peer]

    def _let_go(self, peer: str, holder: _Holder, unread: bool) -> None:
        """A tokenless call ends its turn: one that held it without its request coming
        (its time ran out, it gave the turn up, or its caller went) makes its connection
        late, and counts against its address (HEALTH_LATE_PER_ADDRESS); the waiting
        calls of those go behind the others of lower ranks."""
        self._holders.discard(holder)
        if holder.timer is not None:
            holder.timer.cancel()
        if not unread:
            return
        now = asyncio.get_running_loop().time()
        waits_s = self.late_connections.wait_s(peer, now)
        if not waits_s:  # a connection late anew: its address counts it
            self.late_addresses.take(address_of(peer), now)
        if waits_s < HEALTH_LATE_FOR_S:  # late twice as long at most
            self.late_connections.take(peer, now)
        self.reads.put_behind(lambda waiting: self.rank(waiting, now))

    def _give_turns(self) -> None:
        """Turns held by calls whose requests have not come go to waiting calls that could
        take them: at once to a call of a lower rank, HEALTH_PROMPT_S into the turn to one
        of the same (a freed turn goes to the lowest rank waiting: worker.hub.turns)."""
        now = asyncio.get_running_loop().time()
        wanting = [self.reads.wanting(rank) for rank in range(3)]
        for holder in sorted(self._holders, key=lambda h: (-h.rank, h.since)):
            lowest = next((rank for rank, count in enumerate(wanting) if count), None)
            if lowest is None:
                return
            if (
                holder.gave_up
                or lowest < holder.rank
                or (lowest == holder.rank and now - holder.since >= self.prompt_s)
            ):
                wanting[lowest] -= 1  # this holder's turn goes to that call
                if not holder.gave_up:
                    holder.gave_up = True
                    holder.budget.reschedule(now)
