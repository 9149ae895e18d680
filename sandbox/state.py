"""What containment remembers from one call to the next, in one object its owner holds.

The worker's dispatcher owns one `Containment` and hands it to every call (through
the action's Context), so nothing here lives in a module global: two workers in one
process, or two tests, never share it.
"""

from __future__ import annotations

from sandbox._leftovers import Leftovers
from sandbox._pidcap import PidCap
from sandbox._spawn import Starts
from sandbox.held import HeldPlaces
from sandbox.mounts import MountTable
from sandbox.warm import WarmSandboxes


class Containment:
    """The pid cap's latch (sandbox._pidcap), the leftover sweeps (sandbox._leftovers),
    how bubblewrap is started (sandbox._spawn), which roots no lookup can hang in
    (sandbox.mounts), the sandboxes built ahead of their calls (sandbox.warm) and the
    places asked programs hold still (sandbox.held)."""

    def __init__(self) -> None:
        self.pid_cap = PidCap()
        self.leftovers = Leftovers()
        self.starts = Starts()
        self.mounts = MountTable()
        self.warm = WarmSandboxes()
        self.held = HeldPlaces()
