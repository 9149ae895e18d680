"""A worker stream's outbox, as the hub holds it: the queue its one writer takes from,
which knows how long its oldest message has waited and how many bytes of messages the
worker never asked for (kills, heartbeats) wait in it.

A stream that takes each envelope the hub hands gRPC in time may still read slower than
the hub writes it: a workers'-token stream that opened its HTTP/2 window 24 KB every 2 s
held every KillPlan sent to every session, +19 MB in 200 s, for as long as callers went
on (review18 F7). By these two measures the hub sends such a stream no more kills than
it reads (server._kills_behind), and lets it go once what waits for it is old
(Hub._behind): its worker dials again and is sent its backlog from hub.db.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

from worker.wire.framing import Chunked

Queued = bytes | Chunked | None


class Outbox(asyncio.Queue[Queued]):
    """A session's outbox (None ends it). What goes through `put_unasked` is counted in
    `unasked_bytes` until it is taken; every message, whoever puts it, is timed from
    when it was put (a transfer put back behind others, from then)."""

    def _init(self, maxsize: int) -> None:
        super()._init(maxsize)
        # When each queued message was put (time.monotonic), and its unasked bytes, in
        # the queue's order.
        self._put_at: deque[float] = deque()
        self._unasked: deque[int] = deque()
        self._marking = 0
        self.unasked_bytes = 0

    def put_unasked(self, part: bytes) -> None:
        """Queue an envelope part the worker did not ask for, counted until taken."""
        self._marking = len(part)
        try:
            self.put_nowait(part)
        finally:
            self._marking = 0

    def _put(self, item: Queued) -> None:
        super()._put(item)
        self._put_at.append(time.monotonic())
        self._unasked.append(self._marking)
        self.unasked_bytes += self._marking

    def _get(self) -> Queued:
        self._put_at.popleft()
        self.unasked_bytes -= self._unasked.popleft()
        return super()._get()

    def waited_s(self) -> float:
        """How long the oldest message queued has waited (0: none queued)."""
        return time.monotonic() - self._put_at[0] if self._put_at else 0.0
