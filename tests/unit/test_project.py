"""Project-wide rules: generated code is fresh, and the headless core never loads the TUI."""

from __future__ import annotations

import ast
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


MUTATORS = frozenset(
    {"append", "extend", "insert", "add", "update", "setdefault", "pop", "popitem", "clear"}
)
MUTABLE_CALLS = frozenset({"dict", "list", "set", "bytearray", "defaultdict", "deque"})


def _module_level_containers(tree: ast.Module) -> dict[str, ast.AnnAssign | ast.Assign]:
    found: dict[str, ast.AnnAssign | ast.Assign] = {}
    for node in tree.body:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        value = node.value
        mutable = isinstance(
            value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
        ) or (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id in MUTABLE_CALLS
        )
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            if mutable and isinstance(target, ast.Name) and target.id != "__all__":
                found[target.id] = node
    return found


def test_no_module_level_mutable_state() -> None:
    """State belongs to an object its owner holds (docs/architecture.md, "Owned state"):
    no `global` statement, and a module-level dict, list or set is a constant table,
    declared Final and never changed in place."""
    problems = []
    for package in ("worker", "sandbox", "allowlist", "ui"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if "proto" in path.parts:
                continue
            where = path.relative_to(ROOT)
            tree = ast.parse(path.read_text(), str(where))
            tables = _module_level_containers(tree)
            for name, node in tables.items():
                annotation = node.annotation if isinstance(node, ast.AnnAssign) else None
                if annotation is None or "Final" not in ast.unparse(annotation):
                    problems.append(f"{where}:{node.lineno}: {name} is not declared Final")
            for node in ast.walk(tree):
                if isinstance(node, ast.Global):
                    problems.append(f"{where}:{node.lineno}: global {', '.join(node.names)}")
                elif (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id in tables
                    and node.func.attr in MUTATORS
                ):
                    problems.append(f"{where}:{node.lineno}: {node.func.value.id} is changed")
                elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                    targets = node.targets if not isinstance(node, ast.AugAssign) else [node.target]
                    for target in targets:
                        if (
                            isinstance(target, ast.Subscript)
                            and isinstance(target.value, ast.Name)
                            and target.value.id in tables
                        ):
                            problems.append(f"{where}:{node.lineno}: {target.value.id} is changed")
    assert problems == []
