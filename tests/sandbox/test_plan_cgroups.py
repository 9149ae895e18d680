"""Per-plan cgroups on the real kernel, with real bubblewrap: a plan's limits hold for
all of its sandboxes together, other plans and the worker go on, teardown kills and
removes, and every failure refuses rather than runs unlimited.

This machine (and CI) is a hybrid: cgroup v1 hierarchies hold cpu, memory and pids,
and the worker runs as root, so sandbox.cgroups picks its cgroup v1 backend and the
kernel really enforces each limit here. The cgroup v2 backend's file protocol is
tested in tests/sandbox/test_cgroups.py against a fake cgroupfs.

Waits are on the cgroup's own counters (pids.events, memory.oom_control, cpu.stat),
never on the clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox import _pidcap, cgroups, environment
from sandbox.cgroups import CgroupError, PlanGroup, PlanLimits
from sandbox.process import Completed, Limits, Mount, PidCap, View, run
from tests.sandbox.support import FORK_UNTIL_REFUSED
from tests.support.procs import marker, processes_with

PYTHON = "/usr/bin/python3"  # the system's: the sandbox only sees /usr
ROOMY = PlanLimits(processes=64, memory_bytes=512 * 1024**2, cpus=1.0)


@pytest.fixture(scope="module")
def backend() -> Iterator[cgroups.Backend]:
    choice = cgroups.choose(f"test-{uuid.uuid4().hex[:8]}")
    if not isinstance(choice.backend, cgroups.CgroupV1):
        pytest.skip(f"these tests need cgroup v1 as root, as on this project's CI: {choice.note}")
    choice.backend.prepare()
    yield choice.backend
    assert choice.backend.prepare() == []  # every test destroyed what it made
    choice.backend.close()
    assert not any(Path(folder).exists() for folder in choice.backend.where.split(", "))


def view_of(share: Path, entry: str) -> View:
    return View(
        cwd=str(share),
        mounts=(Mount(str(share), True),),
        env=environment.build({}, []),
        entry=entry,
        read_only_root=True,
    )


async def in_group(
    share: Path, entry: str, group: PlanGroup, argv: list[str], timeout_s: float = 60
) -> Completed:
    return await run(
        argv, view_of(share, entry), Limits(timeout_s=timeout_s), pid_cap=PidCap(), cgroup=group
    )


async def until(check: Callable[[], bool], within_s: float = 20) -> None:
    """Poll a cgroup counter until `check` holds (a counter, not a clock, decides)."""
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, "the counter never moved"
        await asyncio.sleep(0.01)


# Forks children that wait, until a fork is refused; prints how many it made, then waits.
# Run as `FORKS tag [go done]`: with FIFOs `go` and `done`, it starts forking once it
# reads a byte from `go`, and writes one to `done` once it has printed.
FORKS = textwrap.dedent(
    """
    import os, sys, time
    gated = len(sys.argv) > 3
    if gated:
        os.read(os.open(sys.argv[2], os.O_RDONLY), 1)
    r, w = os.pipe()
    made = 0
    while made < 200:
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            os.close(w)
            os.read(r, 1)
            os._exit(0)
        made += 1
    print(made, flush=True)
    if gated:
        os.write(os.open(sys.argv[3], os.O_WRONLY), b"!")
    time.sleep(600)
    """
)


def pids_current(group: PlanGroup) -> int:
    return int((group.folders[0] / "pids.current").read_text())


async def read_bytes(fd: int, count: int, within_s: float = 60) -> bytes:
    """`count` bytes from `fd` (a FIFO's end), woken by the loop as they come."""
    loop = asyncio.get_running_loop()
    readable = asyncio.Event()
    got = bytearray()
    os.set_blocking(fd, False)
    loop.add_reader(fd, readable.set)
    try:
        async with asyncio.timeout(within_s):
            while len(got) < count:
                await readable.wait()
                readable.clear()
                with contextlib.suppress(BlockingIOError):
                    got += os.read(fd, count - len(got))
    finally:
        loop.remove_reader(fd)
    return bytes(got)


def test_a_plans_processes_are_capped_together_and_teardown_kills_and_removes(
    backend: cgroups.Backend, share: Path, entry: str
) -> None:
    cap = 16
    plan_a = backend.create("a" * 32, PlanLimits(cap, ROOMY.memory_bytes, 1.0))
    plan_b = backend.create("b" * 32, ROOMY)
    tag = marker()
    for name in ("go", "done"):
        os.mkfifo(share / name)
    # Held open both ways here: the bombs' opens never wait, and never meet an end.
    go_fd = os.open(share / "go", os.O_RDWR)
    done_fd = os.open(share / "done", os.O_RDWR)
    gated = [PYTHON, "-c", FORKS, tag, str(share / "go"), str(share / "done")]

    async def go() -> tuple[list[Completed], Completed]:
        bombs = [asyncio.create_task(in_group(share, entry, plan_a, gated)) for _ in range(3)]
        # All three in the plan's cgroup (one process each, waiting on `go`) before any
        # forks: a sandbox joining a plan at its cap is refused instead.
        await until(lambda: pids_current(plan_a) == 3)
        os.write(go_fd, b"!!!")
        await read_bytes(done_fd, 3)  # each printed what it made, after its refused fork
        # Each of the three was refused a fork at the plan's cap: the cap is the plan's.
        assert plan_a.counters().forks_refused >= 3
        assert pids_current(plan_a) <= cap
        other = await in_group(share, entry, plan_b, ["/usr/bin/true"])
        assert subprocess.run(["true"], check=False).returncode == 0  # the worker forks
        await asyncio.to_thread(plan_a.destroy)  # teardown
        return list(await asyncio.gather(*bombs)), other

    try:
        bombs, other = asyncio.run(go())
    finally:
        os.close(go_fd)
        os.close(done_fd)
    assert other.exit_code == 0
    made = [int(done.stdout) for done in bombs]
    assert sum(made) + len(bombs) <= cap, made  # each sandbox's first process counts too
    assert all(done.signal == signal.SIGKILL for done in bombs), bombs
    assert processes_with(tag) == []
    assert not any(folder.exists() for folder in plan_a.folders)
    plan_b.destroy()
    assert not any(folder.exists() for folder in plan_b.folders)


def test_a_sandbox_joining_a_plan_at_its_cap_is_refused_and_never_runs(
    backend: cgroups.Backend, share: Path, entry: str
) -> None:
    """A move into a cgroup is not a fork: the kernel lets it past pids.max. A sandbox
    that joined while the plan's other programs filled its cap ran as one process more
    (17 of 16); it is refused instead, and its program never runs."""
    cap = 4
    plan = backend.create("f" * 32, PlanLimits(cap, ROOMY.memory_bytes, 1.0))
    tag = marker()
    ran = share / "ran"

    async def go() -> Completed:
        full = asyncio.create_task(in_group(share, entry, plan, [PYTHON, "-c", FORKS, tag]))
        await until(lambda: plan.counters().forks_refused >= 1)  # at its cap, and stays
        assert pids_current(plan) == cap
        late = [PYTHON, "-c", f"open({str(ran)!r}, 'w')"]
        with pytest.raises(CgroupError, match="already runs its cap of 4 processes"):
            await in_group(share, entry, plan, late)
        # Moved in before it was refused, the held process is killed and leaves.
        await until(lambda: pids_current(plan) == cap)
        await asyncio.to_thread(plan.destroy)
        return await full

    try:
        filled = asyncio.run(go())
    finally:
        if not plan.destroyed:
            plan.destroy()
    assert not ran.exists()
    assert int(filled.stdout) == cap - 1 and filled.signal == signal.SIGKILL, filled
    assert processes_with(tag) == []


@pytest.mark.skipif(not _pidcap.needed(), reason="the pid cap is a root worker's")
def test_a_root_sandbox_in_a_roomy_plan_holds_at_most_its_processes(
    backend: cgroups.Backend, share: Path, entry: str
) -> None:
    """In a plan's cgroup the entry spends no pids (they would be the plan's): the worker
    sets the sandbox's last pid to 300 from outside, so its cap holds from the first
    fork (review7 finding 04: 366 of 64 before the pids wrapped)."""
    roomy = backend.create("e" * 32, PlanLimits(1024, ROOMY.memory_bytes, 1.0))
    try:
        done = asyncio.run(
            run(
                [PYTHON, "-c", FORK_UNTIL_REFUSED],
                view_of(share, entry),
                Limits(timeout_s=60, processes=64),
                pid_cap=PidCap(),
                cgroup=roomy,
            )
        )
        assert done.exit_code == 0, done.stderr
        alive, _own, lowest = (int(word) for word in done.stdout.split())
        assert 60 <= alive <= _pidcap.most_at_once(64) == 64
        assert lowest >= _pidcap.RESERVED_PIDS
    finally:
        roomy.destroy()


def test_a_memory_hog_is_killed_in_its_plan_and_the_next_plan_runs(
    backend: cgroups.Backend, share: Path, entry: str
) -> None:
    hungry = backend.create("c" * 32, PlanLimits(64, 64 * 1024**2, 1.0))
    other = backend.create("d" * 32, ROOMY)
    try:
        before = hungry.counters()
        hog = asyncio.run(
            in_group(share, entry, hungry, [PYTHON, "-c", "b = b'x' * (512 * 1024**2)"])
        )
        assert hog.signal == signal.SIGKILL and hog.exit_code is None, hog
        assert hungry.counters().met_since(before) == ["memory"]
        fine = asyncio.run(in_group(share, entry, other, [PYTHON, "-c", "b = b'x' * 2**27"]))
        assert fine.exit_code == 0 and other.counters().oom_kills == 0
    finally:
        hungry.destroy()
        other.destroy()


def test_a_cpu_bound_plan_is_throttled(backend: cgroups.Backend, share: Path, entry: str) -> None:
    slow = backend.create("e" * 32, PlanLimits(64, ROOMY.memory_bytes, 0.05))

    async def go() -> Completed:
        spin = asyncio.create_task(in_group(share, entry, slow, [PYTHON, "-c", "while True: pass"]))
        await until(lambda: slow.counters().throttled >= 2)
        await asyncio.to_thread(slow.destroy)
        return await spin

    spun = asyncio.run(go())
    assert spun.signal == signal.SIGKILL
    assert not any(folder.exists() for folder in slow.folders)


def test_a_limit_the_kernel_refuses_leaves_no_cgroup_and_says_which(
    backend: cgroups.Backend,
) -> None:
    with pytest.raises(CgroupError, match=r"cpu\.cfs_quota_us.*Invalid argument"):
        backend.create("f" * 32, PlanLimits(64, ROOMY.memory_bytes, 0.0001))  # 10 µs a period
    for base in backend.where.split(", "):
        assert not [name for name in os.listdir(base) if name.startswith("plan-ffff")]


def test_a_sandbox_that_cannot_join_its_plans_cgroup_never_runs(
    backend: cgroups.Backend, share: Path, entry: str
) -> None:
    group = backend.create("9" * 32, ROOMY)
    group.places[-1].folder.rmdir()  # one hierarchy's cgroup is gone: the join must fail
    witness = share / "ran"
    with pytest.raises(CgroupError, match="could not move the sandbox into its plan's cgroup"):
        asyncio.run(in_group(share, entry, group, ["/usr/bin/touch", str(witness)]))
    assert not witness.exists()
    group.destroy()
    assert not any(folder.exists() for folder in group.folders)


def test_a_previous_runs_plan_cgroups_are_killed_and_removed_at_start(
    backend: cgroups.Backend,
) -> None:
    tag = f"test-{uuid.uuid4().hex[:8]}"
    earlier = cgroups.choose(tag).backend
    assert earlier is not None
    earlier.prepare()
    left = earlier.create("7" * 32, ROOMY)
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        left.join(sleeper.pid)
        later = cgroups.choose(tag).backend
        assert later is not None
        assert later.prepare() == [left.name]
        assert sleeper.wait(10) == -signal.SIGKILL
        assert not any(folder.exists() for folder in left.folders)
        later.close()
    finally:
        sleeper.kill()
        sleeper.wait()
