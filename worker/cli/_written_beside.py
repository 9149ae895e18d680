"""Files a command writes into a folder an agent may write too, never through a link.

`agentworker record PLAN -o FILE` and `telemetry export -o FILE` are run where the
person works, often a folder shared with the agent: a link the agent planted there
(FILE, FILE's `STEM.blobs/`, or a `step-N.bin` in it, pointing at ~/.bashrc) made the
person's command write the agent's own request blob, or its rows, through it
(review25 G4). So every name is opened relative to its
folder's descriptor: a folder is entered only if it is one (not a link to one), and
a file is written to a new temporary name (O_EXCL: never an existing file or link) and
renamed over the old name, which replaces a link itself, never its target.
Only the standard library: the verb modules import this lazily.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TextIO


class LinkedError(Exception):
    """A folder on the way is a symbolic link (or not a folder): nothing is written there."""


def write_beside(output: Path, text: str, blobs: Mapping[str, bytes]) -> None:
    """`text` to `output`, and each of `blobs` (name relative to `output`'s folder:
    "STEM.blobs/step-1.bin") beside it; the folders the names hold made if missing.
    Raises LinkedError when a folder in a name is a link, OSError when a write fails."""
    with _folder(os.open(output.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)) as top:
        for name, data in blobs.items():
            *folders, leaf = name.split("/")
            with _entered(top, folders, output.parent) as inner:
                _replace(inner, leaf, data)
        _replace(top, output.name, text.encode("utf-8"))


@contextlib.contextmanager
def replacing(output: Path) -> Iterator[TextIO]:
    """A text file to write `output`'s new content to; it replaces `output` (a link
    there too, never its target) once the block ends without an error, and is removed
    otherwise, so `output` never holds half an export."""
    with _folder(os.open(output.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)) as top:
        temp, fd = _new_file(top, output.name)
        try:
            with open(fd, "w", encoding="utf-8", newline="") as handle:
                yield handle
            os.replace(temp, output.name, src_dir_fd=top, dst_dir_fd=top)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp, dir_fd=top)
            raise


@contextlib.contextmanager
def _folder(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def _entered(top: int, folders: list[str], shown: Path) -> Iterator[int]:
    """The descriptor of `folders` beneath `top`, each made if missing, none a link."""
    fd = os.dup(top)
    try:
        for name in folders:
            shown = shown / name
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o777, dir_fd=fd)
            try:
                inner = os.open(
                    name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
                )
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise LinkedError(
                        f"{shown} is a symbolic link or not a folder: nothing is written "
                        "through it. Remove it, or give -o a name in another folder"
                    ) from None
                raise
            os.close(fd)
            fd = inner
        yield fd
    finally:
        os.close(fd)


def _new_file(folder: int, name: str) -> tuple[str, int]:
    """A new file beside `name` in `folder` (never an existing one, nor a link): its
    name and a descriptor open for writing."""
    temp = f".{name}.{secrets.token_hex(6)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return temp, os.open(temp, flags, 0o666, dir_fd=folder)


def _replace(folder: int, name: str, data: bytes) -> None:
    """`data` as `name` in `folder`: written to a new name, then renamed over `name`."""
    temp, fd = _new_file(folder, name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp, dir_fd=folder)
        raise
