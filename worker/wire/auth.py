"""Bearer-token check for the hub's own services (gRPC health stays open).

The check is a handler lookup, not a server interceptor: gRPC asks a generic
handler for each call's method handler synchronously, where an interceptor costs
every RPC an extra coroutine and await on the hub's loop (a Dispatch is one RPC).
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from typing import Any

import grpc

REFUSAL = "a valid bearer token is required (see hub.token in the config dir)"


class BearerAuth(grpc.GenericRpcHandler):  # type: ignore[misc]  # grpc is untyped
    """`handlers` behind the token: a call that does not present it gets a handler
    that answers UNAUTHENTICATED, whatever method it names."""

    def __init__(self, token: str, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._expected = f"Bearer {token}".encode()
        self._handlers = tuple(handlers)

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        for routes in self._handlers:
            handler = routes.service(details)
            if handler is not None:
                break
        else:
            return None  # not ours: UNIMPLEMENTED, or another handler's (health)
        if hmac.compare_digest(_presented(details), self._expected):
            return handler
        return _refusal(handler, REFUSAL)


def _presented(details: grpc.HandlerCallDetails) -> bytes:
    for key, value in details.invocation_metadata or ():
        if key == "authorization":
            return value.encode() if isinstance(value, str) else bytes(value)
    return b""


def _refusal(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    async def abort(_request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(abort)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(abort)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(abort)
    return grpc.unary_unary_rpc_method_handler(abort)
