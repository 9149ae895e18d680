"""Batching for the worker stream: one gRPC message carries everything that queued up.

A stream write costs far more in gRPC's Python layer than the bytes it carries, so
each side's single writer packs the messages waiting in its outbox into one
envelope — never more than fits the message limit — and writes that.
"""

from __future__ import annotations

import asyncio
from typing import Generic, Protocol, TypeVar

from worker.transport import MAX_MESSAGE_BYTES

# Room left for the envelope's own framing.
MAX_ENVELOPE_BYTES = MAX_MESSAGE_BYTES - 64 * 1024
MAX_ENVELOPE_MESSAGES = 512


class _Sized(Protocol):
    def ByteSize(self) -> int: ...  # noqa: N802 - protobuf's name


M = TypeVar("M", bound=_Sized)


class Batcher(Generic[M]):
    """Takes messages off an outbox (None ends it) in envelope-sized batches."""

    def __init__(self, outbox: asyncio.Queue[M | None]) -> None:
        self._outbox = outbox
        self._carry: M | None = None
        self._ended = False

    async def next_batch(self) -> list[M] | None:
        """The next batch, waiting for at least one message; None once the outbox ended."""
        if self._carry is not None:
            first: M | None = self._carry
            self._carry = None
        elif self._ended:
            return None
        else:
            first = await self._outbox.get()
        if first is None:
            return None
        if self._outbox.empty():
            return [first]  # alone: no need to size it (a 16 MiB blob takes ~9 ms to size)
        batch, size = [first], first.ByteSize()
        while len(batch) < MAX_ENVELOPE_MESSAGES and not self._outbox.empty():
            msg = self._outbox.get_nowait()
            if msg is None:
                self._ended = True
                break
            msg_size = msg.ByteSize()
            if size + msg_size > MAX_ENVELOPE_BYTES:
                self._carry = msg
                break
            batch.append(msg)
            size += msg_size
        return batch
