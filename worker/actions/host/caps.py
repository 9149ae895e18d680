"""The hard caps of the host actions (DESIGN.md §4), in one immutable object.

Handlers and args models read their limits from `CAPS` rather than from literals
of their own, so the whole set can be reviewed (and quoted in messages) at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

MIB: Final = 1024 * 1024


@dataclass(frozen=True)
class HostCaps:
    read_bytes: int = 1 * MIB  # fs_read, per call; page with offset/length
    write_bytes: int = 16 * MIB  # fs_write, per call; above is too_large
    list_entries: int = 10_000  # fs_list, per call (truncated past it)
    list_depth: int = 32
    list_scan_per_folder: int = 100_000  # names read from one folder before giving up
    fetch_body: int = 5 * MIB  # http_fetch response body, counted after decoding
    # Raw bytes read for one response: bounds a compressed stream that inflates to nothing.
    fetch_raw: int = 10 * MIB
    fetch_request_body: int = 16 * MIB
    redirects: int = 5
    exec_output: int = 1 * MIB  # exec, stdout + stderr together per call


CAPS: Final = HostCaps()
