from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, cluster

# Descriptors this test process inherited open from whatever started it (a terminal, a
# CI runner): close-on-exec, as a worker's own are. Left inheritable, the first exec
# run in this process would see one and start bubblewrap with Popen's close_fds from
# then on (sandbox.process._spawn), and the tests would not run the posix_spawn path.
for _name in os.listdir("/proc/self/fd"):
    try:
        if int(_name) > 2 and os.get_inheritable(int(_name)):
            os.set_inheritable(int(_name), False)
    except OSError:  # the listing's own descriptor, closed by now
        pass


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Cluster]:
    """A real hub and a real worker, as subprocesses talking gRPC over loopback."""
    with cluster(tmp_path / "home") as c:
        yield c
