"""The UI socket is the power to approve calls: only this user's own processes, outside
any sandbox, may attach, and `agentworker ui` attaches only to a socket its own user
serves. Real hub and worker subprocesses, real bubblewrap."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import cluster, wait_for
from tests.support.host_calls import call
from tests.support.policies import PYTHON3
from worker.config import Paths
from worker.core.console_socket import NoWorkerError, SocketLink
from worker.errors import StartupError
from worker.wire.own_hub import private_folder

AS_USER_1000 = ("setpriv", "--reuid=1000", "--regid=1000", "--clear-groups")
# Attach, and print the first line the worker answers (empty: it closed at once).
ATTACH = """
import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile("rwb")
try:
    f.write(b'{"op": "attach"}\\n'); f.flush()
    print(repr(f.readline()[:40]))
except OSError:
    print("closed")
"""


@pytest.fixture
def long_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A home too long for a socket address, with the machine's temp folder (short:
    the socket's address must fit under it) made a shared folder: the UI socket then
    lives under that temp folder."""
    temp = Path(tempfile.mkdtemp(prefix="aw-t-", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    home = tmp_path / ("home-with-a-long-name-" + "h" * 80)
    home.mkdir()
    (home / "allowlist.toml").write_text(PYTHON3)
    try:
        yield home
    finally:
        shutil.rmtree(temp)


def test_the_fallback_socket_is_out_of_a_sandboxed_programs_reach(long_home: Path) -> None:
    """A shared folder that holds the temp folder holds the socket's folder too: it is
    withheld from fs_* and blanked in the sandbox, as the data folder's ui.sock is."""
    temp = Path(tempfile.gettempdir())
    sock = Paths(config_dir=long_home, data_dir=long_home).ui_socket
    assert sock.is_relative_to(temp)
    extra = (
        f'[[root]]\npath = "{temp}"\nmode = "rw"\n\n'
        f'[exec]\npolicy = "{long_home / "allowlist.toml"}"\n'
    )
    with cluster(long_home, extra_config=extra) as live:
        wait_for(sock.exists, 60)
        look = "import glob, sys; print(glob.glob(sys.argv[1] + '/agentworker-*/*'))"
        out, blob = call(live, "exec", {"argv": ["python3", "-c", look, str(temp)]})
        assert out["status"] == "ok" and blob == b"[]\n", (out, blob)
        out, _ = call(live, "fs_stat", {"path": str(sock)})
        assert out["error"]["code"] == "path_not_allowed", out


def test_a_ui_in_another_pid_namespace_is_refused(tmp_path: Path) -> None:
    """A program in the exec sandbox runs as this user, in a pid namespace of its own:
    reaching the socket somehow, it still may not attach."""
    with cluster(tmp_path / "home") as live:
        sock = str(Paths.at(live.home).ui_socket)
        here = subprocess.run([sys.executable, "-c", ATTACH, sock], capture_output=True, text=True)
        assert '"type"' in here.stdout or "snapshot" in here.stdout, here
        bwrap = shutil.which("bwrap")
        assert bwrap is not None, "bubblewrap is needed (the CI installs it)"
        boxed = subprocess.run(
            [bwrap, "--dev-bind", "/", "/", "--unshare-pid", sys.executable, "-c", ATTACH, sock],
            capture_output=True,
            text=True,
        )
        assert boxed.stdout.strip() in {"b''", "closed"}, boxed
        log = (live.home / "worker.log").read_text()
        assert "in another pid namespace (a sandbox)" in log, log[-2000:]


def test_a_link_in_place_of_the_sockets_folder_is_refused(tmp_path: Path) -> None:
    """Another user who put a link where the socket's folder goes could swap what it
    leads to for a folder of their own, with their socket in it."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "agentworker-x").symlink_to(real)
    with pytest.raises(StartupError, match="must be a folder \\(not a link\\)"):
        private_folder(tmp_path / "agentworker-x", "the UI socket")
    private_folder(real, "the UI socket")  # the folder itself passes


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root (CI is root)")
def test_ui_refuses_a_socket_served_by_another_user() -> None:
    """`agentworker ui` would tell that user's fake worker the person's kills and pauses."""
    folder = Path(tempfile.mkdtemp(prefix="aw-other-", dir="/tmp"))
    os.chown(folder, 1000, 1000)
    sock = folder / "ui.sock"
    serve = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(1)\n"
        "print('listening', flush=True)\n"
        'c, _ = s.accept(); c.sendall(b\'{"type": "snapshot"}\\n\'); c.recv(1)\n'
    )
    fake = subprocess.Popen(
        [*AS_USER_1000, "/usr/bin/python3", "-c", serve, str(sock)],
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    try:
        assert fake.stdout is not None and fake.stdout.readline() == "listening\n"
        with pytest.raises(NoWorkerError, match="served by another user \\(uid 1000\\)"):
            asyncio.run(SocketLink(sock).open(lambda event: None))
    finally:
        fake.kill()
        fake.communicate()
        shutil.rmtree(folder)


def test_own_places_name_the_fallback_sockets_folder(long_home: Path) -> None:
    from worker.config import load, own_places

    paths = Paths(config_dir=long_home, data_dir=long_home)
    folders, files = own_places(load(paths), paths)
    assert paths.ui_socket.parent in folders and paths.ui_socket in files
    assert json.dumps([str(f) for f in folders])  # resolved paths, printable
