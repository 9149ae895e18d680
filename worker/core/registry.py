"""What an action is: its args and result models, its handler, and its `ActionSpec`.

Each action module declares one `SPEC` beside its code (docs/architecture.md, "Adding
an action"); `worker.actions.build` assembles the registry from those modules. The
pipeline knows nothing about individual actions beyond the registry.
"""

from __future__ import annotations

import enum
import functools
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Final, Generic, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, StringConstraints

from allowlist import PolicyFile
from sandbox import Arriving, Containment, Root
from worker.config import Config, Paths
from worker.core.threads import CallThreads
from worker.errors import ErrorCode, WorkerError
from worker.wire.framing import Buffer

MIB: Final = 1024 * 1024

A = TypeVar("A", bound="Args")
R = TypeVar("R", bound="Result")
T = TypeVar("T")


# Args and result models build their validators when first used, not at import: the
# worker's start need not build some 40 of them (12 ms of CPU) for actions that may
# never be called; each costs its first call about 0.3 ms.


class Args(BaseModel):
    """Base for every args model: unknown fields are an error, types are strict."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, defer_build=True)


class Result(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL bytes")
    return value


PathArg = Annotated[str, StringConstraints(min_length=1, max_length=4096), AfterValidator(_no_nul)]


async def digest_known() -> None:
    """Context.digest_ready for a call whose digest came with it."""


def claimed_already() -> None:
    """Context.claim for a call the pipeline claimed before its handler ran."""


async def _never_approved(what: str, preview: str) -> None:
    raise WorkerError(
        "scope_required",
        f"{what} needs the approval of the person at this worker, and no one can be asked here",
    )


class Services:
    """Long-lived objects a worker owns and its handlers use (the desktop of the computer
    surface, say), found by their type: the surface that defines one asks for it, and
    the core need not know it. Owned by the dispatcher, never a module global."""

    def __init__(self, *owned: object) -> None:
        self._by_type: dict[type, object] = {type(item): item for item in owned}

    def get(self, kind: type[T]) -> T | None:
        found = self._by_type.get(kind)
        return found if isinstance(found, kind) else None


@dataclass(frozen=True)
class Context:
    """What a handler may know about its call."""

    correlation_id: str
    plan_id: str
    agent_id: str
    blob: bytes
    roots: Sequence[Root]
    paths: Paths  # the worker's config and data folders (never read from the environment)
    config: Config = field(default_factory=Config)
    # The exec allowlist in force, loaded once per version of its file (the worker's own).
    policies: PolicyFile = field(default_factory=PolicyFile)
    # What containment remembers between calls (the pid cap's latch, leftover sweeps).
    containment: Containment = field(default_factory=Containment)
    services: Services = field(default_factory=Services)
    in_flight: Callable[[], int] = lambda: 0
    # For an action-level "ask" (e.g. an allowlist rule): resolves when the person
    # approves, raises WorkerError otherwise. Headless workers never prompt.
    approve: Callable[[str, str], Awaitable[None]] = field(default=_never_approved)
    # The request blob as the parts it came in, not joined, for an action whose spec
    # says `blob_in_pieces` (then `blob` is empty); see `blob_pieces`.
    # A blob that follows its request (protocol 3) is one piece still coming
    # (sandbox.Arriving): read in a thread, each part waited for.
    pieces: Sequence[bytes | memoryview | Arriving] = ()
    # For an action whose spec says `claims_late`: claims the call in the ledger (a
    # commit), and must return before anything the handler does can take effect; it
    # raises WorkerError, and the handler must then start nothing, when the claim
    # cannot be made. Elsewhere the call was claimed before its handler ran: nothing.
    claim: Callable[[], None] = claimed_already
    # Resolves once the call's digest is known, which `claim` needs: a call may start
    # while the hub still hashes its blob (see worker.wire.local). Elsewhere: at once.
    digest_ready: Callable[[], Awaitable[None]] = field(default=digest_known)
    # When the hub in this process hands the blob over and hashes it for the digest
    # (worker.wire.local): the blob's SHA-256 (hex) from that hash, or None should it
    # not come. None (no callable) elsewhere: a handler that needs the hash makes it.
    blob_sha256: Callable[[], Awaitable[str | None]] | None = None
    # The worker's threads: the loop's default executor, and the lanes apart from it
    # for folders whose file system may hang (worker.core.threads, fs_paths.in_thread).
    threads: CallThreads = field(default_factory=CallThreads)
    # Sandbox mode: the server's placement token of the call's plan on this worker
    # (ActionRequest.placement_token), kept with the plan's workspace. A secret: never
    # logged.
    placement_token: str = field(default="", repr=False)

    @property
    def data_dir(self) -> Path:
        return self.paths.data_dir

    def blob_pieces(self) -> Sequence[bytes | memoryview | Arriving]:
        """The request blob, in the pieces it came in (or whole, as one piece)."""
        return self.pieces or (self.blob,)

    @property
    def blob_bytes(self) -> int:
        """The request blob's size, whole or in pieces: a check of its size asks this,
        never `len(blob)`, which is 0 for a blob that came in pieces."""
        return sum(
            len(piece) if isinstance(piece, Arriving) else memoryview(piece).nbytes
            for piece in self.blob_pieces()
        )


@dataclass(frozen=True)
class Json:
    """A result already serialized, for one too large to build as a model object per
    item (fs_list's 10,000 entries: validating each cost more than listing them). It
    must be what the action's result model would serialize to; its tests check that
    it validates as that model."""

    text: str


@dataclass(frozen=True)
class Outcome(Generic[R]):
    result: R | Json
    # A view when the handler read into a buffer of its own (fs_read's cached page).
    blob: Buffer = b""
    truncated: bool = False
    # The blob's check (worker.core.blob_files.check_hasher over it) when the handler
    # has it already, so the ledger's file of a large blob is not hashed again on the
    # loop (exec hashes its output as it reads it, while the program runs).
    blob_check: bytes | None = None
    # The result as it may be kept once delivered, when not whole: secrets masked (an
    # http_fetch's Set-Cookie, review25 G10). The server and the ledger keep this form
    # after the ack; the call's caller gets `result`.
    at_rest: R | None = None


Handler = Callable[[Context, A], Awaitable[Outcome[Any]] | Outcome[Any]]


class Effect(enum.Enum):
    """What running an action does beyond answering (its effect class).

    NONE: it only looks (a stat, a read, a listing, a screenshot, the pointer's
    position): running it twice does no harm, so the ledger does not claim it before
    it runs (no commit on its path) and holds its result in memory until the server
    acks it; duplicates are still answered from the ledger. ANY: it may change
    something (a file, a process, the network, the desktop's input): claimed durably
    before it runs, never run twice. An action is ANY unless it says otherwise.
    """

    NONE = "none"
    ANY = "any"


# Codes the pipeline itself may answer for any action: an action's `codes` lists
# only the ones its own handler (and the helpers it calls) may raise besides these.
PIPELINE_CODES: Final = frozenset(
    {
        ErrorCode.VALIDATION_ERROR,
        ErrorCode.UNKNOWN_ACTION,
        ErrorCode.SCOPE_REQUIRED,
        ErrorCode.SCOPE_DENIED,
        ErrorCode.PLAN_KILLED,
        ErrorCode.TIMEOUT,
        ErrorCode.CANCELLED,
        ErrorCode.OUTCOME_UNKNOWN,
        ErrorCode.ARGS_MISMATCH,
        ErrorCode.BLOB_GONE,  # a late repeat of a call whose result blob was let go
        ErrorCode.BUSY,
        ErrorCode.PAUSED,
        ErrorCode.RESULT_TOO_LARGE,
        ErrorCode.PERMISSION_DENIED,  # an OSError with no path, translated by the pipeline
        ErrorCode.INTERNAL_ERROR,
    }
)


@dataclass(frozen=True, kw_only=True)
class ActionSpec(Generic[A, R]):
    """One action, declared as `SPEC = ActionSpec(...)` in the module that implements it."""

    surface: str  # "workerHost", "workerComputer", ...
    name: str  # the action's name on the wire; the scope is surface.name
    args: type[A]
    result: type[R]
    # `async def`, or a plain function for work that never waits (one quick syscall):
    # the pipeline runs a plain one at once, in the turn that received the call.
    handler: Callable[[Context, A], Awaitable[Outcome[R]] | Outcome[R]]
    summary: str = ""
    takes_blob: bool = False
    # A blob that came in parts reaches the handler as those parts (`Context.pieces`),
    # not joined into one buffer first: for an action that only writes it out.
    blob_in_pieces: bool = False
    sandboxed: bool = False
    # The error codes this action may answer beyond PIPELINE_CODES.
    codes: frozenset[ErrorCode] = frozenset()
    # Its hard caps, by name (bytes, entries, hops): what the args models and the
    # handler enforce, in one place a reader (and `describe`) can quote.
    caps: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    # Only registered when `[worker] diagnostics = true` (tests and benchmarks).
    diagnostic: bool = False
    # False for actions registered only to say why they cannot run here (the computer
    # surface with no display): they answer `not_supported`, but Hello leaves them out.
    advertised: bool = True
    # Effect.NONE only for an action that changes nothing, whatever its args (see Effect).
    effect: Effect = Effect.ANY
    # An effectful action whose handler claims its calls itself (Context.claim) right
    # before its effect starts, so that the claim's commit overlaps work that has none:
    # exec starts bubblewrap held at its start line, commits the claim while the
    # sandbox is built, and only then lets it go on; fs_write writes and flushes its
    # temporary file, then claims, then renames it into place. Until it claims, a call is
    # answered as an effect-free one is (its result held, not recorded): nothing of it
    # took effect. A handler that never calls Context.claim must not say this.
    claims_late: bool = False
    # The scopes a call needs beyond the action's own, by its args, each with why it
    # does (shown in the prompt and the refusal): a middle click pastes the selection
    # where the pointer is, a terminal too, which is typing (workerComputer.key_type).
    also_needs: Callable[[A], Mapping[str, str]] | None = None

    @property
    def scope(self) -> str:
        return f"{self.surface}.{self.name}"

    @functools.cached_property
    def inline(self) -> bool:
        return not inspect.iscoroutinefunction(self.handler)

    @property
    def answers(self) -> frozenset[ErrorCode]:
        """Every code a call of this action can end with."""
        return PIPELINE_CODES | self.codes


Registry = dict[str, ActionSpec[Any, Any]]


def table(*specs: ActionSpec[Any, Any]) -> Registry:
    """The registry of `specs`, by scope; a scope declared twice is a mistake."""
    registry: Registry = {}
    for spec in specs:
        if spec.scope in registry:
            raise ValueError(f"action {spec.scope} registered twice")
        registry[spec.scope] = spec
    return registry
