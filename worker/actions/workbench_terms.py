"""A sandbox plan's answers in its own terms: its workspace is /workspace.

The handlers underneath are host mode's, confined to the plan's workspace as to a shared
folder, so their refusals named the worker's own path of it
(`/home/op/.local/share/agentworker/workbench/3f2a.../files`) and called it "every shared
folder". The agent never sees that path: it spells the workspace `/workspace` (or
relative), and the operator reads sandbox words. Rewritten once here, on the way out.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final, TypeVar

from sandbox.workspaces import EMPTY, MOUNT_POINT
from worker.errors import WorkerError

H = TypeVar("H", bound=Callable[..., Any])

# Host mode's words for the one folder a plan has.
_WORDS: Final = (
    ("outside every shared folder", "outside the plan's workspace"),
    ("the first shared folder", "the plan's workspace"),
    ("its shared folder", "the plan's workspace"),
    ("the read-write shared folder", "the plan's workspace"),
)


def host_paths(base: Path) -> re.Pattern[str]:
    """The worker's own paths of the workspaces under `base` (and of the empty folder
    a plan without one looks into), however `base` was spelt."""
    spellings = sorted({str(base), os.path.realpath(base)}, key=len, reverse=True)
    folders = "|".join(re.escape(spelling) for spelling in spellings)
    return re.compile(rf"(?:{folders})/(?:[0-9a-f]{{32}}/files|{re.escape(EMPTY)})")


def in_plan_terms(paths: re.Pattern[str], exc: WorkerError) -> WorkerError:
    """`exc` with the workspace's host path written /workspace, in its message and
    details, and host mode's shared-folder words made the plan's."""
    exc.message = _text(paths, exc.message)
    exc.args = (exc.message,)
    exc.details = _value(paths, exc.details)
    return exc


def answering_in_plan_terms(paths: re.Pattern[str], handler: H) -> H:
    """`handler` (returning an outcome or an awaitable of one) whose WorkerErrors are
    said in the plan's terms; a coroutine function still (the pipeline runs the others
    inline)."""
    if inspect.iscoroutinefunction(handler):

        async def said_later(*args: Any) -> Any:
            return await _awaited(paths, handler(*args))

        return said_later  # type: ignore[return-value]

    def said(*args: Any) -> Any:
        try:
            out = handler(*args)
        except WorkerError as exc:
            raise in_plan_terms(paths, exc) from exc.__cause__
        return _awaited(paths, out) if inspect.isawaitable(out) else out

    return said  # type: ignore[return-value]


async def _awaited(paths: re.Pattern[str], out: Awaitable[Any]) -> Any:
    try:
        return await out
    except WorkerError as exc:
        raise in_plan_terms(paths, exc) from exc.__cause__


def _text(paths: re.Pattern[str], text: str) -> str:
    if not paths.search(text):
        return text
    text = paths.sub(MOUNT_POINT, text)
    for host, plan in _WORDS:
        text = text.replace(host, plan)
    return text


def _value(paths: re.Pattern[str], value: Any) -> Any:
    if isinstance(value, str):
        return _text(paths, value)
    if isinstance(value, dict):
        return {key: _value(paths, item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_value(paths, item) for item in value)
    return value
