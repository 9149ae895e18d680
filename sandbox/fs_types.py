"""One word for what a stat result describes, as reported to the agent."""

from __future__ import annotations

import os
import stat
from typing import Final

# By the file-type bits (S_IFMT): one dict lookup per entry of a 10,000-entry listing.
_KINDS: Final = {
    stat.S_IFREG: "file",
    stat.S_IFDIR: "directory",
    stat.S_IFLNK: "symlink",
    stat.S_IFIFO: "fifo",
    stat.S_IFSOCK: "socket",
    stat.S_IFCHR: "char_device",
    stat.S_IFBLK: "block_device",
}


def file_kind(st: os.stat_result) -> str:
    """One of "file", "directory", "symlink", "fifo", "socket", "char_device",
    "block_device" or "other" (door, whiteout and other exotic types)."""
    return _KINDS.get(stat.S_IFMT(st.st_mode), "other")
