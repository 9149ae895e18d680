"""Large buffers stay in the process's heap, instead of a fresh mapping each.

glibc's malloc gives an allocation of 128 KiB or more a mapping of its own and hands
it back to the kernel on free (the threshold rises with use, but trimming returns the
top of the heap too). Every blob that crosses gRPC is copied into a few such buffers,
so each 16 MiB call touched ~100 MiB of new pages: the kernel zeroed and charged each
page to the cgroup on first touch, and that page-fault work was half the hub's time
moving a blob. With buffers up to the largest message served from the heap and freed
memory kept for the next call, a 16 MiB call through hub and worker takes half the
time (docs/architecture.md, "Blobs"). The cost: a long-running process keeps
the memory its largest calls freed until its hourly housekeeping gives it back
(`give_back`).
"""

from __future__ import annotations

import ctypes
import functools
import gc
import logging
import sys

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
