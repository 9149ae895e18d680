"""`agentworker --help` answers without loading the heavy parts (grpc, httpx, pydantic),
and `agentworker call` loads only what a call needs (grpc, protobuf, the token), with
protobuf loading while the channel connects and json while the Dispatch is out.

The probe runs the installed command's own entry point (ui.launch.main), as a
person typing the command would."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cluster import Cluster
from worker.cli import main as cli_main
from worker.cli.main import parser

HEAVY = ("grpc", "httpx", "pydantic", "google.protobuf", "textual")

# Standard modules and parts of the worker `--help` has no use for, each costing
# milliseconds at every start (issue 12: `--help` at once).
# shutil (which loads bz2 and lzma) is what argparse asks the terminal's width of.
SLOW_FOR_HELP = ("asyncio", "ssl", "ctypes", "subprocess", "sandbox", "worker.errors", "shutil")

_PROBE = """
import contextlib, io, json, sys
from ui.launch import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    main()
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {heavy})))
"""


def _loaded_by(
    *argv: str, heavy: tuple[str, ...] = HEAVY, env: dict[str, str] | None = None
) -> list[str]:
    probe = _PROBE.format(heavy={name.split(".")[0] for name in heavy})
    done = subprocess.run(
        [sys.executable, "-c", probe, *argv], capture_output=True, text=True, check=True, env=env
    )
    loaded: list[str] = json.loads(done.stdout.splitlines()[-1])
    return [m for m in loaded if any(m == h or m.startswith(h + ".") for h in heavy)]


def test_help_imports_neither_grpc_nor_httpx() -> None:
    assert _loaded_by("--help") == []


def test_help_imports_no_event_loop_tls_or_sandbox() -> None:
    assert _loaded_by("--help", heavy=SLOW_FOR_HELP) == []


@pytest.mark.parametrize("columns", [None, "100", "0", "-3", "wide"])
@pytest.mark.parametrize("terminal", [(132, 40), (0, 0), OSError])
def test_help_is_as_wide_as_shutil_says(
    monkeypatch: pytest.MonkeyPatch, columns: str | None, terminal: tuple[int, int] | type
) -> None:
    """The parsers' width comes without shutil, and is the width shutil would give."""
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)

    def get_terminal_size(fd: int = 1) -> os.terminal_size:
        if terminal is OSError:
            raise OSError("not a terminal")
        return os.terminal_size(terminal)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "get_terminal_size", get_terminal_size)
    assert cli_main.terminal_columns() == shutil.get_terminal_size().columns
    assert parser()._get_formatter()._width == shutil.get_terminal_size().columns - 2


VERBS = sorted(parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]


def test_each_verb_is_built_by_the_group_that_adds_it() -> None:
    """main.VERBS (which group to import for a verb) is what the groups add, no more."""
    added = {}
    for name in cli_main.GROUPS:
        sub = argparse.ArgumentParser().add_subparsers()
        cli_main.group(name).add_parsers(sub)
        added.update(dict.fromkeys(sub.choices, name))
    assert added == cli_main.VERBS
    assert sorted(added) == VERBS


@pytest.mark.parametrize(
    ("argv", "verb"),
    [
        (["call", "fs_stat"], "call"),
        (["--home", "call", "up"], "up"),  # --home takes a value: the verb comes after
        (["--home=call", "-v", "status"], "status"),
        (["--hom", "x", "kill", "p"], "kill"),  # an abbreviated option, as argparse reads it
        (["-v", "--help", "call"], None),  # help first: every verb listed
        (["nonsense"], None),  # argparse says which verbs there are
        ([], None),
    ],
)
def test_the_verb_is_found_before_the_parser_is_built(argv: list[str], verb: str | None) -> None:
    assert cli_main.verb_of(argv) == verb


# `call` needs grpc, protobuf, the token and the hub's address: none of the worker,
# its settings' validation, the sandbox or the desktop (issue 12: a call at once).
NOT_FOR_CALL = (
    "pydantic",
    "httpx",
    "textual",
    "sandbox",
    "worker.errors",
    "worker.config",
    "worker.core",
    "worker.actions",
    "worker.app",
    # --blob-out's temporary file and the hub's new token: their modules (tempfile
    # with random; secrets with hashlib and hmac) load only when those run.
    "tempfile",
    "random",
    "secrets",
    "hmac",
    # argparse's width without shutil (bz2, lzma); Paths, Keepalive and ControlClient
    # made without dataclasses; Dispatch sent without the generated stub module
    # (grpc._utilities, for its version check): each a millisecond or more.
    "shutil",
    "dataclasses",
    "worker.wire.proto.agentworker_pb2_grpc",
)


# What `call` does in order, noted by the probe below: the channel is asked to connect
# before the generated protobuf module loads (gRPC's threads connect meanwhile), and
# the Dispatch is under way before json (for the answer) loads.
_CALL_ORDER_PROBE = """
import contextlib, io, sys
import grpc.aio._channel as aio
from ui.launch import main

events = []

def note(event):
    if event not in events:
        events.append(event)

class Watch:
    def find_spec(self, name, path=None, target=None):
        if name in ("json", "worker.wire.proto.agentworker_pb2"):
            note("import " + name)

def get_state(self, try_to_connect=False, _real=aio.Channel.get_state):
    if try_to_connect:
        note("connect")
    return _real(self, try_to_connect)

def call(self, *args, _real=aio.UnaryUnaryMultiCallable.__call__, **kwargs):
    note("Dispatch")
    return _real(self, *args, **kwargs)

# `call` sends Dispatch as a stream of one request, to read its headers early
def streamed(self, *args, _real=aio.StreamUnaryMultiCallable.__call__, **kwargs):
    note("Dispatch")
    return _real(self, *args, **kwargs)

class Out(io.StringIO):
    def write(self, text):
        note("output")
        return super().write(text)

sys.meta_path.insert(0, Watch())
aio.Channel.get_state, aio.UnaryUnaryMultiCallable.__call__ = get_state, call
aio.StreamUnaryMultiCallable.__call__ = streamed
out = Out()
with contextlib.redirect_stdout(out):
    code = main()
print(code, *events, sep="|")
"""


@pytest.mark.parametrize("action", ["workerHost.fs_stat", "fs_stat"])
def test_call_imports_only_what_a_call_needs(live: Cluster, action: str) -> None:
    argv = ("call", action, '{"path": "."}', "--agent", "tester")
    assert _loaded_by(*argv, heavy=NOT_FOR_CALL, env=live.env) == []
    # and in an order that lets the waits overlap the loading
    ordered = subprocess.run(
        [sys.executable, "-c", _CALL_ORDER_PROBE, *argv],
        env=live.env,
        capture_output=True,
        text=True,
    )
    assert ordered.stdout.splitlines()[-1].split("|") == [
        "0",
        "connect",
        "import worker.wire.proto.agentworker_pb2",
        "Dispatch",
        "import json",
        "output",
    ], ordered
    # and the call itself went through
    done = subprocess.run(
        [sys.executable, "-m", "worker", *argv], env=live.env, capture_output=True, text=True
    )
    assert done.returncode == 0 and json.loads(done.stdout)["status"] == "ok", done


@pytest.mark.parametrize("verb", VERBS)
def test_each_verbs_help_imports_nothing_heavy(verb: str) -> None:
    assert _loaded_by(verb, "--help") == []


def test_the_workers_actions_load_no_http_client_until_a_fetch() -> None:
    """Every action imported (as a worker does at start): httpx, the largest import of
    a worker's start, loads on the first http_fetch (issue 12: start at once), and
    click, rich and pygments (httpx's command line) never."""
    probe = (
        "import json, sys; from worker import actions; actions.build(diagnostics=True); "
        "print(json.dumps([m for m in ('httpx', 'httpcore', 'click', 'rich', 'pygments') "
        "if sys.modules.get(m) is not None]))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == []


def test_a_worker_without_sandbox_mode_loads_neither_its_workbench_nor_an_idna_codec(
    tmp_path: Path,
) -> None:
    """What `up` and `run` do before READY, in a fresh process: the workbench (sandbox
    mode's actions) loads only with --sandbox, the hub's check that its address is free
    resolves an ASCII name without Python's IDNA codec, and difflib waits for a key name
    to suggest (each a few ms of every start)."""
    probe = (
        "import json, sys; from pathlib import Path; from worker import app; "
        "from worker.config import load, Paths; paths = Paths.at(Path(sys.argv[1])); "
        "paths.ensure(); app.build_dispatcher(paths, load(paths)).close(); "
        "assert app._address_taken('127.0.0.1:1') is False; "
        "assert app._address_taken('localhost:1') is False; "
        "print(json.dumps([m for m in ('worker.actions.workbench', 'encodings.idna', "
        "'difflib', 'textual', 'ui') if m in sys.modules]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


@pytest.mark.parametrize(("verb", "collecting"), [("status", False), ("grants", True)])
def test_the_command_runs_a_brief_verb_without_the_collector_and_freezes_it_after(
    tmp_path: Path, verb: str, collecting: bool
) -> None:
    """The installed command's way in (worker.cli.main.entry): a brief verb (a question
    to the hub) runs without the cyclic collector, another keeps it, and after either
    the collector is left nothing to search at the exit (issue 12: about 10 ms of
    `call` while it runs, 20 ms after it has answered). `main` touches neither, as
    tests call it in-process."""
    probe = (
        "import gc; from ui.launch import main; from worker.cli.main import main as cli_main; "
        "cli_main(['status']); untouched = gc.isenabled(), gc.get_freeze_count(); main(); "
        "print(*untouched, gc.isenabled(), gc.get_freeze_count() > 0)"
    )
    env = {**os.environ, "AGENTWORKER_HOME": str(tmp_path)}  # no hub: `status` says so
    done = subprocess.run(
        [sys.executable, "-c", probe, verb], env=env, capture_output=True, text=True
    )
    assert done.stdout.splitlines()[-1].split() == ["True", "0", str(collecting), "True"], done


def test_the_brief_verbs_are_verbs() -> None:
    assert cli_main.BRIEF.issubset(VERBS)


def test_up_builds_without_the_collector_and_freezes_what_it_built(tmp_path: Path) -> None:
    """`up` imports and builds its hub and worker with the cyclic collector off, then
    freezes what that made and collects again from there (worker.memory.settle):
    about 100 collections of its start (issue 12: READY at once). The probe stops
    `up` at that point, as ctrl-C would."""
    probe = (
        "import gc; from worker import memory; from worker.cli.main import main\n"
        "seen = []\n"
        "def settle():\n"
        "    seen.append(gc.isenabled()); real(); seen.append(gc.isenabled())\n"
        "    raise KeyboardInterrupt\n"
        "real, memory.settle = memory.settle, settle\n"
        "code = main(['up', '--headless'])\n"
        "print(code, *seen, gc.get_freeze_count() > 0)\n"
    )
    env = {**os.environ, "AGENTWORKER_HOME": str(tmp_path)}
    (tmp_path / "config.toml").write_text('[hub]\nlisten = "127.0.0.1:0"\n')
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert done.stdout.splitlines()[-1].split() == ["130", "False", "True", "True"], done
