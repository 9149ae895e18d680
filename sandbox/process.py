"""Run one program in a sandbox: argv only, capped output, and a kill that always lands.

`run` starts bubblewrap (see sandbox._bwrap for what the sandbox sees). With the
entry helper (`View.entry`) the sandbox's first process sets the limits, caps
processes and applies Landlock itself, then becomes the program; bubblewrap first
holds the sandbox at its start line (--block-fd) while the same helper, run outside,
writes the sandbox's share of its user's inotify instances and watches in its user
namespace and, for a root worker, sets its last pid (sandbox._startline). Without
it, `prlimit` sets the limits and, for a root worker, the sandbox is held while
sandbox._pidcap caps its processes from outside; its user's inotify instances are not
shared out then (`agentworker doctor` says so).

It reads stdout and stderr together up to `Limits.output_bytes`, then keeps
draining and discarding so a chatty program never blocks on a full pipe. The
child is watched through a pidfd on the event loop: no thread per child, and
nothing here blocks the loop for longer than a fork. On the timeout, or when the
calling task is cancelled (a deadline, a Cancel, a plan's kill switch), it
SIGKILLs the sandbox's first process: the kernel then kills every process in the
sandbox's pid namespace, including setsid'd, double-forked and SIGTERM-ignoring
ones. bubblewrap is killed too. After the program exits, the pipes get
`Limits.drain_s` to close, never longer.

When the worker itself dies (SIGKILL, a crash), bubblewrap's --die-with-parent
kills bubblewrap, and with it the sandbox's first process (its parent-death signal
is armed before the program starts). The one gap that chain leaves, a worker
dying while bubblewrap is still building the sandbox, is closed by the lifeline:
a pipe whose write end only the worker holds; the entry helper checks it after
its own parent-death signal is armed, and exits if the worker is gone.

With a plan's cgroup (`cgroup`, sandbox mode where cgroups apply, see
sandbox.cgroups), bubblewrap holds the sandbox at its start line (--block-fd)
until the worker has moved the sandbox's first process into the cgroup: every
process of the program starts inside it, none can fork outside. A failed move
kills the sandbox before anything in it ran.

Nothing here uses preexec_fn (unsafe with threads): limits are set inside the sandbox,
and bubblewrap gives the program a session of its own (--new-session: no controlling
terminal). bubblewrap is started by os.posix_spawn where the entry helper closes what
it inherits, else by subprocess's vfork path with close_fds (sandbox._spawn). bubblewrap
itself gets a process group of its own, so the signals a terminal sends the worker's
group (Ctrl+C) miss it, but stays in the worker's session: with the kernel's
autogroups a new session is a new scheduling group, and one made for bubblewrap at
every exec waited for a CPU behind everything else on a busy machine (6-11 ms an exec
at load 15-17).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import struct
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Final, Protocol

from sandbox import _entry, _pidcap, _seccomp, _startline, sockets
from sandbox._bwrap import (
    Limits,
    Mount,
    PrivateDir,
    SandboxUnavailableError,
    Tools,
    View,
    call_words,
    command,
    find_tools,
    private_files,
    visible_by_default,
)
from sandbox._pidcap import PidCap
from sandbox._spawn import Spawned, Starts
from sandbox.cgroups import PlanGroup
from sandbox.held import Pin
from sandbox.warm import WarmSandboxes

__all__ = [
    "Completed",
    "Limits",
    "Mount",
    "PidCap",
    "PrivateDir",
    "SandboxUnavailableError",
    "View",
    "run",
    "visible_by_default",
]

EXIT_GRACE_S: Final = 5.0  # after SIGKILL, how long to wait for the exit to be reaped
# Reads of the output pipes: at least this much (a chatty program's discarded rest)...
READ_MIN: Final = 64 * 1024
# ...and at most this much, as far as the output budget goes: the whole of it, should
# the program have written it all before the loop came round.
READ_MAX: Final = 1024 * 1024
SMALL_READ: Final = 4096  # reads shorter than this are gathered, not kept one by one
# Moves of a sandbox into its plan's cgroup run here, not in the caller's default pool.
# The program waits at its start line until the move is done, so a run stopped
# meanwhile ran nothing; a pool that counts a call's thread work as work that may yet
# take effect (the worker's) would otherwise answer such a stop as an unknown outcome.
_JOINING: Final = ThreadPoolExecutor(2, thread_name_prefix="sandbox-cgroup-join")


class Hasher(Protocol):
    """What `run(hash_output=...)` makes: a hash fed the output as it is read."""

    def update(self, data: bytes | bytearray, /) -> object: ...

    def digest(self) -> bytes: ...


@dataclass(frozen=True)
class Completed:
    exit_code: int | None  # None when the program was killed by a signal
    signal: int | None  # the terminating signal's number, if any
    stdout: bytes
    stderr: bytes
    truncated: bool  # output beyond Limits.output_bytes was discarded
    timed_out: bool
    duration_s: float
    # With `run(hash_output=...)`: the digest of stdout followed by stderr (what was
    # kept), stdout hashed as it was read, while the program ran.
    output_digest: bytes | None = None


class _Child:
    """bubblewrap's process, watched through a pidfd on the event loop: no thread per
    child, no blocking. Collects stdout and stderr under one byte budget (the rest is
    read and discarded, so a chatty program never blocks on a full pipe) and feeds
    stdin without ever waiting on it."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes] | Spawned,
        out: int,
        err: int,
        budget: int,
        starts: Starts,
        hasher: Hasher | None = None,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.popen = popen
        self.starts = starts
        self.budget = budget
        # What was kept, as read; small reads are gathered into one bytearray, so a
        # program writing a byte at a time costs its bytes, not an object per byte.
        self.output: dict[int, list[bytes | bytearray]] = {out: [], err: []}
        self.stdout, self.stderr = out, err
        self.truncated = False
        # Fed stdout as it is kept (stderr at the end: see `digest`), so hashing the
        # output costs nothing once the program has exited.
        self.hasher = hasher
        self.open_pipes: set[int] = set()
        self.feeding: set[int] = set()  # descriptors still being written (stdin, a call)
        self._waiter: asyncio.Future[None] | None = None  # see `until`
        self.pidfd = os.pidfd_open(popen.pid)
        self.loop.add_reader(self.pidfd, self._reap)
        for fd in (out, err):
            os.set_blocking(fd, False)
            self.open_pipes.add(fd)
            self.loop.add_reader(fd, self._readable, fd)

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def exited(self) -> bool:
        return self.popen.returncode is not None

    def pipes_closed(self) -> bool:
        return not self.open_pipes

    async def until(self, ready: Callable[[], bool], within_s: float) -> bool:
        """Wait until `ready()` holds (True) or `within_s` has passed (False). It is
        checked again whenever the child exits or a pipe closes: one future woken by
        the readers, no task or Event per wait, so each event costs one loop turn."""
        if ready():
            return True
        expired = False

        def expire() -> None:
            nonlocal expired
            expired = True
            self._changed()

        timer = self.loop.call_later(max(0.0, within_s), expire)
        try:
            while not ready():
                if expired:
                    return False
                self._waiter = self.loop.create_future()
                await self._waiter
        finally:
            timer.cancel()
            self._waiter = None
        return True

    def _changed(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def signal(self, number: int) -> None:
        if self.pidfd >= 0 and self.popen.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.pidfd, number)

    def feed(self, data: bytes, fd: int) -> None:
        """Write `data` to `fd` (the program's stdin, or a waiting sandbox's call) as it
        drains, then close it."""
        os.set_blocking(fd, False)
        view = memoryview(data)

        def writable() -> None:
            nonlocal view
            try:
                view = view[os.write(fd, view[:65536]) :]
            except BlockingIOError:
                return
            except OSError:  # the program closed its stdin: the rest is not wanted
                view = view[:0]
            if not view:
                self.loop.remove_writer(fd)
                os.close(fd)
                self.feeding.discard(fd)

        self.feeding.add(fd)
        writable()  # a pipe with room takes it all now: no loop turn
        if fd in self.feeding:
            self.loop.add_writer(fd, writable)

    def _readable(self, fd: int) -> None:
        try:
            data = os.read(fd, min(max(self.budget, READ_MIN), READ_MAX))
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.loop.remove_reader(fd)
            os.close(fd)
            self.open_pipes.discard(fd)
            if not self.open_pipes:
                self._changed()
            return
        take = min(len(data), self.budget)
        if take:
            kept = data[:take] if take < len(data) else data
            chunks = self.output[fd]
            if take >= SMALL_READ:
                chunks.append(kept)
            elif chunks and isinstance(chunks[-1], bytearray):
                chunks[-1] += kept
            else:
                chunks.append(bytearray(kept))
            if fd == self.stdout and self.hasher is not None:
                self.hasher.update(kept)
            self.budget -= take
        if take < len(data):
            self.truncated = True

    def _reap(self) -> None:
        if self.popen.poll() is not None:
            self.loop.remove_reader(self.pidfd)
            os.close(self.pidfd)
            self.pidfd = -1
            self._changed()

    def digest(self, stderr: bytes) -> bytes | None:
        """The hash of what was kept of stdout, then `stderr` (the kept stderr)."""
        if self.hasher is None:
            return None
        if stderr:
            self.hasher.update(stderr)
        return self.hasher.digest()

    def collected(self, fd: int) -> bytes:
        """What was kept of `fd`'s output (one copy at most: none for a single read)."""
        return b"".join(self.output[fd])

    def close(self) -> None:
        """Stop watching; close what is still open (after the child was killed)."""
        for fd in list(self.open_pipes):
            self.loop.remove_reader(fd)
            os.close(fd)
        self.open_pipes.clear()
        for fd in list(self.feeding):
            self.loop.remove_writer(fd)
            os.close(fd)
        self.feeding.clear()
        if self.pidfd >= 0:
            self.loop.remove_reader(self.pidfd)
            os.close(self.pidfd)
            self.pidfd = -1
        if isinstance(self.popen, Spawned) and self.popen.poll() is None:
            self.starts.not_reaped(self.popen)


async def run(
    argv: Sequence[str],
    view: View,
    limits: Limits,
    stdin: bytes | None = None,
    *,
    pid_cap: PidCap,
    cgroup: PlanGroup | None = None,
    starts: Starts | None = None,
    on_start: Callable[[int], None] | None = None,
    on_sockets: Callable[[sockets.SocketMemory], None] | None = None,
    hash_output: Callable[[], Hasher] | None = None,
    claim: Callable[[], None] | None = None,
    warm: WarmSandboxes | None = None,
    warm_for: str = "",
    pins: Sequence[Pin] = (),
) -> Completed:
    """Run `argv` (argv[0] an absolute path) in a fresh sandbox; see the module doc.
    `pid_cap` is the caller's (one per worker): it remembers the machine's pid_max
    across sandboxes and latches a refusal should capping ever misbehave. With
    `cgroup`, the sandbox joins it before anything in it runs (CgroupError, and
    nothing ran, when it cannot). `starts`, the caller's too (a worker's
    `Containment` holds one), says how bubblewrap is started (sandbox._spawn); a
    fresh one when none is given. `on_start` is told bubblewrap's pid once it started
    (every process of the sandbox descends from it). `on_sockets` (with the entry
    helper only) is told, once bubblewrap started, how to sum what the sandbox's
    sockets hold in kernel buffers (sandbox.sockets), valid until the run ends.
    `hash_output` makes a hash that is fed the kept stdout as it is read, then the
    kept stderr: its digest is `Completed.output_digest`.

    `claim` is called once before anything of the program can run; should it raise,
    nothing of it ran and its exception is raised. With the entry helper it is called
    while bubblewrap builds the sandbox (held at its start line, --block-fd, let go
    only once `claim` returned), so its work costs the call nothing: a worker that
    dies meanwhile lets the sandbox go on, but the entry then finds its lifeline
    closed and exits before the program starts. Without the entry there is no such
    check, and `claim` is called before bubblewrap starts.

    With `warm` (the caller's, one per worker; the entry helper, no cgroup, no
    `on_sockets`) the sandbox may be one built ahead for plan `warm_for`, exactly as
    this call's would be (sandbox.warm): `claim` is then called before the call is
    sent to it, and nothing of the program runs before. Either way, once the program
    has run, the plan's next sandbox is built ahead.

    `pins`: places bound onto themselves over the view (sandbox.held: the places an
    asked program holds, read-only); the caller keeps and closes their descriptors. A
    sandbox with pins is never one built ahead."""
    starts = starts or Starts()
    built_ahead = cgroup is None and on_sockets is None and not pins and view.uid is None
    if warm is not None and view.entry is not None and built_ahead:
        words = _call_message(argv, view)
        if words is not None:
            return await _run_warm(
                words,
                view,
                limits,
                stdin,
                pid_cap=pid_cap,
                starts=starts,
                on_start=on_start,
                hash_output=hash_output,
                claim=claim,
                warm=warm,
                plan=warm_for,
            )
    tools = find_tools(view.bwrap)
    capped = _pidcap.needed()
    if capped:
        pid_cap.check_kernel()
    entry = view.entry is not None
    # Its share of its user's per-user counts, written in its user namespace from
    # outside while it is held (sandbox._startline): with the entry helper only.
    user_limits = _startline.user_limits() if entry else ()
    if claim is not None and not entry:
        claim()  # no lifeline to stop a program held for it (see the doc)
        claim = None
    # pid 1 must be known before the sandbox goes on (see below).
    report_first = not entry or cgroup is not None or capped or bool(user_limits)
    ours: list[int] = []  # descriptors this process keeps
    theirs: list[int] = []  # descriptors only bubblewrap keeps: closed here once it started
    memory: sockets.SocketMemory | None = None
    try:
        info_r, info_w = _pipe(ours, theirs)
        lifeline_r: int | None = None
        lifeline_w: int | None = None
        block_r: int | None = None
        block_w: int | None = None
        diag_fd: int | None = None
        if entry:
            lifeline_r, lifeline_w = _pipe(theirs, ours)
            if on_sockets is not None:
                our_end, diag_fd = sockets.channel()
                memory = sockets.SocketMemory(our_end)
                theirs.append(diag_fd)
        if report_first or claim is not None:
            # Held at its start line until its report is read: without the entry (which
            # closes every other descriptor) the program inherits the report's pipe, and
            # one that read it first would make a call that ran look as if it never
            # started (see _Sandbox.drive). With the entry, held until its user limits
            # are written and, for a root worker, its last pid set from outside
            # (sandbox._startline); a plan's until it joined; one with a `claim` until
            # that returned.
            block_r, block_w = _pipe(theirs, ours)
        file_fds, seccomp_fd = _view_files(view, theirs, diag=diag_fd is not None)
        pinned = []
        for pin in pins:  # bubblewrap's copies, closed here once it started
            theirs.append(os.dup(pin.fd))
            pinned.append((theirs[-1], pin.inside, pin.on_the_way))
        line = command(
            tools,
            argv,
            view,
            limits,
            info_fd=info_w,
            block_fd=block_r,
            file_fds=file_fds,
            seccomp_fd=seccomp_fd,
            lifeline_fd=lifeline_r,
            pid_cap=_pidcap.cap_for(limits.processes) if capped and entry else None,
            diag_fd=diag_fd,
            pins=pinned,
        )
        out_r, out_w = _pipe(ours, theirs)
        _widen(out_w, limits.output_bytes)
        err_r, err_w = _pipe(ours, theirs)
        in_r, in_w = _pipe(theirs, ours) if stdin else (subprocess.DEVNULL, -1)
        started = time.monotonic()
        popen = _start(starts, line, view, (in_r, out_w, err_w), info_r, theirs, closes_all=entry)
        for owned in (out_r, err_r, in_w, lifeline_w, block_w):
            if owned in ours:
                ours.remove(owned)  # the child watcher and the sandbox own these now
        child = _Child(
            popen,
            out_r,
            err_r,
            limits.output_bytes,
            starts,
            hash_output() if hash_output is not None else None,
        )
        if isinstance(popen, Spawned):
            child.loop.call_soon(starts.check)  # while it runs
        if stdin:
            child.feed(stdin, in_w)
        sandbox = _Sandbox(child, info_r, lifeline_w, block_w)
        try:
            if on_start is not None:
                on_start(popen.pid)
            if on_sockets is not None and memory is not None:
                on_sockets(memory)
            return await sandbox.drive(
                tools,
                limits,
                started,
                pid_cap if capped and not entry else None,
                cgroup,
                view.entry if capped or user_limits else None,
                last_pid=capped,
                user_limits=user_limits,
                claim=claim,
                report_first=report_first,
            )
        finally:
            sandbox.kill()
            sandbox.stop_watching()
            child.close()
            if capped and entry:
                pid_cap.check_machine()
    finally:
        sockets.close_quietly(memory)
        for fd in (*ours, *theirs):
            with contextlib.suppress(OSError):
                os.close(fd)


# The longest call a sandbox built ahead is sent (entry.c's CALL_MOST), and the most
# strings in it with the entry's own line (its WORDS_MOST, less room for that line).
CALL_MOST: Final = 64 * 1024
CALL_WORDS_MOST: Final = 8192 - 256


def _call_message(argv: Sequence[str], view: View) -> bytes | None:
    """What a sandbox built ahead is sent for this call (sandbox/entry.c, -W): its
    length, then its words, each ended by a NUL. None when it would be too long: the
    call then builds its sandbox with its argv on bubblewrap's line, as before."""
    words = call_words(argv, view)
    if len(words) > CALL_WORDS_MOST:
        return None
    try:
        encoded = [os.fsencode(word) for word in words]
    except UnicodeError:
        return None
    if any(b"\0" in word for word in encoded):
        return None
    body = b"\0".join(encoded) + b"\0"
    if len(body) > CALL_MOST:
        return None
    return struct.pack("<I", len(body)) + body


# Where the bubblewrap line names a file or folder it binds: the name after each.
_BINDS: Final = frozenset({"--ro-bind", "--bind", "--ro-bind-try", "--dev-bind"})


@dataclass(frozen=True)
class _Shape:
    """All a sandbox is built from but its call's own words (argv, folder, environment):
    two calls of one shape get the very same sandbox. `line` is bubblewrap's whole line
    for it, every descriptor's number left out (what the view makes of the file system
    now: which hidden places exist, the folders pinned), and `files` the (device,
    inode) behind each name it binds, None for one absent: a name that now leads
    elsewhere makes another shape."""

    view: View
    limits: Limits
    stdin: bool
    capped: bool
    tools: Tools
    line: tuple[str, ...]
    files: tuple[tuple[int, int] | None, ...]

    @classmethod
    def of(cls, tools: Tools, view: View, limits: Limits, stdin: bool, capped: bool) -> _Shape:
        view = replace(view, cwd="/", env={})
        limits = replace(limits, timeout_s=0.0)  # counted from the call's start, outside
        files = [0] * len(private_files(view.private))
        line = command(
            tools,
            (),
            view,
            limits,
            info_fd=0,
            block_fd=0,
            file_fds=files,
            seccomp_fd=0 if view.seccomp else None,
            lifeline_fd=0,
            pid_cap=_pidcap.cap_for(limits.processes) if capped else None,
            wait_fd=0,
        )
        return cls(view, limits, stdin, capped, tools, tuple(line), _identities(line))

    def as_now(self) -> _Shape:
        """This shape with what its bound names lead to now."""
        return replace(self, files=_identities(self.line))


def _identities(line: Sequence[str]) -> tuple[tuple[int, int] | None, ...]:
    """The (device, inode) behind each name `line` binds, None for one absent."""
    found: list[tuple[int, int] | None] = []
    for name in (line[at + 1] for at, arg in enumerate(line[:-1]) if arg in _BINDS):
        try:
            st = os.stat(name)
        except OSError:
            found.append(None)
        else:
            found.append((st.st_dev, st.st_ino))
    return tuple(found)


class _Prepared:
    """A sandbox built and waiting for its call: bubblewrap let go from its start line
    (its report read, its limits written), its entry helper reading the call's pipe."""

    def __init__(
        self,
        shape: _Shape,
        child: _Child,
        sandbox: _Sandbox,
        call_w: int,
        in_w: int,
        ours: list[int],
        pid_cap: PidCap,
    ) -> None:
        self.shape = shape
        self.child = child
        self.sandbox = sandbox
        self.call_w = call_w
        self.in_w = in_w
        self.ours = ours  # descriptors this process keeps (its report's pipe)
        self.pid_cap = pid_cap
        self.done = False

    @property
    def pid(self) -> int | None:
        """Its first process (the entry helper, waiting), as this process sees it."""
        return self.sandbox.init_pid

    def alive(self) -> bool:
        """Still waiting: neither it nor bubblewrap ended (a failed build exits)."""
        return not self.done and not self.child.exited() and self.sandbox.pidfd is not None

    async def go(
        self,
        words: bytes,
        stdin: bytes | None,
        limits: Limits,
        hash_output: Callable[[], Hasher] | None,
        on_start: Callable[[int], None] | None,
    ) -> Completed:
        """Send the call and see it through; the sandbox is let go of either way."""
        child, sandbox = self.child, self.sandbox
        try:
            if hash_output is not None:
                child.hasher = hash_output()
            started = time.monotonic()
            call_w, self.call_w = self.call_w, -1
            child.feed(words, call_w)  # all of it now, into an empty pipe
            if stdin:
                in_w, self.in_w = self.in_w, -1
                child.feed(stdin, in_w)
            if on_start is not None:
                on_start(child.popen.pid)
            try:
                timed_out = await sandbox.finish(limits, started)
            except BaseException:
                sandbox.kill()
                await child.until(child.exited, EXIT_GRACE_S)
                raise
            return sandbox._completed(timed_out, time.monotonic() - started)
        finally:
            self.kill()
            if self.shape.capped:  # the entry capped it once the call came
                self.pid_cap.check_machine()

    def kill(self) -> None:
        """Kill it (never waits; safe to call more than once) and close what it held."""
        if self.done:
            return
        self.done = True
        self.sandbox.kill()
        self.sandbox.stop_watching()
        self.child.close()
        for fd in (self.call_w, self.in_w, *self.ours):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.call_w = self.in_w = -1
        self.ours.clear()

    async def discard(self) -> None:
        """Kill it and wait until it is reaped: its first process is killed, bubblewrap
        reaps it and exits (killed too should it not within EXIT_GRACE_S), and is
        reaped here."""
        if self.done:
            return
        try:
            if self.sandbox.pidfd is not None:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(self.sandbox.pidfd, signal.SIGKILL)
            else:
                self.sandbox.kill()
            await self.child.until(self.child.exited, EXIT_GRACE_S)
        finally:
            self.kill()


@contextlib.asynccontextmanager
async def starting_within(within_s: float) -> AsyncIterator[None]:
    """A sandbox's start (`_Sandbox.hold`) within `within_s`, the call's timeout: a start
    that never comes (bubblewrap, or a helper, waiting on something that does not
    happen) fails the call, which nothing bounded before its program ran."""
    try:
        async with asyncio.timeout(within_s) as bound:
            yield
    except TimeoutError:
        if not bound.expired():
            raise
        raise SandboxUnavailableError(
            f"the sandbox did not start within the call's timeout ({within_s:g} s): "
            "bubblewrap never said it was ready, or its limits were not set in time; "
            "nothing of the call ran"
        ) from None


async def _prepare(
    shape: _Shape,
    pid_cap: PidCap,
    starts: Starts,
    claim: Callable[[], None] | None = None,
    *,
    within_s: float,
) -> _Prepared:
    """Start bubblewrap for a sandbox of `shape` whose entry waits for its call, and see
    it through its start line within `within_s` (`claim` called while it is held
    there). A shape's limits have no timeout: the call's is counted from its start."""
    view, limits, tools = shape.view, shape.limits, shape.tools
    user_limits = _startline.user_limits()
    ours: list[int] = []
    theirs: list[int] = []
    prepared: _Prepared | None = None
    try:
        info_r, info_w = _pipe(ours, theirs)
        lifeline_r, lifeline_w = _pipe(theirs, ours)
        call_r, call_w = _pipe(theirs, ours)
        block_r, block_w = _pipe(theirs, ours)
        file_fds, seccomp_fd = _view_files(view, theirs, diag=False)
        line = command(
            tools,
            (),
            view,
            limits,
            info_fd=info_w,
            block_fd=block_r,
            file_fds=file_fds,
            seccomp_fd=seccomp_fd,
            lifeline_fd=lifeline_r,
            pid_cap=_pidcap.cap_for(limits.processes) if shape.capped else None,
            wait_fd=call_r,
        )
        out_r, out_w = _pipe(ours, theirs)
        _widen(out_w, limits.output_bytes)
        err_r, err_w = _pipe(ours, theirs)
        in_r, in_w = _pipe(theirs, ours) if shape.stdin else (subprocess.DEVNULL, -1)
        popen = _start(starts, line, view, (in_r, out_w, err_w), info_r, theirs, closes_all=True)
        for owned in (out_r, err_r, in_w, lifeline_w, block_w, call_w):
            if owned in ours:
                ours.remove(owned)  # the child watcher, the sandbox and the call own these
        child = _Child(popen, out_r, err_r, limits.output_bytes, starts)
        if isinstance(popen, Spawned):
            child.loop.call_soon(starts.check)
        sandbox = _Sandbox(child, info_r, lifeline_w, block_w)
        prepared = _Prepared(shape, child, sandbox, call_w, in_w, ours, pid_cap)
        ours = []  # the prepared sandbox's now
        async with starting_within(within_s):
            await sandbox.hold(
                tools,
                limits,
                None,
                None,
                view.entry if shape.capped or user_limits else None,
                last_pid=shape.capped,
                user_limits=user_limits,
                claim=claim,
            )
        sandbox.release()
    except BaseException:
        if prepared is not None:
            prepared.sandbox.kill()
            with contextlib.suppress(BaseException):
                await prepared.child.until(prepared.child.exited, EXIT_GRACE_S)
            prepared.kill()
        raise
    finally:
        for fd in (*ours, *theirs):
            with contextlib.suppress(OSError):
                os.close(fd)
    return prepared


async def _run_warm(
    words: bytes,
    view: View,
    limits: Limits,
    stdin: bytes | None,
    *,
    pid_cap: PidCap,
    starts: Starts,
    on_start: Callable[[int], None] | None,
    hash_output: Callable[[], Hasher] | None,
    claim: Callable[[], None] | None,
    warm: WarmSandboxes,
    plan: str,
) -> Completed:
    """`run` in a sandbox whose entry waits for its call: the one built ahead for
    `plan` if it has this call's shape, else one built now (claimed while held at its
    start line, as `run` does); then the plan's next one is built ahead."""
    tools = find_tools(view.bwrap)
    capped = _pidcap.needed()
    if capped:
        pid_cap.check_kernel()
    shape = _Shape.of(tools, view, limits, bool(stdin), capped)
    prepared = await _taken(warm, plan, shape)
    if prepared is not None:
        if claim is not None:
            try:
                claim()  # before the call is sent: nothing of it has run
            except BaseException:
                await prepared.discard()
                raise
    else:
        prepared = await _prepare(shape, pid_cap, starts, claim, within_s=limits.timeout_s)
    done = await prepared.go(words, stdin, limits, hash_output, on_start)
    # Built ahead with what its bound names lead to then, just before bubblewrap binds
    # them (later than this call looked); the call that takes it compares (_taken). Its
    # start is bounded as this call's was: the plan's next call may wait for it.
    warm.refill(
        plan,
        shape,
        lambda: _prepare(shape.as_now(), pid_cap, starts, within_s=limits.timeout_s),
    )
    return done


async def _taken(warm: WarmSandboxes, plan: str, shape: _Shape) -> _Prepared | None:
    """The sandbox held for `plan` if it has `shape` and still waits; else None (one
    that does not is let go)."""
    building = warm.take(plan, shape)
    if building is None:
        return None
    try:
        prepared = await asyncio.shield(building)
    except asyncio.CancelledError:
        # This call was stopped while its sandbox was still being built: let it go.
        building.cancel()
        if building.done() and not building.cancelled() and building.exception() is None:
            await building.result().discard()
        raise
    except Exception:  # noqa: BLE001 - its build failed: this call builds its own
        return None
    if not isinstance(prepared, _Prepared):
        return None
    if prepared.shape != shape or not prepared.alive():
        # Ended, or built while a bound name led elsewhere than it does for this call.
        await prepared.discard()
        return None
    return prepared


def _view_files(view: View, theirs: list[int], *, diag: bool) -> tuple[list[int], int | None]:
    """The memory files bubblewrap places in the sandbox (private files, then the seccomp
    filter when the view has one), each added to `theirs`."""
    file_fds = [_memory_file(content) for content in private_files(view.private)]
    theirs += file_fds
    rules = _seccomp.filter_for_machine(view.unix_sockets, diag=diag) if view.seccomp else None
    seccomp_fd = _memory_file(rules) if rules is not None else None
    if seccomp_fd is not None:
        theirs.append(seccomp_fd)
    return file_fds, seccomp_fd


def _start(
    starts: Starts,
    line: list[str],
    view: View,
    stdio: tuple[int, int, int],
    info_r: int,
    theirs: list[int],
    *,
    closes_all: bool,
) -> subprocess.Popen[bytes] | Spawned:
    """Start bubblewrap with `stdio` (in, out, err) and every descriptor of `theirs`, which
    are closed here once it started (or failed to)."""
    in_r, out_w, err_w = stdio
    # bubblewrap gets the read end of its report too: were the worker to die, its
    # write would otherwise raise SIGPIPE and kill it before it let the sandbox go
    # on, leaving that waiting forever (the entry closes it for the program).
    keep = (info_r, *(fd for fd in theirs if fd not in stdio))
    try:
        return starts.start(
            line, view.env, in_r, out_w, err_w, keep, closes_all=closes_all, as_uid=view.uid
        )
    except OSError as exc:
        raise SandboxUnavailableError(f"bubblewrap could not be started: {exc}") from exc
    finally:
        for fd in theirs:
            os.close(fd)
        theirs.clear()


def _pipe(reader_list: list[int], writer_list: list[int]) -> tuple[int, int]:
    """A pipe (both ends close-on-exec), its read end added to `reader_list` and its
    write end to `writer_list`."""
    read, write = os.pipe()
    reader_list.append(read)
    writer_list.append(write)
    return read, write


class _Sandbox:
    """One running sandbox and how to kill all of it.

    bubblewrap's own process starts the sandbox's first process (pid 1 of its pid
    namespace), reports that pid on --info-fd, then waits for it. Killing pid 1 makes
    the kernel kill every process in the sandbox. Killing bubblewrap alone is not
    enough while it is still starting the sandbox: its child would wait for it
    forever, holding our pipes; so a kill that finds pid 1 not yet reported stops
    bubblewrap first, reads the report (or its children) and kills them too.
    """

    def __init__(
        self, child: _Child, info_r: int, lifeline_w: int | None, block_w: int | None
    ) -> None:
        self.child = child
        self.info_r = info_r
        self.info = bytearray()
        self.info_done = False
        self.lifeline_w = lifeline_w
        self.block_w = block_w
        self.init_pid: int | None = None
        self.pidfd: int | None = None  # the sandbox's first process (its pid 1)
        self.killed = False
        self._watching = False  # its report's pipe is watched on the loop
        os.set_blocking(info_r, False)

    async def drive(
        self,
        tools: Tools,
        limits: Limits,
        started: float,
        cap_from_outside: PidCap | None,
        cgroup: PlanGroup | None,
        settle_with: str | None = None,
        *,
        last_pid: bool = False,
        user_limits: tuple[tuple[str, int], ...] = (),
        claim: Callable[[], None] | None = None,
        report_first: bool = True,
    ) -> Completed:
        try:
            async with starting_within(limits.timeout_s):
                await self.hold(
                    tools,
                    limits,
                    cap_from_outside,
                    cgroup,
                    settle_with,
                    last_pid=last_pid,
                    user_limits=user_limits,
                    claim=claim,
                    report_first=report_first,
                )
            self.release()
            timed_out = await self.finish(limits, started)
        except BaseException:
            self.kill()
            # Reap it before the caller moves on.
            await self.child.until(self.child.exited, EXIT_GRACE_S)
            raise
        return self._completed(timed_out, time.monotonic() - started)

    async def hold(
        self,
        tools: Tools,
        limits: Limits,
        cap_from_outside: PidCap | None,
        cgroup: PlanGroup | None,
        settle_with: str | None = None,
        *,
        last_pid: bool = False,
        user_limits: tuple[tuple[str, int], ...] = (),
        claim: Callable[[], None] | None = None,
        report_first: bool = True,
    ) -> None:
        """What is done while bubblewrap holds the sandbox at its start line (its
        callers bound it: `starting_within`). Should it raise, the caller kills the
        sandbox."""
        if claim is not None:
            # Right after bubblewrap started, while it builds the sandbox, which waits
            # at its start line (--block-fd) until this returned: nothing of the
            # program runs before. Should it raise, the sandbox is killed below.
            claim()
        if report_first:
            # Held at its start line (--block-fd) until pid 1 is known and, where
            # needed, in place, capped and its user limits written. Elsewhere (the
            # entry helper for a regular user's worker on a kernel before 5.11, no
            # cgroup) nothing needs pid 1 unless the sandbox is killed: `kill` then
            # reads bubblewrap's report while bubblewrap is stopped, and the exit is
            # the one event waited for.
            init_pid = await self._child_pid()
            if init_pid is None:
                await self.child.until(self.child.exited, EXIT_GRACE_S)
                raise SandboxUnavailableError(self._bwrap_complaint())
            if self.pidfd is not None and cgroup is not None:
                # It and all it will start join the plan's cgroup. In a thread: a move
                # can wait for the kernel's cgroup locks.
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(_JOINING, cgroup.join, init_pid)
            try:
                if self.pidfd is not None and cap_from_outside is not None:
                    await cap_from_outside.cap_processes(tools, init_pid, limits.processes)
                if self.pidfd is not None and settle_with is not None:
                    await _startline.settle(
                        settle_with,
                        self.pidfd,
                        self.child.starts,
                        last_pid=last_pid,
                        limits=user_limits,
                    )
            except SandboxUnavailableError:
                await self._failed_first(limits)
                raise

    def release(self) -> None:
        """Let bubblewrap go on from its start line."""
        if self.block_w is not None:
            with contextlib.suppress(BrokenPipeError):  # it already failed: the exit says
                os.write(self.block_w, b"go")

    async def finish(self, limits: Limits, started: float) -> bool:
        """Wait for the program's exit (or its timeout, counted from `started`) and its
        pipes; whether it timed out. Should it raise, the caller kills the sandbox."""
        remaining = limits.timeout_s - (time.monotonic() - started)
        timed_out = not await self.child.until(self.child.exited, remaining)
        if timed_out:
            self.kill()
            await self.child.until(self.child.exited, EXIT_GRACE_S)
        await self.child.until(self.child.pipes_closed, limits.drain_s)
        # An exit of 0 is the program's own (bubblewrap's failures exit 1, the
        # entry's 125, prlimit's 1 or 127): no report to read to know it started.
        if (
            not timed_out
            and self.child.returncode != 0
            and self._take_info(running=False)
            and self.init_pid is None
        ):
            raise SandboxUnavailableError(self._bwrap_complaint())  # it never started
        return timed_out

    async def _failed_first(self, limits: Limits) -> None:
        """The pid cap could not be set from outside: were it because bubblewrap failed
        while it built the sandbox (the info comes before its mounts, so the cap is set
        meanwhile; a folder gone leaves no pid namespace to join), say what bubblewrap
        said instead."""
        self.kill()
        await self.child.until(self.child.exited, EXIT_GRACE_S)
        await self.child.until(self.child.pipes_closed, limits.drain_s)
        if self.child.collected(self.child.stderr).startswith(b"bwrap: "):
            raise SandboxUnavailableError(self._bwrap_complaint())

    def kill(self) -> None:
        """SIGKILL the sandbox's pid 1 (so the kernel kills every process in it) and
        bubblewrap. Never waits; safe to call more than once."""
        if self.lifeline_w is not None:  # an entry not yet past its check exits at once
            os.close(self.lifeline_w)
            self.lifeline_w = None
        if self.pidfd is None and self.child.returncode is None:
            self.child.signal(signal.SIGSTOP)  # no further step until it is killed
            stopped = self._wait_stopped()
            # Exited instead: pid 1 is gone (bubblewrap outlives it) and its pid may name
            # another process by now, so no pidfd is opened for it.
            self._take_info(running=stopped)
            if self.pidfd is None and stopped:
                for pid in _children(self.child.popen.pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)  # stopped parent: the pid cannot be reused
        if self.pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            os.close(self.pidfd)
            self.pidfd = None
        self.child.signal(signal.SIGKILL)
        if self.block_w is not None:
            os.close(self.block_w)
            self.block_w = None

    def _wait_stopped(self) -> bool:
        """Wait for bubblewrap to stop (True) or find it exited (False)."""
        try:
            said = os.waitid(os.P_PID, self.child.popen.pid, os.WSTOPPED | os.WEXITED | os.WNOWAIT)
        except (ChildProcessError, OSError):
            return False
        return said is not None and said.si_code == os.CLD_STOPPED

    async def _child_pid(self) -> int | None:
        """The sandbox's first pid, from bubblewrap's --info-fd (None if it never started)."""
        done = self._watch_info()
        await done
        return self.init_pid

    def _watch_info(self) -> asyncio.Future[None]:
        """Read bubblewrap's report as it comes; the future is done once it is all in."""
        loop = self.child.loop
        done: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            if self._take_info():
                self.stop_watching()
                if not done.done():
                    done.set_result(None)

        self._watching = True
        loop.add_reader(self.info_r, readable)
        return done

    def stop_watching(self) -> None:
        # On the loop the reader was added on (the child's), not the running one: a
        # kill at teardown may come with no loop running (a closed loop ignores it).
        if self._watching:
            self._watching = False
            self.child.loop.remove_reader(self.info_r)

    def _take_info(self, *, running: bool = True) -> bool:
        """Read what bubblewrap reported; True once it is all there (or never will be).
        With `running` False (bubblewrap has exited) no pidfd is opened: pid 1 is gone,
        and its pid may already name another process."""
        while not self.info_done:
            try:
                data = os.read(self.info_r, 65536)
            except BlockingIOError:
                return False
            if data:
                self.info += data
                continue
            self.info_done = True
            self.init_pid = _pid_in(bytes(self.info))
            if running and self.init_pid is not None and self.pidfd is None and not self.killed:
                with contextlib.suppress(ProcessLookupError):
                    self.pidfd = os.pidfd_open(self.init_pid)
        return True

    def _completed(self, timed_out: bool, duration: float) -> Completed:
        code = self.child.returncode
        stderr = self.child.collected(self.child.stderr)
        stdout = self.child.collected(self.child.stdout)
        if code == 1 and not stdout and stderr.startswith(b"bwrap: "):
            raise SandboxUnavailableError(self._bwrap_complaint())
        if code == _entry.FAILED and stderr.startswith(_entry.SAYS):
            said = stderr.decode(errors="replace").strip()[:400]
            raise SandboxUnavailableError(
                f"the sandbox's entry could not confine the program, so it did not run: {said}"
            )
        number = _signal_of(code)
        return Completed(
            exit_code=None if number is not None else code,
            signal=number,
            stdout=stdout,
            stderr=stderr,
            truncated=self.child.truncated,
            timed_out=timed_out,
            duration_s=duration,
            output_digest=self.child.digest(stderr),
        )

    def _bwrap_complaint(self) -> str:
        said = self.child.collected(self.child.stderr).decode(errors="replace").strip()[:400]
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


def _widen(pipe: int, size: int) -> None:
    """Let the pipe hold up to `size` bytes (as far as the kernel allows; it rounds up to
    a power of two pages): a program whose output fits the budget writes it all
    without waiting on the worker, which reads it in a turn or two of the loop instead
    of one per 64 KiB. Pages are taken only as they are written."""
    with contextlib.suppress(OSError):  # over /proc/sys/fs/pipe-max-size, or the user's
        fcntl.fcntl(pipe, fcntl.F_SETPIPE_SZ, min(size, READ_MAX))  # pipe pages: as it was


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


def _pid_in(info: bytes) -> int | None:
    """The sandbox's first pid in bubblewrap's --info-fd report, if it has one."""
    try:
        pid = json.loads(info or b"{}").get("child-pid")
    except (ValueError, AttributeError):
        return None
    return pid if isinstance(pid, int) and pid > 0 else None


def _children(pid: int) -> list[int]:
    """The children of `pid` (stopped, so the list cannot change under us)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as listing:
            return [int(child) for child in listing.read().split()]
    except (OSError, ValueError):
        return []
