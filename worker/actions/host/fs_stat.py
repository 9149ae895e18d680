"""workerHost.fs_stat: what a path is, without following it out of its root."""

from __future__ import annotations

import functools
import grp
import pwd
import stat as stat_mod
from collections.abc import Awaitable
from typing import Any, Final

import orjson

from sandbox import file_kind
from worker.actions.host.fs_paths import (
    CONFINED_CODES,
    carried,
    confined,
    hanging_root,
    in_thread,
    on_loop,
)
from worker.core.registry import ActionSpec, Args, Context, Effect, Json, Outcome, PathArg, Result


class FsStatArgs(Args):
    path: PathArg
    follow_symlinks: bool = False


class FsStatResult(Result):
    path: str
    type: str
    size: int
    mode: str  # octal permission bits, e.g. "0o644"
    uid: int
    gid: int
    owner: str | None
    group: str | None
    nlink: int
    mtime: float
    atime: float
    ctime: float
    # Root-relative, only when it stays inside; bytes that are not UTF-8 shown as \xNN.
    symlink_target: str | None = None


def fs_stat(
    ctx: Context, args: FsStatArgs
) -> Outcome[FsStatResult] | Awaitable[Outcome[FsStatResult]]:
    """A plain function: on a local disk a stat or two never waits long enough to be
    worth a thread hop, or even a task of its own (see ActionSpec.handler), so it runs
    in the turn that received the call. Under a root where a lookup may never return
    (a FUSE or network mount on the way or beneath: `on_loop`), in a thread of that
    root's own (`in_thread`)."""
    if on_loop(ctx, args.path):
        return stat_now(ctx, args)
    return in_thread(ctx, hanging_root(ctx, args.path), stat_now, ctx, args)


def stat_now(ctx: Context, args: FsStatArgs) -> Outcome[FsStatResult]:
    with confined(ctx, args.path) as (root, located):
        st = root.stat(located.relative, follow_symlinks=args.follow_symlinks)
        target = None
        if stat_mod.S_ISLNK(st.st_mode):
            target = root.readlink_inside(located.relative)
            if target is not None:
                target, _changed = carried(target)
    # Every value comes straight from the kernel's stat, typed by os.stat_result:
    # trusted data, so it is written as the model's JSON without building the model
    # (pydantic's model_construct and dump took 20 us of each call's 60 here). orjson
    # writes these plain types byte for byte as pydantic does (as fs_list's answer;
    # tests hold that the text is the model's own), in the model's field order.
    answer: dict[str, Any] = {
        "path": args.path,
        "type": file_kind(st),
        "size": st.st_size,
        "mode": oct(stat_mod.S_IMODE(st.st_mode)),
        "uid": st.st_uid,
        "gid": st.st_gid,
        "owner": _owner(st.st_uid),
        "group": _group(st.st_gid),
        "nlink": st.st_nlink,
        "mtime": st.st_mtime,
        "atime": st.st_atime,
        "ctime": st.st_ctime,
        "symlink_target": target,
    }
    try:
        return Outcome(Json(orjson.dumps(answer).decode()))
    except orjson.JSONEncodeError:  # a path orjson will not write (a lone surrogate)
        return Outcome(FsStatResult.model_construct(**answer))


@functools.lru_cache(maxsize=256)
def _owner(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


@functools.lru_cache(maxsize=256)
def _group(gid: int) -> str | None:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return None


SPEC: Final = ActionSpec(
    surface="workerHost",
    name="fs_stat",
    args=FsStatArgs,
    result=FsStatResult,
    handler=fs_stat,
    effect=Effect.NONE,  # only looks: may run twice, so no claim before it runs
    summary="type, size, mode, owner and times of a path inside the roots",
    codes=CONFINED_CODES,
)
