"""The files of `agentworker call --blob-in/--blob-out`, checked before the call runs.

A missing input file or output folder is said before anything is sent, so the
action never runs for nothing; the output file is replaced atomically when the
call succeeds and removed when it fails, so it never holds an older answer.
Only the standard library: the verb modules import this at their top.
"""

from __future__ import annotations

import os
from pathlib import Path

# Actions whose blob is what they write: an empty one must be asked for.
WRITES_THE_BLOB = frozenset({"workerHost.fs_write", "workbenchHost.fs_write"})


def _problem(message: str) -> Exception:
    """A --blob-in/--blob-out that cannot work: a usage error, before anything is sent."""
    from worker.errors import UsageError  # not at the top: it loads the sandbox package

    return UsageError(message)


def full_action(name: str) -> str:
    """`fs_stat` → `workerHost.fs_stat`; a name with a surface stays as it is."""
    return name if "." in name else f"workerHost.{name}"


def read_blob_in(action: str, blob_in: Path | None) -> bytes:
    """The request blob; refuses a missing file, and fs_write with no blob at all."""
    if blob_in is None:
        if full_action(action) in WRITES_THE_BLOB:
            raise _problem(
                f"{action} writes the request blob: pass --blob-in FILE with the bytes to write "
                "(--blob-in /dev/null for an empty file)"
            )
        return b""
    if blob_in.is_dir():
        raise _problem(f"--blob-in {blob_in}: that is a folder; name a file")
    try:
        return blob_in.read_bytes()
    except FileNotFoundError:
        raise _problem(f"--blob-in {blob_in}: no such file (nothing was sent)") from None
    except OSError as exc:
        raise _problem(f"--blob-in {blob_in}: cannot read it: {exc.strerror}") from None


def check_blob_out(blob_out: Path | None) -> None:
    """Before the call: the folder exists and the name is not a folder."""
    if blob_out is None:
        return
    folder = blob_out.parent
    if blob_out.is_dir():
        raise _problem(f"--blob-out {blob_out}: that is a folder; name a file in it")
    if not folder.is_dir():
        raise _problem(
            f"--blob-out {blob_out}: the folder {folder} does not exist (nothing was sent); "
            f"create it first (mkdir -p {folder})"
        )
    if not os.access(folder, os.W_OK):
        raise _problem(f"--blob-out {blob_out}: the folder {folder} is not writable")


def write_blob_out(blob_out: Path | None, ok: bool, blob: bytes) -> str | None:
    """After the call: the blob on success (atomically, empty too); on failure the file
    is removed. Returns a note for the person, or None."""
    if blob_out is None:
        return None
    if not ok:
        try:
            blob_out.unlink()
        except FileNotFoundError:
            return None
        return f"removed {blob_out}: the call failed, so it has no output"
    import tempfile  # here: it loads shutil, random, bz2 and lzma, unused without --blob-out

    fd, temp = tempfile.mkstemp(dir=blob_out.parent, prefix=f".{blob_out.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(blob)
        os.replace(temp, blob_out)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return None
