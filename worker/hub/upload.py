"""A call's blob as it comes up a DispatchUpload, read a part at a time (ControlService).

A unary Dispatch reaches the hub whole: the hub has every byte of a 16 MiB fs_write
before it sends the worker any, and the call took the caller's hop, the hub's relay
and the worker's write one after the other. A DispatchUpload brings the call first
and its blob after it in parts (`DispatchUploadPart`); the hub relays each part to the
worker as it arrives (down the stream, protocol 3: the request ahead of its parts, the
digest last; inside `up`, handed over by reference), so the three overlap
(docs/architecture.md, "Blobs").

`receive` reads the parts and checks them as they come: in order (each says where it
starts), never more than announced (`too_large` at once), all of it (a stream that
ends short is `validation_error`), at most `max_parts` of them, within the call's
deadline (`timeout`). Each part is kept as the view of the message it came in (the
blob the hub holds while the call may have to be sent again: `Pieces`, joined only
should it have to go whole), handed on at once (`hand`), and fed to the call's digest
and framed as a BlobPart when relayed down a stream (`feed`): in a thread, one part
after the other, never on the event loop; the reader goes on reading meanwhile, a few
parts ahead at most (`AHEAD`). A refused upload is answered once its caller stopped
sending (`_drained`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import queue
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

import blake3

from worker.errors import WorkerError
from worker.wire.framing import PART_BYTES, Buffer, Chunked, blob_part

if TYPE_CHECKING:
    from sandbox import Arriving

# Parts read and not yet taken (copied, hashed, framed), at most: past them the reader
# waits, and gRPC's flow control holds the caller back.
AHEAD: Final = 4
# How long the next part may take after the last one (after the call, the first): a
# caller that stalls is refused then, not at the call's deadline (up to 300 s), and
# lets go of its turn and of the worker's call (review13 finding 05). A 1 MiB part in
# 60 s is a link of 17 KB/s.
PART_WITHIN_S: Final = 60.0
# The smallest part worth a message of its own (but the last): an upload of N bytes
# may come in N / MIN_PART_BYTES + 2 parts at most, so tiny parts cannot multiply the
# hub's and the worker's bookkeeping.
MIN_PART_BYTES: Final = 64 * 1024

# What the caller's next part is: its offset and bytes, or None once it sent them all.
NextPart = Callable[[], Awaitable[tuple[int, Buffer] | None]]


def max_parts(size: int) -> int:
    return size // MIN_PART_BYTES + 2


class Pieces:
    """A blob as the parts it came in (views of the messages that brought them), joined
    only where it must go whole (sent again on another stream: `joined`)."""

    def __init__(self, parts: list[Buffer], size: int) -> None:
        self.parts = parts
        self.size = size

    def __len__(self) -> int:
        return self.size

    def joined(self) -> bytes:
        """The blob in one piece (a copy: on the loop only where that is rare)."""
        return b"".join(self.parts)


# Run in a thread on each part, in order (its offset and bytes): what it returns are
# envelope parts to relay (framed BlobParts), in order.
Feed = Callable[[int, memoryview], list[bytes]]


async def receive(
    next_part: NextPart,
    size: int,
    *,
    within_s: float,
    hand: Callable[[memoryview], None] | None = None,
    feed: Feed | None = None,
    transfer: Chunked | None = None,
) -> Pieces:
    """The whole blob of `size` bytes, read off `next_part` within `within_s`: each part
    given to `hand` on the loop as it came, then to `feed` in a thread, what that
    returns added to `transfer`. A WorkerError says why the upload was refused."""
    pieces = Pieces([], size)
    feeder = _Feeder(feed, transfer)
    try:
        try:
            async with asyncio.timeout(within_s):
                try:
                    await _read(next_part, pieces, feeder, hand)
                except _StalledError as stalled:  # it sends nothing: nothing to let go of
                    raise WorkerError(
                        "timeout",
                        f"no part of the call's blob came for {PART_WITHIN_S:g} s (after "
                        f"byte {stalled.received:,}); nothing was run: send the call again",
                        {"received": stalled.received, "part_within_s": PART_WITHIN_S},
                    ) from None
                except WorkerError:
                    # The caller is answered once it stopped sending (a send after the
                    # answer would fail at its end, and gRPC would give it that failure
                    # for the answer); what it sends meanwhile is let go as it comes.
                    await _drained(next_part, size)
                    raise
        except TimeoutError:
            raise WorkerError(
                "timeout",
                f"the call's blob did not come whole within {within_s:g} s (its deadline); "
                "nothing was run: send it again",
                {"blob_bytes": size},
            ) from None
        await feeder.finished()
    finally:
        feeder.stop()
    return pieces


async def _read(
    next_part: NextPart,
    pieces: Pieces,
    feeder: _Feeder,
    hand: Callable[[memoryview], None] | None,
) -> None:
    size = pieces.size
    received = 0
    parts = 0
    most = max_parts(size)
    while (part := await _within(next_part, received)) is not None:
        offset, data = part
        parts += 1
        if offset != received:
            raise WorkerError(
                "validation_error",
                f"a part of the blob starts at byte {offset:,}, where byte {received:,} was "
                "next (parts come in order, with no gaps or repeats); nothing was run: send "
                "the call again",
                {"expected_offset": received, "offset": offset},
            )
        if received + len(data) > size:
            raise WorkerError(
                "too_large",
                f"the blob's parts came to more than the {size:,} bytes announced; nothing "
                "was run: announce the blob's true size",
                {"announced": size, "received": received + len(data)},
            )
        if parts > most:
            raise WorkerError(
                "validation_error",
                f"the blob came in more than {most:,} parts; send parts of at least "
                f"{MIN_PART_BYTES:,} bytes (but the last); nothing was run",
                {"parts": parts, "limit": most},
            )
        if not data:
            continue
        received += len(data)
        view = _unpinned(memoryview(data))
        pieces.parts.append(view)
        if hand is not None:
            hand(view)
        await feeder.put(view)
    if received != size:
        raise WorkerError(
            "validation_error",
            f"the upload ended after {received:,} of the {size:,} bytes announced; nothing "
            "was run: send the call again",
            {"announced": size, "received": received},
        )


class _StalledError(Exception):
    """No part came within PART_WITHIN_S, after `received` bytes."""

    def __init__(self, received: int) -> None:
        super().__init__(received)
        self.received = received


async def _within(next_part: NextPart, received: int) -> tuple[int, Buffer] | None:
    """The caller's next part, if it comes within PART_WITHIN_S."""
    try:
        async with asyncio.timeout(PART_WITHIN_S):
            return await next_part()
    except TimeoutError:
        raise _StalledError(received) from None


def _unpinned(view: memoryview) -> memoryview:
    """`view`, or a copy of it when it is a small part of the message it came in: kept
    while the call may be sent again, a view keeps its whole message alive."""
    whole = view.obj
    if isinstance(whole, bytes | bytearray) and len(whole) > 2 * view.nbytes + 4096:
        return memoryview(bytes(view))
    return view


async def _drained(next_part: NextPart, size: int) -> None:
    """Read and drop what the caller still sends of a refused upload, until it ends, or
    a blob's worth of bytes or parts more (`max_parts`), or a message that is refused."""
    dropped = parts = 0
    with contextlib.suppress(WorkerError):
        while dropped <= size and parts <= max_parts(size):
            part = await next_part()
            if part is None:
                return
            dropped += len(part[1])
            parts += 1


class _Feeder:
    """Feeds each part in turn to `feed` in a thread of its own, one part after the
    other as they come, and adds what it makes to `transfer` on the loop (the hub's
    writer sends them as they come). The reader is held back once AHEAD parts wait
    (`put`), and gRPC's flow control holds the caller back.

    One thread the whole upload long, not a pool job a part: a part handed to the pool
    went only once the loop had taken the last one's result, and each took two hand-
    overs between the loop and a thread, each waiting for the GIL while the loop
    received the next part; the feed fell behind the parts as they came."""

    def __init__(self, feed: Feed | None, transfer: Chunked | None) -> None:
        self._feed = feed
        self._transfer = transfer
        self._loop = asyncio.get_running_loop()
        self._room = asyncio.Semaphore(AHEAD)
        self._parts: queue.SimpleQueue[memoryview | None] = queue.SimpleQueue()
        self._ended: asyncio.Future[None] = self._loop.create_future()
        self._stopped = False
        self._thread: threading.Thread | None = None

    async def put(self, view: memoryview) -> None:
        """Feed `view`, the next part, once fewer than AHEAD parts wait; the feed's
        error, if it failed."""
        if self._feed is None:
            return
        await self._room.acquire()
        if self._ended.done():  # it failed: its error says why
            self._ended.result()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="hub-upload-feed", daemon=True)
            self._thread.start()
        self._parts.put(view)

    async def finished(self) -> None:
        """Once every part put was fed and what it made added (the feed's error, if it
        failed)."""
        if self._thread is None:
            return
        self._parts.put(None)
        await self._ended

    def stop(self) -> None:
        """No more parts: the thread ends after the part it is feeding, and what it
        makes is dropped."""
        self._stopped = True
        if self._thread is not None:
            self._parts.put(None)
        if not self._ended.done():
            self._ended.cancel()
        elif not self._ended.cancelled():
            self._ended.exception()  # taken: the reader's own error says why it stopped

    def _run(self) -> None:
        assert self._feed is not None
        offset = 0
        try:
            while (view := self._parts.get()) is not None and not self._stopped:
                made = self._feed(offset, view)
                offset += len(view)
                self._call(self._fed, made)
        except BaseException as exc:  # noqa: BLE001 - handed to the reader
            self._call(self._end, exc)
        else:
            self._call(self._end, None)

    def _call(self, fn: Callable[..., None], *args: object) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for it
            self._loop.call_soon_threadsafe(fn, *args)

    def _fed(self, made: list[bytes]) -> None:
        if self._stopped:
            return
        if self._transfer is not None:
            for part in made:
                self._transfer.add(part)
        self._room.release()

    def _end(self, error: BaseException | None) -> None:
        if self._ended.done():
            return
        if error is not None:
            self._ended.set_exception(error)
            self._room.release()  # a reader waiting for room hears of it
        else:
            self._ended.set_result(None)


def relay_feed(correlation_id: str, hasher: blake3.blake3) -> Feed:
    """A feed for a transfer down a worker's stream: each part hashed into the call's
    digest and framed as BlobParts of at most PART_BYTES."""

    def feed(offset: int, view: memoryview) -> list[bytes]:
        hasher.update(view)
        return [
            blob_part(correlation_id, offset + at, view[at : at + PART_BYTES])
            for at in range(0, len(view), PART_BYTES)
        ]

    return feed


def sha256_as_handed(arriving: Arriving) -> asyncio.Future[bytes | None]:
    """The SHA-256 of a blob handed to the worker of this process as it comes (`up`,
    `delivery.hand_upload`): a thread of its own reads each part as it is handed
    (`Arriving.parts`), as the worker's writing thread does, woken by the same
    `Arriving.add`; None should the blob stop coming first (the worker stopped reading
    it: its write was refused, say; then the parts the hub keeps are hashed instead).

    Fed by the loop a part at a time (`_Feeder`), each part cost the loop a hand-over to
    the thread and a callback back from it (a wake of the loop through its self-pipe),
    16 a 16 MiB write, on the loop that also reads the caller's next part."""
    from sandbox import ArrivalStopped  # the worker of this process has it loaded

    loop = asyncio.get_running_loop()
    hashed: asyncio.Future[bytes | None] = loop.create_future()

    def settle(digest: bytes | None) -> None:
        if not hashed.done():
            hashed.set_result(digest)

    def run() -> None:
        hasher = hashlib.sha256()
        digest: bytes | None = None
        try:
            for part in arriving.parts():
                hasher.update(part)
            digest = hasher.digest()
        except ArrivalStopped:
            pass
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for it
            loop.call_soon_threadsafe(settle, digest)

    threading.Thread(target=run, name="hub-upload-hash", daemon=True).start()
    return hashed


def sha256_of(pieces: Pieces) -> bytes:
    """The SHA-256 of a blob kept as its parts (in a thread: it reads every byte)."""
    hasher = hashlib.sha256()
    for part in pieces.parts:
        hasher.update(part)
    return hasher.digest()
