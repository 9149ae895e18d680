"""What a person sees of a replay: the progress bar redrawn in place, the summary
table (per step, or per action for a long script) and the JSON report."""

from __future__ import annotations

import io

from worker.replay.expect import Answer, Mismatch
from worker.replay.render import EACH_STEP_UP_TO, ProgressBar, summary
from worker.replay.runner import Outcome, Report, StepReport


def _step(line: int, outcome: Outcome = "passed", action: str = "workerHost.fs_stat") -> StepReport:
    answer = Answer("ok", None, None, {"size": 1}, b"", replayed=False)
    return StepReport(line, line, action, outcome, f"replay-{line}", answer=answer)


def test_the_progress_bar_draws_in_place_and_clears_itself() -> None:
    stream = io.StringIO()
    bar = ProgressBar(stream)
    bar(1, 2, _step(1, "failed"))
    bar(2, 2, _step(2))
    drawn = stream.getvalue()
    assert drawn.startswith("\r[") and "2/2" in drawn and "1 failed" in drawn
    assert "\n" not in drawn
    bar.close()
    assert stream.getvalue().endswith("\r")


def test_a_short_script_is_summarised_step_by_step_with_each_diff() -> None:
    failed = _step(3, "failed")
    failed.mismatches = [Mismatch("result.size", 2, 1)]
    report = Report("s.jsonl", "in-process", [_step(1), failed], seconds=0.5)
    text = summary(report)
    assert "line  step  action" in text
    assert "line 3: workerHost.fs_stat: failed\n    result.size\n      - expected: 2" in text
    assert text.endswith("2 steps: 1 passed, 1 failed in 0.50 s, 4 steps/s")


def test_a_long_script_is_summarised_per_action() -> None:
    steps = [_step(i, action="workerHost.fs_stat") for i in range(1, EACH_STEP_UP_TO + 1)]
    steps += [_step(100, "malformed", "?"), _step(101, action="workerHost.fs_read")]
    text = summary(Report("s.jsonl", "hub 127.0.0.1:1", steps, seconds=1.0))
    header = next(line for line in text.splitlines() if line.startswith("action"))
    assert header.split() == [
        "action",
        "steps",
        "passed",
        "failed",
        "other",
        "p50",
        "ms",
        "max",
        "ms",
    ]
    fs_stat = next(line for line in text.splitlines() if line.startswith("workerHost.fs_stat"))
    assert fs_stat.split()[1:5] == [str(EACH_STEP_UP_TO), str(EACH_STEP_UP_TO), "0", "0"]
    assert "line 100: ?: malformed" in text


def test_the_json_report_counts_outcomes_and_keeps_each_step() -> None:
    report = Report("s.jsonl", "dry-run", [_step(1, "valid"), _step(2, "invalid")], seconds=0)
    data = report.to_json()
    assert data["ok"] is False
    assert data["counts"] == {"valid": 1, "invalid": 1}
    assert [s["line"] for s in data["steps"]] == [1, 2]


def test_a_hubs_error_code_is_drawn_inert() -> None:
    """The code comes from whichever hub answered: one that names a terminal escape
    must not clear or recolour the person's screen (review25)."""
    step = _step(1, "failed")
    step.answer = Answer("error", "\x1b[2Jgone\x07", "no", None, b"", replayed=False)
    text = summary(Report("s.jsonl", "hub 127.0.0.1:1", [step], seconds=0.5))
    assert "\x1b" not in text and "\x07" not in text
    assert "\\e[2Jgone\\x07" in text
