"""The calls waiting in hub.db for their workers, counted in memory.

A call recorded and not yet answered nor abandoned waits in hub.db with its request
whole (args included) until its deadline and a day more; the hub takes no more for a
worker past a bound of them, nor for any past a bound for all (Hub._room_for). Counted
by a query, the bound cost the control path its share, so it was counted only every
32 Dispatches, on the worker's session, and not while a commit was in the writer
thread: each new stream of an id, and a hub whose commits were busy, passed it without
bound, and the bound for all was not counted for a worker connected (review19 A4).

Here the count is kept by worker id as the store records calls (`came`) and answers,
abandons or prunes them (`went`): read at each Dispatch in O(1), never waiting for the
writer thread, the same across a worker's streams. What the writer thread took off is
handed over in a queue (`went_elsewhere`) and taken in by the loop's next read: until
then the count is high, never low.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable


class PendingCalls:
    """How many calls wait for each worker, and their requests' bytes; every worker's
    bytes together."""

    def __init__(self, stored: Iterable[tuple[str, int, int]] = ()) -> None:
        """`stored`: (worker id, calls, bytes) of what hub.db holds pending."""
        self._of: dict[str, tuple[int, int]] = {}
        self._bytes = 0
        # (worker id, request bytes) of calls the writer thread answered or pruned: a
        # deque's append and popleft are safe between threads.
        self._gone: collections.deque[tuple[str, int]] = collections.deque()
        for worker_id, count, size in stored:
            self._of[worker_id] = (count, size)
            self._bytes += size

    def came(self, worker_id: str, size: int) -> None:
        """A call of `size` request bytes recorded for `worker_id` (on the loop)."""
        count, held = self._of.get(worker_id, (0, 0))
        self._of[worker_id] = (count + 1, held + size)
        self._bytes += size

    def went(self, worker_id: str, size: int) -> None:
        """A call counted by `came` no longer waits (on the loop)."""
        count, held = self._of.get(worker_id, (0, 0))
        if count <= 1:
            self._of.pop(worker_id, None)
            self._bytes -= held
        else:
            self._of[worker_id] = (count - 1, held - size)
            self._bytes -= size

    def went_elsewhere(self, gone: Iterable[tuple[str, int]]) -> None:
        """`went` for each, from any thread; taken in by the loop's next read."""
        self._gone.extend(gone)

    def of(self, worker_id: str) -> tuple[int, int]:
        """The calls waiting for `worker_id` and their requests' bytes."""
        self._take_in()
        return self._of.get(worker_id, (0, 0))

    @property
    def total_bytes(self) -> int:
        """The requests' bytes of the calls waiting for every worker."""
        self._take_in()
        return self._bytes

    def _take_in(self) -> None:
        while self._gone:
            self.went(*self._gone.popleft())
