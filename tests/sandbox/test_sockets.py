"""sandbox.sockets for real: what a sandbox's sockets hold in kernel buffers, summed
from outside through the sock_diag socket its entry helper sends (review7 finding 02)."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import textwrap
import time
from pathlib import Path

import pytest

from sandbox import environment
from sandbox.process import Limits, Mount, PidCap, View, run
from sandbox.sockets import SocketMemory, SocketsUnseenError, channel, probe

PYTHON = "/usr/bin/python3"  # the system's: the sandbox only sees /usr, not the venv

# Fills socketpairs (AF_UNIX stream), TCP connections over the sandbox's own loopback
# or both to EAGAIN, never reads them, prints what it queued, then waits for ever.
FILL = textwrap.dedent(
    """
    import os, socket, sys
    how, pairs = sys.argv[1], int(sys.argv[2])
    chunk, queued, kept = b"x" * 65536, 0, []
    def fill(a):
        global queued
        a.setblocking(False)
        while True:
            try:
                queued += a.send(chunk)
            except BlockingIOError:
                return
    if how == "unix":
        for _ in range(pairs):
            a, b = socket.socketpair()
            kept.append((a, b))
            fill(a)
    else:
        server = socket.create_server(("127.0.0.1", 0))
        for _ in range(pairs):
            a = socket.create_connection(server.getsockname())
            b, _ = server.accept()
            kept.append((a, b))
            fill(a)
    print(queued, flush=True)
    os.read(os.pipe()[0], 1)
    """
)


def view_of(share: Path, entry: str) -> View:
    return View(
        cwd=str(share),
        mounts=(Mount(str(share), True),),
        env=environment.build({}, []),
        entry=entry,
    )


async def _held(share: Path, entry: str, argv: list[str], least: int) -> int:
    """Runs `argv` in a sandbox until its sockets hold `least` bytes: what they held."""
    found: list[SocketMemory] = []
    task = asyncio.ensure_future(
        run(
            argv,
            view_of(share, entry),
            Limits(timeout_s=120),
            pid_cap=PidCap(),
            on_sockets=found.append,
        )
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert not task.done(), task.result()
            if found:
                held = await asyncio.to_thread(found[0].queued)
                if held >= least:
                    return held
            await asyncio.sleep(0.02)
        raise AssertionError(f"the sandbox's sockets never held {least} bytes")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


@pytest.mark.parametrize(
    ("how", "pairs", "least"), [("unix", 64, 64 * 200_000), ("tcp", 8, 8 * 1_000_000)]
)
def test_what_a_sandbox_queues_in_its_sockets_is_summed_from_outside(
    tmp_path: Path, entry: str, how: str, pairs: int, least: int
) -> None:
    """Each AF_UNIX pair holds about the system's default send buffer (208 KiB), a TCP
    connection what the kernel's autotuning let it grow to (no setsockopt): RLIMIT_AS
    counts none of it."""
    held = asyncio.run(_held(tmp_path, entry, [PYTHON, "-c", FILL, how, str(pairs)], least))
    assert held >= least


def test_a_sum_after_the_run_ended_touches_no_descriptor(tmp_path: Path, entry: str) -> None:
    async def go() -> tuple[int, SocketMemory]:
        found: list[SocketMemory] = []
        done = await run(
            [PYTHON, "-c", "import os, socket; a, b = socket.socketpair(); a.send(b'x'); print(1)"],
            view_of(tmp_path, entry),
            Limits(),
            pid_cap=PidCap(),
            on_sockets=found.append,
        )
        assert done.exit_code == 0, done
        return len(found), found[0]

    count, memory = asyncio.run(go())
    assert count == 1
    # The run closed its sockets (their numbers may be anyone's now): nothing is held.
    assert memory.queued() == 0


def test_anything_but_a_sock_diag_socket_is_refused_and_sums_fail_closed() -> None:
    """A channel that brings no sock_diag socket cannot be summed: the watch then stops
    the program rather than count nothing."""
    ours, theirs = channel()
    memory = SocketMemory(ours)
    with socket.socket(fileno=theirs) as entry_end:
        read, write = os.pipe()
        entry_end.sendmsg([b"n"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", read))])
        os.close(read)
        os.close(write)
    with pytest.raises(SocketsUnseenError, match="something else"):
        memory.queued()
    memory.close()


def test_a_channel_closed_before_it_sent_means_nothing_ran() -> None:
    ours, theirs = channel()
    memory = SocketMemory(ours)
    assert memory.queued() == 0  # not sent yet: the program has not started
    os.close(theirs)  # the entry failed before it sent: the program never ran
    assert memory.queued() == 0
    memory.close()


def test_this_kernel_lists_every_family_summed() -> None:
    assert probe() == ""


def test_the_entry_makes_its_sock_diag_socket_and_the_program_none(
    tmp_path: Path, entry: str
) -> None:
    """The filter lets the entry helper's socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC,
    NETLINK_SOCK_DIAG) through; the helper then adds a filter that refuses every netlink
    socket, so the program makes none the sum cannot see (review9 finding 03), not even
    the one the helper made."""
    code = textwrap.dedent(
        """
        import errno, socket
        for protocol in (4, 0):  # NETLINK_SOCK_DIAG as the helper asks, NETLINK_ROUTE
            try:
                socket.socket(16, socket.SOCK_RAW | socket.SOCK_CLOEXEC, protocol)
                print("ok")
            except OSError as exc:
                print(errno.errorcode[exc.errno])
        """
    )

    async def go() -> tuple[str, int]:
        found: list[SocketMemory] = []
        done = await run(
            [PYTHON, "-c", code],
            view_of(tmp_path, entry),
            Limits(),
            pid_cap=PidCap(),
            on_sockets=found.append,
        )
        assert done.exit_code == 0, done
        assert len(found) == 1
        return done.stdout.decode(), found[0].queued()

    said, held = asyncio.run(go())
    assert said.split() == ["EAFNOSUPPORT", "EAFNOSUPPORT"]
    assert held == 0  # the helper's socket came out and sums
