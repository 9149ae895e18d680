"""docs/architecture.md's worked example is real code: it runs as written."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

from sandbox import Root
from worker.config import Paths
from worker.core.registry import ActionSpec, Context

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def _example(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    (code,) = [block for block in blocks if "SPEC: Final = ActionSpec(" in block]
    module = types.ModuleType("fs_exists_example")
    monkeypatch.setitem(sys.modules, module.__name__, module)  # pydantic resolves names there
    exec(compile(code, str(DOC), "exec"), module.__dict__)  # noqa: S102 - our own doc
    return module


def test_the_worked_example_declares_a_spec_and_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _example(monkeypatch)
    spec = module.SPEC
    assert isinstance(spec, ActionSpec) and spec.scope == "workerHost.fs_exists"
    assert spec.inline, "a plain function: it runs in the turn that received the call"
    (tmp_path / "here.txt").write_text("x")
    ctx = Context(
        correlation_id="c",
        plan_id="p",
        agent_id="a",
        blob=b"",
        roots=[Root(path=tmp_path.resolve(), writable=False)],
        paths=Paths(config_dir=tmp_path, data_dir=tmp_path),
    )
    here = spec.handler(ctx, spec.args(path="here.txt"))
    gone = spec.handler(ctx, spec.args(path="gone.txt"))
    assert here.result.exists and not gone.result.exists
