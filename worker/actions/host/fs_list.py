"""workerHost.fs_list: what a folder inside the roots holds, a few levels deep.

Symlinks are listed as symlinks and never entered; where one points inside the
root its target is shown, and where it points out nothing about the target is.
The entry limit bounds the answer (`truncated` says more exists), so a folder
with a million files costs one capped call, not a stalled worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import stat as stat_mod
from typing import Annotated, Any, Final

import pydantic_core
from pydantic import Field

from sandbox import ConfinedDir, ConfinementError, Entry, Problem, file_kind, list_tree
from worker.actions.host.fs_paths import CONFINED_CODES, confined
from worker.core.registry import ActionSpec, Args, Context, Effect, Json, Outcome, PathArg, Result
from worker.errors import CONFINEMENT_CODES

LIST_ENTRIES: Final = 10_000  # per call (truncated past it)
LIST_DEPTH: Final = 32
SCAN_PER_FOLDER: Final = 100_000  # names read from one folder before giving up


class FsListArgs(Args):
    path: PathArg = "."
    depth: Annotated[int, Field(ge=1, le=LIST_DEPTH)] = 1  # 1: the folder's own entries
    limit: Annotated[int, Field(ge=1, le=LIST_ENTRIES)] = 1000
    hidden: bool = False  # include names starting with '.'


class FsEntry(Result):
    path: str  # relative to the listed folder
    name: str
    type: str  # file, directory, symlink, fifo, socket, char_device, block_device, other
    size: int
    mtime: float
    mode: str  # octal permission bits, e.g. "0o644"
    symlink_target: str | None = None  # root-relative, only when it stays inside
    error: str | None = None  # why a folder's contents are missing, if they are


class FsListResult(Result):
    path: str
    entries: list[FsEntry]
    truncated: bool


async def fs_list(ctx: Context, args: FsListArgs) -> Outcome[FsListResult]:
    return await asyncio.to_thread(_list, ctx, args)


def _list(ctx: Context, args: FsListArgs) -> Outcome[FsListResult]:
    with confined(ctx, args.path) as (root, located):
        listing = list_tree(
            root,
            located.relative,
            depth=args.depth,
            limit=args.limit,
            hidden=args.hidden,
            scan_limit=SCAN_PER_FOLDER,
        )
        entries = [_entry(root, located.relative, entry) for entry in listing.entries]
    # An FsListResult as JSON, written from plain dicts: a validated FsEntry per entry
    # cost three times the listing itself (tests hold that it validates as the model).
    answer = {"path": args.path, "entries": entries, "truncated": listing.truncated}
    return Outcome(Json(pydantic_core.to_json(answer).decode()), truncated=listing.truncated)


def _entry(root: ConfinedDir, base: str, entry: Entry) -> dict[str, Any]:
    """One FsEntry's fields, in its order."""
    st = entry.stat
    target = None
    if stat_mod.S_ISLNK(st.st_mode):
        with contextlib.suppress(ConfinementError):  # gone or changed since it was listed
            target = root.readlink_inside(entry.path if base == "." else f"{base}/{entry.path}")
    return {
        "path": entry.path,
        "name": entry.name,
        "type": file_kind(st),
        "size": st.st_size,
        "mtime": st.st_mtime,
        "mode": oct(stat_mod.S_IMODE(st.st_mode)),
        "symlink_target": target,
        "error": None if entry.error is None else _error(entry.error),
    }


def _error(error: Problem | str | None) -> str | None:
    """A sandbox problem as its wire code; an errno's name as it is."""
    return CONFINEMENT_CODES[error].value if isinstance(error, Problem) else error


SPEC: Final = ActionSpec(
    surface="workerHost",
    name="fs_list",
    args=FsListArgs,
    result=FsListResult,
    handler=fs_list,
    effect=Effect.NONE,  # only looks: may run twice, so no claim before it runs
    summary="a folder's entries inside the roots, a few levels deep, symlinks never entered",
    codes=CONFINED_CODES,
    caps={"entries": LIST_ENTRIES, "depth": LIST_DEPTH, "scan_per_folder": SCAN_PER_FOLDER},
)
