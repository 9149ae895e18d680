"""workerHost.fs_list: what a folder inside the roots holds, a few levels deep.

Symlinks are listed as symlinks and never entered; where one points inside the
root its target is shown, and where it points out nothing about the target is.
The entry limit bounds the answer (`truncated` says more exists), so a folder
with a million files costs one capped call, not a stalled worker.
"""

from __future__ import annotations

import contextlib
import os
import stat as stat_mod
from typing import Annotated, Any, Final

import orjson
from pydantic import Field

from sandbox import ConfinedDir, ConfinementError, Problem, Row, file_kind, list_tree
from worker.actions.host.fs_paths import CONFINED_CODES, carried, confined, hanging_root, in_thread
from worker.core.registry import ActionSpec, Args, Context, Effect, Json, Outcome, PathArg, Result
from worker.errors import CONFINEMENT_CODES

LIST_ENTRIES: Final = 10_000  # per call (truncated past it)
LIST_DEPTH: Final = 32
SCAN_PER_FOLDER: Final = 100_000  # names read from one folder before giving up
NOT_UTF8: Final = "name_not_utf8"


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
    # Why a folder's contents are missing, if they are; or "name_not_utf8": the name on
    # disk is not UTF-8, so `path` and `name` show its other bytes as \xNN and no fs_*
    # call can name it (exec can, by a pattern: `ls`, `mv caf*`).
    error: str | None = None


class FsListResult(Result):
    path: str
    entries: list[FsEntry]
    truncated: bool


async def fs_list(ctx: Context, args: FsListArgs) -> Outcome[FsListResult]:
    return await in_thread(ctx, hanging_root(ctx, args.path), _list, ctx, args)


def _list(ctx: Context, args: FsListArgs) -> Outcome[FsListResult]:
    with confined(ctx, args.path) as (root, located):
        listing = list_tree(
            root,
            located.relative,
            depth=args.depth,
            limit=args.limit,
            hidden=args.hidden,
            scan_limit=SCAN_PER_FOLDER,
            row=_rows(root, located.relative),
        )
    # An FsListResult as JSON, written from plain dicts: a validated FsEntry per entry
    # cost three times the listing itself. orjson writes these plain types byte for
    # byte as pydantic does, in under half its time (tests hold that the text is the
    # model's own).
    answer = {"path": args.path, "entries": listing.entries, "truncated": listing.truncated}
    try:
        text = orjson.dumps(answer)
    except orjson.JSONEncodeError:  # a name (or a link's target) that is not UTF-8
        answer["entries"] = [_nameable(entry) for entry in listing.entries]
        text = orjson.dumps(answer)
    return Outcome(Json(text.decode()), truncated=listing.truncated)


def _nameable(entry: dict[str, Any]) -> dict[str, Any]:
    """The entry with each name that is not UTF-8 shown with \\xNN escapes (see
    fs_paths.carried), and marked so."""
    for key in ("path", "name", "symlink_target"):
        if entry[key] is not None:
            entry[key], changed = carried(entry[key])
            if changed:
                entry["error"] = entry["error"] or NOT_UTF8
    return entry


def _rows(root: ConfinedDir, base: str) -> Row[dict[str, Any]]:
    """What the listing keeps of each entry: its FsEntry's fields, in order, made as
    the walk finds it (no stat result or other record per entry is kept)."""
    prefix = "" if base == "." else f"{base}/"
    # An entry's type and mode follow from its st_mode, and a tree holds few distinct
    # ones: each has a finished entry to copy (not a symlink's, whose target is read
    # each time), whose four fields of its own are then set. Copying it costs 0.28 us
    # an entry where building the dict took 0.4 (a 10,000-entry listing: 2.8 ms
    # against 4.0 of rows, in a process doing nothing else); deciding type and mode
    # once per st_mode spared three calls an entry, a tenth of the listing.
    templates: dict[int, dict[str, Any]] = {}

    def row(
        path: str, name: str, st: os.stat_result, error: Problem | str | None
    ) -> dict[str, Any]:
        template = templates.get(st.st_mode)
        if template is None or error is not None:
            return described(path, name, st, error)
        entry = template.copy()  # keeps the fields' order: the model's
        entry["path"] = path
        entry["name"] = name
        entry["size"] = st.st_size
        entry["mtime"] = st.st_mtime
        return entry

    def described(
        path: str, name: str, st: os.stat_result, error: Problem | str | None
    ) -> dict[str, Any]:
        """An entry made field by field (a symlink, an error, a new st_mode)."""
        kind = file_kind(st)
        target = None
        if kind == "symlink":
            with contextlib.suppress(ConfinementError):  # gone or changed since it was listed
                target = root.readlink_inside(prefix + path)
        entry = {
            "path": path,
            "name": name,
            "type": kind,
            "size": st.st_size,
            "mtime": st.st_mtime,
            "mode": oct(stat_mod.S_IMODE(st.st_mode)),
            "symlink_target": target,
            "error": None if error is None else _error(error),
        }
        if kind != "symlink" and error is None:
            templates[st.st_mode] = entry.copy()
        return entry

    return row


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
