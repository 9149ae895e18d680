from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, cluster


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Cluster]:
    """A real hub and a real worker, as subprocesses talking gRPC over loopback."""
    with cluster(tmp_path / "home") as c:
        yield c
