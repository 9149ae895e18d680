"""workerHost.fs_read: a page of a regular file inside the roots.

At most 1 MiB per call, so neither a 1 TB sparse file nor a file that keeps
growing can make one call unbounded: the caller pages with `offset`/`length`
and `next_offset`. The bytes travel in the result blob; with `encoding` they are
decoded into `text` instead, and a page never ends inside a character (the
partial character starts the next page). Only regular files are read: a FIFO,
socket or device is refused before it is opened, so none can hang the call.
"""

from __future__ import annotations

import codecs
import os
from collections.abc import Awaitable
from typing import Annotated, Final, Literal

from pydantic import Field

from sandbox import open_regular, read_at, read_cached
from worker.actions.host.fs_paths import CONFINED_CODES, confined, hanging_root, in_thread, on_loop
from worker.core.registry import MIB, ActionSpec, Args, Context, Effect, Outcome, PathArg, Result
from worker.wire.framing import Buffer

READ_BYTES: Final = 1 * MIB  # per call; page with offset/length
# The kernel refuses a read whose end passes 2^63 - 1: offsets stop a page before.
MAX_OFFSET: Final = 2**63 - 1 - READ_BYTES

Encoding = Literal["utf-8", "latin-1", "ascii"]


class FsReadArgs(Args):
    path: PathArg
    offset: Annotated[int, Field(ge=0, le=MAX_OFFSET)] = 0
    # Omitted: as much as one call may carry (1 MiB). More is a validation error.
    length: Annotated[int, Field(ge=0, le=READ_BYTES)] | None = None
    # Set: decode into `text` (undecodable bytes become U+FFFD) instead of the blob.
    encoding: Encoding | None = None


class FsReadResult(Result):
    path: str
    offset: int
    length: int  # bytes of the file this page covers
    next_offset: int  # where the next page starts
    size: int  # the file's size once this page was read
    eof: bool  # the page reaches the end of the file
    truncated: bool  # no length was given and the 1 MiB cap ended the page first
    encoding: Encoding | None = None
    text: str | None = None


def fs_read(
    ctx: Context, args: FsReadArgs
) -> Outcome[FsReadResult] | Awaitable[Outcome[FsReadResult]]:
    """A page the kernel holds in its page cache is read in the turn that received the
    call, as fs_stat answers: the path's lookup and the open are the system calls
    fs_stat makes there too, and the read (RWF_NOWAIT) takes the bytes from the cache
    or nothing, never waiting for a disk (a 1 MiB page: about 45 us here, where the
    hop to a thread and back cost the call its own task, two wake-ups and, on a busy
    machine, waits for a core). Any other page, and a page to decode into text, is
    read in a thread, and so is every page under a root where a lookup may never
    return (a FUSE or network mount on the way or beneath: `on_loop`)."""
    if args.encoding is None and on_loop(ctx, args.path):
        cached = _read(ctx, args, cached_only=True)
        if cached is not None:
            return cached
    return read_in_thread(ctx, args)


async def read_in_thread(ctx: Context, args: FsReadArgs) -> Outcome[FsReadResult]:
    outcome = await in_thread(ctx, hanging_root(ctx, args.path), _read, ctx, args)
    assert outcome is not None  # only a read of the cache alone finds nothing
    return outcome


def _read(
    ctx: Context, args: FsReadArgs, *, cached_only: bool = False
) -> Outcome[FsReadResult] | None:
    """The page; with `cached_only`, None unless the kernel had all of it cached."""
    wanted = READ_BYTES if args.length is None else args.length
    with confined(ctx, args.path) as (root, located):
        fd = open_regular(root, located.relative, allow_hard_links=ctx.config.fs.allow_hard_links)
        try:
            data = (read_cached if cached_only else read_at)(fd, args.offset, wanted)
            size = os.fstat(fd).st_size  # after the read: a growing file may be longer now
        finally:
            os.close(fd)
    if data is None:
        return None
    if cached_only and len(data) < wanted and args.offset + len(data) < size:
        return None  # the file grew while it was read: read on to where a thread would
    eof = args.offset + len(data) >= size
    text = None
    if args.encoding is not None:
        text, used = _decode(data, args.encoding, final=eof)
        data = data[:used]
    cut = args.length is None and not eof
    result = FsReadResult(
        path=args.path,
        offset=args.offset,
        length=len(data),
        next_offset=args.offset + len(data),
        size=size,
        eof=eof,
        truncated=cut,
        encoding=args.encoding,
        text=text,
    )
    return Outcome(result, blob=b"" if text is not None else data, truncated=cut)


def _decode(data: Buffer, encoding: str, *, final: bool) -> tuple[str, int]:
    """Text of `data`, and how many bytes it used (a split character is left over)."""
    decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
    text = decoder.decode(data, final=final)
    pending = len(decoder.getstate()[0])
    if pending == len(data) and data:  # a page smaller than one character: show it as is
        return codecs.decode(data, encoding, errors="replace"), len(data)
    return text, len(data) - pending


SPEC: Final = ActionSpec(
    surface="workerHost",
    name="fs_read",
    args=FsReadArgs,
    result=FsReadResult,
    handler=fs_read,
    effect=Effect.NONE,  # only looks: may run twice, so no claim before it runs
    summary="up to 1 MiB of a regular file inside the roots (offset/length), in the blob",
    codes=CONFINED_CODES,
    caps={"read_bytes": READ_BYTES},
)
