"""The screenshot's PNG, encoded in strips straight from the grab, is the same image
as the one encoded from the whole converted picture, whatever its size and stride."""

from __future__ import annotations

import io
import os

import pytest
from PIL import Image

from worker.actions.computer import _imaging
from worker.actions.computer._backend import Grab
from worker.actions.computer._geometry import Rect


@pytest.mark.parametrize(
    ("width", "height", "padding"),
    [(1920, 1080, 0), (333, 77, 0), (1, 1, 0), (50, _imaging.STRIP_ROWS, 12), (7, 65, 4)],
)
def test_strips_make_the_same_image(width: int, height: int, padding: int) -> None:
    stride = width * 4 + padding
    grab = Grab(Rect(0, 0, width, height), os.urandom(stride * height), stride)
    whole = Image.open(io.BytesIO(_imaging.png(_imaging.to_image(grab))))
    strips = Image.open(io.BytesIO(_imaging.png_of_grab(grab)))
    assert strips.size == whole.size == (width, height) and strips.mode == "RGB"
    assert strips.tobytes() == whole.tobytes()
