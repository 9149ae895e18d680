"""A root worker's pid cap, from outside: the entry helper run as `-O FD -N 300` sets a
fresh pid namespace's last pid (sandbox._startline.settle), for real, as root."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path

import pytest

from sandbox import _pidcap, _startline, environment
from sandbox._bwrap import SandboxUnavailableError
from sandbox._spawn import Starts
from sandbox.process import Limits, Mount, PidCap, View, run

pytestmark = pytest.mark.skipif(not _pidcap.needed(), reason="the pid cap is a root worker's")


def test_the_helper_sets_a_fresh_namespaces_last_pid_so_its_next_pid_is_301(entry: str) -> None:
    """A fresh pid namespace whose pid 1 waits on its stdin: once the helper has set its
    last pid from outside, the next process there is 301 (spent nothing to get there)."""
    script = 'echo ready; read go; /bin/sh -c "echo \\$\\$"'
    with subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", "--", "/bin/sh", "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    ) as held:
        assert held.stdin is not None and held.stdout is not None
        try:
            assert held.stdout.readline() == b"ready\n"  # its pid 1 exists, and waits
            first = Path(f"/proc/{held.pid}/task/{held.pid}/children").read_text().split()
            pidfd = os.pidfd_open(int(first[0]))
            try:
                asyncio.run(_startline.settle(entry, pidfd, Starts(), last_pid=True, limits=()))
            finally:
                os.close(pidfd)
            held.stdin.write(b"go\n")
            held.stdin.close()
            assert held.stdout.read() == b"301\n"
            assert held.wait() == 0
        finally:
            held.kill()


def test_the_helper_refuses_a_namespace_that_is_not_fresh(entry: str) -> None:
    """Given a process of the machine's own pid namespace (whose pids are far past 300),
    the helper writes nothing and says why; the exec would be refused."""
    pidfd = os.pidfd_open(os.getpid())
    try:
        with pytest.raises(SandboxUnavailableError, match="not a fresh pid namespace"):
            asyncio.run(_startline.settle(entry, pidfd, Starts(), last_pid=True, limits=()))
    finally:
        os.close(pidfd)


def test_a_cancelled_pass_leaves_no_helper_running(tmp_path: Path) -> None:
    """The caller cancelled (a deadline, the kill switch) while the helper ran: it is
    killed, and kept to be reaped at a later start."""
    started = tmp_path / "started"
    os.mkfifo(started)
    stuck = tmp_path / "stuck-helper"
    stuck.write_text(f"#!/bin/sh\necho $$ > {started}\nexec sleep 600\n")
    stuck.chmod(0o700)
    starts = Starts()

    async def go() -> int:
        pidfd = os.pidfd_open(os.getpid())
        try:
            passing = asyncio.create_task(
                _startline.settle(str(stuck), pidfd, starts, last_pid=True, limits=())
            )
            pid = int(await asyncio.to_thread(started.read_text))
            passing.cancel()
            with pytest.raises(asyncio.CancelledError):
                await passing
            return pid
        finally:
            os.close(pidfd)

    pid = asyncio.run(go())
    ended = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    assert ended is not None
    assert (ended.si_code, ended.si_status) == (os.CLD_KILLED, signal.SIGKILL)
    assert [spawned.pid for spawned in starts._unreaped] == [pid]
    os.waitpid(pid, 0)


def test_a_sandbox_bubblewrap_could_not_build_says_what_bubblewrap_said(
    entry: str, tmp_path: Path
) -> None:
    """bubblewrap reports the sandbox's pid before it makes the mounts, so the last pid
    is set while it builds; a shared folder gone by then fails the build, and the call
    says so as bubblewrap did, not as the pid cap that found no sandbox to join."""
    gone = tmp_path / "gone"
    view = View(
        cwd="/",
        mounts=(Mount(str(gone), True),),
        env=environment.build({}, []),
        entry=entry,
    )
    with pytest.raises(SandboxUnavailableError, match="bubblewrap could not build the sandbox"):
        asyncio.run(run(["/usr/bin/true"], view, Limits(), pid_cap=PidCap()))
