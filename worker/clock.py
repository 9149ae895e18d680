"""Wall-clock time as the databases and the wire carry it: integer Unix milliseconds."""

from __future__ import annotations

import time
from typing import Final


def now_ms() -> int:
    return int(time.time() * 1000)


class Clock:
    """The time a handler reads: through its Context, so a test can hand in another."""

    def now_ms(self) -> int:
        return now_ms()

    def monotonic(self) -> float:
        return time.monotonic()


SYSTEM_CLOCK: Final = Clock()
