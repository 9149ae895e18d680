"""Where the pointer is, and the monitors, asked by the event loop itself: no thread.

A `cursor_position` that went through the desktop's query thread paid two thread
hops and four python-xlib round trips (the pointer, RandR's monitors, whether
Xinerama is active, its screens): about 0.3 ms of a 1.5 ms call on an idle Xvfb.
`PointerLine` is an X connection of its own, opened once with python-xlib (in a
thread: connecting and authenticating block) and then spoken to directly over its
socket, non-blocking, from the loop: the four requests go out in one write and their
replies come back in one read. Each call asks afresh: a position or a layout is never
reused from an earlier call, nor shared with a call that started later.

The X server may hang (a stopped Xvfb, a compositor stuck in a driver). A query waits
at most `BOUND_S` for its replies; past it the line is closed (a late reply would put
the next query out of step) and the call answers `timeout`; the next call opens a new
line. The loop itself never blocks on the server: every read and write is
non-blocking.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any, Final

from worker.actions.computer._geometry import Layout, Monitor, Rect
from worker.errors import WorkerError

BOUND_S: Final = 5.0  # longest a query waits for the X server's replies
# A broken or hostile server could announce a reply of 16 GiB, or send events without
# end. No reply asked for here comes near the first (a monitor is ~100 bytes), nor
# does a query's whole read near the second; past either the line is closed.
MAX_REPLY_BYTES: Final = 1 << 20
MAX_READ_BYTES: Final = 4 << 20
QUERY_POINTER: Final = 38  # core request opcodes
GET_ATOM_NAME: Final = 17
RR_GET_MONITORS: Final = 42  # RandR 1.5 minor opcode
XINERAMA_IS_ACTIVE, XINERAMA_QUERY_SCREENS = 4, 5
REPLY, ERROR, GENERIC_EVENT = 1, 0, 35
MONITOR_INFO: Final = 24  # bytes of one RandR MONITORINFO before its outputs


def compose_layout(randr: list[Monitor], xinerama: list[Rect], screen: Rect) -> tuple[Layout, bool]:
    """The layout from RandR's monitors, Xinerama's screens (when it is active) and the
    screen's size; and whether input must warp the pointer instead of moving it.

    More monitors from Xinerama than from RandR: several X screens joined into one
    desktop, where XTEST motion stays on the pointer's screen; warp instead."""
    warp = len(xinerama) > len(randr)
    if warp:
        monitors = [
            Monitor(rect, primary=index == 0, name=f"xinerama-{index}")
            for index, rect in enumerate(xinerama)
        ]
    else:
        monitors = list(randr)
    if not monitors:
        monitors = [Monitor(screen, True, "screen")]
    if not any(m.primary for m in monitors):
        first = monitors[0]
        monitors[0] = Monitor(first.rect, True, first.name, first.scale)
    return Layout(tuple(monitors), "x11"), warp


class PointerLine:
    """One X connection the event loop asks, one query at a time."""

    def __init__(self, display: Any, atom_names: dict[int, str]) -> None:
        """Take over `display` (a python-xlib Display just opened; blocking: call this
        from a thread). `atom_names` is the backend's cache of monitor names."""
        try:
            screen = display.screen()
            self._root = int(screen.root.id)
            self._screen = Rect(0, 0, screen.width_in_pixels, screen.height_in_pixels)
            randr = display.query_extension("RANDR")
            xinerama = display.query_extension("XINERAMA")
            if randr is None:
                raise WorkerError(
                    "not_supported",
                    "the X server lacks the RANDR extension, which driving the desktop needs",
                )
            wire = display.display
            if wire.data_send or wire.data_recv:  # nothing may be left half-said
                raise AssertionError("the X connection had data pending when taken over")
        except BaseException:
            display.close()
            raise
        self._display = display  # held: it owns the socket
        self._randr = int(randr.major_opcode)
        self._xinerama = int(xinerama.major_opcode) if xinerama is not None else 0
        self._order = ">" if wire.big_endian else "<"
        self._serial = int(wire.request_serial)  # the next request's sequence number
        self._socket = wire.socket
        self._socket.setblocking(False)
        self._buffer = bytearray()
        self._names = atom_names
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None
        self.closed = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._socket.close()

    async def where(self) -> tuple[int, int, Layout]:
        """The pointer's position (root coordinates) and the layout, as the X server
        has them now; `timeout` if it does not answer within BOUND_S."""
        bound_s = BOUND_S
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        async with self._lock:
            if self.closed:  # a query before this one gave up on the server
                raise WorkerError("timeout", "the X server stopped answering; try again")
            try:
                async with asyncio.timeout(bound_s):
                    return await self._ask(loop)
            except TimeoutError:
                self.close()
                raise WorkerError(
                    "timeout",
                    f"the X server did not answer within {bound_s:g} s (is the desktop "
                    "session hung?); try again",
                    {"bound_s": bound_s},
                ) from None
            except OSError as exc:
                self.close()
                raise WorkerError(
                    "not_supported",
                    f"lost the connection to the X server: {exc}",
                    {"reason": "X connection lost", "fix": "is the desktop session running?"},
                ) from exc
            except BaseException:  # cancelled mid-way, or an X error: out of step now
                self.close()
                raise

    async def _ask(self, loop: asyncio.AbstractEventLoop) -> tuple[int, int, Layout]:
        o = self._order
        requests = [
            struct.pack(o + "BxHI", QUERY_POINTER, 2, self._root),
            struct.pack(o + "BBHIB3x", self._randr, RR_GET_MONITORS, 3, self._root, 1),
        ]
        if self._xinerama:
            requests.append(struct.pack(o + "BBH", self._xinerama, XINERAMA_IS_ACTIVE, 1))
            requests.append(struct.pack(o + "BBH", self._xinerama, XINERAMA_QUERY_SCREENS, 1))
        replies = await self._exchange(loop, requests)
        x, y = struct.unpack_from(o + "hh", replies[0], 16)
        monitors = self._monitors(replies[1])
        missing = sorted({atom for atom, *_ in monitors if atom not in self._names})
        if missing:
            names = await self._exchange(
                loop, [struct.pack(o + "BxHI", GET_ATOM_NAME, 2, atom) for atom in missing]
            )
            for atom, reply in zip(missing, names, strict=True):
                (length,) = struct.unpack_from(o + "H", reply, 8)
                self._names[atom] = bytes(reply[32 : 32 + length]).decode("latin1")
        randr = [
            Monitor(rect, primary=primary, name=self._names[atom])
            for atom, primary, rect in monitors
        ]
        xinerama: list[Rect] = []
        if self._xinerama and struct.unpack_from(o + "I", replies[2], 8)[0]:
            (count,) = struct.unpack_from(o + "I", replies[3], 8)
            xinerama = [
                Rect(*struct.unpack_from(o + "hhHH", replies[3], 32 + 8 * i)) for i in range(count)
            ]
        layout, _warp = compose_layout(randr, xinerama, self._screen)
        return x, y, layout

    def _monitors(self, reply: bytes) -> list[tuple[int, bool, Rect]]:
        o = self._order
        (count,) = struct.unpack_from(o + "I", reply, 12)
        found, offset = [], 32
        for _ in range(count):
            atom, primary, _auto, outputs, x, y, w, h = struct.unpack_from(
                o + "IBBHhhHH", reply, offset
            )
            found.append((atom, bool(primary), Rect(x, y, w, h)))
            offset += MONITOR_INFO + 4 * outputs
        return found

    async def _exchange(
        self, loop: asyncio.AbstractEventLoop, requests: list[bytes]
    ) -> list[bytes]:
        """Send `requests` in one write; their replies, in order (events are skipped:
        this connection selects none, but the server may send some unasked)."""
        o, first, count = self._order, self._serial, len(requests)
        self._serial = (first + count) % 65536
        await loop.sock_sendall(self._socket, b"".join(requests))
        replies: list[bytes] = []
        buffer = self._buffer
        read = 0
        while True:
            while len(buffer) >= 32:
                kind = buffer[0]
                size = 32
                if kind == REPLY or kind & 0x7F == GENERIC_EVENT:
                    size += 4 * struct.unpack_from(o + "I", buffer, 4)[0]
                if size > MAX_REPLY_BYTES:
                    raise WorkerError(
                        "internal_error",
                        f"the X server announced a reply of {size:,} bytes to a query of the "
                        "pointer, which needs a few hundred; the connection was closed",
                    )
                if len(buffer) < size:
                    break
                packet = bytes(buffer[:size])
                del buffer[:size]
                if kind not in (REPLY, ERROR):
                    continue
                (serial,) = struct.unpack_from(o + "H", packet, 2)
                index = (serial - first) % 65536
                if kind == ERROR:
                    raise WorkerError(
                        "internal_error",
                        f"the X server refused a query of the pointer (X error {packet[1]}, "
                        f"request {index + 1} of {count})",
                    )
                if index != len(replies):
                    raise WorkerError("internal_error", "the X server's replies came out of step")
                replies.append(packet)
                if len(replies) == count:
                    return replies
            chunk = await loop.sock_recv(self._socket, 65536)
            if not chunk:
                raise ConnectionResetError("the X server closed the connection")
            read += len(chunk)
            if read > MAX_READ_BYTES:
                raise WorkerError(
                    "internal_error",
                    f"the X server sent over {MAX_READ_BYTES:,} bytes without answering a "
                    "query of the pointer; the connection was closed",
                )
            buffer += chunk
            # sock_recv returns at once while data waits: without this a server that
            # keeps sending would hold the loop, and the bound's timer with it.
            await asyncio.sleep(0)
