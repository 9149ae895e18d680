"""One word for what a stat result describes, as reported to the agent."""

from __future__ import annotations

import os
import stat

# Checked in this order; S_IFMT values are exclusive, so the order only matters for readability.
_KINDS = (
    (stat.S_ISREG, "file"),
    (stat.S_ISDIR, "directory"),
    (stat.S_ISLNK, "symlink"),
    (stat.S_ISFIFO, "fifo"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "char_device"),
    (stat.S_ISBLK, "block_device"),
)


def file_kind(st: os.stat_result) -> str:
    """One of "file", "directory", "symlink", "fifo", "socket", "char_device",
    "block_device" or "other" (door, whiteout and other exotic types)."""
    for test, kind in _KINDS:
        if test(st.st_mode):
            return kind
    return "other"
