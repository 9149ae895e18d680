"""worker.wire.own_hub: how a client tells this user's hub from another user's listener,
with real sockets and real files (review11 finding 06)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.port_squatter import Squatter
from worker.errors import HubUnreachableError, NotYourHubError
from worker.wire.own_hub import Dial, OwnHub, listeners

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="becoming another user needs root")


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    # A short path: a Unix socket's address holds about 100 bytes.
    short = Path(f"/tmp/own-hub-{os.getpid()}-{tmp_path.name[-12:]}")
    short.mkdir(mode=0o700)
    yield short
    for item in short.iterdir():
        item.unlink()
    short.rmdir()


@pytest.fixture
def tcp() -> Iterator[str]:
    """A port this user listens on (loopback)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def unused_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_a_socket_of_ours_that_answers_is_dialled(folder: Path, tcp: str) -> None:
    path = folder / "hub.sock"
    with socket.socket(socket.AF_UNIX) as served:
        served.bind(str(path))
        served.listen()
        assert OwnHub(path, tcp).dial() == Dial(f"unix:{path}", local_socket=True)


def test_a_stopped_hubs_socket_is_down_and_nothing_else_is_dialled(folder: Path, tcp: str) -> None:
    path = folder / "hub.sock"
    with socket.socket(socket.AF_UNIX) as served:
        served.bind(str(path))  # bound, never listening: as a crashed hub leaves it
    with pytest.raises(HubUnreachableError, match="no hub answered at"):
        OwnHub(path, tcp).dial()  # not the port, though this user listens there


def test_no_socket_and_our_own_listener_is_the_port(folder: Path, tcp: str) -> None:
    assert listeners(tcp) == {os.getuid()}
    assert OwnHub(folder / "hub.sock", tcp).dial() == Dial(tcp, local_socket=False)


def test_no_socket_and_no_listener_is_no_hub(folder: Path) -> None:
    port = unused_port()
    assert listeners(port) == set()
    with pytest.raises(HubUnreachableError, match="start one"):
        OwnHub(folder / "hub.sock", port).dial()


def test_a_folder_others_may_write_in_is_refused(folder: Path, tcp: str) -> None:
    folder.chmod(0o770)
    with pytest.raises(NotYourHubError, match="only you may write in"):
        OwnHub(folder / "hub.sock", tcp).dial()


@as_root
def test_a_socket_file_of_another_user_is_refused(folder: Path, tcp: str) -> None:
    path = folder / "hub.sock"
    with socket.socket(socket.AF_UNIX) as served:
        served.bind(str(path))
        served.listen()
        os.chown(path, 65534, 65534)
        with pytest.raises(NotYourHubError, match=r"not a socket of yours \(owner uid 65534"):
            OwnHub(path, tcp).dial()


@as_root
def test_a_socket_served_by_another_user_is_refused(folder: Path, tcp: str) -> None:
    path = folder / "hub.sock"
    other = Squatter("--unix", str(path))
    try:
        with pytest.raises(NotYourHubError, match=r"runs as another user \(uid 65534\)"):
            OwnHub(path, tcp).dial()
    finally:
        other.report()


@as_root
def test_a_port_held_by_another_user_is_refused(folder: Path) -> None:
    port = unused_port()
    other = Squatter(port)
    try:
        assert listeners(port) == {65534}
        with pytest.raises(NotYourHubError) as refused:
            OwnHub(folder / "hub.sock", port).dial()
        assert f"refusing to send a token to {port}" in refused.value.message
        assert "another user (uid 65534)" in refused.value.message
        assert "Nothing was sent" in refused.value.message
    finally:
        other.report()


@as_root
def test_doctor_names_another_users_listener_as_a_blocker(tmp_path: Path) -> None:
    """`agentworker doctor` asks the hub's status with hub.token: never of a squatter."""
    import asyncio

    from tests.support.cluster import write_config
    from worker.cli.doctor import _ask_hub
    from worker.config import Paths, load

    port = unused_port()
    home = tmp_path / "home"
    write_config(home, port)
    (home / "hub.token").write_text("ab" * 32)
    paths = Paths.at(home)
    other = Squatter(port)
    try:
        finding = asyncio.run(_ask_hub(paths, load(paths)))
    finally:
        got = other.report()
    assert finding.status == "blocker"
    assert "held by another user (uid 65534)" in finding.summary
    assert "Nothing was sent" in finding.summary
    assert got["connections"] == 0
