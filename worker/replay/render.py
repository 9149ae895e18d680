"""What a person sees of a replay: a progress bar while it runs (on a terminal,
on stderr), then a summary table and the diff of every step that fell short."""

from __future__ import annotations

import statistics
import time
from typing import Final, TextIO

from worker.core.approvals import inert
from worker.replay.expect import render as render_diff
from worker.replay.runner import FAILING, Report, StepReport

BAR_WIDTH: Final = 30
REDRAW_EVERY_S: Final = 0.1
# Up to this many steps the summary lists each one; past it, one row per action.
EACH_STEP_UP_TO: Final = 40


class ProgressBar:
    """`[#######.......]  12/40  3 failed  workerHost.fs_stat`, redrawn in place at
    most every REDRAW_EVERY_S (drawing costs more than a fast step)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.failed = 0
        self._drawn_at = 0.0
        self._width = 0

    def __call__(self, done: int, total: int, step: StepReport) -> None:
        if step.outcome in FAILING:
            self.failed += 1
        now = time.monotonic()
        if done < total and now - self._drawn_at < REDRAW_EVERY_S:
            return
        self._drawn_at = now
        filled = BAR_WIDTH * done // total if total else BAR_WIDTH
        failed = f"  {self.failed} failed" if self.failed else ""
        text = f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done:>{len(str(total))}}/{total}"
        text += f"{failed}  {inert(step.action, 200)}"
        self.stream.write("\r" + text.ljust(self._width))
        self._width = len(text)
        self.stream.flush()

    def close(self) -> None:
        if self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()


def _row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return [_row(head, widths), _row(["-" * w for w in widths], widths)] + [
        _row(r, widths) for r in rows
    ]


def _answer_cells(step: StepReport) -> list[str]:
    a = step.answer
    if a is None:
        return ["", "", ""]
    return [
        a.status + (" (replayed)" if a.replayed else ""),
        inert(a.error_code, 80) if a.error_code else "",  # a hub's to choose
        f"{step.duration_ms:.1f}",
    ]


def summary(report: Report) -> str:
    lines = [f"replay of {report.script} ({report.mode})", ""]
    if len(report.steps) <= EACH_STEP_UP_TO:
        head = ["line", "step", "action", "outcome", "status", "error", "ms"]
        rows = [
            [str(s.line), str(s.index or ""), inert(s.action, 200), s.outcome, *_answer_cells(s)]
            for s in report.steps
        ]
        if report.mode == "dry-run":
            head, rows = head[:4], [r[:4] for r in rows]
    else:
        head = ["action", "steps", "passed", "failed", "other", "p50 ms", "max ms"]
        rows = []
        for action in sorted({s.action for s in report.steps}):
            of = [s for s in report.steps if s.action == action]
            ms = [s.duration_ms for s in of if s.answer is not None]
            passed = sum(1 for s in of if s.outcome in ("passed", "valid"))
            failed = sum(1 for s in of if s.outcome in FAILING)
            rows.append(
                [
                    inert(action, 200),
                    str(len(of)),
                    str(passed),
                    str(failed),
                    str(len(of) - passed - failed),
                    f"{statistics.median(ms):.2f}" if ms else "",
                    f"{max(ms):.2f}" if ms else "",
                ]
            )
    lines += _table(head, rows)
    problems = [s for s in report.steps if s.outcome in FAILING]
    if problems:
        lines += ["", "what fell short:"]
    for s in problems:
        note = f" ({inert(s.note)})" if s.note else ""
        lines.append(f"  line {s.line}: {inert(s.action, 200)}{note}: {s.outcome}")
        lines += [f"    {inert(p)}" for p in s.problems]
        if s.mismatches:
            lines.append(render_diff(s.mismatches, s.answer))
    counts = ", ".join(
        f"{report.count(o)} {o.replace('_', ' ')}"
        for o in ("passed", "failed", "malformed", "not_run", "valid", "invalid")
        if report.count(o)
    )
    rate = ""
    ran = sum(1 for s in report.steps if s.answer is not None)
    if ran and report.seconds > 0:
        rate = f", {ran / report.seconds:,.0f} steps/s"
    lines += ["", f"{len(report.steps)} steps: {counts or 'none'} in {report.seconds:.2f} s{rate}"]
    if report.stopped:
        lines.append(f"the replay stopped: {inert(report.stopped, 1000)}")
    return "\n".join(lines)
