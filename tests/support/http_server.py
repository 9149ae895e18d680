"""A local HTTP server that behaves well or badly on request, and a honeypot.

`TestServer` answers on 127.0.0.1 (opened on purpose in the test config): plain
pages, an echo, redirects, and hostile bodies — a gzip bomb, a lying
Content-Length, a chunked body that never ends (in large chunks or one-byte ones), a
trickle. Every endless answer
stops when the client goes away or the server closes, so no thread outlives it.

`Honeypot` is a listener that only counts connections. Refusal tests aim at it
(and the worker's proxy variables point at it): a count above zero means a
connection was made that the URL guard should have prevented.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import socket
import ssl
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

BOMB_BYTES = 32 * 1024 * 1024  # what the gzip bomb inflates to: far past the 5 MiB cap


def pattern(size: int) -> bytes:
    """`size` bytes counting 0..250 over and over: made whole by repeating, not byte by
    byte in Python (6 MiB so took seconds of this process's CPU on a loaded machine
    before the headers went, past the worker's read timeout)."""
    return (bytes(range(251)) * (size // 251 + 1))[:size]


@functools.cache
def _bomb() -> bytes:
    return gzip.compress(b"\0" * BOMB_BYTES, compresslevel=9)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the tests assert on results, not on logs

    # http.server finds handlers by name: do_<METHOD>.
    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = (  # noqa: N815
        lambda self: self._route()
    )

    def _route(self) -> None:
        parts = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        handler = getattr(self, "_" + parts.path.strip("/").replace("-", "_"), None)
        if handler is None:
            self._send(404, b"no such page\n")
            return
        # The client may stop reading part-way: that is what several tests check for.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            handler(query)
        self.close_connection = True

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    # --- well-behaved -----------------------------------------------------------------

    def _hello(self, query: dict[str, str]) -> None:
        self._send(200, b"hello\n", {"Content-Type": "text/plain", "Set-Cookie": "a=1"})

    def _login(self, query: dict[str, str]) -> None:
        """A sign-in's answer: the session cookie and token the query names, and a
        Location carrying the token back in its query."""
        secret = query.get("secret", "")
        headers = {
            "Content-Type": "text/plain",
            "Set-Cookie": f"session={secret}; HttpOnly",
            "X-Auth-Token": secret,
            "Location": f"/home?access_token={secret}",
        }
        self._send(200, b"signed in\n", headers)

    def _login_no_body(self, query: dict[str, str]) -> None:
        """A sign-in answered with headers alone (a 204): its result has no blob, so
        only its secrets tell a repeat that the result is not kept whole."""
        secret = query.get("secret", "")
        headers = {"Set-Cookie": f"session={secret}; HttpOnly", "X-Auth-Token": secret}
        self._send(204, b"", headers)

    def _echo(self, query: dict[str, str]) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length) if length else b""
        seen = {
            "method": self.command,
            "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body": body.decode("latin-1"),
        }
        self._send(200, json.dumps(seen).encode(), {"Content-Type": "application/json"})

    def _bytes(self, query: dict[str, str]) -> None:
        size = int(query.get("n", "0"))
        self._send(200, pattern(size))

    def _gzip(self, query: dict[str, str]) -> None:
        self._send(200, gzip.compress(b"hello gzip\n"), {"Content-Encoding": "gzip"})

    def _deflate_raw(self, query: dict[str, str]) -> None:
        squeeze = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        body = squeeze.compress(b"raw deflate\n") + squeeze.flush()
        self._send(200, body, {"Content-Encoding": "deflate"})

    def _redirect(self, query: dict[str, str]) -> None:
        status = int(query.get("status", "302"))
        self._send(status, b"", {"Location": query["to"]})

    def _chain(self, query: dict[str, str]) -> None:
        left = int(query.get("n", "0"))
        if left == 0:
            self._send(200, b"end of chain\n")
        else:
            self._send(302, b"", {"Location": f"/chain?n={left - 1}"})

    # --- hostile ----------------------------------------------------------------------

    def _gzip_bomb(self, query: dict[str, str]) -> None:
        self._send(200, _bomb(), {"Content-Encoding": "gzip"})

    def _double_gzip(self, query: dict[str, str]) -> None:
        self._send(200, gzip.compress(_bomb()), {"Content-Encoding": "gzip, gzip"})

    def _short_body(self, query: dict[str, str]) -> None:
        """Promises a megabyte, sends ten bytes, hangs up."""
        self.send_response(200)
        self.send_header("Content-Length", "1000000")
        self.end_headers()
        self.wfile.write(b"ten bytes!")
        self.wfile.flush()

    def _long_body(self, query: dict[str, str]) -> None:
        """Promises five bytes, sends a hundred."""
        self.send_response(200)
        self.send_header("Content-Length", "5")
        self.end_headers()
        self.wfile.write(b"x" * 100)

    def _huge_length(self, query: dict[str, str]) -> None:
        """Claims a terabyte, then sends more than the cap as fast as it can."""
        self.send_response(200)
        self.send_header("Content-Length", str(1 << 40))
        self.end_headers()
        self._stream_until_stopped(raw=True)

    def _chunked_forever(self, query: dict[str, str]) -> None:
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._stream_until_stopped(raw=False)

    def _endless_interim(self, query: dict[str, str]) -> None:
        """`102 Processing` interim responses, as fast as the socket takes them, forever:
        no final response ever comes."""
        frames = b"HTTP/1.1 102 Processing\r\n\r\n" * 2048
        deadline = time.monotonic() + 30
        while not self.server.stopping.is_set() and time.monotonic() < deadline:
            self.wfile.write(frames)

    def _tiny_chunks(self, query: dict[str, str]) -> None:
        """A chunked body of one-byte chunks, as fast as the socket takes them, forever."""
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        frames = b"1\r\nA\r\n" * 16384
        deadline = time.monotonic() + 30
        while not self.server.stopping.is_set() and time.monotonic() < deadline:
            self.wfile.write(frames)

    def _stream_until_stopped(self, *, raw: bool) -> None:
        block = b"z" * 65536
        frame = block if raw else b"%x\r\n%s\r\n" % (len(block), block)
        deadline = time.monotonic() + 30
        while not self.server.stopping.is_set() and time.monotonic() < deadline:
            self.wfile.write(frame)

    def _trickle(self, query: dict[str, str]) -> None:
        """One byte every 50 ms: each read is quick, the whole never ends."""
        self.send_response(200)
        self.send_header("Content-Length", "100000")
        self.end_headers()
        deadline = time.monotonic() + 30
        while not self.server.stopping.is_set() and time.monotonic() < deadline:
            self.wfile.write(b".")
            self.wfile.flush()
            self.server.stopping.wait(0.05)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    stopping: threading.Event

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client hanging up mid-answer is expected here


class TestServer:
    """The well- and badly-behaved server, on 127.0.0.1 at `port`."""

    __test__ = False  # not a pytest class

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.stopping = threading.Event()
        if tls is not None:  # the handshake happens in the handler's thread, on first read
            self._server.socket = tls.wrap_socket(
                self._server.socket, server_side=True, do_handshake_on_connect=False
            )
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def __enter__(self) -> TestServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


class Honeypot:
    """Counts every connection made to it, and answers none."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.1)
        self.port = int(self._sock.getsockname()[1])
        self._accepted: list[int] = []  # the peer port of each connection, in order
        self._sentinels: set[int] = set()  # ours, made by settle()
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def connections(self) -> int:
        """Connections accepted so far, not counting settle()'s own."""
        with self._changed:
            return len([port for port in self._accepted if port not in self._sentinels])

    def settle(self, timeout: float = 10.0) -> None:
        """Return once every connection made before this call has been accepted: a
        connection of ours joins the back of the listen queue and is waited for."""
        with socket.create_connection(("127.0.0.1", self.port)) as sentinel:
            port = int(sentinel.getsockname()[1])
            with self._changed:
                self._sentinels.add(port)
                if not self._changed.wait_for(lambda: port in self._accepted, timeout):
                    raise AssertionError("the honeypot did not accept within the timeout")

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._changed:
                self._accepted.append(int(peer[1]))
                self._changed.notify_all()
            conn.close()

    def __enter__(self) -> Honeypot:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self._sock.close()
