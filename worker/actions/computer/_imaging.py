"""Turning a grab into the bytes a screenshot returns: PNG or JPEG, maybe smaller.

Encoding is what a screenshot costs, so the encoders were picked by measuring a
busy 1920x1080 screen on the development machine (best of 10, same run):

    grab (mss, XShm)                          0.8 ms
    BGRA → RGB (Pillow's raw decoder)         0.9 ms
    PNG, zlib-ng level 1, no row filter       2.9 ms   328 KB   ← PNG default
    PNG, zlib level 1                        11.2 ms   271 KB
    PNG, zlib-ng level 6                     10.3 ms   243 KB
    PNG, Pillow (zlib, compress_level=1)     35.9 ms   276 KB
    JPEG q75, Pillow (libjpeg-turbo)          4.4 ms   354 KB   ← JPEG
    WebP q75 method 0, Pillow                37.5 ms   237 KB   (not offered: 8x JPEG)

So PNG is written here: Pillow converts the pixels, zlib-ng (a maintained zlib
with fast paths) deflates the rows at level 1, and the chunks are put together by
hand. Pillow writes JPEG.
"""

from __future__ import annotations

import io
import struct
import zlib
from typing import Final, Literal

from PIL import Image
from zlib_ng import zlib_ng

from worker.actions.computer._backend import CursorImage, Grab

Format = Literal["png", "jpeg"]
PNG_LEVEL: Final = 1
_PNG_SIGNATURE: Final = b"\x89PNG\r\n\x1a\n"


def to_image(grab: Grab) -> Image.Image:
    """The grab as an RGB image (one C pass over the BGRA bytes)."""
    size = (grab.rect.width, grab.rect.height)
    return Image.frombuffer("RGB", size, grab.bgra, "raw", "BGRX", grab.stride, 1)


def resize(image: Image.Image, width: int, height: int) -> Image.Image:
    if (width, height) == image.size:
        return image
    return image.resize((width, height), Image.Resampling.BILINEAR, reducing_gap=2.0)


def draw_cursor(image: Image.Image, cursor: CursorImage | None, x: int, y: int) -> None:
    """Paint the pointer onto `image`, whose (0, 0) is `(x, y)` away from the hotspot's
    screen point: x and y are the pointer's position in the image's own pixels."""
    if cursor is None:
        cursor = _arrow()
    sprite = Image.frombuffer(
        "RGBA", (cursor.width, cursor.height), cursor.rgba, "raw", "RGBA", 0, 1
    )
    image.paste(sprite, (x - cursor.hot_x, y - cursor.hot_y), sprite)


def encode(image: Image.Image, fmt: Format, quality: int) -> bytes:
    if fmt == "jpeg":
        out = io.BytesIO()
        image.save(out, "JPEG", quality=quality)
        return out.getvalue()
    return png(image)


def png(image: Image.Image) -> bytes:
    """An 8-bit RGB PNG, rows unfiltered, deflated by zlib-ng at level 1."""
    width, height = image.size
    pixels = image.tobytes()
    stride = width * 3
    view = memoryview(pixels)
    rows = b"".join(b"\0" + view[i : i + stride] for i in range(0, len(pixels), stride))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"".join(
        (
            _PNG_SIGNATURE,
            _chunk(b"IHDR", header),
            _chunk(b"IDAT", zlib_ng.compress(rows, PNG_LEVEL)),
            _chunk(b"IEND", b""),
        )
    )


def _chunk(kind: bytes, data: bytes) -> bytes:
    return b"".join(
        (struct.pack(">I", len(data)), kind, data, struct.pack(">I", zlib.crc32(kind + data)))
    )


def _arrow() -> CursorImage:
    """A plain arrow pointer, for platforms that do not hand out the real one."""
    rows = [
        "X...........",
        "XX..........",
        "XWX.........",
        "XWWX........",
        "XWWWX.......",
        "XWWWWX......",
        "XWWWWWX.....",
        "XWWWWWWX....",
        "XWWWWWWWX...",
        "XWWWWWWWWX..",
        "XWWWWWXXXXX.",
        "XWWXWWX.....",
        "XWX.XWWX....",
        "XX..XWWX....",
        "X....XWWX...",
        ".....XWWX...",
        "......XX....",
    ]
    colours = {"X": b"\0\0\0\xff", "W": b"\xff\xff\xff\xff", ".": b"\0\0\0\0"}
    rgba = b"".join(colours[c] for row in rows for c in row)
    return CursorImage(rgba, len(rows[0]), len(rows), 0, 0)
