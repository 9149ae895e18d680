"""Wall-clock time as the databases and the wire carry it: integer Unix milliseconds.

Code that prunes by age (telemetry retention, the hub's store) takes the
time as an argument where a test needs to drive it (`prune(now=...)`); deadlines
run on the event loop's monotonic clock.
"""

from __future__ import annotations

import time


def now_ms() -> int:
    return int(time.time() * 1000)
