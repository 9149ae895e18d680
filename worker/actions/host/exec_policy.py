"""The worker's view of the allowlist: which policy is in force, and how paths are judged.

The policy is loaded once and reloaded when the person's allowlist file changes,
so an edit takes effect on the next call without a restart. A file that does
not load (a typo, an example that no longer holds) refuses every exec, with the
loader's message, until it is fixed: a broken policy never falls back to a
looser one.

Paths in arguments are judged the way `workerHost.fs_*` judges them
(`sandbox.locate`): relative paths are taken from the call's working directory,
and must end up inside a shared folder, writable when the argument is written.
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from allowlist import PathCheck, Policy, PolicyError, PolicyFile, Refusal
from sandbox import ConfinementError, HardLinkError, Problem, Root, locate
from worker.config import USER_POLICY, Config, Paths
from worker.errors import ErrorCode, WorkerError

# The allowlist's refusals (its own words) as the codes a caller sees.
REFUSAL_CODES: Final[dict[Refusal, ErrorCode]] = {
    Refusal.NOT_ALLOWED: ErrorCode.COMMAND_NOT_ALLOWED,
    Refusal.FORBIDDEN: ErrorCode.COMMAND_FORBIDDEN,
    Refusal.PATH_REFUSED: ErrorCode.PATH_NOT_ALLOWED,
}


def user_policy_file(config: Config, paths: Paths) -> Path | None:
    """The person's allowlist: [exec] policy, else allowlist.toml beside config.toml."""
    if config.exec.policy is not None:
        return Path(os.path.expanduser(config.exec.policy))
    beside = paths.config_dir / USER_POLICY
    return beside if beside.exists() else None


def policy_for(config: Config, paths: Paths, policies: PolicyFile) -> Policy:
    """The policy in force, from `policies` (the worker's, loaded once per version of
    the file); WorkerError if it does not load."""
    path = user_policy_file(config, paths)
    try:
        return policies.current(path)
    except PolicyError as exc:
        raise _broken(path, exc) from None


def _broken(path: Path | None, exc: PolicyError) -> WorkerError:
    return WorkerError(
        "command_not_allowed",
        f"the exec allowlist did not load, so nothing may run until the person at this worker "
        f"fixes it: {exc}",
        {"policy_file": str(path) if path else None},
    )


def path_check(roots: Sequence[Root], cwd: str, *, allow_hard_links: bool = False) -> PathCheck:
    """A PathCheck for arguments of a program started in `cwd` (a real path in a root).

    Two steps, as for files: by text (inside a root, writable if written), then by
    the kernel, resolving the path beneath its root exactly as the program will,
    '..' included. A symbolic link that leads out (to /etc/passwd, or a folder
    link followed by '..') is refused; a path that does not exist yet is not,
    since nothing there can lead anywhere. A regular file with several names (hard
    links) is refused unless `allow_hard_links`, as for fs_*: another name may lie
    outside the shared folders.
    """

    def check(path: str, write: bool) -> str | None:
        full = path if path.startswith("/") else posixpath.join(cwd, path)
        try:
            located = locate(roots, full, write=write)
            _resolves_beneath(located.root, full, allow_hard_links)
        except ConfinementError as exc:
            return exc.message
        return None

    return check


def _resolves_beneath(root: Root, full: str, allow_hard_links: bool) -> None:
    prefix = str(root.path).rstrip("/") + "/"
    if full != str(root.path) and not full.startswith(prefix):
        raise ConfinementError(
            Problem.OUTSIDE,
            f"{full!r} reaches its shared folder {root.path} only through '..'; "
            "write the plain path instead.",
        )
    raw = full[len(prefix) :] or "."  # '..' kept: the kernel must judge it where it stands
    try:
        with root.confined() as confined:
            st = confined.stat(raw, follow_symlinks=True)
    except ConfinementError as exc:
        if exc.problem is Problem.OUTSIDE:
            raise
        return  # missing, say: nothing there can lead anywhere
    if not allow_hard_links and stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        raise HardLinkError(full, st.st_nlink)


# ----------------------------------------------------------------- folders a program walks

# How many entries the worker looks at before a walking program runs; a folder with
# more is refused (named), never run unchecked.
WALK_LIMIT: Final = 100_000
_WALK_HINT: Final = (
    " If hard-linked files in the shared folders should be usable, set allow_hard_links = "
    "true under [fs] in config.toml."
)


def refuse_hard_links_within(
    roots: Sequence[Root],
    folders: Sequence[str],
    *,
    skip: Sequence[str] = (),
    limit: int = WALK_LIMIT,
) -> None:
    """Refuse (path_not_allowed, naming the file) a program that walks `folders` when a
    regular file with several names (hard links) lies anywhere beneath them: another
    name may be outside the shared folders, and the program would read it where fs_read
    refuses it (`[fs] allow_hard_links = false`).

    The walk looks where the program can: into the shared folders only (a symbolic link
    leading elsewhere leads nowhere in the sandbox, or to system folders everyone
    sees), following links to folders inside them (grep -R, rg -L do), each folder
    once; the worker's own folders, blanked in the sandbox, and `skip` are left out.
    The agent cannot make a hard link to a file outside them (link(2) works within one
    mount; the sandbox mounts each shared folder apart from the system), so what the
    walk sees is what the program finds. At most `limit` entries: beyond that the call
    is refused, since what went unseen cannot be vouched for.
    """
    tops = [os.path.realpath(root.path) for root in roots]
    left_out = {os.path.realpath(place) for root in roots for place in root.withheld}
    left_out.update(os.path.realpath(place) for place in skip)

    def inside(real: str) -> bool:
        return any(real == top or real.startswith(top.rstrip("/") + "/") for top in tops)

    seen: set[tuple[int, int]] = set()
    stack = [os.path.realpath(folder) for folder in folders]
    count = 0
    while stack:
        here = stack.pop()
        if not inside(here) or here in left_out:
            continue
        try:
            st = os.stat(here)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        try:
            entries = list(os.scandir(here))
        except OSError:
            continue  # unreadable here, unreadable in the sandbox
        count += len(entries)
        if count > limit:
            raise WorkerError(
                "path_not_allowed",
                f"the program would search {folders[0]!r}, which holds more than {limit:,} "
                "entries; the worker checks every file a searching program may open for hard "
                "links first, and cannot check that many. Search a narrower folder." + _WALK_HINT,
                {"path": folders[0], "limit": limit},
            )
        for entry in entries:
            if entry.path in left_out:
                continue
            try:
                if entry.is_symlink():
                    real = os.path.realpath(entry.path)
                    if inside(real):
                        stack.append(real)  # a folder is walked; a file is judged below
                        _judge(real, os.stat(real))
                elif entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    _judge(entry.path, entry.stat(follow_symlinks=False))
            except OSError:
                continue


def check_walked(
    roots: Sequence[Root], cwd: str, searched: Sequence[str], git_env: Mapping[str, str]
) -> None:
    """Refuse a program that walks folders holding a hard-linked file (see
    exec_policy.refuse_hard_links_within). git walks its whole working tree, less its
    repository folder (objects a local clone hard-links are git's immutable data)."""
    work_tree = git_env.get("GIT_WORK_TREE")
    if work_tree is not None:
        skip = [git_env[name] for name in ("GIT_DIR", "GIT_COMMON_DIR") if name in git_env]
        refuse_hard_links_within(roots, [work_tree], skip=skip)
        return
    folders = [path if path.startswith("/") else os.path.join(cwd, path) for path in searched]
    refuse_hard_links_within(roots, folders)


def _judge(path: str, st: os.stat_result) -> None:
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        raise WorkerError(
            "path_not_allowed",
            f"the program would search {path!r}, which has {st.st_nlink} names (hard links); "
            "another name may lie outside the shared folders, so the program is not run."
            + _WALK_HINT,
            {"path": path, "links": st.st_nlink},
        )
