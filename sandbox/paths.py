"""Keep every file operation inside the folders the person chose to share.

Two steps, both needed. `locate` maps the path an agent sent to one configured root
and a relative path beneath it, by text alone, refusing anything that only makes
sense as an escape ('..' climbing out, '~', NUL bytes). `ConfinedDir` then opens
that relative path with the kernel confining the lookup to the root's directory fd,
so symlinks, magic /proc links and races cannot lead out either. There is no
"check the path, then open it" anywhere: the open itself is the check.

Hard links cannot be told apart from ordinary files by path: a hard link inside a
root to a file outside it is, to the kernel, a file inside. `st_nlink` is reported
so a policy above this layer can refuse files with more than one link.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Final

from sandbox import _openat2
from sandbox._lexical import PATH_MAX_BYTES, beneath, byte_length, components
from sandbox._walk import walk_open


class Problem(StrEnum):
    """What went wrong with a path, in the sandbox's own words.

    The sandbox stands alone, so it does not speak the worker's error codes; the
    worker maps each problem to one at its boundary (worker.errors).
    """

    OUTSIDE = "outside"  # an escape ('..', a link out, a magic link), NUL, '~', no root
    # holds it, a write to a read-only root, a hard-linked file
    MISSING = "missing"
    NOT_A_FOLDER = "not_a_folder"  # a part before the last is not a folder
    A_FOLDER = "a_folder"  # a folder where a file is needed
    DENIED = "denied"  # the operating system's permissions, or a read-only file system
    TOO_LONG = "too_long"  # a name or path the kernel finds too long
    TOO_BIG = "too_big"  # a file the file system will not let grow (EFBIG, ENOSPC)
    EXISTS = "exists"  # an exclusive create found the name taken
    NOT_A_FILE = "not_a_file"  # a FIFO, socket or device where a regular file is needed


class ConfinementError(Exception):
    """A path was refused or could not be used: `problem` says which way, `message`
    says what happened and what to do, for a person."""

    def __init__(self, problem: Problem, message: str) -> None:
        super().__init__(message)
        self.problem = Problem(problem)
        self.message = message

    def __repr__(self) -> str:
        return f"ConfinementError({self.problem.value!r}, {self.message!r})"


@dataclass(frozen=True)
class Root:
    """A shared folder: `path` is absolute and already resolved (os.path.realpath)."""

    path: Path
    writable: bool
    # Places beneath `path` that are never reachable through it, whatever the path or
    # symlink used: the worker's own folders and files (its settings, token, data),
    # when a person shares a folder that holds them. Absolute and resolved.
    withheld: tuple[Path, ...] = ()
    # The withheld places that were folders when the root was made, by identity: a
    # place is withheld by its path, so a folder moved away from it (by a program
    # outside any sandbox, `mv ~/.local ~/old`) would be in plain view at its new one.
    anchors: tuple[Anchor, ...] = ()
    # The uid whose file system identity writes beneath `path` take (a plan's own uid,
    # sandbox.plan_uids: what the worker makes there is the plan's); None: the worker's.
    owner: int | None = None

    def __post_init__(self) -> None:
        if not self.path.is_absolute() or ".." in self.path.parts:
            raise ValueError(f"a root must be an absolute, resolved path, not {self.path}")
        for place in self.withheld:
            if not place.is_absolute() or place == self.path or not place.is_relative_to(self.path):
                raise ValueError(f"{place} is not a place inside the root {self.path}")

    @classmethod
    def sharing(cls, path: Path, *, writable: bool, withheld: tuple[Path, ...] = ()) -> Root:
        """A root whose withheld folders are anchored as they are now."""
        return cls(path, writable, withheld, tuple(_anchors(withheld)))

    def moved(self) -> str | None:
        """Why this root cannot be used as it was shared, or None: its path no longer
        leads to itself (a link or a move on its way), or a folder withheld from it is
        no longer at its path. What a sandbox binds or blanks by path must be checked
        so first; `confined` checks the withheld folders itself."""
        if os.path.realpath(self.path) != str(self.path):
            return moved_root(self.path)
        return self._withheld_moved()

    def _withheld_moved(self) -> str | None:
        for anchor in self.anchors:  # one stat each, a few microseconds
            if not anchor.in_place():
                return moved_withheld(anchor.path, self.path)
        return None

    def confined(self, *, use_openat2: bool | None = None) -> ConfinedDir:
        """This root opened for confined access, its withheld places enforced.

        Refused if the folder is no longer at its path: a folder on the way to a
        shared folder inside another was moved and a link put in its place (`mv
        ~/proj/vendor ~/v0; ln -s ../.local ~/proj/vendor`), and this root's path now
        leads somewhere else, past the places withheld from the outer one."""
        confined = ConfinedDir(self.path, use_openat2=use_openat2, withheld=self.withheld)
        if confined.where() != str(self.path):  # the kernel's name for what was opened
            confined.close()
            raise ConfinementError(Problem.OUTSIDE, moved_root(self.path))
        why = self._withheld_moved()
        if why is not None:
            confined.close()
            raise ConfinementError(Problem.OUTSIDE, why)
        return confined


@dataclass(frozen=True)
class Anchor:
    """A folder as it was: its path, and the identity of what was there."""

    path: Path
    device: int
    inode: int

    def in_place(self) -> bool:
        """Whether the same folder is still at the path, by the kernel's own name for
        it: a link put in the place of it or of a folder on its way does not pass."""
        try:
            fd = os.open(self.path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            same = (st.st_dev, st.st_ino) == (self.device, self.inode)
            return same and _landed(fd) == str(self.path)
        finally:
            os.close(fd)


def _anchors(places: Sequence[Path]) -> Iterator[Anchor]:
    for place in places:
        try:
            st = os.stat(place, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            yield Anchor(place, st.st_dev, st.st_ino)


@dataclass(frozen=True)
class Located:
    """Where a path lives: a root, and a normalised path beneath it ("." for the root)."""

    root: Root
    relative: str


def _show(path: str) -> str:
    """The caller's path, quoted (NUL and control bytes visible) and cut to a readable size."""
    return repr(path if len(path) <= 120 else path[:100] + "...")


def _landed(fd: int) -> str:
    """Where an open fd really is: the kernel's own name for it."""
    return os.readlink(f"/proc/self/fd/{fd}")


def _withheld_refusal(path: str) -> ConfinementError:
    return _refuse(
        path,
        "leads into the worker's own folders (its settings, token and data), which are "
        "never shared, even when a shared folder holds them.",
    )


def moved_root(path: Path) -> str:
    """Why a shared folder that is no longer at its path is not used."""
    return (
        f"the shared folder {path} is no longer at that path (a folder on its way was "
        "moved, or replaced by a link); nothing is read, written or run through it until "
        "it is put back"
    )


def moved_withheld(place: Path, root: Path) -> str:
    """Why a shared folder is not used while one of the worker's own folders in it is
    away from its path."""
    return (
        f"the worker's own folder {place} is no longer at that path (it, or a folder on "
        f"its way, was moved or replaced while the worker ran), so it cannot be kept "
        f"hidden; nothing is read, written or run through the shared folder {root} until "
        "it is put back or the worker is restarted"
    )


def _refuse(path: str, why: str) -> ConfinementError:
    return ConfinementError(Problem.OUTSIDE, f"{_show(path)} {why}")


_NO_ROOTS = (
    "No folders are shared with the agent yet, so no path can be used. Add one to "
    'config.toml as a [[root]] table, for example:\n[[root]]\npath = "~/projects"\n'
    'mode = "rw"  # or "ro" for read-only'
)


def locate(roots: Sequence[Root], user_path: str, *, write: bool = False) -> Located:
    """Map a caller's path to the root that holds it, by text alone.

    Absolute paths must lie under one of the roots (the longest match wins); relative
    paths are taken beneath the FIRST root (and then, too, a root nested in it wins).
    Backslashes and percent signs are ordinary file-name characters on Linux and stay
    literal. '..' may move within a path but
    never above the root. Raises ConfinementError(Problem.OUTSIDE) otherwise, and
    for `write` under a read-only root.
    """
    if not roots:
        raise ConfinementError(Problem.OUTSIDE, _NO_ROOTS)
    if not user_path:
        raise _refuse(user_path, "is empty. Name a file or folder inside a shared folder.")
    if "\0" in user_path:
        raise _refuse(user_path, "contains a NUL byte, which no file name may contain.")
    size = byte_length(user_path)
    if size is None:
        raise _refuse(user_path, "is not valid text for a file name.")
    if size > PATH_MAX_BYTES:
        raise _refuse(user_path, f"is {size} bytes long; paths may have at most 4,095 bytes.")
    if user_path.startswith("~"):
        raise _refuse(
            user_path,
            "starts with '~', which is not expanded here. Write the full path, or a path "
            "relative to the first shared folder.",
        )
    parts = components(user_path)
    if parts is None:
        raise _refuse(user_path, "uses '..' to climb out of the shared folder. Stay inside it.")
    if not user_path.startswith("/"):
        # Beneath the first root, but a root nested in it still rules its own part:
        # a read-only folder shared inside a read-write one stays read-only.
        parts = [*roots[0].path.parts[1:], *parts]
    found = _longest_root(roots, parts)
    if found is None:
        shared = ", ".join(str(root.path) for root in roots)
        raise _refuse(user_path, f"is outside every shared folder ({shared}).")
    root, parts = found
    if write and not root.writable:
        raise _refuse(
            user_path,
            f"is in the read-only shared folder {root.path}; it can be read but not changed. "
            'To allow changes, set mode = "rw" for that [[root]] in config.toml.',
        )
    return Located(root=root, relative="/".join(parts) or ".")


def _longest_root(roots: Sequence[Root], parts: list[str]) -> tuple[Root, list[str]] | None:
    """The deepest root that `parts` (an absolute path's parts) lies under, and the rest."""
    best: tuple[Root, list[str]] | None = None
    for root in roots:
        rest = beneath(root.path.parts, parts)
        if rest is not None and (best is None or len(rest) < len(best[1])):
            best = (root, rest)
    return best


# The one errno table: what each kernel error means for a path, and what to do about
# it. Messages name only the caller's own path, never where a refused symlink pointed.
# The worker uses it too (worker.errors.from_os_error), with its own code per problem.
ERRNO_PROBLEMS: Final[dict[int, tuple[Problem, str]]] = {
    errno.EXDEV: (
        Problem.OUTSIDE,
        "leads outside its shared folder (through '..' or a symbolic link). "
        "Use a path that stays inside the folder.",
    ),
    errno.ELOOP: (
        Problem.OUTSIDE,
        "goes through a symbolic link that is refused: a loop, more than 40 links, a special "
        "/proc link, or a link where none may be followed. Use the real path instead.",
    ),
    errno.ENOENT: (
        Problem.MISSING,
        "does not exist. Check the spelling, or list the folder above it to see what is there.",
    ),
    errno.ENOTDIR: (
        Problem.NOT_A_FOLDER,
        "has a part that is not a folder. Check that every part before the last is a folder.",
    ),
    errno.EISDIR: (Problem.A_FOLDER, "is a folder, not a file. List it, or name a file inside it."),
    errno.EACCES: (
        Problem.DENIED,
        "cannot be used: the operating system denied access. The computer's owner can "
        "change its permissions if it should be available.",
    ),
    errno.EPERM: (
        Problem.DENIED,
        "cannot be used: the operating system does not permit this operation on it.",
    ),
    errno.EROFS: (Problem.DENIED, "is on a read-only file system and cannot be changed."),
    errno.EEXIST: (Problem.EXISTS, "already exists. Choose another name, or remove it first."),
    errno.ENAMETOOLONG: (
        Problem.TOO_LONG,
        "is too long: a name may have at most 255 bytes and a path at most 4,095. "
        "Use a shorter path.",
    ),
    errno.EFBIG: (Problem.TOO_BIG, "cannot grow: the file would pass the size limit."),
    errno.ENOSPC: (Problem.TOO_BIG, "cannot grow: no space is left on the device."),
}


@contextmanager
def _translating(path: str) -> Iterator[None]:
    """Turn the kernel's OSError for `path` into a ConfinementError; others pass through."""
    try:
        yield
    except OSError as exc:
        found = ERRNO_PROBLEMS.get(exc.errno or 0)
        if found is None:
            raise
        code, what = found
        raise ConfinementError(code, f"{_show(path)} {what}") from exc


def openat2_available() -> bool:
    """Whether this kernel has openat2 (probed once); ConfinedDir prefers it when it does."""
    return _openat2.available()


class ConfinedDir:
    """An open directory fd for a root; every lookup is resolved beneath it.

    With openat2 (Linux 5.6+) the kernel enforces RESOLVE_BENEATH and
    RESOLVE_NO_MAGICLINKS. Without it, a component-by-component walk gives the same
    answers (see sandbox._walk). `use_openat2=None` picks openat2 when available.
    Paths given here are relative to the root, as in `Located.relative`.
    """

    def __init__(
        self,
        root: Path,
        *,
        use_openat2: bool | None = None,
        withheld: Sequence[Path] = (),
    ) -> None:
        if not sys.platform.startswith("linux"):
            raise NotImplementedError("path confinement is implemented for Linux only")
        if use_openat2 is None:
            use_openat2 = _openat2.available()
        elif use_openat2 and not _openat2.available():
            raise RuntimeError("openat2 was requested but this kernel does not provide it")
        self.uses_openat2: Final = use_openat2
        self._root = root
        self._withheld = tuple(str(place) for place in withheld)
        flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        with _translating(str(root)):
            self._fd: int | None = os.open(root, flags)

    def __enter__(self) -> ConfinedDir:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def where(self) -> str:
        """Where the opened folder is, by the kernel's own name for it."""
        if self._fd is None:
            raise ValueError("the folder is closed")
        return _landed(self._fd)

    def close(self) -> None:
        """Release the root's fd; safe to call twice."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def open(self, relative: str, flags: int, mode: int = 0o600) -> int:
        """An fd for `relative` resolved beneath the root (O_CLOEXEC is always added).

        Symlinks are followed while they stay beneath the root; O_NOFOLLOW in `flags`
        leaves a final symlink unfollowed, as with open(2). The caller closes the fd.
        """
        with _translating(relative):
            return self._open(relative, flags | os.O_CLOEXEC, mode)

    def stat(self, relative: str, *, follow_symlinks: bool = False) -> os.stat_result:
        """stat (or lstat, the default) of `relative`, resolved beneath the root."""
        with _translating(relative):
            path = self._clean(relative)
            quick = not follow_symlinks and not self._withheld
            if quick and "/" not in path and path != ".." and self._fd is not None:
                # A name right in the root, not followed: there is no walk that could
                # lead out, so one fstatat answers, without opening the file.
                return os.stat(path, dir_fd=self._fd, follow_symlinks=False)
        fd = self.open(relative, os.O_PATH | (0 if follow_symlinks else os.O_NOFOLLOW))
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def readlink_inside(self, relative: str) -> str | None:
        """If `relative` is a symlink whose target lies inside the root, that target as
        a root-relative path; otherwise None (a target outside is never revealed).

        Conservative: the text-derived answer is confirmed against the file it names,
        and None is returned when it cannot be (a '..' below a symlinked folder, say).
        """
        fd = self.open(relative, os.O_PATH | os.O_NOFOLLOW)
        try:
            if not stat.S_ISLNK(os.fstat(fd).st_mode):
                return None
            target = os.readlink("", dir_fd=fd)
        finally:
            os.close(fd)
        candidate = self._target_on_text(relative, target)
        if candidate is None:
            return None
        try:
            followed = self.stat(relative, follow_symlinks=True)
        except ConfinementError as exc:
            # Dangling, with every step so far inside. Without '..' the text names the
            # very place the kernel would look; with it, a symlinked folder on the way
            # could make the text wrong, and there is no file to compare against.
            plain = ".." not in f"{relative}/{target}".split("/")
            return candidate if exc.problem is Problem.MISSING and plain else None
        try:
            named = self.stat(candidate, follow_symlinks=True)
        except ConfinementError:
            return None
        same = (followed.st_dev, followed.st_ino) == (named.st_dev, named.st_ino)
        return candidate if same else None

    def open_parent(self, relative: str) -> tuple[int, str]:
        """(fd of the parent directory resolved beneath the root, final name).

        For writing through dir_fd: create with O_NOFOLLOW, rename with src/dst_dir_fd.
        The final name is not resolved. The root itself cannot be the target.
        """
        with _translating(relative):
            parts = self._clean(relative).split("/")
            if parts[-1] in (".", ".."):
                raise _refuse(
                    relative, "names a shared folder or a folder above a name; name a file inside."
                )
            parent = "/".join(parts[:-1]) or "."
            fd = self._open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, 0)
            if self._withheld and self._is_withheld(f"{_landed(fd)}/{parts[-1]}"):
                os.close(fd)
                raise _withheld_refusal(relative)
            return fd, parts[-1]

    @property
    def withheld_ids(self) -> frozenset[tuple[int, int]]:
        """(device, inode) of each withheld place that exists now: for walks that open
        children by name, which `open` does not see."""
        found = set()
        for place in self._withheld:
            try:
                st = os.stat(place, follow_symlinks=False)
            except OSError:
                continue
            found.add((st.st_dev, st.st_ino))
        return frozenset(found)

    def _is_withheld(self, real: str) -> bool:
        return any(real == place or real.startswith(place + "/") for place in self._withheld)

    def _checked(self, fd: int, relative: str) -> int:
        """`fd` if where it landed is not withheld; else it is closed and refused."""
        if self._withheld and self._is_withheld(_landed(fd)):
            os.close(fd)
            raise _withheld_refusal(relative)
        return fd

    def _open(self, relative: str, flags: int, mode: int) -> int:
        if self._fd is None:
            raise ValueError("this ConfinedDir is closed")
        path = self._clean(relative)
        if self.uses_openat2:
            resolve = _openat2.RESOLVE_BENEATH | _openat2.RESOLVE_NO_MAGICLINKS
            try:
                return self._checked(_openat2.openat2(self._fd, path, flags, mode, resolve), path)
            except OSError as exc:
                # EXDEV also covers absolute symlinks pointing back inside, which the
                # walk can follow safely; EAGAIN is a rename race, worth a careful retry.
                if exc.errno not in (errno.EXDEV, errno.EAGAIN):
                    raise
        return self._checked(walk_open(self._fd, self._root, path, flags, mode), path)

    def _clean(self, relative: str) -> str:
        """`relative` without empty parts and '.', or "."; refuses what cannot be relative."""
        if "\0" in relative:
            raise _refuse(relative, "contains a NUL byte, which no file name may contain.")
        if relative.startswith("/"):
            raise _refuse(relative, "is absolute; give a path relative to the shared folder.")
        size = byte_length(relative)
        if size is None:
            raise _refuse(relative, "is not valid text for a file name.")
        if size > PATH_MAX_BYTES:
            raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG))
        return "/".join(p for p in relative.split("/") if p not in ("", ".")) or "."

    def _target_on_text(self, relative: str, target: str) -> str | None:
        """Where symlink `relative` with `target` points, as a root-relative path, by text."""
        if target.startswith("/"):
            parts = beneath(self._root.parts, components(target) or [])
        else:
            parent = self._clean(relative).split("/")[:-1]
            parts = components("/".join([*parent, target]))
        return None if parts is None else "/".join(parts) or "."
