"""Open a caller's path inside its root; the sandbox's refusals become wire errors here."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Final, TypeVar

from sandbox import (
    ConfinedDir,
    ConfinementError,
    HardLinkError,
    HeldError,
    Located,
    Root,
    locate,
)
from worker.core.registry import Context
from worker.core.threads import looking
from worker.errors import ErrorCode, WorkerError, from_confinement, from_os_error

# What `confined` may answer: a refusal, or the file system's own no.
CONFINED_CODES: Final = frozenset(
    {
        ErrorCode.PATH_NOT_ALLOWED,
        ErrorCode.NOT_FOUND,
        ErrorCode.NOT_DIRECTORY,
        ErrorCode.IS_DIRECTORY,
        ErrorCode.PERMISSION_DENIED,
        ErrorCode.ALREADY_EXISTS,
        ErrorCode.TOO_LARGE,
        ErrorCode.NOT_SUPPORTED,
    }
)

_HARD_LINK_HINT = (
    " If hard-linked files in the shared folders should be usable, set "
    "allow_hard_links = true under [fs] in config.toml."
)


def on_loop(ctx: Context, path: str) -> bool:
    """Whether a lookup of `path` may be made on the event loop: it lies in a root where
    no lookup can reach a file system that may never answer (a FUSE mount whose daemon
    is gone, NFS, CIFS...: `sandbox.mounts`, the worker's table in its Containment), or
    its text is refused before any lookup. Elsewhere a lookup that hangs would stop the
    worker: every call, the heartbeats and the kill switch. About a microsecond when
    every root is local."""
    roots, local = ctx.roots, ctx.containment.mounts.local
    if all(local(str(root.path)) for root in roots):
        return True
    try:
        root = locate(roots, path).root
    except ConfinementError:
        return True  # answered from the text alone
    return local(str(root.path))


def all_local(ctx: Context) -> bool:
    """Whether a lookup anywhere in the roots may be made on the event loop (on_loop)."""
    local = ctx.containment.mounts.local
    return all(local(str(root.path)) for root in ctx.roots)


T = TypeVar("T")


def hanging_root(ctx: Context, path: str | None, *, reaching_all: bool = False) -> Root | None:
    """The root a lookup of `path` is made in, if a lookup there may never return (see
    on_loop); None when it cannot hang there or its text is refused before any lookup.
    For work `reaching_all` roots (exec's checks), the first root where one may hang
    when `path`'s root (or no path) names none."""
    local = ctx.containment.mounts.local
    if all(local(str(root.path)) for root in ctx.roots):
        return None
    if path is not None:
        try:
            root = locate(ctx.roots, path).root
        except ConfinementError:
            root = None
        if root is not None and not local(str(root.path)):
            return root
    if not reaching_all:
        return None
    return next(root for root in ctx.roots if not local(str(root.path)))


def in_thread(
    ctx: Context, root: Root | None, fn: Callable[..., T], /, *args: object, looks: bool = False
) -> Awaitable[T]:
    """fn(*args) in a thread: the worker's pool (`asyncio.to_thread`, or `looking` for
    a job that only `looks`) when `root` is None, else a thread of that root's own
    lane (worker.core.threads.Lanes), so that lookups stuck in its file system never
    hold a thread another root's calls need; `busy` when its stuck lookups fill it."""
    if root is None:
        return looking(fn, *args) if looks else asyncio.to_thread(fn, *args)
    folder = str(root.path)
    mounts = ctx.containment.mounts

    def where() -> str:
        hazards = mounts.may_hang(folder)
        return f"{folder} ({', '.join(hazards)})" if hazards else folder

    return ctx.threads.lanes.run(folder, where, fn, *args, looks=looks)


@contextmanager
def confined(
    ctx: Context, path: str, *, write: bool = False
) -> Iterator[tuple[ConfinedDir, Located]]:
    """Open the root holding `path` and yield it with the path's place beneath it."""
    located: Located | None = None
    try:
        located = locate(ctx.roots, path, write=write)
        with located.root.confined() as root:
            yield root, located
    except HardLinkError as exc:
        details = {"path": path, "links": exc.links}
        error = from_confinement(exc, details)
        raise WorkerError(error.code, exc.message + _HARD_LINK_HINT, details) from exc
    except ConfinementError as exc:
        details = {"path": path}
        error = from_confinement(exc, details)
        if error.code == "not_found" and located is not None:
            # Say where it was looked for: a relative path starts in the first root,
            # not in the caller's current folder, and that surprises people.
            looked = os.path.normpath(located.root.path / located.relative)
            details["looked_for"] = looked
            message = f"{exc.message} Looked for {looked}"
            if not path.startswith("/"):
                message += (
                    f" (relative paths start in the first shared folder, {ctx.roots[0].path})"
                )
            raise WorkerError(error.code, message + ".", details) from exc
        raise error from exc
    except OSError as exc:  # not a confinement question (a full disk, a file size limit)
        raise from_os_error(exc, path) from exc


def check_lands_writable(ctx: Context, parent_fd: int, path: str) -> None:
    """Refuse a write whose folder, as the kernel resolved it, lies in a read-only root.

    `locate` judges the path's text; a symbolic link inside a read-write root can
    still lead into a read-only root nested in it (both are inside, so the
    confined open allows it). The folder actually opened says where it landed.
    """
    landed = os.readlink(f"/proc/self/fd/{parent_fd}")
    try:
        locate(ctx.roots, landed, write=True)
    except ConfinementError as exc:
        raise WorkerError(
            "path_not_allowed",
            f"{path!r} leads through a symbolic link into a folder that is shared read-only; "
            "it can be read but not changed.",
            {"path": path},
        ) from exc


def carried(name: str) -> tuple[str, bool]:
    """A name read from the disk as JSON can carry it, and whether it had to change.
    A name that is not UTF-8 comes to Python with its other bytes as lone surrogates,
    which no JSON writer takes: those are shown as \\xNN (`caf\\xe9.txt`)."""
    try:
        name.encode()
    except UnicodeEncodeError:
        return os.fsencode(name).decode("utf-8", "backslashreplace"), True
    return name, False


def busy_held(exc: HeldError, shown: str) -> WorkerError:
    """`busy` for a place an asked program holds (`shown` is the writer's name for
    it), or for one being written that an asked program names (sandbox.held)."""
    if exc.other_names:
        return WorkerError(
            "busy",
            f"the running call {exc.by} holds {exc.path}, a file with other names (hard "
            "links): a program that could write in a shared folder could change it through "
            "them, and does not start until that call has ended. Run it then",
            {"path": exc.path, "held_by": exc.by},
        )
    if exc.holding:
        return WorkerError(
            "busy",
            f"{shown} is held by the running call {exc.by}: a command approved with it as "
            "it was is running and must open what was approved. Write it once that call "
            "has ended",
            {"path": shown, "held_by": exc.by},
        )
    return WorkerError(
        "busy",
        f"{exc.path} is being written by the call {exc.by}, and this command's approval "
        "would bind it as it is: run the command once that write has ended",
        {"path": exc.path, "written_by": exc.by},
    )
