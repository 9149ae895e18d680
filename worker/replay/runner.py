"""Running a script's steps one after another, and checking each answer.

Tolerant by default: a malformed line or a step whose answer misses its
expectation is recorded with its line number and the run goes on; with
`fail_fast` the first such step ends it (the rest are reported as not run).
`validate` is the dry run: every step and its args checked against the action's
model, nothing sent anywhere.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from worker.core.registry import Registry
from worker.replay.expect import Answer, Mismatch, check
from worker.replay.script import DEFAULT_SURFACE, BlobError, Entry, Malformed, Script
from worker.replay.targets import Target
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.protocol import WORKBENCH_SURFACE

Outcome = Literal["passed", "failed", "malformed", "not_run", "valid", "invalid"]
# The longest a run of steps answered at once holds the event loop (see `replay`).
LOOP_TURN_S = 0.05
# Outcomes that make a run (or a dry run) fail.
FAILING: frozenset[str] = frozenset({"failed", "malformed", "invalid"})


@dataclass
class StepReport:
    line: int
    index: int
    action: str
    outcome: Outcome
    correlation_id: str = ""
    note: str | None = None
    answer: Answer | None = None
    mismatches: list[Mismatch] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # malformed or invalid: why
    duration_ms: float = 0.0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "line": self.line,
            "step": self.index,
            "action": self.action,
            "outcome": self.outcome,
            "correlation_id": self.correlation_id or None,
            "note": self.note,
            "duration_ms": round(self.duration_ms, 3),
        }
        if self.answer is not None:
            out.update(
                status=self.answer.status,
                error_code=self.answer.error_code,
                error_message=self.answer.error_message,
                result=self.answer.result,
                blob_bytes=len(self.answer.blob),
                blob_sha256=self.answer.blob_sha256,
                replayed=self.answer.replayed,
            )
        if self.mismatches:
            out["mismatches"] = [m.to_json() for m in self.mismatches]
        if self.problems:
            out["problems"] = self.problems
        return out


@dataclass
class Report:
    script: str
    mode: str  # "in-process", "hub ADDR" or "dry-run"
    steps: list[StepReport] = field(default_factory=list)
    seconds: float = 0.0
    stopped: str | None = None  # why the person stopped the run (pause, a kill), if so

    def count(self, outcome: str) -> int:
        return sum(1 for s in self.steps if s.outcome == outcome)

    @property
    def ok(self) -> bool:
        return not any(s.outcome in FAILING for s in self.steps)

    def to_json(self) -> dict[str, Any]:
        ran = [s for s in self.steps if s.answer is not None]
        return {
            "script": self.script,
            "mode": self.mode,
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "steps_per_s": round(len(ran) / self.seconds, 1) if self.seconds and ran else None,
            "counts": {
                o: self.count(o)
                for o in ("passed", "failed", "malformed", "not_run", "valid", "invalid")
                if self.count(o)
            },
            "steps": [s.to_json() for s in self.steps],
            **({"stopped": self.stopped} if self.stopped else {}),
        }


Progress = Callable[[int, int, StepReport], None]  # steps done, steps in all, the last


def request_of(entry: Entry) -> pb.ActionRequest:
    surface, name = entry.step.surface_action
    return pb.ActionRequest(
        correlation_id=entry.correlation_id,
        plan_id=entry.plan,
        agent_id=entry.agent,
        task_id=entry.task,
        surface=surface,
        action=name,
        args_json=entry.args_json(),
        timeout_ms=entry.step.timeout_ms or 0,
        attempt=1,
    )


def _malformed(item: Malformed) -> StepReport:
    return StepReport(item.line, item.index, item.action, "malformed", problems=list(item.problems))


def _named(entry: Entry) -> str:
    surface, name = entry.step.surface_action
    return f"{surface}.{name}"


def _not_run(item: Entry | Malformed) -> StepReport:
    if isinstance(item, Entry):
        return StepReport(item.line, item.index, _named(item), "not_run", item.correlation_id)
    return StepReport(item.line, item.index, item.action, "not_run")


async def replay(
    script: Script,
    target: Target,
    *,
    mode: str,
    fail_fast: bool = False,
    progress: Progress | None = None,
    report: Report | None = None,
) -> Report:
    """Run every step of `script` on `target`, in order, one at a time. A `report`
    given is filled as each step ends, so that a caller whose run is interrupted
    (Ctrl-C) still holds what ran (`interrupted` completes it)."""
    if report is None:
        report = Report(script=str(script.path or "-"), mode=mode)
    total = len(script.items)
    begun = time.perf_counter()
    stopped = False
    turn_given = begun
    for item in script.items:
        # A step the worker answers without waiting (fs_stat) gives the loop no turn:
        # a run of such steps held it to the end, and Ctrl-C (a cancel the loop
        # delivers) waited for the last step. A turn each LOOP_TURN_S, not each step:
        # the loop then also flushes the acks, which costs more batched less.
        if time.perf_counter() - turn_given >= LOOP_TURN_S:
            await asyncio.sleep(0)
            turn_given = time.perf_counter()
        if stopped:
            step = _not_run(item)
        elif isinstance(item, Malformed):
            step = _malformed(item)
        else:
            step = await _run_step(item, target)
        report.steps.append(step)
        if step.outcome in FAILING and fail_fast:
            stopped = True
        person_stop = getattr(target, "person_stop", None)
        if person_stop and not stopped:  # paused or killed by the person: no more steps
            stopped = True
            report.stopped = person_stop
            step.outcome = "failed" if step.outcome == "passed" else step.outcome
        report.seconds = time.perf_counter() - begun
        if progress is not None:
            progress(len(report.steps), total, step)
    return report


def interrupted(report: Report, script: Script, why: str) -> Report:
    """`report` of a run stopped mid-way (Ctrl-C): each step it holds no answer for,
    the one under way included, as not run, and `why` as the reason it stopped."""
    report.steps += [_not_run(item) for item in script.items[len(report.steps) :]]
    report.stopped = why
    return report


async def _run_step(entry: Entry, target: Target) -> StepReport:
    if entry.step.wait_ms:  # the script's own pause (`wait_ms`), not a poll
        await asyncio.sleep(entry.step.wait_ms / 1000)
    step = StepReport(entry.line, entry.index, _named(entry), "passed", entry.correlation_id)
    step.note = entry.step.note
    try:
        blob = entry.read_blob()
    except BlobError as exc:
        step.outcome = "malformed"
        step.problems.append(str(exc))
        return step
    begun = time.perf_counter()
    answer = await target.call(request_of(entry), blob)
    step.duration_ms = (time.perf_counter() - begun) * 1000
    step.answer = answer
    step.mismatches = check(entry.expect, answer)
    if step.mismatches:
        step.outcome = "failed"
    return step


# ----------------------------------------------------------------- dry run


def validate(script: Script, registry: Registry) -> Report:
    """Check every step without running it: the line, the action, its args against the
    action's model (as the pipeline parses them) and its blob. A step that expects the
    very error found (unknown_action, validation_error) is as intended: valid."""
    report = Report(script=str(script.path or "-"), mode="dry-run")
    for item in script.items:
        if isinstance(item, Malformed):
            report.steps.append(_malformed(item))
            continue
        step = StepReport(item.line, item.index, _named(item), "valid", item.correlation_id)
        step.note = item.step.note
        code, problems = _args_problems(item, registry)
        if problems and item.expect.error_code != code:
            step.outcome = "invalid"
            step.problems = problems
        report.steps.append(step)
    return report


def _args_problems(entry: Entry, registry: Registry) -> tuple[str, list[str]]:
    name = _named(entry)
    spec = registry.get(name)
    surface, action = entry.step.surface_action
    if spec is None and surface == WORKBENCH_SURFACE:
        # Sandbox mode's actions take the host actions' args (see actions/workbench.py).
        spec = registry.get(f"{DEFAULT_SURFACE}.{action}")
    if spec is None:
        known = ", ".join(sorted(registry))
        return "unknown_action", [f"action: this worker has no {name}; it offers: {known}"]
    problems = []
    if entry.blob_path is not None and not spec.takes_blob:
        problems.append(f"blob: {name} takes no blob")
    try:
        spec.args.model_validate_json(entry.args_json())
    except ValidationError as exc:
        problems.extend(
            f"args.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
            if err["loc"]
            else f"args: {err['msg']}"
            for err in exc.errors(include_url=False, include_input=False)
        )
    return "validation_error", problems
