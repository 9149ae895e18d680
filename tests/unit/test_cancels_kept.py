"""A cancel of a task waiting with a bound is never lost when what it waits for comes in
the same turns of the loop as the cancel.

On Python 3.11 `asyncio.wait_for` returned the awaited thing's outcome when the task
was cancelled as that thing ended (cpython gh-86296; 3.12 rebuilt wait_for on
asyncio.timeout): the task went on as if never cancelled. The loops below are ended
by a cancel alone, and a caller awaits them (the replay's watcher, the hub's stop
awaiting an in-process worker's stream), so a lost cancel left it hanging; the kill
check ran on after the worker had stopped. Each test wakes the wait, then cancels the
task 0..11 turns of the loop later: the turns where wait_for lost it are among them.
Product code bounds its waits with asyncio.timeout; pyproject's banned-api keeps
wait_for out of it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.hub_inproc import hub_in_process
from worker import app
from worker.config import Config, Paths
from worker.core.pipeline import Dispatcher
from worker.replay.targets import PersonsStop, _watch_the_person
from worker.wire.inproc import _Context
from worker.wire.proto import agentworker_pb2 as pb

TURNS = range(12)


@pytest.fixture
def dispatcher(tmp_path: Path) -> Iterator[Dispatcher]:
    built = app.build_dispatcher(Paths(config_dir=tmp_path, data_dir=tmp_path), Config())
    try:
        yield built
    finally:
        built.close()


async def _kept(
    run: Callable[[], Awaitable[Any]],
    wake: Callable[[], None],
    went_on: asyncio.Event,
    turns: int,
) -> bool:
    """Whether a cancel `turns` turns of the loop after `wake` ended `run`: False when
    `run` went on past its wait after the cancel (it set `went_on`, or ended otherwise)
    instead. True too when `run` had ended by then: there was no cancel to lose."""
    task = asyncio.ensure_future(run())
    for _ in range(3):  # to its wait
        await asyncio.sleep(0)
    assert not task.done()
    wake()
    for _ in range(turns):
        await asyncio.sleep(0)
    if task.done():
        return True
    task.cancel()
    went_on.clear()  # a pass before the cancel is no matter: one after it is
    on = asyncio.create_task(went_on.wait())
    await asyncio.wait({task, on}, return_when=asyncio.FIRST_COMPLETED)
    on.cancel()
    kept = task.cancelled()
    if not task.done():
        task.cancel()  # back in its wait now, where a cancel is not lost
    with contextlib.suppress(asyncio.CancelledError, Exception):  # cancelled, or how it went on
        await task
    return kept


def test_the_replays_watch_of_the_person_ends_when_cancelled_as_a_pause_comes(
    tmp_path: Path, dispatcher: Dispatcher
) -> None:
    """The replay cancels its watch of the person's stop after its last step, then
    awaits it: a cancel lost as a pause came left the replay hanging there."""
    switch = dispatcher.pause
    assert switch is not None
    stop = PersonsStop(tmp_path / "person", dispatcher)
    went_on = asyncio.Event()
    bring_in = stop.bring_in

    def looked() -> None:  # the watch's next look: it went on past its wait
        went_on.set()
        bring_in()

    stop.bring_in = looked  # type: ignore[method-assign]

    async def scenario() -> list[int]:
        lost = []
        for turns in TURNS:
            if not await _kept(
                lambda: _watch_the_person(dispatcher, stop),
                lambda: switch.stop("a test", "the person"),
                went_on,
                turns,
            ):
                lost.append(turns)
        return lost

    assert asyncio.run(scenario()) == []


def test_the_workers_kill_check_ends_when_cancelled_as_it_is_nudged(
    dispatcher: Dispatcher,
) -> None:
    """`agentworker kill` nudges the worker (SIGUSR1) as it stops: its kill check, once
    cancelled, must not run on against a closed ledger."""
    nudged, went_on = asyncio.Event(), asyncio.Event()
    enforce_kills = dispatcher.enforce_kills

    def enforced() -> int:  # the check's next pass: it went on past its wait
        went_on.set()
        return enforce_kills()

    dispatcher.enforce_kills = enforced  # type: ignore[method-assign]

    async def scenario() -> list[int]:
        lost = []
        for turns in TURNS:
            if not await _kept(
                lambda: app._enforce_kills(dispatcher, nudged), nudged.set, went_on, turns
            ):
                lost.append(turns)
        return lost

    assert asyncio.run(scenario()) == []


class _OneMessage:
    """The in-process worker's side of its stream (the far side of the hub's handler):
    one message, sent when the test says."""

    def __init__(self) -> None:
        self.sent: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()

    def __aiter__(self) -> _OneMessage:
        return self

    async def __anext__(self) -> list[Any]:
        return await self.sent


def test_the_hubs_first_read_of_its_in_process_worker_keeps_a_cancel(tmp_path: Path) -> None:
    """The hub's stop cancels the stream handlers of `up`'s own worker and awaits them
    (LocalStreams.stop). A cancel that came as the worker's first message was read was
    lost: the handler went on to take the message (here one it refuses, so that it
    ends; a Hello would have begun a session the stop then waited on)."""

    async def scenario() -> list[int]:
        lost = []
        async with hub_in_process(tmp_path / "home") as running:
            for turns in TURNS:
                worker = _OneMessage()

                async def serve(worker: _OneMessage = worker) -> None:
                    context = _Context(())  # peer(): the in-process worker's
                    async for _ in running.hub.stream(worker, context):  # type: ignore[arg-type]
                        pass

                # Whether it went on shows in how it ended: refused (the message read
                # after the cancel), or cancelled.
                if not await _kept(
                    serve,
                    lambda w=worker: w.sent.set_result([(pb.WorkerMessage(), None)]),  # type: ignore[misc]
                    asyncio.Event(),
                    turns,
                ):
                    lost.append(turns)
        return lost

    assert asyncio.run(scenario()) == []
