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
from collections.abc import Sequence
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
