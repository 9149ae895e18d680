"""workerDiag.probe: a diagnostic action for tests, benchmarks and health checks.

It only exists when `[worker] diagnostics = true`. It can sleep (to exercise
deadlines, cancellation and concurrency), hold until its caller lets it go (a
window a test opens and closes on an event, not on the clock), leave a countable
side effect (to prove a call ran exactly once), and echo its request blob many
times (to produce an oversized result on purpose).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Annotated, Final

from pydantic import Field, StringConstraints

from worker.core.registry import ActionSpec, Args, Context, Outcome, Result
from worker.errors import WorkerError

MarkName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]

# How often a held call looks for its release file: a stat on the loop, cheap.
HOLD_POLL_S: Final = 0.01
# The longest a call is held, as the longest sleep: a hold nobody releases ends with
# `timeout` rather than keeping a slot for as long as the call's own deadline (a day).
HOLD_MAX_S: Final = 600.0


class ProbeArgs(Args):
    sleep_ms: int = Field(default=0, ge=0, le=600_000)
    mark: MarkName | None = None
    # Hold the call (after its mark, before any sleep) until the file
    # `diag/<hold>.release` exists in the data folder: a test makes it when it wants
    # the call to finish. A cancel, kill or deadline stops the wait as any other.
    hold: MarkName | None = None
    blob_repeat: int = Field(default=0, ge=0, le=64)
    # Sleep this long ignoring cancellation, as a misbehaving handler would (tests
    # that a drain still ends within its bound).
    stubborn_ms: int = Field(default=0, ge=0, le=600_000)
    # Block a worker thread this long, as a blocking library call would: a cancel
    # reaches the task, never the thread (tests that a drain ends all the same).
    blocking_ms: int = Field(default=0, ge=0, le=600_000)


class ProbeResult(Result):
    marks: int  # how many times this mark has been made, this call included
    in_flight: int  # calls executing when this one started, itself included


async def probe(ctx: Context, args: ProbeArgs) -> Outcome[ProbeResult]:
    in_flight = ctx.in_flight()
    marks = 0
    if args.mark is not None:
        marks = await asyncio.to_thread(_make_mark, ctx, args.mark)
    if args.hold is not None:
        await _held_until(ctx.data_dir / "diag" / f"{args.hold}.release")
    if args.sleep_ms:
        await asyncio.sleep(args.sleep_ms / 1000)
    if args.stubborn_ms:
        await _sleep_through_cancels(args.stubborn_ms / 1000)
    if args.blocking_ms:
        await asyncio.to_thread(time.sleep, args.blocking_ms / 1000)
    return Outcome(ProbeResult(marks=marks, in_flight=in_flight), blob=ctx.blob * args.blob_repeat)


def _make_mark(ctx: Context, mark: str) -> int:
    folder = ctx.data_dir / "diag"
    folder.mkdir(exist_ok=True)
    fd = os.open(folder / f"{mark}.marks", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, b".")
        os.fsync(fd)
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


async def _held_until(release: Path) -> None:
    # Another process makes the file and no portable event says so (ASYNC110): look
    # for it every 10 ms, one stat of the diagnostics folder each (ASYNC240).
    try:
        async with asyncio.timeout(HOLD_MAX_S):
            while not release.exists():  # noqa: ASYNC110, ASYNC240
                await asyncio.sleep(HOLD_POLL_S)
    except TimeoutError:
        raise WorkerError(
            "timeout", f"held {HOLD_MAX_S:g} s and never released ({release.name})"
        ) from None


async def _sleep_through_cancels(seconds: float) -> None:
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    while (left := until - loop.time()) > 0:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(left)


SPEC: Final = ActionSpec(
    surface="workerDiag",
    name="probe",
    args=ProbeArgs,
    result=ProbeResult,
    handler=probe,
    summary="sleep, hold until released, mark a side effect, echo the blob (tests and benchmarks)",
    takes_blob=True,
    diagnostic=True,
)
