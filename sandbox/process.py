"""Run one program in a sandbox: argv only, capped output, and a kill that always lands.

`run` starts bubblewrap (see sandbox._bwrap for what the sandbox sees), waits
until the sandbox exists, caps its processes, then lets the program start. It
reads stdout and stderr together up to `Limits.output_bytes`, then keeps
draining and discarding so a chatty program never blocks on a full pipe. On the
timeout, or when the calling task is cancelled (a deadline, a Cancel, a plan's
kill switch), it SIGKILLs the sandbox's first process: the kernel then kills
every process in the sandbox's pid namespace, including setsid'd, double-forked
and SIGTERM-ignoring ones. The bubblewrap process's own group is killed too.
After the program exits, the pipes get `Limits.drain_s` to close, never longer.

Nothing here uses preexec_fn (unsafe with threads): limits are set by prlimit
inside the sandbox and the new session by subprocess itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from sandbox import _pidcap, _seccomp
from sandbox._bwrap import (
    Limits,
    Mount,
    PrivateDir,
    SandboxUnavailableError,
    Tools,
    View,
    command,
    find_tools,
    private_files,
    visible_by_default,
)

__all__ = [
    "Completed",
    "Limits",
    "Mount",
    "PrivateDir",
    "SandboxUnavailableError",
    "View",
    "run",
    "visible_by_default",
]

STDOUT, STDERR = 1, 2
EXIT_GRACE_S: Final = 5.0  # after SIGKILL, how long to wait for the exit to be reaped


@dataclass(frozen=True)
class Completed:
    exit_code: int | None  # None when the program was killed by a signal
    signal: int | None  # the terminating signal's number, if any
    stdout: bytes
    stderr: bytes
    truncated: bool  # output beyond Limits.output_bytes was discarded
    timed_out: bool
    duration_s: float


class _Capture(asyncio.SubprocessProtocol):
    """Collects stdout and stderr under one byte budget; discards the rest."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.output = {STDOUT: bytearray(), STDERR: bytearray()}
        self.truncated = False
        self.open_pipes = {STDOUT, STDERR}
        self.pipes_closed = asyncio.Event()
        self.exited = asyncio.Event()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        take = min(len(data), self.budget)
        if take:
            self.output[fd] += data[:take]
            self.budget -= take
        if take < len(data):
            self.truncated = True

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self.open_pipes.discard(fd)
        if not self.open_pipes:
            self.pipes_closed.set()

    def process_exited(self) -> None:
        self.exited.set()


async def run(
    argv: Sequence[str], view: View, limits: Limits, stdin: bytes | None = None
) -> Completed:
    """Run `argv` (argv[0] an absolute path) in a fresh sandbox; see the module doc."""
    tools = find_tools(view.bwrap)
    info_r, info_w = os.pipe()
    block_r, block_w = os.pipe()
    file_fds = [_memory_file(content) for content in private_files(view.private)]
    rules = _seccomp.filter_for_machine() if view.seccomp else None
    if rules is not None:
        file_fds.append(_memory_file(rules))
    started = time.monotonic()
    loop = asyncio.get_running_loop()
    try:
        try:
            transport, capture = await loop.subprocess_exec(
                lambda: _Capture(limits.output_bytes),
                *command(
                    tools,
                    argv,
                    view,
                    limits,
                    info_fd=info_w,
                    block_fd=block_r,
                    file_fds=file_fds[: len(file_fds) - (rules is not None)],
                    seccomp_fd=file_fds[-1] if rules is not None else None,
                ),
                stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=dict(view.env),
                cwd="/",
                pass_fds=(info_w, block_r, *file_fds),
                start_new_session=True,
            )
        except OSError as exc:
            raise SandboxUnavailableError(f"bubblewrap could not be started: {exc}") from exc
        finally:
            for fd in (info_w, block_r, *file_fds):
                os.close(fd)
        sandbox = _Sandbox(transport, capture)
        try:
            return await sandbox.drive(tools, limits, info_r, block_w, stdin, started)
        finally:
            sandbox.kill()
            transport.close()
    finally:
        for fd in (info_r, block_w):
            with contextlib.suppress(OSError):
                os.close(fd)


class _Sandbox:
    """One running sandbox: its transport, its output, and how to kill all of it."""

    def __init__(self, transport: asyncio.SubprocessTransport, capture: _Capture) -> None:
        self.transport = transport
        self.capture = capture
        self.pidfd: int | None = None  # the sandbox's first process (its pid 1)

    async def drive(
        self,
        tools: Tools,
        limits: Limits,
        info_r: int,
        block_w: int,
        stdin: bytes | None,
        started: float,
    ) -> Completed:
        try:
            init_pid = await _child_pid(info_r)
            if init_pid is None:
                await self._wait_exit(EXIT_GRACE_S)
                raise SandboxUnavailableError(self._bwrap_complaint())
            with contextlib.suppress(ProcessLookupError):
                self.pidfd = os.pidfd_open(init_pid)
            if self.pidfd is not None and _pidcap.needed():
                await _pidcap.cap_processes(tools, init_pid, limits.processes)
            with contextlib.suppress(BrokenPipeError):  # it already failed: the exit says why
                os.write(block_w, b"go")
            if stdin:
                pipe = self.transport.get_pipe_transport(0)
                if isinstance(pipe, asyncio.WriteTransport):
                    pipe.write(stdin)
                    pipe.write_eof()
            remaining = limits.timeout_s - (time.monotonic() - started)
            timed_out = not await self._wait_exit(max(0.0, remaining))
            if timed_out:
                self.kill()
                await self._wait_exit(EXIT_GRACE_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.capture.pipes_closed.wait(), limits.drain_s)
        except BaseException:
            self.kill()
            with contextlib.suppress(TimeoutError):  # reap it before the caller moves on
                await asyncio.wait_for(self.capture.exited.wait(), EXIT_GRACE_S)
            raise
        return self._completed(timed_out, time.monotonic() - started)

    def kill(self) -> None:
        """SIGKILL the sandbox's pid 1 (so the kernel kills every process in it) and
        bubblewrap's own process group. Safe to call more than once."""
        if self.pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            os.close(self.pidfd)
            self.pidfd = None
        if self.transport.get_returncode() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.transport.get_pid(), signal.SIGKILL)

    async def _wait_exit(self, within_s: float) -> bool:
        try:
            await asyncio.wait_for(self.capture.exited.wait(), within_s)
        except TimeoutError:
            return False
        return True

    def _completed(self, timed_out: bool, duration: float) -> Completed:
        code = self.transport.get_returncode()
        stderr = bytes(self.capture.output[STDERR])
        stdout = bytes(self.capture.output[STDOUT])
        if code == 1 and not stdout and stderr.startswith(b"bwrap: "):
            raise SandboxUnavailableError(self._bwrap_complaint())
        number = _signal_of(code)
        return Completed(
            exit_code=None if number is not None else code,
            signal=number,
            stdout=stdout,
            stderr=stderr,
            truncated=self.capture.truncated,
            timed_out=timed_out,
            duration_s=duration,
        )

    def _bwrap_complaint(self) -> str:
        said = self.capture.output[STDERR].decode(errors="replace").strip()[:400]
        if any(sign in said for sign in _NAMESPACE_SIGNS) or not said:
            return (
                f"bubblewrap could not build the sandbox ({said or 'no message'}). It needs "
                "unprivileged user namespaces (kernel.unprivileged_userns_clone=1, or "
                "AppArmor's userns restriction lifted for bwrap)."
            )
        return (
            f"bubblewrap could not build the sandbox ({said}). A shared folder or a file in "
            "it may have been moved or replaced while the sandbox was being set up; try again."
        )


# What bubblewrap says when user namespaces are what it lacks.
_NAMESPACE_SIGNS: Final = (
    "namespace",
    "uid map",
    "uid_map",
    "setgroups",
    "Operation not permitted",
    "No permissions",
)


def _memory_file(content: bytes) -> int:
    """A descriptor reading `content` from its start: a file in memory, on no file system
    anyone else can name."""
    fd = os.memfd_create("agentworker-private", os.MFD_CLOEXEC)
    try:
        view = memoryview(content)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _signal_of(code: int | None) -> int | None:
    """A killed program's signal: bubblewrap reports it as 128+N, as a shell does;
    bubblewrap itself killed shows as a negative return code."""
    if code is None:
        return None
    if code < 0:
        return -code
    if 128 < code <= 128 + 64:
        return code - 128
    return None


async def _child_pid(info_r: int) -> int | None:
    """The sandbox's first pid, from bubblewrap's --info-fd (None if it never started)."""
    raw = await _read_to_eof(info_r)
    try:
        pid = json.loads(raw or b"{}").get("child-pid")
    except ValueError:
        return None
    return pid if isinstance(pid, int) and pid > 0 else None


async def _read_to_eof(fd: int) -> bytes:
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    done: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        if data:
            chunks.append(data)
        elif not done.done():
            done.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await done
    finally:
        loop.remove_reader(fd)
    return b"".join(chunks)
