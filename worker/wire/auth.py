"""Bearer-token check for every hub RPC except gRPC health."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

_OPEN_PREFIXES = ("/grpc.health.v1.Health/",)


class BearerAuth(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc.aio is untyped
    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if details.method.startswith(_OPEN_PREFIXES) or handler is None:
            return handler
        sent = dict(details.invocation_metadata or ()).get("authorization", "")
        presented = sent.encode() if isinstance(sent, str) else bytes(sent)
        if hmac.compare_digest(presented, self._expected):
            return handler
        return _refusal(
            handler, "a valid bearer token is required (see hub.token in the config dir)"
        )


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
