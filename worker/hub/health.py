"""gRPC health (`grpc.health.v1.Health`), open without the token: Check and Watch.

A service the hub serves ("" for the hub as a whole, and the names of its own services)
is SERVING while the hub serves; any other name is one it does not serve: Check answers
NOT_FOUND and Watch tells SERVICE_UNKNOWN, as the health protocol says. To know the name
the request is read, and gRPC reads a request whole, up to the server's 32 MiB limit,
before it hands it over (grpc_health's servicer, a unary one, had sixteen tokenless
31 MiB Checks at once take the hub from 62 MiB to 1.2 GB). So a call's request is read
when its turn comes, as ControlService's are (`worker.hub.turns`): two at once, one of
them per connection, each within HEALTH_READ_WITHIN_S; a call waiting for its turn
holds its request unread (what HTTP/2 took in of it, 64 KiB at most), and past
HEALTH_WAITING such calls a new one is answered busy at once. A request longer than a
service name needs is refused.

A Watch is told its status and then nothing until the hub stops (its services never
change), so the hub holds few of them open: HEALTH_WATCHES_HELD of all callers',
HEALTH_WATCHES_PER_CONNECTION of one connection's; any other is told its status and
ended, as a Check is (gRPC's health-checking clients watch again when a stream ends).
Held without a bound, 2,400 tokenless Watch calls took the hub from 63 to 255 MiB
(review9 finding 04).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Final

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2

from worker.hub.turns import Turns

HEALTH_SERVICE: Final = "grpc.health.v1.Health"
HEALTH_WATCHES_HELD: Final = 64
HEALTH_WATCHES_PER_CONNECTION: Final = 4
# Requests read at once, and of them one connection's; how long a request may take to
# arrive once its turn came (a health request is a name: it comes with the call; 2 s
# was too short for a hub sharing two cores with a load of 20).
HEALTH_READS_AT_ONCE: Final = 2
HEALTH_READ_WITHIN_S: Final = 10.0
# Calls waiting for a turn to be read, at most; another is answered RESOURCE_EXHAUSTED.
HEALTH_WAITING: Final = 64
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


class Health:
    """Check and Watch for the services named `served` (and "", the hub itself)."""

    def __init__(
        self,
        served: Iterable[str],
        *,
        watches_held: int = HEALTH_WATCHES_HELD,
        watches_per_connection: int = HEALTH_WATCHES_PER_CONNECTION,
        read: Callable[[int], None] = lambda _nbytes: None,
    ) -> None:
        """`read(nbytes)` is told each request's size once it was read (the hub gives
        the memory of large ones back once they stop: worker.memory.IdleGiveBack)."""
        self.served = frozenset({"", *served})
        self._read = read
        self.reads = Turns(HEALTH_READS_AT_ONCE, 1)
        self.watches = _Watches(watches_held, watches_per_connection)
        self.read_within_s = HEALTH_READ_WITHIN_S

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

    async def _named(self, context: grpc.aio.ServicerContext) -> str:
        """The service the call's request names, read in turn; a refusal otherwise."""
        if self.reads.waiting() >= HEALTH_WAITING:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"busy: {HEALTH_WAITING} health calls already wait to be read; ask again later",
            )
        request: Any = None
        async with self.reads.turn(context.peer()):
            try:
                async with asyncio.timeout(self.read_within_s):
                    request = await context.read()
            except TimeoutError:
                request = None
        if request is None:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the health request did not arrive within {self.read_within_s:g} s of its "
                "turn to be read; send it with the call",
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
