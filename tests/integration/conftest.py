"""Fixtures the integration modules share; each module brings its own `live` cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cluster import Cluster


@pytest.fixture
def box(live: Cluster, request: pytest.FixtureRequest) -> Path:
    """A folder of the workspace for this test alone, named for it.

    A parametrized test's brackets are dropped so the name stays a plain path segment.
    """
    folder = live.workspace / request.node.name.replace("[", "-").replace("]", "")
    folder.mkdir()
    return folder
