"""workerHost.fs_write: put the request blob in a file inside a read-write root.

`create` makes a new file and refuses an existing name; `overwrite` replaces a
file (or makes it); `append` adds to its end. Creating and replacing are atomic
(temp file, fsync, rename; see sandbox.files): a reader, or a crash, sees the old
content whole or the new content whole, never half. A symlink at the name is
refused, not written through. At most 16 MiB per call. A write also sweeps up
temporary files an earlier, crashed write left in the same folder.

A call is claimed in the ledger by its handler (`ActionSpec.claims_late`): creating
and replacing write the temporary file and flush it to disk, which no one sees (its
name is ours, and a crash leaves it to the sweep), while the call is claimed, and
rename the file into place, the call's one visible effect, only once the claim is
committed. So the claim's commit, and the wait for the call's digest that it needs
(the hub may still be hashing the blob: `Context.digest_ready`), are not in series
before the bytes go to disk. Appending, and a write that makes missing folders, change
what others see as they go: they claim first.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal

from sandbox import (
    ArrivalStopped,
    Arriving,
    Data,
    HeldError,
    Written,
    append_bytes,
    data_size,
    each_part,
    make_parents,
    plan_uids,
    write_atomic,
)
from worker.actions.host.fs_paths import (
    CONFINED_CODES,
    busy_held,
    check_lands_writable,
    confined,
    hanging_root,
    in_thread,
)
from worker.core.registry import MIB, ActionSpec, Args, Context, Outcome, PathArg, Result
from worker.errors import ErrorCode, WorkerError
from worker.wire.protocol import BLOB_CAPS

WRITE_BYTES: Final = BLOB_CAPS["fs_write"]  # per call (16 MiB); above is too_large
HASH_SLICE_BYTES: Final = MIB  # the hash trails the write by this much at most

Mode = Literal["create", "overwrite", "append"]


class FsWriteArgs(Args):
    path: PathArg
    mode: Mode = "create"
    make_parents: bool = False  # create missing folders above the file (inside the root)


class FsWriteResult(Result):
    path: str
    mode: Mode
    bytes_written: int
    sha256: str  # of the bytes written (for append: of the appended bytes)
    size: int  # the file's size afterwards
    created: bool


async def fs_write(ctx: Context, args: FsWriteArgs) -> Outcome[FsWriteResult]:
    # A large blob comes in the parts it travelled in (SPEC's blob_in_pieces): written
    # and hashed piece by piece, never joined into one buffer first.
    data = ctx.blob_pieces()
    size = data_size(data)
    if size > WRITE_BYTES:
        raise WorkerError(
            "too_large",
            f"the blob is {size:,} bytes; fs_write takes at most {WRITE_BYTES:,} "
            "bytes per call. Write the first part, then append the rest in further calls.",
            {"bytes": size, "limit": WRITE_BYTES},
        )
    try:
        written, digest = await _written_and_hashed(ctx, args, data)
    except ArrivalStopped as stopped:  # the blob stopped coming (protocol 3): why
        reason = stopped.reason
        if isinstance(reason, WorkerError):
            raise reason from None
        raise WorkerError("cancelled", f"the blob stopped coming: {reason}") from None
    except WorkerError as exc:
        if exc.code is not ErrorCode.NOT_FOUND or args.make_parents:
            raise
        hint = " To create the missing folders too, set make_parents to true."
        raise WorkerError(exc.code, exc.message + hint, exc.details) from exc
    result = FsWriteResult(
        path=args.path,
        mode=args.mode,
        bytes_written=size,
        sha256=digest,
        size=written.size,
        created=written.created,
    )
    return Outcome(result)


async def _claimed(ctx: Context, verdict: _Verdict) -> None:
    """Claim the call (Context.claim) once its digest is known, and let the writing
    thread put its file in place, in the same turn: once claimed, the write may take
    effect; until then it may not."""
    await ctx.digest_ready()
    ctx.claim()
    verdict.give(True)


async def _written_and_hashed(
    ctx: Context, args: FsWriteArgs, data: Sequence[bytes | memoryview | Arriving]
) -> tuple[Written, str]:
    """The write and the SHA-256 of its bytes, each in a thread (both release the GIL),
    the call claimed on the loop meanwhile, before the write's effect.

    Creating and replacing claim the call while its temporary file is written and
    flushed (the claim waits for the call's digest, which may still be on its way), and
    rename the file into place only once the claim is committed: the thread waits for
    that verdict, which has mostly come by then. The hash trails the write a slice at a
    time (`_Progress`): each slice is hashed once it is in the file, while the next is
    copied, so the two share the slice's bytes in the processor's cache and the hash is
    done about a slice after the copy, beside the fsync. (Begun when the write began,
    both reading all 16 MiB at once, they slowed each other and the copy took 6-8 ms
    instead of 3.7; begun after the copy, the hash's 8.5-10 ms came after the fsync.)
    A write refused before its bytes went in hashes nothing."""
    progress = _Progress()
    verdict = _Verdict()

    def place() -> None:  # in the writing thread: the temporary file is on disk
        if not verdict.wait():
            raise _NotClaimedError

    late = args.mode != "append" and not args.make_parents
    if not late:  # its first byte changes what others see: claimed before it
        await _claimed(ctx, verdict)
    root = hanging_root(ctx, args.path)  # a root that may hang writes in a lane of its own
    # A blob still coming (protocol 3, an upload) is waited for by the writing and the
    # hashing threads: threads of their own, never the pool's (CallThreads.apart).
    coming = any(isinstance(piece, Arriving) for piece in data)
    place_late = place if late else None
    writing = asyncio.ensure_future(
        ctx.threads.apart(_write, ctx, args, data, progress, place_late)
        if coming and root is None
        else in_thread(ctx, root, _write, ctx, args, data, progress, place_late)
    )
    claiming = asyncio.ensure_future(_claimed(ctx, verdict)) if late else None
    # Inside `up` the hub hashes the very bytes handed over (its digest is made from
    # their SHA-256), and hands that hash over too: no second pass over 16 MiB here.
    hashing = (
        asyncio.ensure_future(
            ctx.threads.apart(_sha256, data, progress)
            if coming
            else asyncio.to_thread(_sha256, data, progress)
        )
        if ctx.blob_sha256 is None
        else None
    )
    try:
        if claiming is not None:
            await asyncio.wait((writing, claiming), return_when=asyncio.FIRST_COMPLETED)
            if claiming.done():
                claiming.result()  # a claim that failed: raised here, nothing placed
        written = await writing
        digest = await hashing if hashing is not None else await _handed_sha256(ctx, data)
        assert digest is not None  # every byte went in
        return written, digest
    finally:
        # A failure or a cancel before the claim: the temporary file goes, unnamed; the
        # hash stops where the write did, and a blob still coming (protocol 3) is no
        # longer waited for.
        verdict.give(False)
        progress.stop()
        for piece in data:
            if isinstance(piece, Arriving):
                piece.stop(WorkerError("cancelled", "the write stopped; nothing was placed"))
        # The threads run on (the pipeline says what that means for the call), their
        # futures are let go without a word; a claim still waiting for its digest stops.
        # What a job that failed too ends with is taken here (the call's answer says
        # why): left unread, asyncio logged its traceback (review12 finding 07).
        for job in (writing, claiming, hashing):
            if job is not None:
                job.add_done_callback(_taken)
                job.cancel()


def _taken(job: asyncio.Future[Any]) -> None:
    if not job.cancelled():
        job.exception()


async def _handed_sha256(ctx: Context, data: Sequence[bytes | memoryview | Arriving]) -> str:
    """The hub's SHA-256 of the blob (Context.blob_sha256), or, should it not come,
    the blob's hashed here."""
    assert ctx.blob_sha256 is not None
    handed = await ctx.blob_sha256()
    if handed is not None:
        return handed
    return await asyncio.to_thread(_sha256_of, data)


def _sha256_of(data: Sequence[bytes | memoryview | Arriving]) -> str:
    hasher = hashlib.sha256()
    for piece in each_part(data):
        hasher.update(piece)
    return hasher.hexdigest()


class _Progress:
    """How many bytes of the blob are in the file, from the writing thread to the
    hashing one, which waits for each slice; `stop` (the write ended, whichever way)
    lets it go without the rest."""

    def __init__(self) -> None:
        self._moved = threading.Condition()
        self._in = 0
        self._stopped = False

    def wrote(self, count: int) -> None:
        with self._moved:
            self._in = count
            self._moved.notify_all()

    def stop(self) -> None:
        with self._moved:
            self._stopped = True
            self._moved.notify_all()

    def until(self, count: int) -> bool:
        """Whether `count` bytes went in (waited for); False if the write stopped first."""
        with self._moved:
            while self._in < count and not self._stopped:
                self._moved.wait()
            return self._in >= count


class _NotClaimedError(Exception):
    """The call was not claimed (refused, stopped, or its claim failed): the writing
    thread removes its temporary file and renames nothing."""


class _Verdict:
    """Whether the writing thread may put its file in place: given once on the loop
    (after the claim's commit, or no), awaited in the thread. The first word stands."""

    def __init__(self) -> None:
        self._given = threading.Event()
        self._lock = threading.Lock()
        self._go = False

    def give(self, go: bool) -> None:
        with self._lock:
            if not self._given.is_set():
                self._go = go
                self._given.set()

    def wait(self) -> bool:
        self._given.wait()
        return self._go


def _sha256(data: Sequence[bytes | memoryview | Arriving], progress: _Progress) -> str | None:
    """The SHA-256 of `data`, each slice hashed once it is in the file; None if the
    write stopped before all of it went in."""
    hasher = hashlib.sha256()
    done = 0
    try:
        for piece in each_part(data):
            view = memoryview(piece)
            for at in range(0, len(view), HASH_SLICE_BYTES):
                part = view[at : at + HASH_SLICE_BYTES]
                if not progress.until(done + len(part)):
                    return None
                hasher.update(part)
                done += len(part)
    except ArrivalStopped:  # the blob stopped coming (protocol 3): so did the write
        return None
    return hasher.hexdigest()


def _write(
    ctx: Context,
    args: FsWriteArgs,
    data: Data,
    progress: _Progress,
    place: Callable[[], None] | None,
) -> Written:
    try:
        # Beneath a plan's workspace with a uid of its own, as that uid: each entry
        # made (the temp file renamed into place, parents) is the plan's.
        with plan_uids.acting_as(_owner_of(ctx)):
            return _written(ctx, args, data, progress, place)
    finally:
        progress.stop()  # the hash has all it will get


def _owner_of(ctx: Context) -> int | None:
    owners = {root.owner for root in ctx.roots}
    return owners.pop() if len(owners) == 1 else None


def _written(
    ctx: Context,
    args: FsWriteArgs,
    data: Data,
    progress: _Progress,
    place: Callable[[], None] | None,
) -> Written:
    with confined(ctx, args.path, write=True) as (root, located):
        if args.make_parents:
            make_parents(
                root, located.relative, lambda fd: check_lands_writable(ctx, fd, args.path)
            )
        parent, name = root.open_parent(located.relative)
        try:
            check_lands_writable(ctx, parent, args.path)
            lands = _real_place(parent, name, located.root.path / located.relative)
            # An append writes the file in place: held by inode too, whatever its name
            # (another name of a held file: review21 B1). A replacement leaves it be.
            inode = _inode(parent, name) if args.mode == "append" else None
            try:
                writing = ctx.containment.held.write(lands, ctx.correlation_id, inode)
            except HeldError as exc:  # an asked program's argument (sandbox.held)
                raise busy_held(exc, args.path) from None
            with writing:
                return _placed(ctx, args, data, progress, place, parent, name, lands)
        finally:
            os.close(parent)


def _placed(
    ctx: Context,
    args: FsWriteArgs,
    data: Data,
    progress: _Progress,
    place: Callable[[], None] | None,
    parent: int,
    name: str,
    lands: str,
) -> Written:
    """The write itself, into the folder `parent` opened (registered in sandbox.held),
    its target's real path `lands`."""
    if args.mode == "append":
        allow = ctx.config.fs.allow_hard_links
        done = append_bytes(
            parent,
            name,
            data,
            allow_hard_links=allow,
            shown=args.path,
            wrote=progress.wrote,
        )
    else:
        replace = args.mode == "overwrite"
        done = write_atomic(
            parent,
            name,
            data,
            replace=replace,
            shown=args.path,
            wrote=progress.wrote,
            before_place=place,
        )
    # After the write, so that sweeping (best effort) never delays or fails it. A
    # leftover's name an asked program holds stays (review23 C10).
    folder = os.path.dirname(lands)
    held = ctx.containment.held
    ctx.containment.leftovers.sweep(
        parent,
        guard=lambda leftover, inode: held.write(
            os.path.join(folder, leftover), ctx.correlation_id, inode
        ),
    )
    return done


def _inode(parent: int, name: str) -> tuple[int, int] | None:
    """The file `name` in the folder `parent` (a link not followed), or None."""
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _real_place(parent: int, name: str, fallback: os.PathLike[str]) -> str:
    """The path the write lands on as the kernel names its folder (the very folder
    opened), for sandbox.held; where there is no /proc, the path's real one."""
    try:
        return os.path.join(os.readlink(f"/proc/self/fd/{parent}"), name)
    except OSError:
        return os.path.realpath(fallback)


SPEC: Final = ActionSpec(
    surface="workerHost",
    name="fs_write",
    args=FsWriteArgs,
    result=FsWriteResult,
    handler=fs_write,
    summary="create, overwrite (atomically) or append to a file in a read-write root; "
    "the blob is the content, at most 16 MiB",
    takes_blob=True,
    blob_in_pieces=True,
    codes=CONFINED_CODES,
    caps={"write_bytes": WRITE_BYTES},
    claims_late=True,  # Context.claim, once the temporary file is on disk: see the module
)
