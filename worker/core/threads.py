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

A job under a shared folder whose file system may never answer (a FUSE mount whose
server is gone, NFS or CIFS without its server: `sandbox.mounts`) does not go to this
pool at all: a thread stuck in the kernel there stays stuck after its call answered
(`timeout`, `cancelled`), and six of them took every thread of the pool, so every
other folder's work waited behind them, maybe for ever (review8 finding 04). Such a
job runs in a thread of its own, in its folder's lane (`Lanes`): at most
LANE_THREADS at once for one folder, LANES_THREADS for every such folder together.
A job waits for its lane while the threads there belong to calls still waiting for
them, and is refused `busy` (retryable, naming the folder's mounts) once every one
belongs to a call that stopped waiting: the file system does not answer, and
another thread would only get stuck too. A stuck thread ends, and gives its place
back, when the file system answers (or its server goes away: ENOTCONN). So one file
system that stops answering costs at most LANE_THREADS threads, and never a thread
another folder's calls need.

A job that waits for bytes still on their way (a write whose blob comes in parts) runs
in a thread of its own as well (`CallThreads.apart`), counted as its call's work: in the
pool, six of them held every thread while the stream that would bring their bytes
waited for one (review12 finding 01).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import threading
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final, ParamSpec, TypeVar

from worker.errors import WorkerError

# The correlation id of the call whose task is running; "" outside any call.
CURRENT_CALL: contextvars.ContextVar[str] = contextvars.ContextVar("current_call", default="")

P = ParamSpec("P")
T = TypeVar("T")

# Threads of one lane (a shared folder whose file system may never answer) at once,
# and of every lane together: what file systems that stop answering can hold at most.
LANE_THREADS: Final = 4
LANES_THREADS: Final = 16


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
        self.lanes = Lanes(self)  # the jobs under folders that may hang, apart

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        cid = CURRENT_CALL.get()
        self._started(cid)
        try:
            future = super().submit(fn, *args, **kwargs)
        except BaseException:
            self._finished(cid)
            raise
        # Done when it returns, raises, or is cancelled before it started (then it
        # never runs): in each case it holds no thread any more.
        future.add_done_callback(lambda f: self._finished(cid, ran=not f.cancelled()))
        return future

    def _started(self, cid: str) -> None:
        with self._lock:
            self._jobs[cid] += 1

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

    async def apart(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """fn(*args) in a thread of its own, outside the pool, counted as the current
        call's work like a pool job. For a job that waits for bytes still on their way
        (a blob coming in parts): six of them held all six of the pool's threads, so the
        stream's own work that would bring those bytes, and every other call's, waited
        behind them (review12 finding 01). Such jobs are bounded by the transfers the
        connection lets follow at once (connection.MAX_FOLLOWING)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()
        cid = CURRENT_CALL.get()

        def deliver(result: Any, error: BaseException | None) -> None:
            if done.cancelled():
                return
            if error is not None:
                done.set_exception(error)
            else:
                done.set_result(result)

        def work() -> None:
            result: Any = None
            error: BaseException | None = None
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                error = exc
            self._finished(cid, ran=True)
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for it
                loop.call_soon_threadsafe(deliver, result, error)

        self._started(cid)
        try:
            threading.Thread(target=work, name="agentworker-apart", daemon=True).start()
        except BaseException:
            self._finished(cid)
            raise
        return await done


class _Lane:
    """One shared folder's threads (see Lanes)."""

    __slots__ = ("abandoned", "held", "waiting", "where")

    def __init__(self, where: str) -> None:
        self.where = where  # the folder and the mounts beneath it that may hang
        self.held = 0  # threads running a job of this lane
        self.abandoned = 0  # of them: jobs whose caller stopped waiting (stuck)
        self.waiting: deque[asyncio.Future[None]] = deque()  # jobs in line, in order


class _Job:
    __slots__ = ("abandoned", "ended")

    def __init__(self) -> None:
        self.ended = False  # its thread returned (seen on the loop)
        self.abandoned = False  # its caller stopped waiting while it ran


class Lanes:
    """Threads apart from the pool for jobs under folders whose file system may never
    answer, per folder (see the module's notes). The counts are kept on the event
    loop; a thread reports its end there."""

    def __init__(
        self, pool: CallThreads, per_lane: int = LANE_THREADS, total: int = LANES_THREADS
    ) -> None:
        self._pool = pool
        self._per_lane = per_lane
        self._total = total
        self._lanes: dict[str, _Lane] = {}
        self._held = 0
        self._abandoned = 0
        self._waiting_below: list[tuple[int, asyncio.Future[None]]] = []

    def held(self) -> int:
        """Threads running a lane's job (stuck ones included)."""
        return self._held

    def stuck(self) -> dict[str, int]:
        """Per lane with any: threads whose caller stopped waiting (still in the kernel)."""
        return {key: lane.abandoned for key, lane in self._lanes.items() if lane.abandoned}

    async def below(self, held: int) -> None:
        """Until the lanes hold fewer than `held` threads."""
        if self._held >= held:
            waiter = asyncio.get_running_loop().create_future()
            self._waiting_below.append((held, waiter))
            await waiter

    async def idle(self) -> None:
        """Until no lane holds a thread."""
        await self.below(1)

    async def run(
        self,
        key: str,
        where: Callable[[], str],
        fn: Callable[..., T],
        /,
        *args: Any,
        looks: bool = False,
    ) -> T:
        """fn(*args) in a thread of lane `key`, counted as the current call's work
        (unless it only `looks`, as `looking`). `where` names the folder in a refusal."""
        loop = asyncio.get_running_loop()
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane(where())
        try:
            await self._enter(key, lane)
        except BaseException:
            self._forget_if_idle(key, lane)
            raise
        cid = "" if looks else CURRENT_CALL.get()
        done: asyncio.Future[T] = loop.create_future()
        job = _Job()
        pool = self._pool

        def work() -> None:
            result: Any = None
            error: BaseException | None = None
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                error = exc
            pool._finished(cid, ran=True)
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for it
                loop.call_soon_threadsafe(self._ended, key, lane, job, done, result, error)

        pool._started(cid)
        try:
            threading.Thread(target=work, name=f"agentworker-lane-{key}", daemon=True).start()
        except BaseException:
            pool._finished(cid)
            self._give_back(key, lane)
            raise
        try:
            return await done
        except asyncio.CancelledError:
            if not job.ended:  # its thread stays: stuck until the file system answers
                job.abandoned = True
                lane.abandoned += 1
                self._abandoned += 1
                self._wake()
            raise

    def _room(self, lane: _Lane) -> bool:
        return lane.held < self._per_lane and self._held < self._total

    def _take(self, lane: _Lane) -> None:
        lane.held += 1
        self._held += 1

    def _refusal(self, lane: _Lane) -> WorkerError | None:
        """`busy` when every thread the job could have is stuck, else None (it waits)."""
        if lane.held >= self._per_lane and lane.abandoned >= lane.held:
            return WorkerError(
                "busy",
                f"the file system of {lane.where} does not answer: {lane.held} lookups there "
                "are still waiting for it after their calls stopped (a FUSE mount whose "
                "server stopped, or a network file system without its server?). Calls "
                "under that folder are refused until it answers; try again later, or ask "
                "the person to check that mount",
                {"stuck": lane.abandoned, "folder": lane.where},
            )
        if self._held >= self._total and self._abandoned >= self._held:
            return WorkerError(
                "busy",
                f"file systems that do not answer hold all {self._total} threads for "
                f"folders whose mounts may hang ({lane.where} among them): calls under "
                "such folders are refused until one answers; try again later, or ask the "
                "person to check those mounts",
                {"stuck": self._abandoned, "folder": lane.where},
            )
        return None

    async def _enter(self, key: str, lane: _Lane) -> None:
        if not lane.waiting and self._room(lane):
            self._take(lane)
            return
        refusal = self._refusal(lane)
        if refusal is not None:
            raise refusal
        waiter = asyncio.get_running_loop().create_future()
        lane.waiting.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._give_back(key, lane)  # its thread was given just as the call stopped
            elif waiter in lane.waiting:
                lane.waiting.remove(waiter)
            raise

    def _ended(
        self,
        key: str,
        lane: _Lane,
        job: _Job,
        done: asyncio.Future[Any],
        result: Any,
        error: BaseException | None,
    ) -> None:
        job.ended = True
        if job.abandoned:
            lane.abandoned -= 1
            self._abandoned -= 1
        if not done.done():
            if error is None:
                done.set_result(result)
            else:
                done.set_exception(error)
        self._give_back(key, lane)

    def _give_back(self, key: str, lane: _Lane) -> None:
        lane.held -= 1
        self._held -= 1
        self._wake()
        self._forget_if_idle(key, lane)
        waiting, self._waiting_below = self._waiting_below, []
        for held, waiter in waiting:
            if self._held >= held:
                self._waiting_below.append((held, waiter))
            elif not waiter.done():
                waiter.set_result(None)

    def _wake(self) -> None:
        """Give freed threads to the jobs in line, and refuse those that would wait
        only for stuck ones."""
        for lane in list(self._lanes.values()):
            while lane.waiting and self._room(lane):
                waiter = lane.waiting.popleft()
                if not waiter.done():
                    self._take(lane)
                    waiter.set_result(None)
            while lane.waiting and (refusal := self._refusal(lane)) is not None:
                waiter = lane.waiting.popleft()
                if not waiter.done():
                    waiter.set_exception(refusal)

    def _forget_if_idle(self, key: str, lane: _Lane) -> None:
        if not lane.held and not lane.waiting and self._lanes.get(key) is lane:
            del self._lanes[key]
