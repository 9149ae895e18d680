"""Containment: keeps what the agent does inside the folders a person shared.

Stands alone (standard library only) so it can be reviewed, tested and reused
without the worker around it.
"""

from sandbox.fs_types import file_kind
from sandbox.paths import (
    ConfinedDir,
    ConfinementError,
    Located,
    Root,
    locate,
    openat2_available,
)

__all__ = [
    "ConfinedDir",
    "ConfinementError",
    "Located",
    "Root",
    "file_kind",
    "locate",
    "openat2_available",
]
