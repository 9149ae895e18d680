"""The folder where large result blobs wait for their ack (`state.db-blobs/`), one
file each, reached only through one descriptor of the folder.

The folder sits beside the database, which may be inside a folder the person shares
with the agent: a program run there could put a symlink where the folder belongs, to
have the worker lock down (0700) and later sweep a folder of the person's. So the
folder is made when the ledger opens (the sandbox hides the worker's own places that
exist), opened once without following a link and checked to be this user's, and every
file is opened, removed and listed relative to that descriptor, never by path. A
folder that fails the check is not used: blobs are then kept in the database.

A file is named by the SHA-256 of its call's id (64 hex digits, whatever the id) and
holds the blob followed by its BLAKE3: a file a power cut left short, or the right
length but never written, reads as gone, as does any file that cannot be read.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import stat
from pathlib import Path
from typing import Final

import blake3

from worker.wire.framing import Buffer

log = logging.getLogger(__name__)

CHECK_BYTES: Final = 32  # the BLAKE3 after a blob in its file
_NAME: Final = re.compile(r"[0-9a-f]{64}")
_OPEN_FLAGS: Final = os.O_NOFOLLOW | os.O_CLOEXEC


def file_name(correlation_id: str) -> str:
    return hashlib.sha256(correlation_id.encode()).hexdigest()


class BlobFiles:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._fd: int | None = None
        try:
            self._fd = _open_private(folder)
        except OSError as exc:
            why = exc.strerror
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                why = "it is not a folder (a symbolic link, or a file)"
            log.error("large results are kept in the database, not in %s: %s", folder, why)

    def write(self, correlation_id: str, blob: Buffer, check: bytes | None = None) -> bool:
        """The blob, then its BLAKE3 (`check`, when its caller has it: `check_hasher`
        fed the blob), in the call's file; False if it could not be."""
        if self._fd is None:
            return False
        try:
            fd = os.open(
                file_name(correlation_id),
                os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _OPEN_FLAGS,
                0o600,
                dir_fd=self._fd,
            )
            try:
                for view in (memoryview(blob), memoryview(check or _check(blob))):
                    while view:
                        view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
        except OSError:
            return False
        return True

    def read(self, correlation_id: str, size: int) -> bytes | None:
        """The call's blob; None when its file is missing, unreadable, or not `size`
        bytes followed by their BLAKE3."""
        if self._fd is None:
            return None
        try:
            # Not blocking, and only a regular file: a FIFO in its place would hold the
            # open (on the event loop) for ever.
            fd = os.open(
                file_name(correlation_id),
                os.O_RDONLY | os.O_NONBLOCK | _OPEN_FLAGS,
                dir_fd=self._fd,
            )
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                return None
            with open(fd, "rb") as file:
                data = file.read(size + CHECK_BYTES + 1)
        except OSError:
            return None
        if len(data) != size + CHECK_BYTES:
            return None
        content = data[:size]
        return content if _check(content) == data[size:] else None

    def remove(self, correlation_id: str) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(file_name(correlation_id), dir_fd=self._fd)

    def sweep(self, keep: set[str]) -> int:
        """Remove the files of ours no call in `keep` (ids) names; how many. Only names
        of the shape this module makes, and only regular files, are ever removed."""
        if self._fd is None:
            return 0
        wanted = {file_name(cid) for cid in keep}
        removed = 0
        for name in os.listdir(self._fd):
            if name in wanted or not _NAME.fullmatch(name):
                continue
            with contextlib.suppress(OSError):
                st = os.stat(name, dir_fd=self._fd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode):
                    os.unlink(name, dir_fd=self._fd)
                    removed += 1
        return removed

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def check_hasher() -> blake3.blake3:
    """A hash whose digest, once fed a blob, is the check its file ends with: for a
    caller that sees the blob in parts before it is whole (exec's output, hashed as
    it is read while the program runs)."""
    return blake3.blake3()


def _check(blob: Buffer) -> bytes:
    """What follows a blob in its file: its BLAKE3 (0.23 ms a MiB here)."""
    return blake3.blake3(blob).digest()


def _open_private(folder: Path) -> int:
    """A descriptor of `folder`, made 0700 if missing: a real folder (not a link to
    one) of this user's, tightened to 0700 if it was open to others."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | _OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid():
            raise PermissionError(0, f"it belongs to another user (uid {st.st_uid})")
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.fchmod(fd, 0o700)
    except BaseException:
        os.close(fd)
        raise
    return fd
