"""An httpx transport that connects only to addresses the URL guard approved.

httpx would resolve the host again when it connects, and the answer may differ
from the one the guard checked (DNS rebinding). Here the network backend is
replaced: asked for (host, port), it connects to the address pinned for that
pair by the guard, and refuses any pair that has none. httpcore still takes the
Host header and the TLS server name (SNI, certificate check) from the URL, so
the server sees an ordinary request for its own name.

No proxy is ever used (the transport has none, and the client is built with
trust_env=False so HTTP_PROXY and friends are ignored), no unix socket, no HTTP/2.

Every read of a connection is counted (`_Counted`): a fetch reads at most HEAD_BYTES
before the body of its final response (every hop's status line and headers, and any
interim 1xx responses), and each read gives the event loop a turn. httpcore reads
interim responses in a loop of its own, before the body is read at all: a server
sending `102 Processing` for ever held the worker's loop 35 s a fetch (review25 G2b).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Final

import httpcore
import httpx

# The httpx type each httpcore failure becomes, most specific first.
_ERRORS: Final[tuple[tuple[type[Exception], type[httpx.HTTPError]], ...]] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
)


@contextmanager
def _as_httpx_errors() -> Iterator[None]:
    """Re-raise httpcore's failures as httpx's, so callers handle one family."""
    try:
        yield
    except Exception as exc:
        for source, target in _ERRORS:
            if isinstance(exc, source):
                raise target(str(exc)) from exc
        raise


# The most bytes one fetch reads before the body of its final response.
HEAD_BYTES: Final = 1024 * 1024


class Pins:
    """(host, port) → the one address a connection for it may go to; and what the
    fetch's connections may still read before a final response's body
    (`head_bytes_left`, counted while not `in_body`)."""

    def __init__(self) -> None:
        self._pins: dict[tuple[str, int], str] = {}
        self.head_bytes_left = HEAD_BYTES
        self.in_body = False  # the fetch reads a final response's body (set by it)

    def pin(self, host: str, port: int, address: str) -> None:
        self._pins[(host, port)] = address

    def address(self, host: str, port: int) -> str | None:
        return self._pins.get((host, port))


class PinnedBackend(httpcore.AsyncNetworkBackend):
    def __init__(self, pins: Pins) -> None:
        self._pins = pins
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        address = self._pins.address(host, port)
        if address is None:  # fail closed: nothing the guard did not approve
            raise httpcore.ConnectError(f"{host}:{port} was not approved by the URL guard")
        stream = await self._inner.connect_tcp(
            address, port, timeout, local_address, socket_options
        )
        return _Counted(stream, self._pins, self._inner)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are never used by http_fetch")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _Counted(httpcore.AsyncNetworkStream):
    """A connection whose reads are counted against its fetch's HEAD_BYTES (until its
    body is read), each followed by a turn of the loop for other calls."""

    def __init__(
        self, stream: httpcore.AsyncNetworkStream, pins: Pins, backend: httpcore.AnyIOBackend
    ) -> None:
        self._stream = stream
        self._pins = pins
        self._backend = backend

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        data = await self._stream.read(max_bytes, timeout)
        if not self._pins.in_body:
            self._pins.head_bytes_left -= len(data)
            if self._pins.head_bytes_left < 0:
                raise httpcore.RemoteProtocolError(
                    f"the server sent more than {HEAD_BYTES:,} bytes before the body of its "
                    "final response (endless 1xx interim responses, or headers that never end)"
                )
        await self._backend.sleep(0)  # a read of buffered bytes never waits: others run
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        await self._stream.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> httpcore.AsyncNetworkStream:
        tls = await self._stream.start_tls(ssl_context, server_hostname, timeout)
        return _Counted(tls, self._pins, self._backend)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _Body(httpx.AsyncByteStream):
    def __init__(self, stream: Any) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _as_httpx_errors():
            async for part in self._stream:
                yield part

    async def aclose(self) -> None:
        with _as_httpx_errors():
            await self._stream.aclose()


class PinnedTransport(httpx.AsyncBaseTransport):
    """httpx's own transport, minus resolution, proxies and HTTP/2."""

    def __init__(self, pins: Pins, ssl_context: ssl.SSLContext) -> None:
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context,
            max_connections=4,
            http1=True,
            http2=False,
            retries=0,
            network_backend=PinnedBackend(pins),
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions={"timeout": request.extensions.get("timeout", {})},
        )
        with _as_httpx_errors():
            response = await self._pool.handle_async_request(core_request)
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_Body(response.stream),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()
