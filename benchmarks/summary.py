"""The summary `make bench` prints last: every goal the benchmarks recorded (through
`benchmarks._common.goal`), one row each, beside its baseline and ratio.

    python benchmarks/summary.py GOALS_FILE

Exits 0 whether goals were met or missed: the figures are read by people, and a
missed goal is a finding, not a broken benchmark. Exits 1 if the file holds no row.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import Goal, read_goals


def _cells(row: Goal) -> list[str]:
    unit = row.unit
    baseline = "" if row.baseline is None else f"{row.baseline:,.2f}{unit} {row.baseline_name}"
    ratio = "" if row.ratio is None else f"{row.ratio:.2f}x"
    if row.on == "added":
        ratio = f"{row.judged:+.2f}{unit}"
    verdict = "met" if row.met else "MISSED"
    return [
        row.bench,
        row.figure,
        f"{row.value:,.2f}{unit}",
        baseline,
        ratio,
        row.goal_text,
        verdict,
    ]


def table(rows: list[Goal]) -> str:
    head = ["bench", "figure", "value", "raw baseline (same run)", "ratio or +", "goal", ""]
    cells = [head, *(_cells(row) for row in rows)]
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
    met = sum(row.met for row in rows)
    out.append(f"\n{met} of {len(rows)} goals met")
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
