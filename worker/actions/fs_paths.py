"""The one place where the sandbox's confinement errors become wire errors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sandbox import ConfinedDir, ConfinementError, Located, locate
from worker.errors import WorkerError
from worker.registry import Context


@contextmanager
def confined(
    ctx: Context, path: str, *, write: bool = False
) -> Iterator[tuple[ConfinedDir, Located]]:
    """Open the root holding `path` and yield it with the path's place beneath it."""
    try:
        located = locate(ctx.roots, path, write=write)
        with ConfinedDir(located.root.path) as root:
            yield root, located
    except ConfinementError as exc:
        raise WorkerError(exc.code, exc.message, {"path": path}) from exc
