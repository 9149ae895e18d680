"""Containment: keeps what the agent does inside the folders a person shared.

`sandbox.paths` confines file operations to the shared folders, and
`sandbox.files` / `sandbox.listing` read, write and list beneath them without
following a planted link out; `sandbox.process`
runs a program in a bubblewrap sandbox that sees only those folders, with limits
and a kill that reaches every process it started; `sandbox.environment` rebuilds
the program's environment from a pass-list.

Stands alone (standard library only) so it can be reviewed, tested and reused
without the worker around it.
"""

from sandbox._leftovers import Leftovers
from sandbox.arriving import ArrivalStopped, Arriving, each_part
from sandbox.files import (
    ChangedWhileOpenedError,
    Data,
    HardLinkError,
    Written,
    append_bytes,
    data_size,
    make_parents,
    open_regular,
    read_at,
    read_cached,
    write_atomic,
)
from sandbox.fs_types import file_kind
from sandbox.held import HeldError
from sandbox.listing import Entry, Listing, Row, list_tree
from sandbox.paths import (
    ConfinedDir,
    ConfinementError,
    Located,
    Problem,
    Root,
    locate,
    openat2_available,
)
from sandbox.state import Containment

__all__ = [
    "ArrivalStopped",
    "Arriving",
    "ChangedWhileOpenedError",
    "ConfinedDir",
    "ConfinementError",
    "Containment",
    "Data",
    "Entry",
    "HardLinkError",
    "HeldError",
    "Leftovers",
    "Listing",
    "Located",
    "Problem",
    "Root",
    "Row",
    "Written",
    "append_bytes",
    "data_size",
    "each_part",
    "file_kind",
    "list_tree",
    "locate",
    "make_parents",
    "open_regular",
    "openat2_available",
    "read_at",
    "read_cached",
    "write_atomic",
]
