"""An upload's parts are fed (hashed into the call's digest and framed as BlobParts) in
one thread of the upload's own, one after the other as they come, while the reader goes
on reading: what the feed makes goes to the transfer in order, the reader is held back
once AHEAD parts wait for the feed, a feed that fails fails the upload, and an upload
refused midway feeds nothing more and adds nothing more to its transfer.

The parts come from `next_part`, the caller's side of the upload (here a list, or one
that waits on an event): the hub's reader, feed, digest and transfer are the real ones.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable

import blake3
import pytest

from worker.errors import WorkerError
from worker.hub import upload
from worker.wire.framing import PART_BYTES, Chunked, blob_part
from worker.wire.proto import agentworker_pb2 as pb

CID = "c-feed"


def _parts(blob: bytes, sizes: list[int]) -> list[tuple[int, bytes]]:
    out, at = [], 0
    for size in sizes:
        out.append((at, blob[at : at + size]))
        at += size
    assert at == len(blob)
    return out


def _next_part(
    parts: list[tuple[int, bytes]], before: Callable[[int], object] | None = None
) -> upload.NextPart:
    """The caller's parts in turn, then the end; `before(i)` is awaited (if it returns an
    awaitable) before part i is given."""
    given = 0

    async def next_part() -> tuple[int, bytes] | None:
        nonlocal given
        if before is not None:
            waited = before(given)
            if asyncio.isfuture(waited) or asyncio.iscoroutine(waited):
                await waited
        if given == len(parts):
            return None
        given += 1
        return parts[given - 1]

    return next_part


def _transfer(size: int) -> Chunked:
    return Chunked.relayed(pb.ActionRequest(correlation_id=CID), size)


def test_every_part_is_fed_in_order_in_one_thread_of_its_own() -> None:
    """The transfer gets each part framed, in order, after the request's; the digest is
    BLAKE3 over every byte; the feed ran off the loop's thread, in one thread for the
    whole upload."""
    blob = os.urandom(3 * PART_BYTES + 12_345)
    parts = _parts(blob, [PART_BYTES + 7, 2 * PART_BYTES, 12_345 - 7])
    hasher = blake3.blake3()
    relay = upload.relay_feed(CID, hasher)
    threads: set[int] = set()

    def feed(offset: int, view: memoryview) -> list[bytes]:
        threads.add(threading.get_ident())
        return relay(offset, view)

    async def scenario() -> tuple[upload.Pieces, Chunked, int]:
        transfer = _transfer(len(blob))
        pieces = await upload.receive(
            _next_part(parts), len(blob), within_s=30, feed=feed, transfer=transfer
        )
        return pieces, transfer, threading.get_ident()

    pieces, transfer, loop_thread = asyncio.run(scenario())
    assert b"".join(pieces.parts) == blob
    assert hasher.digest() == blake3.blake3(blob).digest()
    assert len(threads) == 1 and loop_thread not in threads
    expected = []
    for offset, data in parts:
        view = memoryview(data)
        expected += [
            blob_part(CID, offset + at, view[at : at + PART_BYTES])
            for at in range(0, len(view), PART_BYTES)
        ]
    assert transfer.parts[1:] == expected


def test_the_reader_waits_once_ahead_parts_wait_for_the_feed() -> None:
    """While the feed is held on the first part, the reader reads AHEAD parts (the one
    held among them) and the next, which waits for room, and asks for no more; once the
    feed goes on, every part comes through."""
    count = upload.AHEAD + 6
    blob = os.urandom(count * upload.MIN_PART_BYTES)
    parts = _parts(blob, [upload.MIN_PART_BYTES] * count)
    go = threading.Event()
    fed: list[int] = []

    def feed(offset: int, view: memoryview) -> list[bytes]:
        go.wait()
        fed.append(offset)
        return []

    async def scenario() -> tuple[int, int]:
        read = 0
        held = asyncio.Event()

        def before(i: int) -> None:  # asked for part i (0-based)
            nonlocal read
            read = i
            if i == upload.AHEAD:
                held.set()

        receiving = asyncio.ensure_future(
            upload.receive(_next_part(parts, before), len(blob), within_s=30, feed=feed)
        )
        await held.wait()  # the reader asked for the part after AHEAD of them
        for _ in range(20):  # and goes no further while the feed is held
            await asyncio.sleep(0)
        read_while_held = read
        go.set()
        await receiving
        return read_while_held, read

    read_while_held, read = asyncio.run(scenario())
    assert read_while_held == upload.AHEAD
    assert read == count and fed == [i * upload.MIN_PART_BYTES for i in range(count)]


def test_a_feed_that_fails_fails_the_upload() -> None:
    blob = os.urandom(4 * upload.MIN_PART_BYTES)
    parts = _parts(blob, [upload.MIN_PART_BYTES] * 4)
    fed: list[int] = []

    def feed(offset: int, view: memoryview) -> list[bytes]:
        fed.append(offset)
        if offset == upload.MIN_PART_BYTES:
            raise OSError("the feed broke")
        return [b"framed"]

    async def scenario() -> None:
        await upload.receive(_next_part(parts), len(blob), within_s=30, feed=feed)

    with pytest.raises(OSError, match="the feed broke"):
        asyncio.run(scenario())
    assert fed == [0, upload.MIN_PART_BYTES]


def test_an_upload_refused_midway_feeds_and_adds_nothing_more() -> None:
    """Parts past the size announced: refused (too_large) while the feed still holds the
    parts before; those it finishes are not added to the transfer, and the thread
    feeds no part after them."""
    size = 3 * upload.MIN_PART_BYTES
    blob = os.urandom(size + upload.MIN_PART_BYTES)
    parts = _parts(blob, [upload.MIN_PART_BYTES] * 4)
    entered, go = threading.Event(), threading.Event()
    fed: list[int] = []
    feeding: list[threading.Thread] = []

    def feed(offset: int, view: memoryview) -> list[bytes]:
        feeding.append(threading.current_thread())
        entered.set()
        go.wait()
        fed.append(offset)
        return [b"framed %d" % offset]

    async def scenario() -> tuple[str, Chunked]:
        transfer = _transfer(size)

        def before(i: int) -> object:  # the part past the size once the feed holds part 0
            return asyncio.to_thread(entered.wait) if i == 3 else None

        code = ""
        try:
            await upload.receive(
                _next_part(parts, before), size, within_s=30, feed=feed, transfer=transfer
            )
        except WorkerError as exc:
            code = exc.code
        go.set()  # the feed goes on once the upload was refused
        await asyncio.to_thread(feeding[0].join)
        await asyncio.sleep(0)  # what the thread handed the loop before it ended has run
        return code, transfer

    code, transfer = asyncio.run(scenario())
    assert code == "too_large"
    assert transfer.parts[1:] == []  # the request's part only
    assert fed == [0]  # the part it was feeding; none after


def test_a_handed_blob_is_hashed_by_a_thread_that_reads_it_as_it_comes() -> None:
    """Inside `up` the hub's SHA-256 of a handed blob reads each part as the worker
    does (`Arriving.parts`), woken by the same `add`: nothing is fed to it from the loop
    and nothing comes back a part at a time; it is the SHA-256 of every byte, once the
    last came."""
    import hashlib

    from sandbox import Arriving

    blob = os.urandom(3 * PART_BYTES + 5)

    async def scenario() -> bytes | None:
        arriving = Arriving(len(blob))
        hashed = upload.sha256_as_handed(arriving)
        for _offset, data in _parts(blob, [PART_BYTES, 2 * PART_BYTES, 5]):
            assert not hashed.done()  # the last part has not come
            arriving.add(memoryview(data))
        return await hashed

    assert asyncio.run(scenario()) == hashlib.sha256(blob).digest()


def test_a_handed_blob_that_stops_coming_is_not_hashed_and_its_parts_are() -> None:
    """A handed blob the worker stopped reading (its write refused) stops the hub's hash
    too (None): the hub then hashes the parts it keeps (`sha256_of`)."""
    import hashlib

    from sandbox import Arriving

    blob = os.urandom(2 * PART_BYTES)

    async def scenario() -> tuple[bytes | None, bytes]:
        arriving = Arriving(len(blob))
        hashed = upload.sha256_as_handed(arriving)
        arriving.add(memoryview(blob)[:PART_BYTES])
        arriving.stop(WorkerError("cancelled", "the write stopped"))
        arriving.add(memoryview(blob)[PART_BYTES:])  # ignored: stopped
        kept = upload.Pieces([blob[:PART_BYTES], blob[PART_BYTES:]], len(blob))
        return await hashed, await asyncio.to_thread(upload.sha256_of, kept)

    stopped, from_parts = asyncio.run(scenario())
    assert stopped is None
    assert from_parts == hashlib.sha256(blob).digest()
