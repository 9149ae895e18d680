"""A worker stream's outbox, as the hub holds it: the queue its one writer takes from,
which knows how long its oldest message has waited with the stream taking next to
nothing meanwhile, and how many bytes of messages the worker never asked for (kills,
heartbeats) wait in it.

A stream that takes each envelope the hub hands gRPC in time may still read slower than
the hub writes it: a workers'-token stream that opened its HTTP/2 window 24 KB every 2 s
held every KillPlan sent to every session, +19 MB in 200 s, for as long as callers went
on (review18 F7). By these two measures the hub sends such a stream no more kills than
it reads (server._kills_behind), and lets it go once what waits for it has waited long
while the stream took less than PROGRESS_BYTES (Hub._behind): its worker dials again
and is sent its backlog from hub.db.

Progress, not age: a worker reading steadily over a slow link behind a backlog of
calls (60 of ~1 MiB args at 0.35 MB/s: 180 s of it) had messages older than
OUTBOX_WAIT_S waiting, and was let go and sent it all again (review21).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from worker.wire.framing import PART_BYTES, Chunked

Queued = bytes | Chunked | None

# What a stream takes of what the hub writes it while messages wait, for its oldest
# message's wait to count from then (`stalled_s`): a part of a blob, as WRITE_STUCK_S
# asks of one envelope. Below PROGRESS_BYTES in OUTBOX_WAIT_S (~9 KB/s) a stream is
# let go, whatever waits; above it, it is kept for as long as it reads.
PROGRESS_BYTES = PART_BYTES


class Outbox(asyncio.Queue[Queued]):
    """A session's outbox (None ends it). What goes through `put_unasked` is counted in
    `unasked_bytes` until it is taken; every message, whoever puts it, is timed from
    when it was put (a transfer put back behind others, from then). `clock` is
    time.monotonic unless a test gives its own."""

    def __init__(self, maxsize: int = 0, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        super().__init__(maxsize)

    def _init(self, maxsize: int) -> None:
        super()._init(maxsize)
        # When each queued message was put (`clock`), and its unasked bytes, in
        # the queue's order.
        self._put_at: deque[float] = deque()
        self._unasked: deque[int] = deque()
        self._marking = 0
        self.unasked_bytes = 0
        # When the stream last took PROGRESS_BYTES more, and what it took since.
        self._progress_at = self._clock()
        self._taken = 0

    def put_unasked(self, part: bytes) -> None:
        """Queue an envelope part the worker did not ask for, counted until taken."""
        self._marking = len(part)
        try:
            self.put_nowait(part)
        finally:
            self._marking = 0

    def _put(self, item: Queued) -> None:
        super()._put(item)
        self._put_at.append(self._clock())
        self._unasked.append(self._marking)
        self.unasked_bytes += self._marking

    def _get(self) -> Queued:
        self._put_at.popleft()
        self.unasked_bytes -= self._unasked.popleft()
        return super()._get()

    def waited_s(self) -> float:
        """How long the oldest message queued has waited (0: none queued)."""
        return self._clock() - self._put_at[0] if self._put_at else 0.0

    def took(self, nbytes: int) -> None:
        """gRPC took an envelope of `nbytes` off the hub's hands (the stream reads)."""
        self._taken += nbytes
        if self._taken >= PROGRESS_BYTES:
            self._progress_at = self._clock()
            self._taken = 0

    def stalled_s(self) -> float:
        """How long the oldest message queued has waited since the stream last took
        PROGRESS_BYTES (0: none queued): what a stream reading a slow link steadily
        keeps short, however long its backlog."""
        if not self._put_at:
            return 0.0
        return self._clock() - max(self._put_at[0], self._progress_at)
