"""The loop's X line against a server that sends too much: a reply announced at 16 GiB,
and events without end. Either is refused, the line closed, and the loop keeps running
meanwhile (review3 finding 06: the buffer grew to 512 MiB, and a flood held the loop
15 s, so the 5 s bound could not fire)."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading

import pytest

from worker.actions.computer._geometry import Rect
from worker.actions.computer._x11_line import PointerLine
from worker.errors import WorkerError

KEYMAP_NOTIFY = bytes([11]) + bytes(31)  # an event: 32 bytes, no length of its own


def line_on(sock: socket.socket) -> PointerLine:
    """A PointerLine over `sock`, set up as __init__ sets it from a python-xlib Display
    (root window, screen, RandR's opcode, no Xinerama, little-endian, next serial)."""
    line = PointerLine.__new__(PointerLine)
    line._display = None
    line._root = 0x123
    line._screen = Rect(0, 0, 1600, 900)
    line._randr = 140
    line._xinerama = 0
    line._order = "<"
    line._serial = 10
    line._socket = sock
    sock.setblocking(False)
    line._buffer = bytearray()
    line._names = {}
    line._lock = None
    line._lock_loop = None
    line.closed = False
    return line


def serve(sock: socket.socket, first: bytes, then: bytes) -> threading.Thread:
    """Send `first`, then `then` over and over until the other end closes."""

    def run() -> None:
        try:
            sock.sendall(first)
            while True:
                sock.sendall(then)
        except OSError:
            pass
        finally:
            sock.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


HUGE_REPLY = bytes([1, 0]) + struct.pack("<HI", 10, 0xFFFFFFFF) + bytes(24)


@pytest.mark.parametrize(
    ("first", "then", "said"),
    [(HUGE_REPLY, bytes(65536), "announced a reply"), (b"", KEYMAP_NOTIFY * 2048, "sent over")],
    ids=["a reply of 16 GiB", "events without end"],
)
def test_a_server_that_sends_too_much_is_cut_off_and_the_loop_runs_on(
    first: bytes, then: bytes, said: str
) -> None:
    ours, theirs = socket.socketpair()
    server = serve(theirs, first, then)
    line = line_on(ours)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    async def scenario() -> None:
        beside = asyncio.ensure_future(ticker())
        try:
            with pytest.raises(WorkerError) as caught:
                await line.where()
        finally:
            beside.cancel()
        assert caught.value.code == "internal_error" and said in caught.value.message

    asyncio.run(scenario())
    assert line.closed and len(line._buffer) <= 5 << 20
    if said == "sent over":  # a flood is read a chunk at a time, the loop running between
        assert ticks > 1, "the loop ran other tasks while the server sent"
    server.join(10)
    assert not server.is_alive()
