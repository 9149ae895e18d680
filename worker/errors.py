"""The error vocabulary: the codes a caller can see, and the exceptions that carry them.

Every failure that reaches the wire is a `WorkerError`: a stable `code` (an
`ErrorCode`), a message a person can act on, and structured `details`. The classes
below sort the codes by what the caller can do about them (docs/architecture.md,
"Errors"); constructing `WorkerError(code, ...)` gives the subclass the code belongs
to, so `except RefusedError:` catches every refusal however it was raised.

    WorkerError            code, message, details; `retryable`, `audited`
     ├─ BadRequestError    the call itself is wrong: validation_error, unknown_action,
     │                     args_mismatch, too_large, result_too_large, unknown_key,
     │                     out_of_bounds
     ├─ RefusedError       a gate said no: scope_required, scope_denied, plan_killed,
     │                     command_not_allowed, command_forbidden, path_not_allowed,
     │                     url_not_allowed
     ├─ FileError          the file system said no: not_found, already_exists,
     │                     is_directory, not_directory, permission_denied
     ├─ UnavailableError   not now or not here: busy, paused, not_supported,
     │                     sandbox_unavailable, blob_gone
     ├─ StoppedError       the call was stopped: timeout, cancelled
     └─ InternalError      our fault, or unknowable: internal_error, outcome_unknown

Lower layers raise exceptions of their own (`OSError`, `sandbox.ConfinementError`,
`allowlist.PolicyError`, anything unexpected). `as_worker_error` is the one place
they become a `WorkerError`; `from_os_error` reads the one errno table (the
sandbox's). No Python
traceback ever reaches the server.

Problems on this machine before any call exists (a bad config file, a missing
token, a taken address) are not wire errors: they are `StartupError`s, each with
the exit code the command line ends with.
"""

from __future__ import annotations

import logging
from enum import StrEnum
from typing import Any, ClassVar, Final

from sandbox import ConfinementError, Problem
from sandbox.paths import ERRNO_PROBLEMS
from sandbox.workspaces import WorkspaceError, WorkspaceProblem

log = logging.getLogger(__name__)


class ErrorCode(StrEnum):
    """The `error.code` strings of the protocol; each knows whether a retry may help
    and whether the person would want an audit row for it."""

    VALIDATION_ERROR = "validation_error"
    UNKNOWN_ACTION = "unknown_action"
    SCOPE_REQUIRED = "scope_required"
    SCOPE_DENIED = "scope_denied"
    PLAN_KILLED = "plan_killed"
    COMMAND_NOT_ALLOWED = "command_not_allowed"
    COMMAND_FORBIDDEN = "command_forbidden"
    PATH_NOT_ALLOWED = "path_not_allowed"
    URL_NOT_ALLOWED = "url_not_allowed"
    NOT_FOUND = "not_found"
    ALREADY_EXISTS = "already_exists"
    IS_DIRECTORY = "is_directory"
    NOT_DIRECTORY = "not_directory"
    PERMISSION_DENIED = "permission_denied"
    TOO_LARGE = "too_large"
    RESULT_TOO_LARGE = "result_too_large"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    OUTCOME_UNKNOWN = "outcome_unknown"
    ARGS_MISMATCH = "args_mismatch"
    BUSY = "busy"
    PAUSED = "paused"  # the global stop, or the person took over the desktop
    NOT_SUPPORTED = "not_supported"  # e.g. no display, Wayland
    UNKNOWN_KEY = "unknown_key"
    OUT_OF_BOUNDS = "out_of_bounds"
    SANDBOX_UNAVAILABLE = "sandbox_unavailable"
    # A repeat of a finished call whose result blob was delivered and let go.
    BLOB_GONE = "blob_gone"
    INTERNAL_ERROR = "internal_error"

    @property
    def retryable(self) -> bool:
        """The same call could succeed later, unchanged."""
        return self in _RETRYABLE

    @property
    def audited(self) -> bool:
        """Worth an audit row: the person will want to know someone tried."""
        return self in _AUDITED


_RETRYABLE: Final = frozenset(
    {ErrorCode.BUSY, ErrorCode.PAUSED, ErrorCode.TIMEOUT, ErrorCode.SANDBOX_UNAVAILABLE}
)
_AUDITED: Final = frozenset(
    {
        ErrorCode.SCOPE_REQUIRED,
        ErrorCode.SCOPE_DENIED,
        ErrorCode.PLAN_KILLED,
        ErrorCode.COMMAND_NOT_ALLOWED,
        ErrorCode.COMMAND_FORBIDDEN,
        ErrorCode.PATH_NOT_ALLOWED,
        ErrorCode.URL_NOT_ALLOWED,
        ErrorCode.ARGS_MISMATCH,
        ErrorCode.OUTCOME_UNKNOWN,
    }
)

# Kept for callers that test membership by string.
CODES: Final = frozenset(ErrorCode)
RETRYABLE: Final = _RETRYABLE


class WorkerError(Exception):
    """A failure with a wire code, a human message and structured details.

    `WorkerError(code, ...)` returns an instance of the subclass that owns `code`;
    a subclass given a code outside its own is a programming error (ValueError).
    """

    codes: ClassVar[frozenset[ErrorCode]] = frozenset()

    def __new__(
        cls,
        code: ErrorCode | str,
        message: str = "",
        details: dict[str, Any] | None = None,
        *,
        retryable: bool | None = None,
    ) -> WorkerError:
        try:
            known = ErrorCode(code)
        except ValueError:
            raise ValueError(f"unknown error code {code!r}") from None
        owner = _OWNER[known]
        if not issubclass(owner, cls):
            raise ValueError(f"{cls.__name__} cannot carry {known.value!r}")
        return super().__new__(owner)

    def __init__(
        self,
        code: ErrorCode | str,
        message: str,
        details: dict[str, Any] | None = None,
        *,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.code = ErrorCode(code)
        self.message = message
        self.details = details or {}
        # Set where one occurrence of a code differs from the code's rule: a host not
        # found because the network is down may be found later (not_found, retryable).
        self._retryable = retryable

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.code, self.message, self.details, self._retryable))

    @property
    def retryable(self) -> bool:
        return self.code.retryable if self._retryable is None else self._retryable

    @property
    def audited(self) -> bool:
        return self.code.audited

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code.value!r}, {self.message!r})"


def _rebuild(
    code: ErrorCode, message: str, details: dict[str, Any], retryable: bool | None
) -> WorkerError:
    return WorkerError(code, message, details, retryable=retryable)


class BadRequestError(WorkerError):
    """The call itself is wrong; sending it again unchanged gets the same answer."""

    codes = frozenset(
        {
            ErrorCode.VALIDATION_ERROR,
            ErrorCode.UNKNOWN_ACTION,
            ErrorCode.ARGS_MISMATCH,
            ErrorCode.TOO_LARGE,
            ErrorCode.RESULT_TOO_LARGE,
            ErrorCode.UNKNOWN_KEY,
            ErrorCode.OUT_OF_BOUNDS,
        }
    )


class RefusedError(WorkerError):
    """A gate said no: a scope, the kill switch, a root, the allowlist, the URL guard."""

    codes = frozenset(
        {
            ErrorCode.SCOPE_REQUIRED,
            ErrorCode.SCOPE_DENIED,
            ErrorCode.PLAN_KILLED,
            ErrorCode.COMMAND_NOT_ALLOWED,
            ErrorCode.COMMAND_FORBIDDEN,
            ErrorCode.PATH_NOT_ALLOWED,
            ErrorCode.URL_NOT_ALLOWED,
        }
    )


class FileError(WorkerError):
    """The file system answered no for a path inside the roots."""

    codes = frozenset(
        {
            ErrorCode.NOT_FOUND,
            ErrorCode.ALREADY_EXISTS,
            ErrorCode.IS_DIRECTORY,
            ErrorCode.NOT_DIRECTORY,
            ErrorCode.PERMISSION_DENIED,
        }
    )


class UnavailableError(WorkerError):
    """Not now, or not on this machine: the worker is busy or paused, or lacks a part."""

    codes = frozenset(
        {
            ErrorCode.BUSY,
            ErrorCode.PAUSED,
            ErrorCode.NOT_SUPPORTED,
            ErrorCode.SANDBOX_UNAVAILABLE,
            ErrorCode.BLOB_GONE,
        }
    )


class StoppedError(WorkerError):
    """The call was stopped before it finished: its deadline, or someone cancelled it."""

    codes = frozenset({ErrorCode.TIMEOUT, ErrorCode.CANCELLED})


class InternalError(WorkerError):
    """Our fault (the log has the traceback), or a call whose outcome cannot be known."""

    codes = frozenset({ErrorCode.INTERNAL_ERROR, ErrorCode.OUTCOME_UNKNOWN})


_OWNER: Final[dict[ErrorCode, type[WorkerError]]] = {
    code: family
    for family in (
        BadRequestError,
        RefusedError,
        FileError,
        UnavailableError,
        StoppedError,
        InternalError,
    )
    for code in family.codes
}
assert set(_OWNER) == set(ErrorCode), "every code belongs to exactly one family"


# ----------------------------------------------------------------- translation


# sandbox/ has a vocabulary of its own (it may not import worker): this is its map.
CONFINEMENT_CODES: Final[dict[Problem, ErrorCode]] = {
    Problem.OUTSIDE: ErrorCode.PATH_NOT_ALLOWED,
    Problem.MISSING: ErrorCode.NOT_FOUND,
    Problem.NOT_A_FOLDER: ErrorCode.NOT_DIRECTORY,
    Problem.A_FOLDER: ErrorCode.IS_DIRECTORY,
    Problem.DENIED: ErrorCode.PERMISSION_DENIED,
    Problem.TOO_LONG: ErrorCode.TOO_LARGE,
    Problem.TOO_BIG: ErrorCode.TOO_LARGE,
    Problem.EXISTS: ErrorCode.ALREADY_EXISTS,
    Problem.NOT_A_FILE: ErrorCode.NOT_SUPPORTED,
}


# ... and the map of its workspaces' problems (sandbox mode).
WORKSPACE_CODES: Final[dict[WorkspaceProblem, ErrorCode]] = {
    WorkspaceProblem.BAD_PLAN_ID: ErrorCode.VALIDATION_ERROR,
    WorkspaceProblem.NOT_PRIVATE: ErrorCode.PERMISSION_DENIED,
    WorkspaceProblem.NO_ROOM: ErrorCode.TOO_LARGE,
    WorkspaceProblem.TOO_MANY_PLANS: ErrorCode.BUSY,
    WorkspaceProblem.FAILED: ErrorCode.INTERNAL_ERROR,
}


def from_workspace(exc: WorkspaceError) -> WorkerError:
    """A workspace's refusal as a wire error, its message and figures kept."""
    return WorkerError(WORKSPACE_CODES[exc.problem], exc.message, exc.details)


def from_confinement(exc: ConfinementError, details: dict[str, Any] | None = None) -> WorkerError:
    """The sandbox's refusal as a wire error, its message kept."""
    return WorkerError(CONFINEMENT_CODES[exc.problem], exc.message, details)


def from_os_error(exc: OSError, path: str | None = None) -> WorkerError:
    """Translate an OSError into a WorkerError; `path` is the caller's spelling, if any.

    The errno table is the sandbox's (sandbox.paths.ERRNO_PROBLEMS): one table, so a
    full disk reads the same whichever layer met it.
    """
    problem, what = ERRNO_PROBLEMS.get(exc.errno or 0, (None, ""))
    code = ErrorCode.INTERNAL_ERROR if problem is None else CONFINEMENT_CODES[problem]
    said = exc.strerror or "an operating-system error"
    if path is None:
        return WorkerError(code, f"the operating system refused: {said}.", {"errno": exc.errno})
    what = what or f"could not be used: {said}."
    return WorkerError(code, f"{path!r} {what}", {"path": path, "errno": exc.errno})


def as_worker_error(exc: BaseException, *, doing: str, call: str = "") -> WorkerError:
    """The one place a failure becomes the error a caller sees.

    Ours pass as they are, the operating system's and the sandbox's are translated,
    and anything else is an internal error: logged here with its traceback, which
    never crosses the wire. `doing` names the work ("running workerHost.exec"),
    `call` the correlation id, both for the message.
    """
    if isinstance(exc, WorkerError):
        return exc
    if isinstance(exc, ConfinementError):
        return from_confinement(exc)
    if isinstance(exc, WorkspaceError):
        return from_workspace(exc)
    if isinstance(exc, OSError):
        return from_os_error(exc)  # no path known here
    where = f" (call {call})" if call else ""
    log.error("internal error %s%s", doing, where, exc_info=exc)
    return WorkerError(
        ErrorCode.INTERNAL_ERROR,
        f"the worker hit an internal error {doing}; its log has the details{where}",
    )


# ----------------------------------------------------------------- this machine


class StartupError(Exception):
    """A problem on this machine that stops a command before any call: not a wire error.

    `exit_code` is what `agentworker` exits with; `message` says what to do.
    """

    exit_code: ClassVar[int] = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(StartupError):
    """A flag or argument the command cannot use (as argparse's own errors)."""

    exit_code = 2


class HubUnreachableError(StartupError):
    """No hub to talk to: none started here, or it did not answer."""

    exit_code = 3


class ConfigError(StartupError):
    """The config file (or an AGENTWORKER_* variable) is unreadable or invalid."""

    exit_code = 4


class CredentialsError(StartupError):
    """A token or certificate is missing, empty or unreadable."""

    exit_code = 5


class TokenRefusedError(CredentialsError):
    """The hub answered, and refused the token sent (UNAUTHENTICATED)."""


class TokenNotSentError(CredentialsError):
    """--server names another hub and no token was given for it: this machine's
    hub.token goes only to this machine's hub (review27 I2)."""


class InUseError(StartupError):
    """Something this command needs is taken: the data folder's lock, an address."""

    exit_code = 6


class InsecureError(StartupError):
    """The command would send or serve a token in plaintext off this machine."""

    exit_code = 7


class NotYourHubError(InsecureError):
    """What answers where this machine's hub should (its socket, its port) is another
    user's: no token is sent to it (worker.wire.own_hub)."""


class NoSandboxError(StartupError):
    """Sandbox mode was asked for, and this machine cannot build the sandbox."""

    exit_code = 8
