"""Bearer-token check for the hub's own services (gRPC health, open to all, is
worker.hub.health).

The check is a handler lookup, not a server interceptor: gRPC asks a generic
handler for each call's method handler synchronously, where an interceptor costs
every RPC an extra coroutine and await on the hub's loop (a Dispatch is one RPC).
Either way it runs before the request is read, and a refused call's request is never
read (see `_refusal`).
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from typing import Any, Final

import grpc

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
            return None  # not ours: UNIMPLEMENTED, or health (worker.hub.health, open)
        presented = presented_token(details.invocation_metadata)
        if hmac.compare_digest(presented, self._expected):
            return handler
        if self._workers is not None and hmac.compare_digest(presented, self._workers):
            return handler if details.method.startswith(WORKER_METHODS) else _WORKERS_ONLY
        return _REFUSED


def presented_token(metadata: Any) -> bytes:
    """The `authorization` a call's metadata presents ("Bearer <token>"; b"": none)."""
    for key, value in metadata or ():
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
