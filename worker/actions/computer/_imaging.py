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

A plain PNG (no pointer drawn, not scaled) is encoded straight from the grab in
strips of `STRIP_ROWS` rows (`png_of_grab`): each strip is converted, given its
rows' filter bytes and fed to one deflate stream while it is still in the CPU's
cache, so no whole-image copy is ever made. Measured on the busy screen as CPU time
(the machine was shared): 9.3 ms per image against 22 ms for converting the whole
image, copying its bytes out, joining its rows and deflating them in one go
(most of the difference is the page faults of four 6-8 MB buffers per shot).
"""

from __future__ import annotations

import io
import struct
import zlib
from typing import Final, Literal, cast

from PIL import Image
from zlib_ng import zlib_ng

from worker.actions.computer._backend import CursorImage, Grab

Format = Literal["png", "jpeg"]
PNG_LEVEL: Final = 1
STRIP_ROWS: Final = 32  # rows converted and deflated at a time (about 180 KB at 1920 wide)
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
    return _png(width, height, zlib_ng.compress(_filtered(pixels, width * 3), PNG_LEVEL))


def png_of_grab(grab: Grab) -> bytes:
    """The image of `png(to_image(grab))`, encoded in strips straight from the grab."""
    width, height = grab.rect.width, grab.rect.height
    source = memoryview(grab.bgra)
    deflate = zlib_ng.compressobj(PNG_LEVEL)
    parts = []
    for top in range(0, height, STRIP_ROWS):
        rows = min(STRIP_ROWS, height - top)
        pixels = source[top * grab.stride : (top + rows) * grab.stride]
        # Pillow reads any buffer; its stubs name bytes only.
        view = cast(bytes, pixels)
        strip = Image.frombuffer("RGB", (width, rows), view, "raw", "BGRX", grab.stride, 1)
        parts.append(deflate.compress(_filtered(strip.tobytes(), width * 3)))
    parts.append(deflate.flush())
    return _png(width, height, b"".join(parts))


def _filtered(pixels: bytes, stride: int) -> bytes:
    """Rows of `pixels`, each after its filter byte (0: none)."""
    view = memoryview(pixels)
    return b"".join(b"\0" + view[i : i + stride] for i in range(0, len(pixels), stride))


def _png(width: int, height: int, idat: bytes) -> bytes:
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"".join(
        (_PNG_SIGNATURE, _chunk(b"IHDR", header), _chunk(b"IDAT", idat), _chunk(b"IEND", b""))
    )


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(data, zlib.crc32(kind))  # not of kind + data: no copy of the data
    return b"".join((struct.pack(">I", len(data)), kind, data, struct.pack(">I", crc)))


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
