"""The suite's hub takes another port when the one it was given is taken before it
binds it (a busy machine: another test's process got there first)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support import cluster as cluster_module
from tests.support.cluster import cluster


def test_a_hub_whose_port_was_taken_meanwhile_starts_on_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        ports = iter([busy])
        real = cluster_module.free_port
        monkeypatch.setattr(cluster_module, "free_port", lambda: next(ports, None) or real())
        with cluster(tmp_path / "home", worker=False) as live:
            assert live.listen != f"127.0.0.1:{busy}"
            assert live.status().connected_workers == 0
            assert "address is in use" in (tmp_path / "home" / "hub.log").read_text()
