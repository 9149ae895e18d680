from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.support.cluster import CLUSTERS_MADE, Cluster, cluster

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


# How much of each process's log a failed test's report shows, from the end.
LOG_TAIL_BYTES = 12_000


@pytest.hookimpl(tryfirst=True)  # before the fixtures, which may make clusters
def pytest_runtest_setup(item: pytest.Item) -> None:
    CLUSTERS_MADE.clear()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test reports the end of the logs of the hubs and workers it started: a
    test that timed out under load on CI is otherwise seen from its own side alone (its
    thread waiting in `select`), with no word of what the hub or the worker did."""
    report = yield
    if report.failed:
        for live in CLUSTERS_MADE:
            for proc in live.procs:
                code = proc.popen.poll() if proc.popen is not None else None
                state = "running" if code is None else f"exit code {code}"
                tail = proc.log()[-LOG_TAIL_BYTES:]
                report.sections.append((f"{proc.log_path} ({state}), its end", tail))
    return report
