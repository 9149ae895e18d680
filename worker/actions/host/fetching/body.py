"""Read a response body within its caps, however the server sends it.

The cap counts bytes after decoding, and decoding is done here, bounded, rather
than by httpx: a few kilobytes of gzip can inflate to gigabytes, and httpx
inflates each received chunk whole (twice over for `Content-Encoding: gzip,
gzip`). Here zlib is never asked for more than fits under the cap. Encodings
other than one layer of gzip or deflate are passed through undecoded (`decoded`
is False). A second cap on raw bytes ends a compressed stream that inflates to
nothing forever; the call's total timeout ends one that trickles.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Final

import httpx

_WBITS: Final = {
    "gzip": 16 + zlib.MAX_WBITS,
    "x-gzip": 16 + zlib.MAX_WBITS,
    "deflate": zlib.MAX_WBITS,
}


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
    try:
        async for chunk in response.aiter_raw():
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
