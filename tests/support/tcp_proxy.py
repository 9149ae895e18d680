"""A TCP relay that can go silent: the far side of a network partition.

`freeze()` stops relaying on every open connection without closing anything — no
bytes, no reset — which is what a dead NAT entry or a pulled cable looks like.
Connections made after the freeze relay normally, so a reconnect gets through.
With `down_bytes_per_s`, what the upstream sends comes at that rate (small socket
buffers, so the rate is what the far side sees): a slow link.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field


@dataclass
class _Link:
    client: socket.socket
    upstream: socket.socket
    frozen: threading.Event = field(default_factory=threading.Event)


class FreezableProxy:
    def __init__(self, upstream_port: int, down_bytes_per_s: float | None = None) -> None:
        self.upstream_port = upstream_port
        self.down_bytes_per_s = down_bytes_per_s
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._links: list[_Link] = []
        self._closed = threading.Event()
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def freeze(self) -> None:
        for link in self._links:
            link.frozen.set()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        time.sleep(0.2)  # let the pumps see the flag before their sockets go
        for link in self._links:
            for sock in (link.client, link.upstream):
                sock.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:
                client.close()  # the far side is down: refuse, as a real relay would
                continue
            link = _Link(client, upstream)
            self._links.append(link)
            if self._closed.is_set():
                # Accepted as the proxy closed, after it closed the links it had: these
                # sockets are closed here (left open, a loaded CI run reported them
                # unclosed, failing test_slow_link's ping test).
                client.close()
                upstream.close()
                return
            self.accepted += 1
            if self.down_bytes_per_s is not None:
                for sock in (client, upstream):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
            for src, dst, rate in (
                (client, upstream, None),
                (upstream, client, self.down_bytes_per_s),
            ):
                threading.Thread(
                    target=self._pump, args=(link, src, dst, rate), daemon=True
                ).start()

    def _pump(
        self, link: _Link, src: socket.socket, dst: socket.socket, rate: float | None
    ) -> None:
        src.settimeout(0.1)
        paced = _Pace(rate) if rate else None
        while not self._closed.is_set():
            if link.frozen.is_set():
                self._closed.wait(0.1)  # hold the socket open, move nothing
                continue
            try:
                data = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data or link.frozen.is_set():
                if not data:  # its end: the far side is told, as a real relay tells it
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
                    return
                continue  # swallowed: the partition began mid-read
            try:
                dst.sendall(data)
            except OSError:
                return
            if paced is not None:
                paced.sent(len(data), self._closed)


class _Pace:
    """Bytes at most `rate` a second, over the link's busy time (idle time earns no
    credit: a fresh count after a pause)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.start, self.count = time.monotonic(), 0

    def sent(self, count: int, closed: threading.Event) -> None:
        now = time.monotonic()
        if now - self.start > self.count / self.rate + 1.0:  # idle a while: start over
            self.start, self.count = now, 0
        self.count += count
        ahead = self.start + self.count / self.rate - now
        if ahead > 0:
            closed.wait(ahead)  # a slow link's pace, not a wait for an event
