"""Read a response body within its caps, however the server sends it.

The cap counts bytes after decoding, and decoding is done here, bounded, rather
than by httpx: a few kilobytes of gzip can inflate to gigabytes, and httpx
inflates each received chunk whole (twice over for `Content-Encoding: gzip,
gzip`). Here zlib is never asked for more than fits under the cap. Encodings
other than one layer of gzip or deflate are passed through undecoded (`decoded`
is False). A second cap on raw bytes ends a compressed stream that inflates to
nothing forever; the call's total timeout ends one that trickles.

A third cap counts the pieces the body comes in: a chunked body of one-byte chunks
is one trip through h11, httpcore, httpx and this loop a byte, on the worker's event
loop, with no wait between them while the socket has bytes (review25 G2: 5 MiB so
took 30 s of the worker's CPU, four at once held every other call up to 4.75 s and
took the worker to 547 MB). A body still coming after MAX_PIECES pieces ends there,
`truncated`, its `error` saying why; and every YIELD_EVERY pieces the loop gets a
turn, so other calls run meanwhile. A server sending 4 KiB chunks reaches the 5 MiB
cap in 1,280 pieces; 80-byte ones in 65,536.
"""

from __future__ import annotations

import asyncio
import zlib
from dataclasses import dataclass
from typing import Final

import httpx

_WBITS: Final = {
    "gzip": 16 + zlib.MAX_WBITS,
    "x-gzip": 16 + zlib.MAX_WBITS,
    "deflate": zlib.MAX_WBITS,
}

# The most pieces (reads of httpx's raw stream: a chunk of a chunked body, or one
# socket read) a body is read in; and how often the read lets the loop run others.
MAX_PIECES: Final = 65_536
YIELD_EVERY: Final = 256


@dataclass(frozen=True)
class Body:
    data: bytes
    truncated: bool  # the cap ended it; more was on offer
    decoded: bool  # any Content-Encoding was undone
    error: str | None  # why the body is incomplete, when the server ended it badly


class _Inflater:
    """One layer of gzip or deflate, inflated at most `room` bytes at a time."""

    def __init__(self, encoding: str) -> None:
        self._wbits = _WBITS[encoding]
        self._zlib = zlib.decompressobj(self._wbits)
        self._started = False

    def feed(self, data: bytes, room: int) -> bytes:
        try:
            out = self._zlib.decompress(data, room)
        except zlib.error:
            # "deflate" is often sent raw, without the zlib header it should have.
            if self._started or self._wbits != zlib.MAX_WBITS:
                raise
            self._zlib = zlib.decompressobj(-zlib.MAX_WBITS)
            out = self._zlib.decompress(data, room)
        self._started = True
        return out

    def finish(self, room: int) -> bytes:
        return self._zlib.flush(room)


def _inflater(response: httpx.Response) -> tuple[_Inflater | None, bool]:
    """The decoder for this response, and whether its body will come out decoded."""
    layers = [
        part.strip().lower()
        for value in response.headers.get_list("content-encoding")
        for part in value.split(",")
    ]
    layers = [layer for layer in layers if layer not in ("", "identity")]
    if not layers:
        return None, True
    if len(layers) == 1 and layers[0] in _WBITS:
        return _Inflater(layers[0]), True
    return None, False


async def read_body(response: httpx.Response, *, cap: int, raw_cap: int) -> Body:
    """At most `cap` decoded bytes of `response`'s body (which is then closed)."""
    inflater, decoded = _inflater(response)
    parts: list[bytes] = []
    size = raw = 0
    truncated = False
    error = None
    pieces = 0
    try:
        async for chunk in response.aiter_raw():
            pieces += 1
            if pieces > MAX_PIECES:
                truncated = True
                error = (
                    f"the server sent the body in more than {MAX_PIECES:,} pieces ({raw:,} "
                    f"bytes in all so far, {raw // MAX_PIECES or 1:,} a piece on average); "
                    "the rest was not read"
                )
                break
            if pieces % YIELD_EVERY == 0:
                await asyncio.sleep(0)  # bytes already buffered never wait: let others run
            raw += len(chunk)
            piece = inflater.feed(chunk, cap - size + 1) if inflater else chunk
            if size + len(piece) > cap:
                parts.append(piece[: cap - size])
                size, truncated = cap, True
                break
            parts.append(piece)
            size += len(piece)
            if raw >= raw_cap:
                truncated = True
                break
        else:
            if inflater is not None:
                tail = inflater.finish(cap - size + 1)
                truncated = size + len(tail) > cap
                parts.append(tail[: cap - size])
    except httpx.RemoteProtocolError as exc:
        error = f"the server ended the body early or sent it malformed ({exc})"
    except httpx.ReadError as exc:
        error = f"the connection broke while the body was read ({exc or 'reset'})"
    except zlib.error as exc:
        error = f"the body is not valid {response.headers.get('content-encoding')} data ({exc})"
    finally:
        await response.aclose()
    return Body(data=b"".join(parts), truncated=truncated, decoded=decoded, error=error)
