"""The lanes of worker.core.threads: jobs under a folder whose file system may never
answer run in threads apart from the worker's pool, a few per folder, and are refused
`busy` once every thread their folder may have belongs to a call that stopped waiting
(review8 finding 04). Each job here blocks on an event the test sets, as a lookup in a
file system that does not answer blocks until it does (tests/unit/test_hung_mounts.py
has the real FUSE mount); the test waits for events, never for a time."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from worker.core.threads import CURRENT_CALL, CallThreads, Lanes
from worker.errors import WorkerError


class _Blocked:
    """A job that says it started and ends only when let go (or raises `fail`)."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.started = threading.Event()
        self.go = threading.Event()
        self.fail = fail

    def __call__(self, value: object = None) -> object:
        self.started.set()
        self.go.wait()
        if self.fail is not None:
            raise self.fail
        return value

    async def under_way(self) -> None:
        await asyncio.to_thread(self.started.wait)


def _where(name: str) -> Callable[[], str]:
    return lambda: f"/srv/{name} (fuse.sshfs at /srv/{name}/mnt)"


def _call(cid: str, job: Callable[[], Awaitable[Any]]) -> asyncio.Task[Any]:
    """The job awaited in a task of its own with `cid` as the current call."""

    async def run() -> Any:
        CURRENT_CALL.set(cid)
        return await job()

    return asyncio.create_task(run())


async def _stopped(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def _refused(task: asyncio.Task[Any]) -> WorkerError:
    error = task.exception()
    assert isinstance(error, WorkerError), error
    assert error.code == "busy" and error.retryable
    return error


def test_a_lane_full_of_stuck_jobs_refuses_and_the_others_run() -> None:
    async def run() -> None:
        pool = CallThreads()
        lanes = Lanes(pool, per_lane=2, total=8)
        jobs = [_Blocked(), _Blocked()]
        tasks = [
            _call(f"c{n}", functools.partial(lanes.run, "a", _where("a"), job, n))
            for n, job in enumerate(jobs)
        ]
        for job in jobs:
            await job.under_way()
        # Full of jobs whose callers still wait: the next waits for a thread.
        third = _Blocked()
        waiting = _call("c2", lambda: lanes.run("a", _where("a"), third))
        await asyncio.sleep(0)
        assert not waiting.done() and lanes.held() == 2
        # Another folder's lane, and the pool, are not held by them.
        other = _call("d", lambda: lanes.run("b", _where("b"), lambda: "b ran"))
        assert await other == "b ran"
        assert await asyncio.get_running_loop().run_in_executor(pool, lambda: "pool ran")
        # The callers stop waiting: their threads stay, counted as their calls' work.
        for task in tasks:
            await _stopped(task)
        assert pool.running("c0") == 1 and pool.running("c1") == 1
        assert lanes.stuck() == {"a": 2}
        await asyncio.wait([waiting])
        error = _refused(waiting)
        assert "/srv/a (fuse.sshfs at /srv/a/mnt)" in error.message
        assert error.details == {"stuck": 2, "folder": "/srv/a (fuse.sshfs at /srv/a/mnt)"}
        assert not third.started.is_set()
        refused = _call("c3", lambda: lanes.run("a", _where("a"), lambda: None))
        await asyncio.wait([refused])
        _refused(refused)
        # The file system answers: the threads end, and the lane takes jobs again.
        for job in jobs:
            job.go.set()
        await lanes.idle()
        assert lanes.stuck() == {} and pool.unfinished() == {}
        assert await lanes.run("a", _where("a"), lambda: "again") == "again"
        pool.shutdown()

    asyncio.run(run())


def test_a_job_in_line_gets_the_thread_a_finished_job_gives_back() -> None:
    async def run() -> None:
        pool = CallThreads()
        lanes = Lanes(pool, per_lane=1, total=8)
        first, second = _Blocked(), _Blocked()
        running = _call("c0", lambda: lanes.run("a", _where("a"), first, 1))
        await first.under_way()
        in_line = _call("c1", lambda: lanes.run("a", _where("a"), second, 2))
        await asyncio.sleep(0)
        assert not second.started.is_set()
        first.go.set()
        assert await running == 1
        await second.under_way()
        second.go.set()
        assert await in_line == 2
        await lanes.idle()
        pool.shutdown()

    asyncio.run(run())


def test_a_job_stopped_in_line_leaves_it_and_errors_reach_the_caller() -> None:
    async def run() -> None:
        pool = CallThreads()
        lanes = Lanes(pool, per_lane=1, total=8)
        first = _Blocked(fail=OSError(107, "Transport endpoint is not connected"))
        running = _call("c0", lambda: lanes.run("a", _where("a"), first))
        await first.under_way()
        never = _Blocked()
        in_line = _call("c1", lambda: lanes.run("a", _where("a"), never))
        await asyncio.sleep(0)
        await _stopped(in_line)
        first.go.set()
        with pytest.raises(OSError, match="not connected"):
            await running
        await lanes.idle()
        assert not never.started.is_set() and lanes.held() == 0
        assert pool.unfinished() == {}
        pool.shutdown()

    asyncio.run(run())


def test_every_lanes_threads_together_are_bounded() -> None:
    async def run() -> None:
        pool = CallThreads()
        lanes = Lanes(pool, per_lane=2, total=3)
        jobs = [_Blocked() for _ in range(3)]
        keys = ["a", "a", "b"]
        tasks = [
            _call(f"c{n}", functools.partial(lanes.run, key, _where(key), job))
            for n, (job, key) in enumerate(zip(jobs, keys, strict=True))
        ]
        for job in jobs:
            await job.under_way()
        # Lane "b" has room of its own, but every lane's thread is taken: it waits...
        waiting = _call("c3", lambda: lanes.run("b", _where("b"), lambda: "b"))
        await asyncio.sleep(0)
        assert not waiting.done()
        # ...and is refused once all of them are stuck.
        for task in tasks:
            await _stopped(task)
        await asyncio.wait([waiting])
        assert "all 3 threads" in _refused(waiting).message
        assert lanes.stuck() == {"a": 2, "b": 1}
        jobs[2].go.set()  # one answers: its thread is free for the next job
        await lanes.below(3)
        assert lanes.held() == 2 and lanes.stuck() == {"a": 2}
        assert await lanes.run("c", _where("c"), lambda: "c") == "c"
        for job in jobs:
            job.go.set()
        await lanes.idle()
        pool.shutdown()

    asyncio.run(run())


def test_a_stopped_effectful_job_is_still_its_calls_work_until_it_ends() -> None:
    """The ledger's at-most-once: a call stopped while its job is stuck in a lane's
    thread is told apart (`running`) from one whose job never started."""

    async def run() -> None:
        pool = CallThreads()
        lanes = Lanes(pool, per_lane=2, total=8)
        job = _Blocked()
        pool.watch("w")
        task = _call("w", lambda: lanes.run("a", _where("a"), job))
        await job.under_way()
        await _stopped(task)
        assert pool.running("w") == 1 and not pool.finished_unseen("w")
        looks = _Blocked()
        looking = _call("w", lambda: lanes.run("a", _where("a"), looks, looks=True))
        await looks.under_way()
        assert pool.running("w") == 1 and pool.unfinished() == {"w": 1, "": 1}
        job.go.set()
        looks.go.set()
        await looking
        await lanes.idle()
        assert pool.running("w") == 0 and pool.finished_unseen("w")
        pool.shutdown()

    asyncio.run(run())
