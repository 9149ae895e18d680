"""`agentworker --help` answers without loading the heavy parts (grpc, httpx, pydantic).

The probe runs the installed command's own entry point (ui.launch.main), as a
person typing `agentworker --help` would."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from worker.cli.main import parser

HEAVY = ("grpc", "httpx", "pydantic", "google.protobuf", "textual")

# Standard modules and parts of the worker `--help` has no use for, each costing
# milliseconds at every start (issue 12: `--help` at once).
SLOW_FOR_HELP = ("asyncio", "ssl", "ctypes", "subprocess", "sandbox", "worker.errors")

_PROBE = """
import contextlib, io, json, sys
from ui.launch import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    main()
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {heavy})))
"""


def _loaded_by(*argv: str, heavy: tuple[str, ...] = HEAVY) -> list[str]:
    probe = _PROBE.format(heavy={name.split(".")[0] for name in heavy})
    done = subprocess.run(
        [sys.executable, "-c", probe, *argv], capture_output=True, text=True, check=True
    )
    loaded: list[str] = json.loads(done.stdout.splitlines()[-1])
    return [m for m in loaded if any(m == h or m.startswith(h + ".") for h in heavy)]


def test_help_imports_neither_grpc_nor_httpx() -> None:
    assert _loaded_by("--help") == []


def test_help_imports_no_event_loop_tls_or_sandbox() -> None:
    assert _loaded_by("--help", heavy=SLOW_FOR_HELP) == []


VERBS = sorted(parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]


@pytest.mark.parametrize("verb", VERBS)
def test_each_verbs_help_imports_nothing_heavy(verb: str) -> None:
    assert _loaded_by(verb, "--help") == []


def test_the_workers_actions_load_no_command_line_client() -> None:
    """Every action imported (as a worker does at start), httpx without its own CLI:
    click, rich and pygments stay out of a headless worker (issue 12: start at once)."""
    probe = (
        "import json, sys; from worker import actions; actions.build(diagnostics=True); "
        "print(json.dumps([m for m in ('click', 'rich', 'pygments', 'httpx._main') "
        "if sys.modules.get(m) is not None]))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == []
