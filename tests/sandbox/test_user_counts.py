"""Counts the kernel keeps per user, outside every namespace: what a sandbox of a
person's worker may take of them, seen by a program of the same user outside (real
bubblewrap, the entry helper, the filter; the worker run as a regular user)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox import _bwrap

PYTHON = "/usr/bin/python3"  # the system's: the sandbox only sees /usr, not the venv
USER = 4250  # a user of this file's own: no other test's descriptors in flight count

# In the sandbox: passes descriptors over its own socketpairs (253 a message, the
# kernel's most) and never reads them, until the kernel refuses; says how many are in
# flight through the FIFO `full`, then holds them until `go` is opened.
FILL_IN_FLIGHT = textwrap.dedent(
    """
    import array, errno, os, socket
    fds = array.array("i", [os.open("/dev/null", os.O_RDONLY)] * 253)
    pairs, sent, end = [], 0, None
    while True:
        if end is None:
            end, other = socket.socketpair()
            end.setblocking(False)
            pairs.append((end, other))
        try:
            end.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
            sent += 253
        except BlockingIOError:
            end = None
        except OSError as exc:
            why = errno.errorcode[exc.errno]
            break
    with open("full", "w") as said:
        said.write(f"{sent} {why}")
    open("go").close()
    """
)

# The worker, as the regular user: runs FILL_IN_FLIGHT with exec's default limits and,
# while the sandbox holds its descriptors in flight, passes one outside (as dbus,
# Wayland and systemd --user do) at the usual soft limit of 1,024 descriptors.
WORKER = textwrap.dedent(
    """
    import array, asyncio, errno, os, resource, socket, sys
    from pathlib import Path
    from sandbox import environment
    from sandbox.process import Limits, Mount, PidCap, View, run
    share, entry, program = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    os.mkfifo(share / "full")
    os.mkfifo(share / "go")
    view = View(cwd=str(share), mounts=(Mount(str(share), True),),
                env=environment.build({}, []), entry=entry)

    def pass_one():
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
        mine, theirs = socket.socketpair()
        try:
            mine.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0]))])
        except OSError as exc:
            return errno.errorcode[exc.errno]
        return "passed"

    async def main():
        sandbox = asyncio.ensure_future(
            run(["/usr/bin/python3", "-c", program], view, Limits(), pid_cap=PidCap())
        )
        full = asyncio.ensure_future(asyncio.to_thread((share / "full").read_text))
        await asyncio.wait([sandbox, full], return_when=asyncio.FIRST_COMPLETED)
        if not full.done():
            print("the sandbox ended first:", sandbox.result())
            os._exit(1)
        outside = pass_one()
        (share / "go").write_text("")
        done = await sandbox
        print(full.result(), outside, done.exit_code)

    asyncio.run(main())
    """
)


@pytest.fixture
def as_user() -> Iterator[tuple[Path, str]]:
    """A folder USER owns and the session's entry helper where USER may run it."""
    place = Path(tempfile.mkdtemp(prefix="aw-counts-", dir="/tmp"))
    place.chmod(0o755)
    share = place / "share"
    share.mkdir()
    os.chown(share, USER, USER)
    try:
        yield share, str(place / "entry")
    finally:
        shutil.rmtree(place)


def test_descriptors_a_sandbox_keeps_in_flight_leave_its_users_programs_room(
    as_user: tuple[Path, str], entry: str
) -> None:
    """The kernel counts descriptors in flight (SCM_RIGHTS) per user and refuses a
    program's next once the count passes its RLIMIT_NOFILE. A sandbox with 1,024 held
    1,265 in flight: every program of the person's at the usual 1,024 then got
    ETOOMANYREFS. The sandbox's own limit bounds what it can hold."""
    share, copy = as_user
    shutil.copy(entry, copy)
    os.chmod(copy, 0o755)  # noqa: S103 - USER must run it
    become = ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--clear-groups"]
    out = subprocess.run(
        [*become, PYTHON, "-c", WORKER, str(share), copy, FILL_IN_FLIGHT],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    in_flight, why, outside, exit_code = out.stdout.split()
    assert (why, exit_code) == ("ETOOMANYREFS", "0")
    assert int(in_flight) <= _bwrap.Limits().open_files + _bwrap.SCM_MAX_FD
    assert outside == "passed"
