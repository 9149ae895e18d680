"""A server that is not the person's hub (a typo'd address, a hostile host): it answers
`WorkerService.Stream` like any gRPC server, keeps the metadata each stream came with
(what a worker sends as it dials: tokens, its key) and ends the stream UNAVAILABLE, so
the worker dials again. The far side of the boundary a worker trusts nothing across."""

from __future__ import annotations

import threading
from concurrent import futures
from typing import Any

import grpc

from worker.wire.protocol import STREAM_METHOD


class RecordingServer:
    """Listening on a free loopback port until `stop()`; `seen` holds each stream's
    metadata, in order."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        service, _, method = STREAM_METHOD.strip("/").partition("/")
        handler = grpc.stream_stream_rpc_method_handler(self._stream)
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, {method: handler}),)
        )
        port = self._server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{port}"
        self._server.start()

    def _stream(self, requests: Any, context: grpc.ServicerContext) -> Any:
        metadata = {key: str(value) for key, value in context.invocation_metadata()}
        with self._lock:
            self.seen.append(metadata)
        context.abort(grpc.StatusCode.UNAVAILABLE, "not the hub you meant")

    def recorded(self) -> list[dict[str, str]]:
        with self._lock:
            return list(self.seen)

    def stop(self) -> None:
        self._server.stop(grace=None).wait()
