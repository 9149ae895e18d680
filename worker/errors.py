"""The one error type that crosses the wire, and the codes it may carry.

Every failure a caller can see is a `WorkerError`: a stable `code` from DESIGN.md §5,
a message a person can act on, and structured `details`. Lower layers raise their
own exceptions; they are translated to a `WorkerError` at one boundary each
(`from_os_error` for the filesystem, the pipeline for everything unexpected), so no
Python traceback ever reaches the server.

    WorkerError
     └─ (code) validation_error, unknown_action, scope_required, scope_denied,
        plan_killed, path_not_allowed, not_found, ..., internal_error
"""

from __future__ import annotations

import errno
from typing import Any, Final

CODES: Final = frozenset(
    {
        "validation_error",
        "unknown_action",
        "scope_required",
        "scope_denied",
        "plan_killed",
        "command_not_allowed",
        "command_forbidden",
        "path_not_allowed",
        "url_not_allowed",
        "not_found",
        "already_exists",
        "is_directory",
        "not_directory",
        "permission_denied",
        "too_large",
        "result_too_large",
        "timeout",
        "cancelled",
        "outcome_unknown",
        "args_mismatch",
        "busy",
        "paused",
        "not_supported",
        "unknown_key",
        "out_of_bounds",
        "sandbox_unavailable",
        "internal_error",
    }
)

# Codes a caller may simply try again (the same call could succeed later).
RETRYABLE: Final = frozenset({"busy", "paused", "timeout", "sandbox_unavailable"})


class WorkerError(Exception):
    """A failure with a wire code, a human message and structured details."""

    def __init__(self, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        if code not in CODES:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details or {}

    @property
    def retryable(self) -> bool:
        return self.code in RETRYABLE

    def __repr__(self) -> str:
        return f"WorkerError({self.code!r}, {self.message!r})"


_ERRNO_CODES: Final = {
    errno.ENOENT: ("not_found", "does not exist"),
    errno.EEXIST: ("already_exists", "already exists"),
    errno.EISDIR: ("is_directory", "is a directory"),
    errno.ENOTDIR: ("not_directory", "a component of the path is not a directory"),
    errno.EACCES: ("permission_denied", "permission denied by the operating system"),
    errno.EPERM: ("permission_denied", "operation not permitted by the operating system"),
    errno.EROFS: ("permission_denied", "the file system is read-only"),
    errno.ENAMETOOLONG: ("too_large", "the path is too long"),
    errno.EFBIG: ("too_large", "the file is too large"),
    errno.ENOSPC: ("too_large", "no space left on the device"),
    errno.ELOOP: ("path_not_allowed", "too many symbolic links, or a link that is refused"),
    errno.EXDEV: ("path_not_allowed", "the path leads outside its root"),
}


def from_os_error(exc: OSError, path: str | None = None) -> WorkerError:
    """Translate an OSError into a WorkerError; `path` is the caller's spelling, if any."""
    code, what = _ERRNO_CODES.get(exc.errno or 0, ("internal_error", "an operating-system error"))
    if path is None:
        detail = exc.strerror or what
        return WorkerError(code, f"the operating system refused: {detail}.", {"errno": exc.errno})
    return WorkerError(code, f"{path!r}: {what}.", {"path": path, "errno": exc.errno})
