"""How a call's blob goes to its worker: built into the request's envelope part, or in
parts ahead of it; and, for a call the hub names itself, before the call is recorded
(`send_early`, and an upload as it comes: `relay_upload`, `hand_upload`), so that the
worker writes the parts while the hub computes the call's digest, which follows once
the call is recorded. docs/architecture.md, "Blobs".
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from worker.errors import WorkerError
from worker.hub import upload
from worker.hub.session import Session
from worker.wire.framing import (
    PART_BYTES,
    Buffer,
    Chunked,
    announced,
    blob_part,
    chunked,
    framed_size,
    request_part,
)
from worker.wire.local import LocalLink
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.protocol import (
    FOLLOW_PROTOCOL,
    HASH_OFF_LOOP_BYTES,
    PARTS_PROTOCOL,
    blob_sha256,
    call_digest,
    digest_as,
    digest_feed,
    digest_of_sha256,
    fed_digest,
    stream_ended,
)
from worker.wire.transport import MAX_MESSAGE_BYTES


def too_large(message_bytes: int, *, framed: bool = False) -> WorkerError | None:
    """Why a ServerMessage of `message_bytes` (already `framed` as an envelope part, or
    not) cannot go down the stream (its envelope would pass the message limit, the
    send would fail and drop the stream), or None."""
    envelope = message_bytes if framed else framed_size(message_bytes)
    if envelope <= MAX_MESSAGE_BYTES:
        return None
    return WorkerError(
        "too_large",
        f"the request would travel in a {envelope:,}-byte message, over the "
        f"{MAX_MESSAGE_BYTES:,}-byte limit; send less (a blob of at most 16 MiB)",
        {"bytes": envelope, "limit": MAX_MESSAGE_BYTES},
    )


# A request as it goes to its worker: one envelope part, or its blob in parts ahead
# of it (`framing.Chunked`).
Outgoing = bytes | Chunked


def digest_and_part(request: pb.ActionRequest, blob: Buffer, in_parts: bool) -> Outgoing:
    """Give `request` its digest (once: a re-sent request carries it) and build what
    goes to the worker: its envelope part with `blob`, or with `in_parts` and a blob
    larger than a part, the blob's parts and then the request. Both read every byte
    of a blob, so a large one's are run in a thread (`prepared`)."""
    if not request.args_digest:
        request.args_digest = call_digest(request, blob)
    if in_parts and len(blob) > PART_BYTES:
        return chunked(request, blob)
    return request_part(request, blob)


async def prepared(request: pb.ActionRequest, blob: Buffer, in_parts: bool) -> Outgoing:
    """`digest_and_part`, off the event loop when the blob is large."""
    if len(blob) >= HASH_OFF_LOOP_BYTES:
        return await asyncio.to_thread(digest_and_part, request, blob, in_parts)
    return digest_and_part(request, blob, in_parts)


def size_of(outgoing: Outgoing) -> int:
    return outgoing.size if isinstance(outgoing, Chunked) else len(outgoing)


def stop_transfer(session: Session, transfer: Chunked) -> None:
    """Send no more of a transfer whose request will not follow; if parts went, cancel
    the call, so that the worker drops what it holds of it."""
    transfer.stop()
    if transfer.sent:
        cancel = pb.Cancel(correlation_id=transfer.request.correlation_id, reason="not sent")
        session.send(pb.ServerMessage(cancel=cancel))


def _parts_and_digest(
    transfer: Chunked, request: pb.ActionRequest, loop: asyncio.AbstractEventLoop
) -> str | None:
    """In a thread: `transfer`'s blob parts, each handed to the loop as soon as it is
    built (the hub's writer sends it meanwhile), and the call's digest, fed the same
    bytes a part at a time; None if the transfer was stopped first."""
    hasher = digest_feed(request)
    view = memoryview(transfer.blob)
    cid = request.correlation_id
    for at in range(0, len(view), PART_BYTES):
        if transfer.stopped:
            return None
        piece = view[at : at + PART_BYTES]
        hasher.update(piece)
        loop.call_soon_threadsafe(transfer.add, blob_part(cid, at, piece))
    return fed_digest(hasher)


_CALLER_LEFT: Final = "the caller left before the call's blob came whole; nothing of it was run"


def _fail(future: asyncio.Future[str], error: WorkerError) -> None:
    """Fail a digest on its way to the worker with `error` (the worker's call stops with
    it), marked retrieved: the worker may never have taken the future."""
    if not future.done():
        future.set_exception(error)
        future.exception()


async def whole(blob: Buffer | upload.Pieces) -> Buffer:
    """A blob in one piece: an upload's parts joined (in a thread: a copy)."""
    if not isinstance(blob, upload.Pieces):
        return blob
    if len(blob.parts) <= 1:
        return blob.parts[0] if blob.parts else b""
    return await asyncio.to_thread(blob.joined)


async def recorded_digest(recorded: str, request: pb.ActionRequest, blob: Buffer) -> str:
    """`request`'s digest in the scheme `recorded` was made in (`digest_as`), off the
    event loop when the blob is large."""
    if len(blob) >= HASH_OFF_LOOP_BYTES:
        return await asyncio.to_thread(digest_as, recorded, request, blob)
    return digest_as(recorded, request, blob)


async def send_early(
    session: Session | None, link: LocalLink | None, request: pb.ActionRequest, blob: Buffer
) -> Early | None:
    """For a new call the hub named itself whose blob goes in parts: queue the
    transfer at once and build its parts and the call's digest in one thread, so
    the parts go while the digest is computed (it rides in the request, which
    goes after them, and covers every byte of the blob all the same). Returns the
    stream and the transfer (`Early`), with the digest set in `request`; the caller
    adds the request's own part once the call is recorded. To the worker in this
    process the request has gone already, without its digest, and `Early.handed` is
    the future that hands it over: the caller resolves it once the call is recorded
    (or cancels it). None when the call does not qualify, for the usual way.

    Only an id the hub made (no caller knows it, so no duplicate, retry or second
    caller can meet it) is sent early: a call whose id the caller chose is
    committed before the worker gets it, which takes its digest first."""
    if (
        session is None
        or session.protocol < PARTS_PROTOCOL
        or len(blob) <= PART_BYTES
        # Near the limit (the parts' framing adds a little): checked whole, first.
        or too_large(len(blob) + request.ByteSize() + PART_BYTES) is not None
    ):
        return None
    if link is not None and link.local(session.session_id):
        # The worker is in this process: it gets the blob by reference, and only
        # the request goes down the stream (worker.wire.local), at once: the digest
        # follows by the link once the call is recorded (`Early.handed`), so the
        # worker starts the call while the blob is hashed here.
        # The blob's SHA-256, which the digest is made from, goes over too, as soon
        # as it is known: fs_write answers with it and need not hash 16 MiB again.
        loop = asyncio.get_running_loop()
        handed: asyncio.Future[str] = loop.create_future()
        sha256: asyncio.Future[str] = loop.create_future()
        link.put(session.session_id, request.correlation_id, blob, handed, sha256)
        alone = Chunked([announced(request, len(blob))], request, blob)
        session.send(alone)
        try:
            hashed = await asyncio.to_thread(blob_sha256, blob)
        except BaseException:  # the caller went away: the call is never recorded
            handed.cancel()
            sha256.cancel()
            raise
        if not sha256.done():
            sha256.set_result(hashed.hex())
        request.args_digest = digest_of_sha256(request, hashed)
        return Early(session, alone, handed)
    # Protocol 3: the request goes first, without its digest, and the worker writes
    # the parts as they come; the digest goes last, once the call is recorded.
    follow = session.protocol >= FOLLOW_PROTOCOL
    transfer = Chunked.begun(request, blob, follow=follow)
    if follow:
        transfer.add(announced(request, len(blob), follow=True))
    session.send(transfer)
    loop = asyncio.get_running_loop()
    try:
        digest = await asyncio.to_thread(_parts_and_digest, transfer, request, loop)
    except BaseException:  # the caller went away (or a bug): send no more of it
        stop_transfer(session, transfer)
        raise
    assert digest is not None  # only a stopped transfer has none
    request.args_digest = digest
    return Early(session, transfer, None)


@dataclass
class Early:
    """A call on its way to its worker before it is recorded: the stream it went down,
    its transfer (the request's part follows once the call is recorded), and, for the
    worker of this process, the future that hands that worker the call's digest."""

    session: Session
    transfer: Chunked
    handed: asyncio.Future[str] | None

    def cancel_handed(self) -> None:
        """The call was not recorded and waited for after all: the worker's call stops."""
        if self.handed is not None and not self.handed.done():
            self.handed.cancel()


@dataclass(frozen=True)
class Coming:
    """An upload's blob still coming from its caller (ControlService.DispatchUpload)."""

    size: int
    next_part: upload.NextPart
    within_s: float  # the longest wait for each part


@dataclass
class Delivered:
    """An upload that came whole, on its way to its worker (`early`), with what stops
    that delivery should the worker's stream have ended meanwhile (`abandon`)."""

    pieces: upload.Pieces
    early: Early
    abandon: Callable[[], None]


async def relay_upload(session: Session, request: pb.ActionRequest, coming: Coming) -> Delivered:
    """An upload relayed down a worker's stream as it comes (protocol 3): the request
    at once, each part framed as it came, the digest (BLAKE3 over the call and every
    byte, fed the parts as they pass) set in `request` once all came; its part is for
    the caller to add once the call is recorded. Refused or left by its caller, the
    transfer stops (the worker lets go of what came) and the error is raised."""
    cid = request.correlation_id
    transfer = Chunked.relayed(request, coming.size)
    session.send(transfer)
    hasher = digest_feed(request)
    try:
        pieces = await upload.receive(
            coming.next_part,
            coming.size,
            within_s=coming.within_s,
            feed=upload.relay_feed(cid, hasher),
            transfer=transfer,
        )
    except BaseException:
        stop_transfer(session, transfer)
        raise
    request.args_digest = fed_digest(hasher)
    transfer.ending(1)  # the digest's part, once the call is recorded
    return Delivered(
        pieces, Early(session, transfer, None), lambda: stop_transfer(session, transfer)
    )


async def hand_upload(
    session: Session, link: LocalLink, request: pb.ActionRequest, coming: Coming
) -> Delivered:
    """An upload handed to the worker of this process as it comes (`up`,
    worker.wire.local): the request at once, the blob as one piece still coming
    (sandbox.Arriving) each part of which the worker reads as it is handed, its
    SHA-256 (fed the parts in a thread as they pass) as soon as all came, and the
    digest made from it set in `request`, handed over once the call is recorded (as
    `send_early` does). Refused or left by its caller, the worker's call stops, its
    file removed, and the error is raised."""
    from sandbox import Arriving  # the worker of this process has it loaded

    cid = request.correlation_id
    loop = asyncio.get_running_loop()
    arriving = Arriving(coming.size)
    handed: asyncio.Future[str] = loop.create_future()
    sha256: asyncio.Future[str] = loop.create_future()
    link.put(session.session_id, cid, arriving, handed, sha256)
    alone = Chunked([announced(request, coming.size)], request, b"")
    session.send(alone)

    def stream_ends() -> None:
        # The call the worker started stops unanswered (its refusal would stand for
        # the delivery that follows, on the worker's next stream), its file removed.
        ended = stream_ended()
        arriving.stop(ended)
        _fail(handed, ended)
        link.drop(cid)

    session.on_close[cid] = stream_ends
    hashing = upload.sha256_as_handed(arriving)
    try:
        pieces = await upload.receive(
            coming.next_part, coming.size, within_s=coming.within_s, hand=arriving.add
        )
        hashed = await hashing
        if hashed is None:  # the worker stopped reading it (its write refused, say)
            hashed = await asyncio.to_thread(upload.sha256_of, pieces)
    except BaseException as exc:  # refused, or the caller went: nothing of it runs
        session.on_close.pop(cid, None)
        error = exc if isinstance(exc, WorkerError) else WorkerError("cancelled", _CALLER_LEFT)
        arriving.stop(error)
        _fail(handed, error)
        sha256.cancel()
        link.drop(cid)
        raise
    session.on_close.pop(cid, None)
    sha256.set_result(hashed.hex())
    request.args_digest = digest_of_sha256(request, hashed)
    return Delivered(pieces, Early(session, alone, handed), stream_ends)
