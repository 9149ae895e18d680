"""A uid of each plan's own (`[sandbox] uids = "A-B"`, a root worker only).

The kernel keeps some counts per user that no namespace or rlimit bounds: epoll
watches (fs.epoll.max_user_watches), pipe pages (fs.pipe-user-pages-soft), descriptors
in flight. A sandbox running as the worker's user can take all of them, and every
other program of that user then fails (a sandbox took root's 5,491,507 epoll watches
in 7.2 s; every event loop of root's got ENOSPC). Started as a uid of its plan's own,
the sandbox is charged to that uid instead, and exhausts only its own.

Here: the range's syntax, the checks a worker makes before it uses one (root, no
account in it, the workbench reachable by it), file work done as a plan's uid
(`acting_as`: the thread's file system uid, so what the worker makes in a workspace
is the plan's), and the kill of a uid's leftovers before its files go.

Standard library only, no worker imports.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import grp
import os
import pwd
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

# The highest uid a range may reach: bubblewrap (0.8) cannot map a uid above it into
# its sandbox ("setting up uid map: Invalid argument"; 2147483648 fails, 2147483647
# runs), and the probe's refusal then blamed the machine's user namespaces.
HIGHEST: Final = 2_147_483_647
# The lowest: below it are the system's accounts, whether named in /etc/passwd or not.
LOWEST: Final = 1000

# login.defs' keys for the ids useradd and groupadd give out, with shadow's defaults
# (used where the file names none), and what each span is.
_LOGIN_DEFS: Final = {
    "UID_MIN": 1000,
    "UID_MAX": 60000,
    "GID_MIN": 1000,
    "GID_MAX": 60000,
    "SUB_UID_MIN": 100_000,
    "SUB_UID_MAX": 600_100_000,
    "SUB_GID_MIN": 100_000,
    "SUB_GID_MAX": 600_100_000,
}
_GIVEN_SPANS: Final = (
    ("UID", "the uids useradd gives new accounts"),
    ("GID", "the gids groupadd gives new groups"),
    ("SUB_UID", "where useradd takes new users' subordinate uids"),
    ("SUB_GID", "where useradd takes new users' subordinate gids"),
)

# Ids systemd hands out that no file names (its UIDS-GIDS.md): a plan's uid there
# would be a container's, a dynamic service's or a home's.
_SYSTEMD_SPANS: Final = (
    (60_001, 60_513, "the uids systemd-homed gives homes"),
    (61_184, 65_519, "the uids systemd gives DynamicUser= services"),
    (524_288, 1_879_048_191, "the uids systemd-nspawn gives containers"),
    (2_147_352_576, 2_147_418_111, "systemd's foreign uid range"),
)

# (uid_t)-1: changes nothing, and the call answers the id now.
_ASK: Final = 0xFFFFFFFF


@functools.cache
def _fs_ids() -> tuple[Callable[[int], int], Callable[[int], int]]:
    """libc's setfsuid and setfsgid (Linux only: looked up when first used)."""
    libc = ctypes.CDLL(None, use_errno=True)
    calls = (libc.setfsuid, libc.setfsgid)
    for call in calls:
        call.argtypes = [ctypes.c_uint]
        call.restype = ctypes.c_uint
    return calls


def parse(text: str) -> range:
    """The uids `text` ("A-B", A <= B) names; ValueError saying what is wrong."""
    low, dash, high = text.strip().partition("-")
    if not dash or not low.strip().isdigit() or not high.strip().isdigit():
        raise ValueError(
            f'{text!r} is not a range of uids: write it as "A-B", e.g. "1900000000-1900000999"'
        )
    first, last = int(low), int(high)
    if first > last:
        raise ValueError(f"the range {text!r} ends before it starts: write the lower uid first")
    if first < LOWEST or last > HIGHEST:
        raise ValueError(
            f"the range {text!r} must lie within {LOWEST}-{HIGHEST}: below {LOWEST} are the "
            f"system's accounts, and bubblewrap cannot map a uid above {HIGHEST}"
        )
    return range(first, last + 1)


def accounts_in(uids: range) -> list[str]:
    """Accounts (users, and groups: a plan's gid is its uid) whose id is in `uids`."""
    found = [f"user {u.pw_name} ({u.pw_uid})" for u in pwd.getpwall() if u.pw_uid in uids]
    found += [f"group {g.gr_name} ({g.gr_gid})" for g in grp.getgrall() if g.gr_gid in uids]
    return found


def given_out_in(uids: range, etc: Path = Path("/etc")) -> list[str]:
    """Ids in `uids` this machine gives out, or may, though no account has them yet:
    subordinate ids (/etc/subuid, /etc/subgid: a rootless container runs as them, and
    its owner may act as them), and login.defs' spans where useradd and groupadd take
    new accounts' ids and new users' subordinate ranges (its defaults where it names
    none). A plan's uid would be a container's, or a later account's, and a teardown
    killed that one's processes (review29b #2, r2)."""
    found = []
    for table in ("subuid", "subgid"):
        with contextlib.suppress(OSError):
            for line in (etc / table).read_text(errors="replace").splitlines():
                name, _, rest = line.strip().partition(":")
                start, _, count = (_number(word) for word in rest.partition(":"))
                if start is not None and count is not None:
                    given = range(start, start + count)
                    if given.start < uids.stop and uids.start < given.stop:
                        found.append(f"{name}'s subordinate ids in /etc/{table}")
    defs = dict(_LOGIN_DEFS)
    with contextlib.suppress(OSError):
        for line in (etc / "login.defs").read_text(errors="replace").splitlines():
            key, value = [*line.split(None, 1), "", ""][:2]
            if key in defs:
                # As shadow reads a value: blanks and a quote skipped, to the next quote.
                number = _number(value.strip().lstrip('"').partition('"')[0])
                if number is None:
                    found.append(f"{key} in {etc}/login.defs, whose value cannot be read")
                else:
                    defs[key] = number
    for low, what in _GIVEN_SPANS:  # a plan's gid is its uid: groups' spans too
        first, last = defs[f"{low}_MIN"], defs[f"{low}_MAX"]
        if first < uids.stop and uids.start <= last:
            found.append(f"{what} ({low}_MIN-{low}_MAX in {etc}/login.defs: {first}-{last})")
    found += [
        f"{what} ({first}-{last}, systemd's)"
        for first, last, what in _SYSTEMD_SPANS
        if first < uids.stop and uids.start <= last
    ]
    return found


def _number(word: str) -> int | None:
    """`word` as shadow and C read a number (base 0: 0x hexadecimal, a leading 0
    octal), or None."""
    word = word.strip()
    try:
        if word[:2].lower() == "0x":
            return int(word[2:], 16)
        if len(word) > 1 and word.startswith("0"):
            return int(word[1:], 8)
        return int(word, 10) if word.isascii() and word.isdigit() else None
    except ValueError:
        return None


def problem(uids: range, base: Path, own: Path) -> str | None:
    """Why this worker cannot give plans a uid of `uids` for its workbench at `base`
    (its own data folder `own` above it), or None. Opens up the worker's own folders
    from `base` up to `own` for search by others (mode 711: never listed, nothing in
    them readable but what is), since bubblewrap, started as the plan's uid, reaches
    each mount source by its path."""
    if os.geteuid() != 0:
        return (
            f"[sandbox] uids is set, and only a worker running as root can start a plan's "
            f"programs as another uid (this one runs as uid {os.geteuid()}). Remove the "
            "setting, or run the worker as root"
        )
    taken = accounts_in(uids)
    if taken:
        shown = ", ".join(taken[:5]) + (f" and {len(taken) - 5} more" if len(taken) > 5 else "")
        return (
            f'[sandbox] uids = "{uids.start}-{uids.stop - 1}" holds accounts of this '
            f"machine ({shown}): a plan would run as one of them. Choose a range no "
            "account uses (`getent passwd` and `getent group` list them)"
        )
    given = given_out_in(uids)
    if given:
        return (
            f'[sandbox] uids = "{uids.start}-{uids.stop - 1}" holds {"; ".join(given)}: a '
            "plan would run as an id this machine gives out. Choose a range outside them, "
            'e.g. "1900000000-1900000999"'
        )
    # Their real paths: bubblewrap resolves each mount source, and a link (a data
    # folder linked into /root) passed here, then every exec failed (review29b #4, r6).
    named = str(own.absolute())
    own, here = own.resolve(), base.resolve()
    if named != str(own):
        named += f" (a link to {own})"
    if here != own and own not in here.parents:
        return f"the workbench {here} is not under the worker's data folder {named}"
    for folder in (here, *here.parents):
        if folder == own or own in folder.parents:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            searchable(folder)
            continue
        mode = os.stat(folder).st_mode
        if not mode & stat.S_IXOTH:
            return (
                f"[sandbox] uids is set and the folder {folder} (mode "
                f"{stat.S_IMODE(mode):o}) above the worker's data folder {named} may not be "
                "searched by other users, so a plan's uid cannot reach its workspace. Put "
                "the data folder where others may pass through (AGENTWORKER_HOME, e.g. "
                "/var/lib/agentworker), or `chmod o+x` that folder"
            )
    return None


def closed_again(own: Path) -> bool:
    """Others' search bit off the worker's data folder `own` (`problem` set it) once no
    plan's uid passes through it; whether it was on."""
    try:
        mode = stat.S_IMODE(os.stat(own).st_mode)
    except FileNotFoundError:
        return False
    if not mode & stat.S_IXOTH:
        return False
    os.chmod(own, mode & ~stat.S_IXOTH)
    return True


def searchable(path: Path | str, extra: int = stat.S_IXOTH) -> None:
    """Let others search (or, with `extra`, more) `path`, a folder or file of the
    worker's own."""
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & extra != extra:
        os.chmod(path, mode | extra)


def reachable(path: str, own: Path) -> None:
    """Let plans' uids execute the worker's file `path` (the entry helper) and pass
    through every folder above it up to `own`."""
    searchable(path, stat.S_IXOTH | stat.S_IXGRP)
    for folder in Path(path).parents:
        if folder != own and own not in folder.parents:
            break
        searchable(folder)


def _set_fs(uid: int, gid: int) -> None:
    setfsuid, setfsgid = _fs_ids()
    setfsgid(gid)
    setfsuid(uid)
    if setfsuid(_ASK) != uid or setfsgid(_ASK) != gid:
        raise PermissionError(f"this thread could not act as uid {uid}")


@contextlib.contextmanager
def acting_as(uid: int | None) -> Iterator[None]:
    """File work in this thread done as `uid` (its file system uid and gid: what it
    makes is the uid's, and it may do what the uid may), until the block ends. Linux
    keeps these per thread (glibc's setfsuid changes only the caller's), and the kernel
    drops root's file capabilities with them and gives them back after. None: as the
    worker."""
    if uid is None:
        yield
        return
    setfsuid, setfsgid = _fs_ids()
    before_uid, before_gid = setfsuid(_ASK), setfsgid(_ASK)
    _set_fs(uid, uid)
    try:
        yield
    finally:
        _set_fs(before_uid, before_gid)


def acting_uid() -> int:
    """The uid whose files this thread makes now: its file system uid (`acting_as`),
    on Linux; elsewhere the effective uid."""
    if not sys.platform.startswith("linux"):
        return os.geteuid()
    return _fs_ids()[0](_ASK)


def give(folder: Path | str, uid: int) -> None:
    """Give `folder` and everything in it to `uid` (owner and group), never following a
    link: a workspace from before its plan had a uid (or after it lost it)."""
    os.chown(folder, uid, uid, follow_symlinks=False)
    for _where, folders, files, fd in os.fwalk(folder, follow_symlinks=False):
        for name in folders + files:
            with contextlib.suppress(FileNotFoundError):
                os.chown(name, uid, uid, dir_fd=fd, follow_symlinks=False)


def kill_all(uid: int) -> None:
    """SIGKILL every process of `uid`: a process of that uid does kill(-1), which the
    kernel sends, in one pass no fork can outrun, to every process it may signal
    (those whose real or saved uid is `uid`; a plan's uid is no account's, so only its
    own programs), itself excepted. Done twice: a process forked as the first pass
    went is caught by the second."""
    for _ in range(2):
        subprocess.run(
            ["/bin/sh", "-c", "kill -KILL -1 2>/dev/null; exit 0"],
            user=uid,
            group=uid,
            extra_groups=[],
            env={"PATH": "/usr/bin:/bin"},
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
