"""The shape of the test tree, shared by the fixtures and the tests."""

from __future__ import annotations

import os
import resource
import signal
import textwrap
from dataclasses import dataclass
from pathlib import Path

from sandbox import ConfinedDir, write_atomic

INSIDE = "inside data\n"
SECRET = "outside secret\n"

# Forks children that wait on a pipe until a fork is refused, lets them go, and prints
# how many processes it had at once (itself counted), its own pid and its children's
# lowest: a sandbox's process cap, seen from inside.
FORK_UNTIL_REFUSED = textwrap.dedent(
    """
    import os
    hold, release = os.pipe()
    alive = []
    while len(alive) < 1000:
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            os.close(release)
            os.read(hold, 1)
            os._exit(0)
        alive.append(pid)
    os.close(release)
    for pid in alive:
        os.waitpid(pid, 0)
    print(len(alive) + 1, os.getpid(), min(alive, default=0))
    """
)


@dataclass(frozen=True)
class Tree:
    root: Path  # the shared folder: data.txt, sub/inner.txt
    outside: Path  # a sibling folder holding secret.txt, which must never be reached

    @property
    def secret(self) -> Path:
        return self.outside / "secret.txt"


def crash_mid_write(root: ConfinedDir, relative: str) -> None:
    """A child dies by SIGXFSZ part-way through an atomic write: no cleanup runs."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it by default
            resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))
            parent, name = root.open_parent(relative)
            write_atomic(parent, name, b"N" * (1 << 20), replace=True)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXFSZ
