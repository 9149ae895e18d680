"""The action registry: one table that names the whole action surface.

Each entry binds a `surface.action` name to its args model, result model, scope
and handler. The pipeline knows nothing about individual actions beyond this.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Generic, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, StringConstraints

from sandbox import Root
from worker.config import Config
from worker.errors import WorkerError

A = TypeVar("A", bound="Args")
R = TypeVar("R", bound="Result")


class Args(BaseModel):
    """Base for every args model: unknown fields are an error, types are strict."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Result(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL bytes")
    return value


PathArg = Annotated[str, StringConstraints(min_length=1, max_length=4096), AfterValidator(_no_nul)]


async def _never_approved(what: str, preview: str) -> None:
    raise WorkerError(
        "scope_required",
        f"{what} needs the approval of the person at this worker, and no one can be asked here",
    )


@dataclass(frozen=True)
class Context:
    """What a handler may know about its call."""

    correlation_id: str
    plan_id: str
    agent_id: str
    blob: bytes
    roots: Sequence[Root]
    data_dir: Path
    config: Config = field(default_factory=Config)
    in_flight: Callable[[], int] = lambda: 0
    # For an action-level "ask" (e.g. an allowlist rule): resolves when the person
    # approves, raises WorkerError otherwise. Headless workers never prompt.
    approve: Callable[[str, str], Awaitable[None]] = field(default=_never_approved)


@dataclass(frozen=True)
class Outcome(Generic[R]):
    result: R
    blob: bytes = b""
    truncated: bool = False


Handler = Callable[[Context, A], Awaitable[Outcome[Any]] | Outcome[Any]]


@dataclass(frozen=True)
class ActionSpec(Generic[A, R]):
    surface: str
    name: str
    args: type[A]
    result: type[R]
    # `async def`, or a plain function for work that never waits (one quick syscall):
    # the pipeline runs a plain one at once, in the turn that received the call.
    handler: Callable[[Context, A], Awaitable[Outcome[R]] | Outcome[R]]
    summary: str = ""
    takes_blob: bool = False
    sandboxed: bool = False

    @property
    def scope(self) -> str:
        return f"{self.surface}.{self.name}"

    @functools.cached_property
    def inline(self) -> bool:
        return not inspect.iscoroutinefunction(self.handler)


Registry = dict[str, ActionSpec[Any, Any]]


def table(*specs: ActionSpec[Any, Any]) -> Registry:
    registry: Registry = {}
    for spec in specs:
        if spec.scope in registry:
            raise ValueError(f"action {spec.scope} registered twice")
        registry[spec.scope] = spec
    return registry
