"""Bounds on waits that stretch with the machine's load.

A bound on a wait is there to catch a hang, not to measure: a start, a connection or
a benchmark's next line that never comes. On an idle machine it is the figure given;
on a loaded one (the suite beside other work, benchmarks at a load of 30 on 2 cores)
everything runs that many times slower, and so may the wait. `slowness()` says how
many times: the one-minute load average over the cores, read again at each look, so
a wait that began idle stretches when the load comes. A hang is still caught: in the
figure given on an idle machine, in that times the slowness on a loaded one.
"""

from __future__ import annotations

import os
import time


def slowness() -> float:
    """How many times slower than idle this machine may run now (at least 1): its
    runnable load per core."""
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


class Bound:
    """`seconds` from now on an idle machine, stretched by `slowness()` as it goes."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.start = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def passed(self) -> bool:
        return self.elapsed() > self.seconds * slowness()

    def restart(self) -> None:
        """Count from now again (progress came)."""
        self.start = time.monotonic()

    def __str__(self) -> str:
        return f"{self.seconds:g} s (x{slowness():.1f} for the machine's load)"
