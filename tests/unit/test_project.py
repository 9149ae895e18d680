"""Project-wide rules: generated code is fresh, and the headless core never loads the TUI."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("agentworker_pb2.py", "agentworker_pb2.pyi", "agentworker_pb2_grpc.py")


def test_generated_protocol_code_is_fresh(tmp_path: Path) -> None:
    (tmp_path / "worker/wire/proto").mkdir(parents=True)
    shutil.copy(ROOT / "worker/wire/proto/agentworker.proto", tmp_path / "worker/wire/proto")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I.",
            "--python_out=.",
            "--grpc_python_out=.",
            "--pyi_out=.",
            "worker/wire/proto/agentworker.proto",
        ],
        cwd=tmp_path,
        check=True,
    )
    for name in GENERATED:
        fresh = (tmp_path / "worker/wire/proto" / name).read_text()
        committed = (ROOT / "worker/wire/proto" / name).read_text()
        assert fresh == committed, f"worker/wire/proto/{name} is stale: run `make proto`"


def test_headless_modules_never_load_textual_or_ui() -> None:
    probe = (
        "import sys, worker.cli.main, worker.app, worker.hub.server, sandbox, allowlist;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'ui'));"
        "print(','.join(bad))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == ""


def test_every_verb_is_registered_once() -> None:
    from worker.cli import main

    assert len(set(main.GROUPS)) == len(main.GROUPS)
    main.parser()  # argparse refuses a verb added twice
