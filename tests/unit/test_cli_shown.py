"""What the CLI prints from outside (a server's ids, an agent's args, a kill's reason)
reaches the terminal inert: no escape sequence, bidi override or line break of its
own; JSON output stays JSON that reads back the same."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from worker.cli._common import json_shown, shown
from worker.cli.main import main
from worker.core.ledger import State
from worker.core.telemetry import Telemetry
from worker.wire.proto import agentworker_pb2 as pb

# Retitle the window, clear the screen, a CSI in its one-byte form, a right-to-left
# override, a line separator and a plain line break to draw a row of its own.
HOSTILE = "p1\x1b]0;pwned\x07\x1b[2J\x9b31m\u202eevil\u2028x\n2026-01-01 ok\U000e0041"
RAW = ("\x1b", "\x07", "\x9b", "\u202e", "\u2028", "\n2026", "\U000e0041")


def _no_raw(out: str) -> None:
    for char in RAW:
        assert char not in out, (char, out)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A state.db holding what a hostile server could have put there."""
    state = State(tmp_path / "state.db")
    telemetry = Telemetry(state.connection)
    telemetry.record_many(
        [
            pb.Invocation(
                invocation_id="i1",
                correlation_id="c1",
                plan_id=HOSTILE,
                agent_id=HOSTILE,
                surface="workerHost",
                action=HOSTILE[:64],
                status="error",
                error_code="validation_error",
                args_preview=HOSTILE,  # as a short invalid args was once kept
                started_unix_ms=int(time.time() * 1000),
            )
        ]
    )
    telemetry.audit("kill", plan_id=HOSTILE, agent_id=HOSTILE, detail={"reason": HOSTILE})
    state.add_grant(HOSTILE, "workerHost.fs_stat", HOSTILE, None, granted_by="ui")
    state.kill_plan(HOSTILE, HOSTILE, "server")
    state.close()
    return tmp_path


@pytest.mark.parametrize(
    "verb",
    [
        ["telemetry", "tail"],
        ["telemetry", "query"],
        ["audit", "tail"],
        ["audit", "query"],
        ["grants"],
        ["killed"],
    ],
)
def test_a_verb_prints_a_servers_text_inert(
    home: Path, capsys: pytest.CaptureFixture[str], verb: list[str]
) -> None:
    assert main(["--home", str(home), *verb]) == 0
    out = capsys.readouterr().out
    _no_raw(out)
    assert "\\e]0;pwned" in out  # shown, as the TUI shows it


@pytest.mark.parametrize(
    "verb",
    [
        ["telemetry", "tail", "--json"],
        ["telemetry", "query", "--json"],
        ["telemetry", "export"],
        ["audit", "query", "--json"],
    ],
)
def test_json_lines_are_inert_and_read_back_the_same(
    home: Path, capsys: pytest.CaptureFixture[str], verb: list[str]
) -> None:
    assert main(["--home", str(home), *verb]) == 0
    out = capsys.readouterr().out
    _no_raw(out)
    (line,) = out.splitlines()
    assert json.loads(line)["plan_id"] == HOSTILE


def test_json_shown_is_the_same_json_with_what_a_terminal_would_act_on_escaped() -> None:
    value = {"id": HOSTILE, "name": "café 字 ✓", "n": [1, 2.5, None]}
    text = json_shown(value, indent=2)
    _no_raw(text)
    assert json.loads(text) == value
    assert "café 字 ✓" in text  # readable text stays readable
    assert "\\u202e" in text and "\\udb40\\udc41" in text  # an astral one as a pair
    assert shown("plain ascii") == "plain ascii"


def test_a_dry_runs_report_shows_a_scripts_text_inert(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A script may come from someone else: its notes and its malformed lines are
    printed in the report."""
    script = tmp_path / "s.jsonl"
    step = {"action": "fs_stat", "args": {"path": "."}, "note": HOSTILE}
    bad = {"action": HOSTILE, "args": {}}
    script.write_text(json.dumps(step) + "\n" + json.dumps(bad) + "\n")
    main(["--home", str(tmp_path), "replay", "--dry-run", str(script)])
    out = capsys.readouterr().out
    _no_raw(out)
    assert "line 2" in out


def test_log_lines_show_a_servers_text_inert() -> None:
    import logging

    from worker.cli._common import LOG_FORMAT, ShownFormatter

    record = logging.LogRecord(
        "w", logging.WARNING, __file__, 1, "plan %s, %d calls:\n  next", (HOSTILE, 3), None
    )
    line = ShownFormatter(LOG_FORMAT).format(record)
    _no_raw(line.replace("\n  next", ""))
    assert line.endswith(f"plan {shown(HOSTILE)}, 3 calls:\n  next")  # ours stay ours
