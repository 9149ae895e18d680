"""The one place where the sandbox's confinement errors become wire errors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sandbox import ConfinedDir, ConfinementError, HardLinkError, Located, locate
from worker.errors import WorkerError, from_os_error
from worker.registry import Context

_HARD_LINK_HINT = (
    " If hard-linked files in the shared folders should be usable, set "
    "allow_hard_links = true under [fs] in config.toml."
)


@contextmanager
def confined(
    ctx: Context, path: str, *, write: bool = False
) -> Iterator[tuple[ConfinedDir, Located]]:
    """Open the root holding `path` and yield it with the path's place beneath it."""
    try:
        located = locate(ctx.roots, path, write=write)
        with ConfinedDir(located.root.path) as root:
            yield root, located
    except HardLinkError as exc:
        details = {"path": path, "links": exc.links}
        raise WorkerError(exc.code, exc.message + _HARD_LINK_HINT, details) from exc
    except ConfinementError as exc:
        raise WorkerError(exc.code, exc.message, {"path": path}) from exc
    except OSError as exc:  # not a confinement question (a full disk, a file size limit)
        raise from_os_error(exc, path) from exc
