"""Bearer-token check for the hub's own services, and gRPC health, open to all.

The check is a handler lookup, not a server interceptor: gRPC asks a generic
handler for each call's method handler synchronously, where an interceptor costs
every RPC an extra coroutine and await on the hub's loop (a Dispatch is one RPC).
Either way it runs before the request is read, and a refused call's request is never
read (see `_refusal`).
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import AsyncIterator, Sequence
from typing import Any, Final

import grpc
from grpc_health.v1 import health_pb2

REFUSAL = "a valid bearer token is required (see hub.token in the config dir)"
WORKERS_ONLY = (
    "this is the workers' token (hub-workers.token): it lets a worker serve, not call; "
    "callers use hub.token"
)
# Every method of the worker's own service, as gRPC names them.
WORKER_METHODS: Final = "/agentworker.v1.WorkerService/"


class BearerAuth(grpc.GenericRpcHandler):  # type: ignore[misc]  # grpc is untyped
    """`handlers` behind the tokens: the callers' token opens every method; the
    workers' token opens only the methods of `WORKER_SERVICE` (a worker's machine
    holds it, and must not be able to send calls to other workers). A call that
    presents neither gets a handler that answers UNAUTHENTICATED, whatever method it
    names; the workers' token on another method gets PERMISSION_DENIED."""

    def __init__(
        self,
        token: str,
        handlers: Sequence[grpc.GenericRpcHandler],
        *,
        workers_token: str | None = None,
    ) -> None:
        self._expected = f"Bearer {token}".encode()
        self._workers = f"Bearer {workers_token}".encode() if workers_token else None
        self._handlers = tuple(handlers)

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        for routes in self._handlers:
            handler = routes.service(details)
            if handler is not None:
                break
        else:
            return None  # not ours: UNIMPLEMENTED, or health (health_service, open)
        presented = _presented(details)
        if hmac.compare_digest(presented, self._expected):
            return handler
        if self._workers is not None and hmac.compare_digest(presented, self._workers):
            return handler if details.method.startswith(WORKER_METHODS) else _WORKERS_ONLY
        return _REFUSED


def _presented(details: grpc.HandlerCallDetails) -> bytes:
    for key, value in details.invocation_metadata or ():
        if key == "authorization":
            return value.encode() if isinstance(value, str) else bytes(value)
    return b""


async def _abort(_requests: Any, context: grpc.aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSAL)


async def _abort_workers_only(_requests: Any, context: grpc.aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.PERMISSION_DENIED, WORKERS_ONLY)


# What a call without the token gets, whatever its method: a streaming handler, which
# never reads the request (the wire is the same for a unary call). For a unary method
# gRPC reads the whole request (up to the 32 MiB limit) before its handler runs, so
# sixteen tokenless 30 MiB calls at once took the hub from 62 to 708 MiB resident.
_REFUSED: Final = grpc.stream_stream_rpc_method_handler(_abort)
_WORKERS_ONLY: Final = grpc.stream_stream_rpc_method_handler(_abort_workers_only)


# gRPC health, open without the token, answered without reading the request: for a
# unary method gRPC reads the request whole first, up to the server's 32 MiB limit,
# and sixteen tokenless 31 MiB Health/Check calls at once took the hub from 62 MiB to
# 1.2 GB (grpc_health's servicer is one). The hub serves one thing, so the answer is
# the same whatever service the request names: SERVING while the hub serves.
HEALTH_SERVICE: Final = "grpc.health.v1.Health"
_SERVING: Final = health_pb2.HealthCheckResponse(
    status=health_pb2.HealthCheckResponse.SERVING
).SerializeToString()
# Watch calls held open at once (a watcher is told SERVING and then nothing more until
# the hub stops, so a held one costs the hub its call, its task and what HTTP/2 took in
# of its unread request, ~80 KiB): at most this many of all callers', and of them this
# many of one connection's. Any other Watch is told SERVING and ended at once, as Check
# is: a watcher that wants more watches again (gRPC's health-checking clients retry a
# stream that ended). Held for ever without a bound, 2,400 tokenless Watch calls took the
# hub from 63 to 255 MiB (review9 finding 04).
HEALTH_WATCHES_HELD: Final = 64
HEALTH_WATCHES_PER_CONNECTION: Final = 4


async def _check(_requests: Any, _context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    yield _SERVING


class _Watches:
    """The Watch calls held open, by connection (gRPC's `context.peer()`)."""

    def __init__(self, held: int, per_connection: int) -> None:
        self.most = held
        self.per_connection = per_connection
        self.by_peer: dict[str, int] = {}
        self.held = 0

    async def watch(
        self, _requests: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        yield _SERVING
        peer = context.peer()
        if self.held >= self.most or self.by_peer.get(peer, 0) >= self.per_connection:
            return  # told SERVING and ended, as Check
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


def health_service(
    held: int = HEALTH_WATCHES_HELD, per_connection: int = HEALTH_WATCHES_PER_CONNECTION
) -> grpc.GenericRpcHandler:
    """grpc.health.v1.Health's Check and Watch, whose requests are never read; at most
    `held` Watch calls held open (`per_connection` of one connection's), the others
    answered and ended."""
    watches = _Watches(held, per_connection)
    return grpc.method_handlers_generic_handler(
        HEALTH_SERVICE,
        {
            "Check": grpc.stream_stream_rpc_method_handler(_check),
            "Watch": grpc.stream_stream_rpc_method_handler(watches.watch),
        },
    )
