"""Large buffers stay in the process's heap, instead of a fresh mapping each.

glibc's malloc gives an allocation of 128 KiB or more a mapping of its own and hands
it back to the kernel on free (the threshold rises with use, but trimming returns the
top of the heap too). Every blob that crosses gRPC is copied into a few such buffers,
so each 16 MiB call touched ~100 MiB of new pages: the kernel zeroed and charged each
page to the cgroup on first touch, and that page-fault work was half the hub's time
moving a blob. With buffers up to the largest message served from the heap and freed
memory kept for the next call, a 16 MiB call through hub and worker takes half the
time (docs/architecture.md, "Blobs"). The cost: a process keeps the memory its
largest calls freed while they keep coming; `IdleGiveBack` gives it back once none
has ended for a couple of seconds (after a burst of sixteen 16 MiB writes the hub
and the worker each kept some 200 MiB until their hourly housekeeping).
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import gc
import logging
import sys
from typing import Final

log = logging.getLogger(__name__)

# mallopt(3) parameters.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Twice the largest gRPC message (worker.wire.transport): every buffer a call needs.
MMAP_THRESHOLD_BYTES = 64 * 1024 * 1024
# Free memory at the top of the heap kept, rather than trimmed after each large free.
TRIM_THRESHOLD_BYTES = 256 * 1024 * 1024


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)  # the symbols already loaded: the C library's among them
        libc.mallopt  # noqa: B018  (musl has no mallopt: not glibc)
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def keep_large_buffers() -> bool:
    """Serve large allocations from the heap and keep what is freed (glibc only);
    False where that does not apply (another libc or OS), which changes nothing else."""
    libc = _glibc()
    if libc is None:
        return False
    mapped: int = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    trimmed: int = libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    ok = mapped == 1 and trimmed == 1
    if not ok:
        log.debug("glibc refused the malloc settings; large buffers are mapped per use")
    return ok


def give_back() -> None:
    """Return the heap's free memory to the kernel (for an idle process)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


# A call moving at least this much (its request's or its result's blob) counts as large.
LARGE_CALL_BYTES: Final = 1024 * 1024
# After the last large call ends, how long the freed memory is kept for the next one.
IDLE_GIVE_BACK_S: Final = 2.0


class IdleGiveBack:
    """Gives the heap's free memory back once no large call has ended for
    `IDLE_GIVE_BACK_S`: calls that follow each other reuse the pages (the point of
    `keep_large_buffers`), and a burst's hundreds of MiB do not stay for the hour. Used
    on the event loop; one per process part that moves blobs (the hub, the worker).

    One timer per idle wait, not one per call: a call that ends while it is armed only
    notes its end, and the timer, when it fires early, waits out the rest."""

    def __init__(self, idle_s: float = IDLE_GIVE_BACK_S) -> None:
        self.idle_s = idle_s
        self._timer: asyncio.TimerHandle | None = None
        self._last_end = 0.0  # the loop's time when the last large call ended
        self.given_back = 0  # times the memory was given back (tests, logs)

    def ended(self, nbytes: int) -> None:
        """A call that moved `nbytes` (its largest blob) ended."""
        if nbytes < LARGE_CALL_BYTES:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a call run outside one): the hourly give-back
            return
        self._last_end = loop.time()
        if self._timer is None:
            # A timer by nature: memory is given back after an idle while.
            self._timer = loop.call_at(self._last_end + self.idle_s, self._due, loop)

    def _due(self, loop: asyncio.AbstractEventLoop) -> None:
        idle_from = self._last_end + self.idle_s
        if loop.time() < idle_from:  # a large call ended meanwhile
            self._timer = loop.call_at(idle_from, self._due, loop)
            return
        self._timer = None
        give_back()
        self.given_back += 1

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def hold_collection() -> None:
    """For a worker's start (`up`, `run`): no cyclic garbage collection until `settle`.
    Importing the worker (gRPC, protobuf, pydantic and its models, some 120
    dataclasses) and building it made about 100 collections before READY, each
    searching objects that live as long as the process."""
    gc.disable()


def settle() -> None:
    """Once the worker is built: what the start made is moved out of the collector's
    sight for good (gc.freeze), and collection resumes for what comes after, which
    then never searches those objects again. The start's own cycles (some 800
    objects) are kept, not freed: that is the price."""
    gc.freeze()
    gc.enable()
