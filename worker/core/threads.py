"""The worker's thread pool: the event loop's default executor, knowing which call
each job belongs to (docs/architecture.md, "The life of one call").

Handlers move blocking work off the loop with `asyncio.to_thread`. A thread cannot
be interrupted: cancelling the task that awaits it (a cancel, a kill, a deadline, a
drain) leaves the job running, and the interpreter joins the pool's threads at exit.
So the pool counts the jobs of each call (the pipeline names the call in
`CURRENT_CALL` for its task; `to_thread` and `run_in_executor` submit from that
task), and it can say two things:

- whether a stopped call's work is still running in a thread, or finished there
  with its result not yet back in the call's task (`finished_unseen`), so its answer
  says the effect is unknown instead of claiming it was stopped;
- whether anything at all still runs in a thread when the worker is leaving, so it
  leaves without joining it (see worker.app), instead of hanging past its drain.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

# The correlation id of the call whose task is running; "" outside any call.
CURRENT_CALL: contextvars.ContextVar[str] = contextvars.ContextVar("current_call", default="")

P = ParamSpec("P")
T = TypeVar("T")


async def looking(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`asyncio.to_thread` for a job that only looks (a quota count, a walk that
    checks paths): it is not counted as its call's work, so a call stopped while it
    runs answers how it was stopped, not that its work may have taken effect."""
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    context.run(CURRENT_CALL.set, "")  # the pool reads the call from the submitter
    job = context.run(loop.run_in_executor, None, functools.partial(fn, *args, **kwargs))
    return await job


class CallThreads(ThreadPoolExecutor):
    """A ThreadPoolExecutor that counts its unfinished jobs, per call."""

    def __init__(self, max_workers: int | None = None) -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix="agentworker")
        self._lock = threading.Lock()
        self._jobs: Counter[str] = Counter()  # call id ("" for none) -> jobs not finished
        self._watched: set[str] = set()  # calls whose finished jobs are noted (`watch`)
        self._unseen: set[str] = set()  # watched calls with a job finished since `seen`

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        cid = CURRENT_CALL.get()
        with self._lock:
            self._jobs[cid] += 1
        try:
            future = super().submit(fn, *args, **kwargs)
        except BaseException:
            self._finished(cid)
            raise
        # Done when it returns, raises, or is cancelled before it started (then it
        # never runs): in each case it holds no thread any more.
        future.add_done_callback(lambda f: self._finished(cid, ran=not f.cancelled()))
        return future

    def _finished(self, cid: str, ran: bool = False) -> None:
        with self._lock:
            self._jobs[cid] -= 1
            if self._jobs[cid] <= 0:
                del self._jobs[cid]
            if ran and cid in self._watched:
                self._unseen.add(cid)

    def watch(self, cid: str) -> None:
        """Note the jobs of call `cid` that finish from now on, until `unwatch`."""
        with self._lock:
            self._watched.add(cid)

    def unwatch(self, cid: str) -> None:
        with self._lock:
            self._watched.discard(cid)
            self._unseen.discard(cid)

    def seen(self, cid: str) -> None:
        """The call's task has run since: whatever its jobs returned reached it."""
        if cid in self._unseen:  # read without the lock: this runs at each step
            with self._lock:
                self._unseen.discard(cid)

    def finished_unseen(self, cid: str) -> bool:
        """Whether a job of the watched call `cid` ran to its end in a thread since the
        call's task last ran: its work is done, its result not yet taken."""
        with self._lock:
            return cid in self._unseen

    def running(self, cid: str) -> int:
        """Jobs of call `cid` not finished (queued or in a thread)."""
        with self._lock:
            return self._jobs.get(cid, 0)

    def unfinished(self) -> dict[str, int]:
        """Every unfinished job, by call id ("" for jobs of no call)."""
        with self._lock:
            return dict(self._jobs)
