"""`make bench RUNS=3`: the summary turns each goal's three rows into one row of
medians, with the spread and how many runs met the goal on their own."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import summary
from benchmarks._common import GOALS_ENV, goal, read_goals


@pytest.fixture
def three_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    goals = tmp_path / "goals.jsonl"
    monkeypatch.setenv(GOALS_ENV, str(goals))
    # Three runs of three goals, as the benchmarks record them: a ratio goal met in
    # two runs of three, a goal on what is added (missed at the median), and a rate.
    for latency, base, added, rate in (
        (2.0, 1.0, 0.5, 900.0),
        (4.0, 1.0, 1.5, 1100.0),
        (2.8, 1.0, 1.2, 1000.0),
    ):
        goal("p50", latency, " ms", 3.0, baseline=base, baseline_name="echo", on="ratio")
        goal("sandbox", 6.0 + added, " ms", 1.0, baseline=6.0, baseline_name="bwrap", on="added")
        goal("rate", rate, " calls/s", 1000.0, at_least=True)
    return goals


def test_each_goal_is_one_row_of_medians_with_the_spread(three_runs: Path) -> None:
    groups = summary.grouped(read_goals(three_runs))
    assert [(g.first.figure, len(g.rows)) for g in groups] == [
        ("p50", 3),
        ("sandbox", 3),
        ("rate", 3),
    ]
    p50, sandbox, rate = groups
    assert (p50.value, p50.judged, p50.met, p50.met_runs) == (2.8, 2.8, True, 2)
    assert (sandbox.judged, sandbox.met, sandbox.met_runs) == (pytest.approx(1.2), False, 1)
    assert (rate.value, rate.met, rate.met_runs) == (1000.0, True, 2)

    text = summary.table(read_goals(three_runs))
    lines = {line.split()[1]: line for line in text.splitlines()[2:] if line.strip()}
    assert "2.80x [2.00..4.00]" in lines["p50"] and "met (2 of 3 runs)" in lines["p50"]
    assert "+1.20 ms [+0.50..+1.50]" in lines["sandbox"]
    assert "MISSED (1 of 3 runs)" in lines["sandbox"]
    assert "1,000.00 calls/s" in lines["rate"] and "[900.00..1,100.00]" in lines["rate"]
    assert "2 of 3 goals met (at the median of 3 runs)" in text


def test_one_run_prints_as_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    goals = tmp_path / "goals.jsonl"
    monkeypatch.setenv(GOALS_ENV, str(goals))
    goal("p50", 2.5, " ms", 3.0, baseline=1.0, baseline_name="echo", on="ratio")
    text = summary.table(read_goals(goals))
    assert "2.50x" in text and "[" not in text and "runs" not in text
    assert "1 of 1 goals met" in text
