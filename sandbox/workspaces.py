"""Per-plan workspaces for sandbox mode (the workbench): one private folder per plan.

In sandbox mode each plan the server runs gets a folder of its own under the
worker's data folder, made on the plan's first call and kept between its calls,
so a later call sees what an earlier one left. Its files are reachable only
through it: file actions resolve beneath it with `ConfinedDir` (the same kernel
confinement as the shared folders), and programs see it alone, at a fixed path,
inside their bubblewrap sandbox. A plan is torn down (its folder removed) on
request, and a plan left idle past an age is swept.

    <base>/<key>/plan.json   the plan id, its server, when it was made and the placement
                             token its calls last brought; its mtime is the last use
    <base>/<key>/files/      the workspace: all the agent ever sees

A workspace belongs to a plan of one server (the key the worker knows the server
by: its address and a digest of its token, see worker.core.connection.server_key).
`key` is a digest of both, so any id a server sends is a safe name, and another
server naming the same plan id reaches another folder, never this one: a worker
started again with the same data folder against another server neither sees nor
reaches the first server's workspaces, and finds them again when it returns.
Workspaces made before servers were recorded (named by the plan id alone) are given
their server once (`sort_old`) if the worker can tell it, else marked UNCLAIMED,
which no server's key equals: kept, reached by no call, until the person claims
one for a server (`claim`) or removes it.
A plan's calls bring the server's placement token of the plan on this worker
(opaque here): plan.json keeps the last one, and the worker says it back when it
connects, so a server that lost its record of where it placed the plan can tell the
worker's word from a stranger's. The bookkeeping sits beside the workspace, never in
it, where the agent could change it (or read the token). Every folder is made
owner-only and checked after it is made (owner, type, mode): a folder someone else
made or opened up is refused, not used.

Disk use is what the files take on disk (allocated blocks), with the number of
entries, counted by a walk that holds folders by descriptor, never follows a link,
opens up what a program shut and refuses what it still cannot count, and stops
past `max_entries` (`count_use`); it is cached and counted again after anything
may have changed it. The quota is checked before each write and bounds each file a
program writes (RLIMIT_FSIZE), so a plan can end up over it only through many
files (or folders) written by programs in one call; that call is answered
`too_large` (the worker counts again after each program), and the plan can then
write nothing more until torn down.

Standard library only, no worker imports: it can be reviewed and tested alone.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

from sandbox import plan_uids
from sandbox.paths import Root

log = logging.getLogger(__name__)

FILES: Final = "files"
META: Final = "plan.json"
TRASH_PREFIX: Final = ".trash-"
# An empty read-only folder: the root of a look-only call of a plan with no workspace.
EMPTY: Final = ".empty"
MAX_PLAN_ID_BYTES: Final = 1024
# Where a plan's workspace appears inside its exec sandbox, and the absolute spelling
# file actions accept for it too.
MOUNT_POINT: Final = "/workspace"
# The server of a workspace from before workspaces were kept per server whose server
# is not known: no server's key equals it (theirs name a scheme or `local-hub#`), so
# no call reaches it until the person claims it for one (`Workspaces.claim`).
UNCLAIMED: Final = "unclaimed"
# plan.json's entry for the placement token, and the longest token kept: plan.json is
# read 64 KiB at most, and one it cannot read names no plan (its folder is removed).
TOKEN: Final = "placement_token"  # noqa: S105 - a key's name, not a secret
# plan.json's entry for the plan's own uid ([sandbox] uids): kept across restarts, and
# no two plans whose folders exist (a removal's leftovers included) hold the same.
UID: Final = "uid"
MAX_TOKEN_CHARS: Final = 512


class WorkspaceProblem(StrEnum):
    """What went wrong with a workspace, in the sandbox's own words: it does not speak
    the worker's error codes, and the worker maps each problem to one at its boundary
    (worker.errors.WORKSPACE_CODES)."""

    BAD_PLAN_ID = "bad_plan_id"  # missing, too long, or with a NUL byte
    NOT_PRIVATE = "not_private"  # a folder that is not ours alone (a link, a stranger's, 0755)
    NO_ROOM = "no_room"  # the plan's quota, or the disk, is full
    TOO_MANY_PLANS = "too_many_plans"  # max_plans workspaces exist: a new plan waits
    FAILED = "failed"  # the operating system refused for another reason


class WorkspaceError(Exception):
    """A workspace could not be made or used: `problem` says which way, `message` what
    happened and what to do, `details` the figures (quota, bytes) for a program."""

    def __init__(
        self, problem: WorkspaceProblem, message: str, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.problem = WorkspaceProblem(problem)
        self.message = message
        self.details = details or {}


@dataclass(frozen=True)
class PlanInfo:
    """One plan's workspace as `list` reports it. `server` is UNCLAIMED for one no
    server reaches (from before servers were recorded, not claimed yet)."""

    plan_id: str
    key: str
    bytes_used: int
    created_unix: float
    last_used_unix: float
    server: str = ""
    # The placement token the plan's calls last brought ("" if none did): a secret of
    # the server's and this worker's, never shown.
    placement_token: str = field(default="", repr=False)
    # The plan's own uid its plan.json names ([sandbox] uids), if any.
    uid: int | None = None


@dataclass(frozen=True)
class Workspace:
    plan_id: str
    key: str
    folder: Path  # <base>/<key>
    files: Path  # the workspace itself (real path)
    server: str = ""
    # The plan's own uid ([sandbox] uids): its programs run as it, and `files` and all
    # in it are its. None: the worker's.
    uid: int | None = None

    @property
    def root(self) -> Root:
        return Root(path=self.files, writable=True, owner=self.uid)


def plan_key(plan_id: str, server: str = "") -> str:
    """The folder name of `server`'s plan `plan_id`: a digest of both (as JSON, so no
    two pairs spell alike)."""
    pair = json.dumps([server, plan_id]).encode()
    return hashlib.sha256(b"agentworker workspace\0" + pair).hexdigest()[:32]


def old_plan_key(plan_id: str) -> str:
    """The folder name a plan's workspace had before workspaces were kept per server."""
    return hashlib.sha256(plan_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _check_server(server: str) -> None:
    if server == UNCLAIMED:
        raise WorkspaceError(
            WorkspaceProblem.FAILED,
            f"{UNCLAIMED!r} names no server: it marks workspaces no server may reach",
        )


def _belongs(meta: dict[str, Any], server: str, plan_id: str) -> bool:
    return meta.get("server") == server and meta.get("plan_id") == plan_id


def check_plan_id(plan_id: str) -> None:
    if not plan_id:
        raise WorkspaceError(
            WorkspaceProblem.BAD_PLAN_ID,
            "sandbox mode keeps a workspace per plan, so every call needs a plan_id; "
            "send the plan's id with the call",
        )
    if len(plan_id.encode("utf-8", "surrogatepass")) > MAX_PLAN_ID_BYTES or "\0" in plan_id:
        raise WorkspaceError(
            WorkspaceProblem.BAD_PLAN_ID,
            f"a plan_id may have at most {MAX_PLAN_ID_BYTES} bytes and no NUL byte",
        )


def _owner_only(
    path: Path, owner: int | None = None, *, passable: bool = False, group: int | None = None
) -> None:
    """Refuse `path` unless it is a real folder of `owner`'s (the worker's user by
    default: else a plan's own uid, beneath its files/) that no one else may enter, or,
    `passable`, only pass through (search, never list: a plan's uid passes through the
    folders above its plan's), or with `group`, that group alone may pass through (a
    plan's folder, its uid's group: no other user reaches what its uid made there)."""
    st = os.lstat(path)
    problem = None
    wanted = os.geteuid() if owner is None else owner
    allowed = stat.S_IXGRP if group is not None else stat.S_IXOTH if passable else 0
    if not stat.S_ISDIR(st.st_mode):
        problem = "is not a folder (a link or a file stands in its place)"
    elif st.st_uid != wanted:
        whose = "the worker's user" if owner is None else "the plan's own uid"
        problem = f"belongs to user {st.st_uid}, not to {whose} {wanted}"
    elif group is not None and st.st_gid != group:
        problem = f"belongs to group {st.st_gid}, not to the plan's own {group}"
    elif st.st_mode & 0o077 & ~allowed:
        most = (
            "710 (its plan's group only passes through)"
            if group is not None
            else "701 (others only pass through)"
            if passable
            else "700 (owner only)"
        )
        problem = f"has mode {stat.S_IMODE(st.st_mode):o}; it must be {most}"
    if problem is not None:
        raise WorkspaceError(
            WorkspaceProblem.NOT_PRIVATE,
            f"the workspace folder {path} {problem}. Remove it, or fix it with "
            f"`chmod 700 {path}`, and try again.",
        )


def _make_private(path: Path, *, passable: bool = False) -> None:
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
        if passable:
            plan_uids.searchable(path)
    _owner_only(path, passable=passable)


def _closed_again(path: Path) -> None:
    """A folder of ours opened for plans' uids to pass through (0701) made owner-only
    again, the setting gone ([sandbox] uids)."""
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o077 == 0o001:
            os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o001)


def _passable_by(folder: Path, uid: int | None) -> None:
    """A plan's folder (the worker's) that its own uid, and no other user, may pass
    through to its files/: group `uid`, mode 710. Not 701: a program may open its
    files/ to all and leave there programs set-uid to its uid, which every local user
    could then run as that uid and keep, to reach the next plan given it (review29b
    r1). Owner-only when the plan has no uid."""
    if uid is None:
        st = os.lstat(folder)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o077:
            os.chmod(folder, stat.S_IMODE(st.st_mode) & ~0o077)  # opened for a uid before
        _owner_only(folder)
        return
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        _owner_only(folder)  # refused, saying why
    os.chown(folder, -1, uid, follow_symlinks=False)
    os.chmod(folder, 0o710, follow_symlinks=False)  # noqa: S103 - its uid's group only
    _owner_only(folder, group=uid)


def _make_files(folder: Path, uid: int | None) -> None:
    """The plan's files/ in `folder`, owner-only, the plan's uid's where it has one."""
    files = folder / FILES
    with contextlib.suppress(FileExistsError):
        os.mkdir(files, 0o700)
        if uid is not None:
            os.chown(files, uid, uid, follow_symlinks=False)
    _owner_only(files, uid)


# Entries a plan's workspace may hold by default ([sandbox] max_entries): an empty file
# takes no blocks, so bytes alone would let a plan make files without end, and every
# count walks them all.
MAX_ENTRIES: Final = 100_000
MAX_PLANS: Final = 64
MAX_PLANS_PER_AGENT: Final = 32
# Folders nested deeper than this are not counted (the walk holds a descriptor per
# level): the count fails closed, and the plan can write no more.
MAX_DEPTH: Final = 256
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_ENTER: Final = stat.S_IRUSR | stat.S_IXUSR


@dataclass(frozen=True)
class Use:
    """What a workspace holds: bytes on disk (allocated blocks) and entries (files,
    folders, links; the workspace folder itself not counted). `complete` is False when
    the count stopped at its cap of entries: then both figures are at least this.
    `held_open` (not in `bytes`): what the plan's running programs hold in files they
    removed but keep open or mapped, looked at while they were stopped for the walk
    (sandbox.held_open); `unseen` says why that could not be looked at, if so."""

    bytes: int
    entries: int
    complete: bool = True
    held_open: int = 0
    unseen: str = ""
    # Folders listed, then gone (moved, removed, swapped) before the walk entered them:
    # their contents are not in this count (sandbox.workspaces._open_folder).
    moved: int = 0


def _uncountable(shown: str, why: str) -> WorkspaceError:
    return WorkspaceError(
        WorkspaceProblem.NO_ROOM,
        f"part of the workspace cannot be counted against its quota ({shown}: {why}), so "
        "the plan can write nothing more. Tear the plan down to start over.",
        {"path": shown},
    )


# A folder listed, then gone or swapped for a file or a link before it is opened (a
# program may do that as the walk passes): counted as it was listed, not entered. The
# count is a moment's; after a program ends, nothing moves.
_WENT: Final = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)


def _open_folder(
    parent_fd: int, name: str, st: os.stat_result, shown: str, owner: int | None = None
) -> int | None:
    """A descriptor of folder `name` (lstat `st`) in `parent_fd`, never through a link;
    None if it went meanwhile (or something else took its place). A folder a program
    shut (mode 000, or no search bit) is opened up first, since the worker owns it:
    owner read and search are added on the folder itself, held by an O_PATH
    descriptor, so a link swapped in is never followed."""
    if st.st_mode & _ENTER == _ENTER:
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        except OSError as exc:
            if exc.errno in _WENT:
                return None
            if exc.errno not in (errno.EACCES, errno.EPERM):
                raise _uncountable(shown, exc.strerror or str(exc)) from None
    try:
        return _opened_up(name, parent_fd, _ENTER, owner)
    except OSError as exc:
        if exc.errno in _WENT:
            return None
        raise _uncountable(shown, exc.strerror or str(exc)) from None  # another's


def _opened_up(name: str, dir_fd: int | None, add: int, owner: int | None = None) -> int:
    """Folder `name` opened to list after adding `add` to its owner's mode bits: for a
    folder a program shut. The mode is changed on the folder itself, held by an O_PATH
    descriptor (never through a link), and only on one of the worker's own (or of
    `owner`, the plan's own uid)."""
    held = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        now = os.fstat(held)
        if now.st_uid not in (os.geteuid(), owner):
            raise OSError(errno.EPERM, f"a folder of user {now.st_uid}, not the worker's")
        # fchmod refuses an O_PATH descriptor; its /proc name reaches the same inode.
        os.chmod(f"/proc/self/fd/{held}", stat.S_IMODE(now.st_mode) | add)
        return os.open(".", _DIR_FLAGS, dir_fd=held)
    finally:
        os.close(held)


def count_use(files: Path, max_entries: int = MAX_ENTRIES, owner: int | None = None) -> Use:
    """What the workspace `files` holds, walked by descriptor without following a link.
    Nothing is skipped: a folder a program made unreadable is opened up (the worker owns
    it), and anything that still cannot be counted, or folders deeper than MAX_DEPTH,
    raise WorkspaceError (NO_ROOM) rather than count less. The walk stops once it has
    seen more than `max_entries` entries (`complete` False), so it is bounded. `owner`:
    the plan's own uid, whose folders it may open up too."""
    total = 0
    entries = 0
    moved = 0
    shown = MOUNT_POINT  # paths in messages as programs see them, not the host's
    try:
        top = os.open(files.parent, _DIR_FLAGS)
    except FileNotFoundError:
        return Use(0, 0)
    except OSError as exc:
        raise _uncountable(shown, exc.strerror or str(exc)) from None
    stack: list[tuple[int, list[tuple[str, os.stat_result]], str]] = [(top, [], "")]
    try:
        try:
            st = os.stat(files.name, dir_fd=top, follow_symlinks=False)
        except FileNotFoundError:
            return Use(0, 0)
        if not stat.S_ISDIR(st.st_mode):
            raise _uncountable(shown, "not a folder")
        stack[0][1].append((files.name, st))
        while stack:
            parent_fd, pending, where = stack[-1]
            if not pending:
                os.close(parent_fd)
                stack.pop()
                continue
            name, st = pending.pop()
            here = f"{where}/{name}" if where else MOUNT_POINT
            if len(stack) > MAX_DEPTH:
                raise _uncountable(here, f"folders nested more than {MAX_DEPTH} deep")
            fd = _open_folder(parent_fd, name, st, here, owner)
            if fd is None:
                moved += 1
                continue
            folders: list[tuple[str, os.stat_result]] = []
            try:
                with os.scandir(fd) as listing:
                    for entry in listing:
                        try:
                            est = entry.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue
                        entries += 1
                        total += est.st_blocks * 512
                        if entries > max_entries:
                            return Use(total, entries, complete=False, moved=moved)
                        if stat.S_ISDIR(est.st_mode):
                            folders.append((entry.name, est))
            except OSError as exc:
                os.close(fd)
                raise _uncountable(here, exc.strerror or str(exc)) from None
            stack.append((fd, folders, here))
    finally:
        for fd, _, _ in stack:
            os.close(fd)
    return Use(total, entries, moved=moved)


def disk_use(folder: Path, owner: int | None = None) -> int:
    """Bytes `folder` takes on disk (allocated blocks), as far as a count of at most
    MAX_ENTRIES entries sees (for reports: the quota uses `count_use`)."""
    try:
        return count_use(folder, owner=owner).bytes
    except WorkspaceError:
        return 0


def remove_tree(path: Path, owner: int | None = None) -> None:
    """Remove `path` and all in it: never following a link, opening up folders a
    program made unreadable or unwritable to us, one folder open at a time and
    without recursion. A plan can make a tree thousands of levels deep (fs_write's
    `make_parents`, any program): `shutil.rmtree` recursed once per level before
    Python 3.12, and such a tree raised RecursionError, which left it in place.
    `owner`: the plan's own uid, whose folders it may open up too."""
    try:
        fd = _open_to_remove(str(path), None, owner)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a file or a link where the folder was: itself only
        return
    # Each folder from `path` down to the one open: its identity (to check the way
    # back up), its name in the one above, and its sub-folders not yet removed.
    levels = [(os.fstat(fd), "", _clear_files(fd))]
    try:
        while True:
            _seen, name, pending = levels[-1]
            if pending:
                child_name = pending.pop()
                try:
                    child = _open_to_remove(child_name, fd, owner)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                        raise
                    _unlink(child_name, fd)  # swapped for a file or a link since
                    continue
                os.close(fd)
                fd = child
                levels.append((os.fstat(fd), child_name, _clear_files(fd)))
                continue
            if len(levels) == 1:
                break
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            expected, found = levels[-2][0], os.fstat(parent)
            if (found.st_dev, found.st_ino) != (expected.st_dev, expected.st_ino):
                os.close(parent)
                raise OSError(errno.ESTALE, f"a folder under {path} moved while it was removed")
            os.close(fd)
            fd = parent
            levels.pop()
            _as_owner(os.rmdir, name, fd)
    finally:
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(path)


def _open_to_remove(name: str, dir_fd: int | None, owner: int | None = None) -> int:
    """The folder `name` (never a link) opened to list, made readable to us first
    if a program took that away."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        return _opened_up(name, dir_fd, stat.S_IRWXU, owner)


def _clear_files(fd: int) -> list[str]:
    """Unlink everything in the open folder but its sub-folders; their names."""
    folders = []
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                folders.append(entry.name)
            else:
                _unlink(entry.name, fd)
    return folders


def _unlink(name: str, fd: int) -> None:
    _as_owner(os.unlink, name, fd)


def _as_owner(remove: Callable[..., None], name: str, fd: int) -> None:
    """`remove` the entry `name` of the open folder `fd`, making the folder writable
    to us first if a program took that away."""
    try:
        remove(name, dir_fd=fd)
    except FileNotFoundError:
        return
    except PermissionError:
        os.fchmod(fd, 0o700)
        with contextlib.suppress(FileNotFoundError):
            remove(name, dir_fd=fd)


def _plan_meta(folder: Path) -> dict[str, Any] | None:
    """The folder's plan.json if it reads as a plan's; None if it is missing or not a
    plan's (no plan can ever be named for the folder). OSError when it cannot be read
    now (EIO, EMFILE): that may pass."""
    try:
        fd = os.open(folder / META, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(64 * 1024)
    try:
        info = json.loads(data)
    except ValueError:
        return None
    if not isinstance(info, dict) or not isinstance(info.get("plan_id"), str):
        return None
    return info


def _uid_of(meta: dict[str, Any]) -> int | None:
    """The plan's own uid its plan.json names, if any."""
    uid = meta.get(UID)
    return uid if isinstance(uid, int) and not isinstance(uid, bool) and uid > 0 else None


def _read_meta(folder: Path) -> dict[str, Any] | None:
    """The plan's plan.json, or None if it has none that reads as a plan's now."""
    try:
        return _plan_meta(folder)
    except OSError:
        return None


def _meta_broken(folder: Path) -> bool:
    """No plan can be named for the folder; not when its plan.json cannot be read now
    (the plan's files are not removed for that)."""
    try:
        return _plan_meta(folder) is None
    except OSError:
        return False


def _rewrite_meta(folder: Path, meta: dict[str, Any]) -> None:
    """plan.json replaced by `meta`, its mtime (the plan's last use) kept."""
    used = os.lstat(folder / META)
    _write_meta(folder, meta)
    os.utime(folder / META, ns=(used.st_atime_ns, used.st_mtime_ns), follow_symlinks=False)


def _write_meta(folder: Path, meta: dict[str, Any]) -> None:
    """plan.json written whole or not at all (a temp file renamed over it)."""
    temp = folder / f".{META}.{secrets.token_hex(4)}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(meta, handle)
        os.rename(temp, folder / META)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


class Workspaces:
    """Every plan's workspace under `base` (owner-only), with a quota per plan."""

    def __init__(
        self,
        base: Path,
        *,
        quota_bytes: int,
        max_entries: int = MAX_ENTRIES,
        max_plans: int = MAX_PLANS,
        max_plans_per_agent: int = MAX_PLANS_PER_AGENT,
        uids: range | None = None,
    ) -> None:
        self.base = base
        # [sandbox] uids: each plan gets one of these as its own (sandbox.plan_uids)
        self.uids = uids
        self.quota_bytes = quota_bytes
        self.max_entries = max_entries
        # Each plan may take quota_bytes: without a bound on plans, a server naming new
        # ones would fill the disk however small the quota.
        self.max_plans = max_plans
        self.max_plans_per_agent = max_plans_per_agent
        self._lock = threading.Lock()
        # key -> the last count (or why it failed), while nothing may have changed it
        self._use: dict[str, Use | WorkspaceError] = {}
        self._changes: dict[str, int] = {}  # key -> `changed` calls (a count started
        # before one is not kept)
        self._opened: dict[str, Workspace] = {}
        # key -> the server and agent its plan.json names: read once per plan folder,
        # not once per new plan for every plan (review4 finding 06: 2.5 s at 20,000 plans)
        self._agents: dict[str, tuple[str | None, str | None]] = {}
        # key -> the placement token its plan.json holds, once read or written: a call
        # bringing the same one (every call, but the first after a placement) reads and
        # writes nothing.
        self._tokens: dict[str, str] = {}

    def prepare(self) -> None:
        """Make the base folder (owner-only) and the empty stand-in, finish removals a
        crash interrupted, and remove plan folders without a readable plan.json (left
        by a version that made the folder before its plan.json): no plan can be named
        for them, so they would be counted against max_plans and never swept."""
        self.base.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        passable = self.uids is not None
        if passable and os.path.isdir(self.base):
            plan_uids.searchable(self.base)  # plans' uids pass through to their files/
        elif not passable:
            _closed_again(self.base)
        _make_private(self.base, passable=passable)
        _make_private(self.base / EMPTY)
        os.chmod(self.base / EMPTY, 0o500)  # nothing is ever written there
        for name in os.listdir(self.base):
            if not name.startswith(".") and _meta_broken(self.base / name):
                log.warning("removing %s: a plan folder without a readable %s", name, META)
                trash = f"{TRASH_PREFIX}{name}.{secrets.token_hex(4)}"
                with contextlib.suppress(OSError):
                    os.rename(self.base / name, self.base / trash)
                    name = trash
            if name.startswith(TRASH_PREFIX):
                try:
                    self.remove(self.base / name)
                except OSError as exc:  # never a reason not to start: it is out of use
                    log.warning("could not remove %s, a removed plan's files: %s", name, exc)

    # ------------------------------------------------------------- one plan

    def open(
        self, plan_id: str, agent_id: str = "", *, server: str = "", placement_token: str = ""
    ) -> Workspace:
        """`server`'s plan's workspace, made now (for `agent_id`) if this is its first
        call; marks it used, and keeps `placement_token` (the call's) if it brings one
        (`_keep_token`)."""
        check_plan_id(plan_id)
        _check_server(server)
        key = plan_key(plan_id, server)
        with self._lock:
            known = self._opened.get(key)
            if known is not None and self._uid_fits(known.uid) and os.path.isdir(known.files):
                self._keep_token(known, placement_token)
                self._touch(known)
                return known
            if not os.path.isdir(self.base / key):
                self._check_plan_room(plan_id, agent_id, server)
            workspace = self._create(plan_id, key, agent_id, server, placement_token)
            self._keep_token(workspace, placement_token)
            self._opened[key] = workspace
            return workspace

    def find(
        self, plan_id: str, *, server: str = "", placement_token: str = ""
    ) -> Workspace | None:
        """`server`'s plan's workspace if it has one (marked used, and `placement_token`
        kept as `open` does), else None: for a call that only looks, which must not take
        one of `max_plans` for a plan that has none."""
        check_plan_id(plan_id)
        _check_server(server)
        key = plan_key(plan_id, server)
        with self._lock:
            known = self._opened.get(key)
            if known is None:
                meta = _read_meta(self.base / key)
                if meta is not None and _belongs(meta, server, plan_id):
                    known = self._workspace(plan_id, key, server, _uid_of(meta))
            if known is None or not os.path.isdir(known.files):
                return None
            self._opened[key] = known
            self._keep_token(known, placement_token)
            self._touch(known)
            return known

    def _keep_token(self, workspace: Workspace, token: str) -> None:
        """Keep `token`, the placement token a call of the plan brought, in its
        plan.json unless it holds that one already: the server's latest word (a server
        that placed the plan here anew gives another), said back when the worker
        connects. A failure to write it is logged and the call goes on: the token only
        helps a server that lost its record find the plan here."""
        if not token or self._tokens.get(workspace.key) == token:
            return
        if len(token) > MAX_TOKEN_CHARS:
            log.warning(
                "plan %r: its call brought a placement token of %d characters, over the "
                "%d kept; not kept",
                workspace.plan_id,
                len(token),
                MAX_TOKEN_CHARS,
            )
            return
        meta = _read_meta(workspace.folder)
        if meta is None:
            return
        if meta.get(TOKEN) != token:
            try:
                _rewrite_meta(workspace.folder, {**meta, TOKEN: token})
            except OSError as exc:
                log.warning(
                    "plan %r: could not keep its placement token in %s: %s",
                    workspace.plan_id,
                    META,
                    exc.strerror,
                )
                return
        self._tokens[workspace.key] = token

    @property
    def empty(self) -> Root:
        """A read-only empty folder: what a look-only call of a plan without a workspace
        sees, as it would see its plan's workspace before anything was written."""
        return Root(path=self.base / EMPTY, writable=False)

    def _check_plan_room(self, plan_id: str, agent_id: str, server: str) -> None:
        """Refuse a new plan's workspace while `max_plans` exist (every server's, and
        those no server reaches), or `max_plans_per_agent` made for this agent of this
        server (a removal's leftovers not counted): one agent of the server must not
        take every workspace from the others."""
        try:
            with os.scandir(self.base) as found:
                keys = [entry.name for entry in found if not entry.name.startswith(".")]
        except FileNotFoundError:
            return
        held = len(keys)
        if held >= self.max_plans:
            raise WorkspaceError(
                WorkspaceProblem.TOO_MANY_PLANS,
                f"plan {plan_id!r} gets no workspace: the sandbox holds {held} plans' "
                f"workspaces, its limit ([sandbox] max_plans = {self.max_plans}). Tear down "
                "a finished plan (the server's Teardown, or `agentworker sandbox teardown "
                "PLAN`) and try again, or raise the limit.",
                {"plans": held, "max_plans": self.max_plans},
            )
        if held < self.max_plans_per_agent:
            return
        mine = sum(1 for key in keys if self._agent_of(key) == (server, agent_id))
        if mine >= self.max_plans_per_agent:
            raise WorkspaceError(
                WorkspaceProblem.TOO_MANY_PLANS,
                f"plan {plan_id!r} gets no workspace: agent {agent_id!r} already holds {mine} "
                f"plans' workspaces, the limit for one agent ([sandbox] max_plans_per_agent "
                f"= {self.max_plans_per_agent}). Tear down one of its finished plans and try "
                "again, or raise the limit.",
                {"plans": mine, "max_plans_per_agent": self.max_plans_per_agent},
            )

    def _agent_of(self, key: str) -> tuple[str | None, str | None]:
        if key not in self._agents:
            meta = _read_meta(self.base / key) or {}
            self._agents[key] = (meta.get("server"), meta.get("agent_id"))
        return self._agents[key]

    def _create(
        self, plan_id: str, key: str, agent_id: str, server: str, token: str = ""
    ) -> Workspace:
        folder = self.base / key
        meta = {
            "plan_id": plan_id,
            "agent_id": agent_id,
            "created_unix": time.time(),
            "server": server,
        }
        if token and len(token) <= MAX_TOKEN_CHARS:
            meta[TOKEN] = token
        passable = self.uids is not None
        try:
            _make_private(self.base, passable=passable)
            found = _read_meta(folder)
            if found is None:
                if self.uids is not None:
                    meta[UID] = self._free_uid(plan_id)
                self._make_whole(folder, meta)
                uid = _uid_of(meta)
            elif not _belongs(found, server, plan_id):  # a digest's clash: never shared
                raise WorkspaceError(
                    WorkspaceProblem.FAILED,
                    f"the workspace folder {folder} holds another plan's files; plan "
                    f"{plan_id!r} gets no workspace while it is there",
                )
            else:
                uid = self._settle_uid(plan_id, folder, found)
            _passable_by(folder, uid)
            _make_files(folder, uid)
        except WorkspaceError:
            raise
        except OSError as exc:
            raise WorkspaceError(
                (
                    WorkspaceProblem.NO_ROOM
                    if exc.errno in (errno.ENOSPC, errno.EDQUOT)
                    else WorkspaceProblem.FAILED
                ),
                f"could not make the workspace of plan {plan_id!r}: {exc.strerror}",
            ) from exc
        self._agents.pop(key, None)  # its plan.json says, from now on
        workspace = self._workspace(plan_id, key, server, uid)
        self._touch(workspace)
        return workspace

    def _workspace(self, plan_id: str, key: str, server: str, uid: int | None) -> Workspace:
        folder = self.base / key
        files = Path(os.path.realpath(folder / FILES))
        return Workspace(plan_id, key, folder, files, server, uid)

    def _uid_fits(self, uid: int | None) -> bool:
        """Whether a plan holding `uid` may keep it: one of [sandbox] uids, or none
        when the setting is off."""
        return uid is None if self.uids is None else uid in self.uids

    def _free_uid(self, plan_id: str) -> int:
        """The lowest uid of the range no plan folder here holds, a removal's leftovers
        included (their programs are killed before their files go, see `remove`)."""
        assert self.uids is not None
        held = set()
        with os.scandir(self.base) as found:
            for entry in found:
                uid = _uid_of(_read_meta(Path(entry.path)) or {})
                if uid is not None:
                    held.add(uid)
        for uid in self.uids:
            if uid not in held:
                return uid
        raise WorkspaceError(
            WorkspaceProblem.TOO_MANY_PLANS,
            f"plan {plan_id!r} gets no workspace: each of the {len(self.uids)} uids of "
            f'[sandbox] uids = "{self.uids.start}-{self.uids.stop - 1}" is a plan\'s. Tear '
            "down a finished plan and try again, or widen the range.",
            {"plans": len(held), "uids": len(self.uids)},
        )

    def _settle_uid(self, plan_id: str, folder: Path, meta: dict[str, Any]) -> int | None:
        """The plan's uid as the setting wants it: kept, or given now (with its files)
        to a plan from before the setting, or from another range; taken back to the
        worker's user when the setting is off."""
        uid = _uid_of(meta)
        if self._uid_fits(uid):
            return uid
        wanted = None if self.uids is None else self._free_uid(plan_id)
        kept = {name: value for name, value in meta.items() if name != UID}
        _rewrite_meta(folder, kept if wanted is None else {**kept, UID: wanted})
        if os.path.isdir(folder / FILES):
            # No kill of `uid`: outside the range now, it may be no plan's any more (a
            # range moved off ids something else uses); a sandbox dies with its worker.
            plan_uids.give(folder / FILES, os.geteuid() if wanted is None else wanted)
        return wanted

    def remove(self, trash: Path) -> None:
        """Remove a plan's folder taken out of use (`detach`): first every process of
        its own uid, if it has one (nothing of it may outlive its files, nor run on as
        the next plan given that uid), then its files."""
        uid = _uid_of(_read_meta(trash) or {})
        if uid is not None and os.geteuid() == 0 and self._uid_fits(uid):
            plan_uids.kill_all(uid)  # never a uid the range no longer holds: not ours now
        if uid is not None:
            # The uid's files first: plan.json, which holds the uid (`_free_uid`), goes
            # last, so no plan is given it while files of it remain (review29b r4).
            remove_tree(trash / FILES, uid)
        remove_tree(trash, uid)

    def _make_whole(self, folder: Path, meta: dict[str, Any]) -> None:
        """Make the plan's folder with its plan.json and files/ under a name no count
        sees, then rename it into place: a failure (a full disk) or a crash midway
        leaves only a leftover `prepare` removes, never a folder without its plan.json.
        A folder already there without a readable plan.json (from before) gets one."""
        made = self.base / f"{TRASH_PREFIX}new-{secrets.token_hex(8)}"
        try:
            _make_private(made)  # opened to the plan's uid alone once in place
            _write_meta(made, meta)
            _make_files(made, _uid_of(meta))
            try:
                os.rename(made, folder)
                return
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
        finally:
            with contextlib.suppress(OSError):
                remove_tree(made, _uid_of(meta))
        _passable_by(folder, _uid_of(meta) if self.uids is not None else None)
        _write_meta(folder, meta)

    def _touch(self, workspace: Workspace) -> None:
        with contextlib.suppress(OSError):
            os.utime(workspace.folder / META)

    def known_use(self, workspace: Workspace) -> Use | None:
        """The cached count, if nothing changed since; raises what the count raised."""
        known = self._use.get(workspace.key)
        if isinstance(known, WorkspaceError):
            raise WorkspaceError(known.problem, known.message, known.details)
        return known

    def use(self, workspace: Workspace) -> Use:
        """What the workspace holds (cached until `changed`); WorkspaceError (NO_ROOM)
        when part of it cannot be counted. A walk, at most `max_entries` entries long:
        in the worker, Workbench.use runs it off the shared pool, one per plan at once."""
        known = self.known_use(workspace)
        if known is not None:
            return known
        with self._lock:
            changes = self._changes.get(workspace.key, 0)
        try:
            counted: Use | WorkspaceError = count_use(
                workspace.files, self.max_entries, workspace.uid
            )
        except WorkspaceError as exc:
            counted = exc
        with self._lock:
            if self._changes.get(workspace.key, 0) == changes:
                self._use[workspace.key] = counted
        if isinstance(counted, WorkspaceError):
            raise counted
        return counted

    def changed(self, workspace: Workspace) -> None:
        """Something may have written to the workspace: count it again when next asked."""
        with self._lock:
            self._use.pop(workspace.key, None)
            self._changes[workspace.key] = self._changes.get(workspace.key, 0) + 1

    def over_entries(self, used: Use) -> bool:
        return not used.complete or used.entries > self.max_entries

    def room(self, workspace: Workspace) -> int:
        """Bytes the plan may still write before its quota is reached."""
        return max(0, self.quota_bytes - self.use(workspace).bytes)

    def check_room(self, workspace: Workspace, incoming: int, used: Use | None = None) -> None:
        """Refuse (NO_ROOM) a write of `incoming` bytes, and a new entry, that would not
        fit the plan's quota or its cap of entries; `used` is the count if known."""
        if used is None:
            used = self.use(workspace)
        if used.entries >= self.max_entries or not used.complete:
            more = "more than " if not used.complete else ""
            raise WorkspaceError(
                WorkspaceProblem.NO_ROOM,
                f"plan {workspace.plan_id!r} holds {more}{used.entries - (not used.complete):,} "
                f"files and folders, its cap ([sandbox] max_entries = {self.max_entries:,}); "
                "nothing more may be written. Remove files it no longer needs (one archive "
                "instead of many small files), or tear the plan down to start over.",
                {"max_entries": self.max_entries, "entries": used.entries},
            )
        if used.bytes + incoming > self.quota_bytes:
            raise WorkspaceError(
                WorkspaceProblem.NO_ROOM,
                f"plan {workspace.plan_id!r} has used {used.bytes:,} of its "
                f"{self.quota_bytes:,}-byte workspace quota; {incoming:,} more bytes would "
                "not fit. Write less, or tear the plan down to start over.",
                {"quota_bytes": self.quota_bytes, "used_bytes": used.bytes, "bytes": incoming},
            )

    # ------------------------------------------------------------- all plans

    def teardown(self, plan_id: str, *, server: str = "") -> bool:
        """Remove `server`'s plan's workspace; True if there was one. Idempotent."""
        trash = self.detach(plan_id, server=server)
        if trash is None:
            return False
        self.remove(trash)
        return True

    def detach(self, plan_id: str, *, server: str = "") -> Path | None:
        """Take `server`'s plan's workspace out of use at once (a rename); the folder to
        remove with `remove_tree`, or None if the plan had none. A later first call of
        the plan starts clean even while the old tree is still being removed."""
        _check_server(server)
        key = plan_key(plan_id, server)
        with self._lock:
            self._opened.pop(key, None)
            self._use.pop(key, None)
            self._agents.pop(key, None)
            self._tokens.pop(key, None)
            self._changes[key] = self._changes.get(key, 0) + 1
            trash = self.base / f"{TRASH_PREFIX}{key}.{secrets.token_hex(4)}"
            try:
                os.rename(self.base / key, trash)
            except FileNotFoundError:
                return None
        return trash

    def plans(self, *, sizes: bool = True, server: str | None = None) -> list[PlanInfo]:
        """Every plan holding a workspace (with `server`, only that server's), most
        recently used first (`bytes_used` is 0 unless `sizes`: counting walks every
        file). A workspace no server reaches says UNCLAIMED: one from before servers
        were recorded not yet sorted (`sort_old`), or one not named for its server
        and plan (a move `sort_old` or `claim` did not finish)."""
        found = []
        try:
            names = os.listdir(self.base)
        except FileNotFoundError:
            return []
        for name in names:
            if name.startswith("."):
                continue
            folder = self.base / name
            info = _read_meta(folder)
            if info is None:
                continue
            try:
                st = os.lstat(folder / META)
                created = float(info.get("created_unix", st.st_mtime))
            except (OSError, ValueError, TypeError):
                continue
            plan_id = info["plan_id"]
            owner = info.get("server")
            if not isinstance(owner, str) or name != plan_key(plan_id, owner):
                owner = UNCLAIMED
            if server is not None and owner != server:
                continue
            token = info.get(TOKEN)
            found.append(
                PlanInfo(
                    plan_id=plan_id,
                    key=name,
                    bytes_used=disk_use(folder / FILES, _uid_of(info)) if sizes else 0,
                    created_unix=created,
                    last_used_unix=st.st_mtime,
                    server=owner,
                    placement_token=token if isinstance(token, str) else "",
                    uid=_uid_of(info),
                )
            )
        return sorted(found, key=lambda p: p.last_used_unix, reverse=True)

    def last_used(self, plan_id: str, *, server: str = "") -> float | None:
        """When `server`'s plan's workspace was last used (unix time), or None if it has
        none."""
        try:
            return os.lstat(self.base / plan_key(plan_id, server) / META).st_mtime
        except OSError:
            return None

    def idle(
        self, idle_s: float, busy: Iterable[tuple[str, str]] = (), now: float | None = None
    ) -> list[tuple[str, str]]:
        """Plans unused for `idle_s` and not in `busy`, as (server, plan id): the ones a
        sweep removes, whichever server's. Never an UNCLAIMED one: the person decides."""
        moment = time.time() if now is None else now
        spared = set(busy)
        return [
            (plan.server, plan.plan_id)
            for plan in self.plans(sizes=False)
            if plan.server != UNCLAIMED
            and (plan.server, plan.plan_id) not in spared
            and moment - plan.last_used_unix >= idle_s
        ]

    def sweep(
        self, idle_s: float, busy: Iterable[tuple[str, str]] = (), now: float | None = None
    ) -> list[tuple[str, str]]:
        """Tear down every plan unused for `idle_s` that is not in `busy`; those removed,
        as (server, plan id)."""
        return [
            (server, plan)
            for server, plan in self.idle(idle_s, busy, now)
            if self.teardown(plan, server=server)
        ]

    # ------------------------------------------------------------- servers

    def sort_old(self, servers_of: Callable[[list[str]], dict[str, str]]) -> list[PlanInfo]:
        """Give each workspace made before workspaces were kept per server (a plan.json
        without `server`) its server once: the one `servers_of` names for its plan id
        (the worker's ledger, when it recorded that server's calls of the plan and no
        other's), else UNCLAIMED. Then name every folder for its server and plan (a
        rename: the files stay). Run at the worker's start, before any call. Returns
        the workspaces sorted now, with their server."""
        found: list[tuple[str, dict[str, Any]]] = []
        try:
            names = os.listdir(self.base)
        except FileNotFoundError:
            return []
        for name in names:
            meta = None if name.startswith(".") else _read_meta(self.base / name)
            if meta is not None:
                found.append((name, meta))
        old = [meta["plan_id"] for _name, meta in found if not isinstance(meta.get("server"), str)]
        owners = servers_of(old) if old else {}
        sorted_now = []
        for name, meta in found:
            plan_id, server = meta["plan_id"], meta.get("server")
            folder = self.base / name
            with self._lock:
                if not isinstance(server, str):
                    server = owners.get(plan_id) or UNCLAIMED
                    try:
                        _rewrite_meta(folder, {**meta, "server": server})
                    except OSError as exc:
                        log.warning("workspace %s could not be sorted: %s", name, exc)
                        continue
                    sorted_now.append((plan_id, name, server))
                wanted = plan_key(plan_id, server)
                if name != wanted:
                    self._move(folder, self.base / wanted)
        return [
            PlanInfo(plan_id, plan_key(plan_id, server), 0, 0.0, 0.0, server)
            for plan_id, _name, server in sorted_now
        ]

    def claim(self, plan_id: str, server: str) -> PlanInfo:
        """Give the UNCLAIMED workspace of plan `plan_id` to `server`: its calls of the
        plan reach it from now on. WorkspaceError when there is no such workspace, or
        the server holds one of the plan already."""
        check_plan_id(plan_id)
        _check_server(server)
        if not server:
            raise WorkspaceError(WorkspaceProblem.FAILED, "name the server to claim it for")
        with self._lock:
            unclaimed = [
                p for p in self.plans(sizes=False) if p.plan_id == plan_id and p.server == UNCLAIMED
            ]
            if not unclaimed:
                raise WorkspaceError(
                    WorkspaceProblem.FAILED,
                    f"no unclaimed workspace of plan {plan_id!r} here (`agentworker sandbox "
                    "list` shows each workspace's server)",
                )
            folder = self.base / unclaimed[0].key
            wanted = self.base / plan_key(plan_id, server)
            if os.path.lexists(wanted):
                raise WorkspaceError(
                    WorkspaceProblem.FAILED,
                    f"server {server} holds a workspace of plan {plan_id!r} already; tear "
                    "that one down first (`agentworker sandbox teardown`) to claim this one",
                )
            meta = _read_meta(folder)
            if meta is None:
                raise WorkspaceError(
                    WorkspaceProblem.FAILED, f"the workspace {folder} went meanwhile"
                )
            try:
                # Another server's placement token, if any, is no proof for this one.
                claimed = {name: value for name, value in meta.items() if name != TOKEN}
                _rewrite_meta(folder, {**claimed, "server": server})
                os.rename(folder, wanted)  # never over a workspace: it is not empty
            except OSError as exc:
                with contextlib.suppress(OSError):
                    _rewrite_meta(folder, meta)  # unclaimed as it was
                raise WorkspaceError(
                    WorkspaceProblem.FAILED,
                    f"the workspace of plan {plan_id!r} could not be claimed: {exc}",
                ) from None
            self._agents.pop(folder.name, None)
        return replace(unclaimed[0], key=wanted.name, server=server)

    def _move(self, folder: Path, wanted: Path) -> None:
        """Name a workspace's folder for its server and plan; one already there (which
        cannot be another's: the name is a digest of both) keeps it, and this one
        stays where no call reaches it."""
        if os.path.lexists(wanted):
            log.warning(
                "workspace %s stays unreachable: %s is there already", folder.name, wanted.name
            )
            return
        try:
            os.rename(folder, wanted)
        except OSError as exc:
            log.warning("workspace %s could not be renamed for its server: %s", folder.name, exc)
            return
        self._agents.pop(folder.name, None)
