"""A request's blob that came ahead of it in parts (protocol 2, `BlobPart`).

A hub sends a large blob as parts so that small messages interleave with it on the
one stream (docs/architecture.md, "Blobs"). The worker keeps the parts of each
correlation id until its request comes, within bounds a hostile server cannot push
past: one call's parts may not exceed what one message could carry (else the call
is refused `too_large` when its request comes); all parts held at once may not
exceed eight such calls' bytes nor 64 calls, each part and id counted with its
bookkeeping (else `busy`); and parts come in order, with no gaps or repeats (else
`validation_error`). A refused call's parts are dropped at once. A blob that follows
its request (protocol 3) is counted within the same bounds, whole, from its request
(`reserve`) until its last part and digest came or it stopped (`release`).
"""

from __future__ import annotations

import asyncio
from typing import Final

from sandbox import Arriving
from worker.errors import WorkerError
from worker.ids import id_problem
from worker.wire.framing import Buffer
from worker.wire.transport import MAX_MESSAGE_BYTES

MAX_CALL_BYTES: Final = MAX_MESSAGE_BYTES
MAX_HELD_BYTES: Final = 8 * MAX_MESSAGE_BYTES
# What keeping one part costs beyond its bytes (its entry), and one call beyond its
# parts (its entries, and its id at up to 4 bytes a character): counted, so a flood
# of tiny parts or of ids meets the bound too.
PART_OVERHEAD_BYTES: Final = 256
ID_OVERHEAD_BYTES: Final = 1024
# Calls whose parts are held at once (the hub sends a few large calls at a time).
MAX_CALLS: Final = 64
# Ids whose parts were refused, remembered until their request comes (bounded: a
# server that never sends the requests cannot grow it without limit).
MAX_REFUSED_IDS: Final = 1024
# What a blob that follows its request is counted in parts of (a hub's part size), for
# their bookkeeping: its parts are counted all at once, when the request comes.
PART_BYTES_GUESS: Final = 1024 * 1024


class BlobParts:
    def __init__(self) -> None:
        # Each part a view of the message it came in (copied once, when joined).
        # (Inside `up`, a blob handed over still coming is one part: sandbox.Arriving.)
        self._parts: dict[str, list[Buffer | Arriving]] = {}
        self._sizes: dict[str, int] = {}
        self._held = 0
        # Refused ids, with the error their request gets.
        self._refused: dict[str, WorkerError] = {}
        # Blobs that follow their requests (protocol 3): what each was counted as.
        self._reserved: dict[str, int] = {}

    @property
    def held_bytes(self) -> int:
        return self._held

    def add(self, correlation_id: str, data: Buffer | Arriving, offset: int) -> bool:
        """Keep a part that starts at `offset` of its blob; past a bound, or out of
        order, drop the call's parts and refuse it. False for a part no request could
        claim (no id, one longer than any request's or one not printable)."""
        if id_problem("correlation_id", correlation_id, required=True) is not None:
            return False
        if correlation_id in self._refused:
            return True
        new = correlation_id not in self._sizes
        had = self._sizes.get(correlation_id, 0)
        cost = len(data) + PART_OVERHEAD_BYTES + (ID_OVERHEAD_BYTES if new else 0)
        if offset != had:
            self._refuse(correlation_id, _out_of_order(had, offset))
        elif had + len(data) > MAX_CALL_BYTES:
            self._refuse(correlation_id, _too_large())
        elif self._held + cost > MAX_HELD_BYTES or (new and len(self._sizes) >= MAX_CALLS):
            self._refuse(correlation_id, _busy())
        else:
            self._parts.setdefault(correlation_id, []).append(data)
            self._sizes[correlation_id] = had + len(data)
            self._held += cost
        return True

    def reserve(self, correlation_id: str, size: int) -> WorkerError | None:
        """Count a blob of `size` bytes that follows its request (protocol 3) as held,
        all of it at once, until `release`; the error its request is refused with when
        it would pass a bound (nothing counted then)."""
        if size > MAX_CALL_BYTES:
            return _too_large()
        cost = size + ID_OVERHEAD_BYTES + -(-size // PART_BYTES_GUESS) * PART_OVERHEAD_BYTES
        if (
            self._held + cost > MAX_HELD_BYTES
            or len(self._sizes) + len(self._reserved) >= MAX_CALLS
        ):
            return _busy()
        self._reserved[correlation_id] = cost
        self._held += cost
        return None

    def release(self, correlation_id: str) -> None:
        """A blob that followed its request is no longer held here (see `reserve`)."""
        self._held -= self._reserved.pop(correlation_id, 0)

    def holds(self, correlation_id: str) -> bool:
        """Whether parts of this call are held (its request has not come yet)."""
        return correlation_id in self._sizes

    def take(self, correlation_id: str, expected: int) -> list[Buffer | Arriving]:
        """The parts of the request that has come, in order; a WorkerError when they
        were refused or do not add up to the `expected` bytes it announces."""
        refused = self._refused.pop(correlation_id, None)
        if refused is not None:
            raise refused
        got = self._sizes.get(correlation_id, 0)
        parts = self._drop(correlation_id)
        if got != expected:
            raise WorkerError(
                "validation_error",
                f"the request announced a blob of {expected:,} bytes in parts, and "
                f"{got:,} came; nothing was run: send the call again",
                {"expected": expected, "received": got},
            )
        return parts

    def clear(self) -> None:
        """The stream ended: parts of requests that never came are gone with it (the
        hub sends an open call again, whole, on the next stream)."""
        self._parts.clear()
        self._sizes.clear()
        self._refused.clear()
        self._reserved.clear()
        self._held = 0

    def refuse(self, correlation_id: str, error: WorkerError) -> None:
        """Drop the call's parts (a Cancel came before its request): its request, if it
        comes, is refused with `error`, and parts still coming are dropped too."""
        self._refuse(correlation_id, error)

    def _refuse(self, correlation_id: str, error: WorkerError) -> None:
        self._drop(correlation_id)
        self._refused[correlation_id] = error
        while len(self._refused) > MAX_REFUSED_IDS:
            del self._refused[next(iter(self._refused))]

    def _drop(self, correlation_id: str) -> list[Buffer | Arriving]:
        parts = self._parts.pop(correlation_id, [])
        if self._sizes.pop(correlation_id, None) is not None:
            self._held -= ID_OVERHEAD_BYTES
        self._held -= sum(len(part) + PART_OVERHEAD_BYTES for part in parts)
        return parts


def _out_of_order(expected: int, offset: int) -> WorkerError:
    return WorkerError(
        "validation_error",
        f"a part of the request's blob starts at byte {offset:,}, where byte {expected:,} "
        "was next (parts come in order, with no gaps or repeats); nothing was run: send "
        "the call again",
        {"expected_offset": expected, "offset": offset},
    )


def _too_large() -> WorkerError:
    return WorkerError(
        "too_large",
        f"the request's blob came in parts of more than {MAX_CALL_BYTES:,} bytes, more "
        "than one message may carry; nothing was run: send a smaller blob",
        {"limit": MAX_CALL_BYTES},
    )


def _busy() -> WorkerError:
    return WorkerError(
        "busy",
        f"the worker holds {MAX_HELD_BYTES:,} bytes of other calls' blobs, still coming; "
        "nothing was run: send it again later",
        {"limit": MAX_HELD_BYTES},
    )


class Following(Arriving):
    """A blob that follows its request (protocol 3), handed to its call as it comes
    (sandbox.Arriving); `settled` resolves on the event loop once it came whole with its
    digest, or stopped coming (`settle`), for what must see all of it (a prompt)."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.settled: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def settle(self) -> None:
        if not self.settled.done():
            self.settled.set_result(None)
