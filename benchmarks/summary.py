"""The summary `make bench` prints last: every goal the benchmarks recorded (through
`benchmarks._common.goal`), one row each, beside its baseline and ratio.

    python benchmarks/summary.py GOALS_FILE

`make bench RUNS=3` runs every benchmark three times into one file; a goal recorded
more than once is then one row of medians: the value, the baseline and the judged
figure (ratio or added) are each the median of the runs, the spread of the judged
figure is shown beside it, and the verdict is the median's, with how many runs met
the goal on their own. A shared machine's one run proves little; three say how much.

Exits 0 whether goals were met or missed: the figures are read by people, and a
missed goal is a finding, not a broken benchmark. Exits 1 if the file holds no row.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import Goal, read_goals


@dataclass(frozen=True)
class Runs:
    """One goal over every run that recorded it (in order)."""

    rows: list[Goal]

    @property
    def first(self) -> Goal:
        return self.rows[0]

    @property
    def value(self) -> float:
        return statistics.median(row.value for row in self.rows)

    @property
    def baseline(self) -> float | None:
        known = [row.baseline for row in self.rows if row.baseline is not None]
        return statistics.median(known) if known else None

    @property
    def judged(self) -> float:
        return statistics.median(row.judged for row in self.rows)

    @property
    def met(self) -> bool:
        goal = self.first
        return self.judged >= goal.limit if goal.at_least else self.judged <= goal.limit

    @property
    def met_runs(self) -> int:
        return sum(row.met for row in self.rows)


def grouped(rows: list[Goal]) -> list[Runs]:
    """The rows of each (bench, figure), in the order each was first recorded."""
    runs: dict[tuple[str, str], list[Goal]] = {}
    for row in rows:
        runs.setdefault((row.bench, row.figure), []).append(row)
    return [Runs(group) for group in runs.values()]


def _cells(runs: Runs) -> list[str]:
    goal = runs.first
    unit = goal.unit
    baseline = "" if runs.baseline is None else f"{runs.baseline:,.2f}{unit} {goal.baseline_name}"
    judged = [row.judged for row in runs.rows]
    if goal.on == "added":
        ratio = f"{runs.judged:+.2f}{unit}"
        spread = f" [{min(judged):+.2f}..{max(judged):+.2f}]"
    elif goal.on == "ratio" or goal.ratio is not None:
        ratios = [row.ratio for row in runs.rows if row.ratio is not None]
        ratio = f"{statistics.median(ratios):.2f}x"
        spread = f" [{min(ratios):.2f}..{max(ratios):.2f}]"
    else:
        ratio = ""
        spread = f" [{min(judged):,.2f}..{max(judged):,.2f}]"
    verdict = "met" if runs.met else "MISSED"
    count = len(runs.rows)
    if count > 1:
        verdict += f" ({runs.met_runs} of {count} runs)"
        ratio = ratio + spread if ratio else spread.strip()
    return [
        goal.bench,
        goal.figure,
        f"{runs.value:,.2f}{unit}",
        baseline,
        ratio,
        goal.goal_text,
        verdict,
    ]


def table(rows: list[Goal]) -> str:
    goals = grouped(rows)
    runs = max(len(group.rows) for group in goals)
    head = ["bench", "figure", "value", "raw baseline (same run)", "ratio or +", "goal", ""]
    if runs > 1:
        head[2:5] = ["median value", "median raw baseline", "median ratio or + [spread]"]
    cells = [head, *(_cells(group) for group in goals)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(head))]
    right = {2, 4}  # numbers line up on the right

    def line(values: list[str]) -> str:
        parts = [
            v.rjust(w) if i in right else v.ljust(w)
            for i, (v, w) in enumerate(zip(values, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    out = [line(head), "  ".join("-" * w for w in widths)]
    out += [line(values) for values in cells[1:]]
    met = sum(group.met for group in goals)
    over = f" (at the median of {runs} runs)" if runs > 1 else ""
    out.append(f"\n{met} of {len(goals)} goals met{over}")
    return "\n".join(out)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} GOALS_FILE")
    rows = read_goals(Path(sys.argv[1]))
    if not rows:
        sys.exit(f"no goal was recorded in {sys.argv[1]}")
    print("\nsummary: every goal of the benchmarks, beside its raw baseline from the same run\n")
    print(table(rows))


if __name__ == "__main__":
    main()
