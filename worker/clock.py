"""Wall-clock time as the databases and the wire carry it: integer Unix milliseconds."""

from __future__ import annotations

import time


def now_ms() -> int:
    return int(time.time() * 1000)
