"""Path arithmetic on text alone, shared by `locate` and the fallback walk.

Resolving '.' and '..' without asking the file system is what makes the answer
independent of whatever symlinks happen to exist at the moment we look.
"""

from __future__ import annotations

PATH_MAX_BYTES = 4095  # Linux PATH_MAX is 4096 including the terminating NUL


def components(path: str) -> list[str] | None:
    """The parts of `path` with empty parts, '.' and '..' resolved by text alone.

    Returns None when a relative path's '..' climbs above where it started. In an
    absolute path '..' at '/' stays at '/', as POSIX specifies.
    """
    absolute = path.startswith("/")
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part != "..":
            parts.append(part)
        elif parts:
            parts.pop()
        elif not absolute:
            return None
    return parts


def beneath(root: tuple[str, ...], parts: list[str]) -> list[str] | None:
    """The rest of absolute `parts` below `root` (a Path's parts), or None if not below it."""
    top = list(root[1:])
    return parts[len(top) :] if parts[: len(top)] == top else None


def byte_length(path: str) -> int | None:
    """Length of `path` as the kernel will see it; None if it cannot be encoded."""
    try:
        return len(path.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:
        return None
