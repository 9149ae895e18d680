"""Sandboxes built ahead of their calls: one per recent plan, held until its next call.

Building a sandbox (bubblewrap's namespaces and mounts) is most of what an exec costs
(5-6 ms of the 6-7 ms of exec's own line on this class of machine, against ~1 ms to
run `true` in one already built). So after a plan's exec has run, the worker builds
the next sandbox for that plan, exactly as that call's was built, and leaves its entry
helper waiting for the call (sandbox/entry.c, -W): nothing of any call runs in it
until a call of that plan takes it, and the call's claim is durable (the caller
claims before it sends the call's words; see sandbox.process.run).

A sandbox is taken only by a call of its plan whose sandbox would be built exactly
alike (`Shape`: the whole bubblewrap line but the call's own argv, folder and
environment, the limits, whether it has stdin, and the file behind every name the
line binds, as (device, inode), looked at again when it is taken); any difference
discards it, and the call builds its own as before. The person's kill of its plan,
a pause, a reload of the settings and the worker's end discard them (`discard`,
`close`); so does `idle_s` without a call of its plan. At most `most` are held at
once (the plans used last), each two processes (bubblewrap and the entry helper,
waiting in a read) with their empty namespaces: no program of the agent's runs
while it waits. The worker dying kills them (bubblewrap's --die-with-parent, and the
entry finds its call's pipe closed and exits, running nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final, Protocol

log = logging.getLogger(__name__)

MOST: Final = 4  # plans with a sandbox held at once
IDLE_S: Final = 30.0  # a held sandbox no call of its plan took within this is let go
# How long after a call's program ended its plan's next sandbox starts to be built:
# after the call's answer left (its ledger commit and send, ~1 ms), so that the build
# takes no CPU from it.
REFILL_DELAY_S: Final = 0.005


class Built(Protocol):
    """A sandbox held for its call (sandbox.process's)."""

    @property
    def pid(self) -> int | None: ...

    def alive(self) -> bool: ...

    def kill(self) -> None: ...

    async def discard(self) -> None: ...


@dataclass
class _Held:
    shape: object
    task: asyncio.Task[Any]
    timer: asyncio.TimerHandle


class WarmSandboxes:
    """The sandboxes held for the plans' next calls (see the module's doc). One per
    worker (its `Containment`); `most` 0 holds none."""

    def __init__(self, most: int = MOST, idle_s: float = IDLE_S) -> None:
        self.most = most
        self.idle_s = idle_s
        self._held: dict[str, _Held] = {}  # by plan, the one used last at the end
        self._epoch = 0  # moved by every discard: a refill asked for before it is dropped
        self._closed = False
        self._reaping: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._held)

    def plans(self) -> list[str]:
        return list(self._held)

    def built(self, plan: str) -> Built | None:
        """`plan`'s sandbox, once built and still waiting for its call (None else)."""
        held = self._held.get(plan)
        if held is None or not held.task.done() or held.task.cancelled():
            return None
        if held.task.exception() is not None:
            return None
        built: Built = held.task.result()
        return built if built.alive() else None

    def take(self, plan: str, shape: object) -> asyncio.Task[Any] | None:
        """The sandbox held for `plan` (its build, perhaps still under way) if it was
        built as `shape` says; None otherwise (one of another shape is discarded)."""
        held = self._held.pop(plan, None)
        if held is None:
            return None
        held.timer.cancel()
        if held.shape != shape:
            self._let_go(held)
            return None
        return held.task

    def refill(
        self, plan: str, shape: object, build: Callable[[], Coroutine[Any, Any, Built]]
    ) -> None:
        """Build `plan`'s next sandbox as `shape`, REFILL_DELAY_S from now, unless a
        discard comes first."""
        if self.most <= 0 or self._closed:
            return
        epoch = self._epoch
        loop = asyncio.get_running_loop()
        loop.call_later(REFILL_DELAY_S, self._refill, plan, shape, build, epoch)

    def _refill(
        self,
        plan: str,
        shape: object,
        build: Callable[[], Coroutine[Any, Any, Built]],
        epoch: int,
    ) -> None:
        if self._closed or epoch != self._epoch or self.most <= 0:
            return
        held = self._held.pop(plan, None)
        if held is not None:
            if held.shape == shape:  # another call of the plan left one already
                self._held[plan] = held
                return
            held.timer.cancel()
            self._let_go(held)
        while len(self._held) >= self.most:
            oldest = next(iter(self._held))
            self._drop(oldest)
        loop = asyncio.get_running_loop()
        task = loop.create_task(build())
        task.add_done_callback(_quietly)
        timer = loop.call_later(self.idle_s, self._expire, plan, task)
        self._held[plan] = _Held(shape, task, timer)

    def _expire(self, plan: str, task: asyncio.Task[Any]) -> None:
        held = self._held.get(plan)
        if held is not None and held.task is task:
            self._drop(plan)

    def discard(self, plan: str | None = None) -> None:
        """Let go of `plan`'s held sandbox (every plan's with None), and of every refill
        asked for before now: it is killed, and reaped soon after."""
        self._epoch += 1
        for name in [plan] if plan is not None else list(self._held):
            if name in self._held:
                self._drop(name)

    def close(self) -> None:
        """The worker's end: every held sandbox discarded, none built again."""
        self._closed = True
        self.discard()

    async def aclose(self) -> None:
        """`close`, then wait until what was held is reaped."""
        self.close()
        if self._reaping:
            await asyncio.gather(*list(self._reaping), return_exceptions=True)

    def _drop(self, plan: str) -> None:
        held = self._held.pop(plan)
        held.timer.cancel()
        self._let_go(held)

    def _let_go(self, held: _Held) -> None:
        task = held.task
        if not task.done():
            if task.get_loop().is_closed():
                # Its loop ended with the build still waiting (a process that runs one
                # loop after another): nothing of it runs again, and what it started
                # ends with its lifeline, this process.
                return
            task.cancel()  # a build cancelled kills what it started (sandbox.process)
            return
        if task.cancelled() or task.exception() is not None:
            return
        built: Built = task.result()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # the loop has ended: killed, and reaped by whoever is left
            built.kill()
            return
        reaping = loop.create_task(built.discard())
        self._reaping.add(reaping)
        reaping.add_done_callback(self._reaping.discard)


def _quietly(task: asyncio.Task[Any]) -> None:
    """A build that failed is only a call that builds its own: said in the log."""
    if not task.cancelled() and task.exception() is not None:
        with contextlib.suppress(Exception):
            log.info("a sandbox built ahead of its call failed: %s", task.exception())
