"""A granted allowlist ask of a python module is bound to what the import system runs
for it from the working folder: its source, its package's files, and the cache it takes
over the source (review23 C5: an "unchecked hash-based" __pycache__/mod.<tag>.pyc,
valid whatever mod.py holds, written by the agent's fs_write alone, ran under a grant of
`python3 -m mod`), and a module a runner imports by name (C6: `python3 -m unittest
tests.test_mod` bound no file at all). Real hub and `agentworker run`, the grant as a
person runs it, the change by the agent's own fs_write."""

from __future__ import annotations

import json
import py_compile
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import Cluster, cluster
from tests.support.policies import PYTHON3_ASKS, exec_config

EVIL = "import pathlib; pathlib.Path('PWNED').write_text('ran unasked')\n"


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Cluster]:
    config = exec_config(tmp_path / "policy", PYTHON3_ASKS)
    with cluster(tmp_path / "home", extra_config=config) as c:
        yield c


def _granted(live: Cluster, argv: list[str]) -> str:
    """The exec of `argv` in the workspace, refused headless, then granted by the
    person for the agent: its args, to call it again."""
    args = json.dumps({"argv": argv, "cwd": str(live.workspace)})
    refused = live.call("workerHost.exec", args)
    assert refused["error"]["code"] == "scope_required", refused
    name = refused["error"]["details"]["needs_approval"]
    granted = live.cli("grant", name, "--agent", "tester")
    assert granted.returncode == 0, granted.stderr
    return args


def _written(live: Cluster, path: str, blob: bytes) -> None:
    """`path` in the workspace written by the agent's fs_write, its folders made."""
    where = str(live.workspace / path)
    args = json.dumps({"path": where, "mode": "overwrite", "make_parents": True})
    answer = live.call("workerHost.fs_write", args, blob=blob)
    assert answer["status"] == "ok", answer


def _unchecked_pyc(tmp_path: Path, source: str) -> bytes:
    """`source` compiled as python's cache of a module, valid whatever the module's
    source holds (PEP 552's unchecked hash)."""
    (tmp_path / "src.py").write_text(source)
    py_compile.compile(
        str(tmp_path / "src.py"),
        cfile=str(tmp_path / "src.pyc"),
        doraise=True,
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )
    return (tmp_path / "src.pyc").read_bytes()


@pytest.mark.parametrize(("module", "folder"), [("mod", ""), ("pkg.mod", "pkg/")])
def test_a_cache_written_beside_a_granted_module_asks_again(
    live: Cluster, tmp_path: Path, module: str, folder: str
) -> None:
    (live.workspace / "pkg").mkdir()
    (live.workspace / "pkg" / "__init__.py").write_text("")
    (live.workspace / f"{folder}mod.py").write_text("print('benign')\n")
    args = _granted(live, ["python3", "-m", module])
    cached = f"{folder}__pycache__/mod.{sys.implementation.cache_tag}.pyc"
    _written(live, cached, _unchecked_pyc(tmp_path, EVIL))
    again = live.call("workerHost.exec", args)
    assert again.get("error", {}).get("code") == "scope_required", again
    assert not (live.workspace / "PWNED").exists()


def test_a_module_a_granted_runner_imports_by_name_asks_again_once_rewritten(
    live: Cluster,
) -> None:
    (live.workspace / "tests").mkdir()
    (live.workspace / "tests" / "__init__.py").write_text("")
    (live.workspace / "tests" / "test_mod.py").write_text("print('benign')\n")
    args = _granted(live, ["python3", "-m", "unittest", "tests.test_mod"])
    _written(live, "tests/test_mod.py", EVIL.encode())
    again: dict[str, Any] = live.call("workerHost.exec", args)
    assert again.get("error", {}).get("code") == "scope_required", again
    assert not (live.workspace / "PWNED").exists()
