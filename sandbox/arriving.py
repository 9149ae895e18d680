"""A blob whose parts are still coming, written and read in threads as they come.

A worker that is sent a request ahead of its blob (protocol 3) starts writing the
blob's parts to the temporary file while the rest are on their way. `Arriving` holds
the parts that came (each a view of the message it came in), in order; the threads
that read it (`parts`) wait for each part they reach, and stop with `ArrivalStopped`
when the blob stops coming (its stream ended, the call was stopped, or what came did
not add up), whatever comes after. Its `len` is the size announced, so a size check
never waits.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence


class ArrivalStopped(Exception):  # noqa: N818  (a stop, not a fault of the reader)
    """The blob stopped coming before the part asked for: `reason` says why."""

    def __init__(self, reason: BaseException) -> None:
        super().__init__(str(reason))
        self.reason = reason


class Arriving:
    """A blob of `size` bytes, its parts added as they come (`add`, from one thread)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._parts: list[bytes | memoryview] = []
        self._received = 0
        self._stopped: BaseException | None = None
        self._moved = threading.Condition()

    def __len__(self) -> int:
        return self.size

    @property
    def received(self) -> int:
        return self._received

    @property
    def complete(self) -> bool:
        return self._received >= self.size

    @property
    def stopped(self) -> BaseException | None:
        return self._stopped

    def add(self, part: bytes | memoryview) -> None:
        """The next part (its bounds checked by the caller); ignored once stopped."""
        with self._moved:
            if self._stopped is None:
                self._parts.append(part)
                self._received += len(part)
                self._moved.notify_all()

    def stop(self, reason: BaseException) -> None:
        """No more parts will come: a reader waiting for one stops with `reason`. The
        parts that came are still read; the first reason stands."""
        with self._moved:
            if self._stopped is None:
                self._stopped = reason
            self._moved.notify_all()

    def parts(self) -> Iterator[bytes | memoryview]:
        """Every part, in order, each waited for (in a thread, never on an event loop);
        `ArrivalStopped` at the first part that will not come."""
        at = done = 0
        while done < self.size:
            with self._moved:
                while at >= len(self._parts) and self._stopped is None:
                    self._moved.wait()
                if at >= len(self._parts):
                    assert self._stopped is not None
                    raise ArrivalStopped(self._stopped)
                part = self._parts[at]
            at += 1
            done += len(part)
            yield part

    def came(self) -> tuple[bytes | memoryview, ...]:
        """The parts that came so far (all of them, once `complete`); never waits."""
        with self._moved:
            return tuple(self._parts)


def each_part(pieces: Sequence[bytes | memoryview | Arriving]) -> Iterator[bytes | memoryview]:
    """Each piece of a blob in order, an `Arriving` one's parts as they come."""
    for piece in pieces:
        if isinstance(piece, Arriving):
            yield from piece.parts()
        else:
            yield piece
