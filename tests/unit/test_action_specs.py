"""Every action is declared beside its code, and declares the codes it may answer."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import ModuleType

import pytest

from worker import actions
from worker.core.registry import PIPELINE_CODES, ActionSpec, Outcome
from worker.errors import ErrorCode

MODULES = [module for surface in actions.surfaces() for module in actions.modules(surface)]


def _handlers(module: ModuleType) -> list[str]:
    """Public functions of the module that return an Outcome: the action's handler."""
    return [
        name
        for name, value in vars(module).items()
        if inspect.isfunction(value)
        and value.__module__ == module.__name__
        and not name.startswith("_")
        and str(inspect.signature(value).return_annotation).startswith(Outcome.__name__)
    ]


def _code_literals(module: ModuleType) -> set[str]:
    """The string codes the module's source passes as WorkerError's first argument."""
    tree = ast.parse(Path(inspect.getfile(module)).read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "WorkerError"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.add(node.args[0].value)
    return found


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_a_module_with_a_handler_declares_its_spec(module: ModuleType) -> None:
    handlers = _handlers(module)
    spec = getattr(module, "SPEC", None)
    if not handlers:
        assert spec is None, f"{module.__name__} declares a SPEC but has no handler"
        return
    assert isinstance(spec, ActionSpec), f"{module.__name__} has a handler but no SPEC"
    assert spec.handler.__name__ in handlers
    assert spec.args.__module__ == module.__name__


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_every_code_an_action_module_raises_exists_and_is_declared(module: ModuleType) -> None:
    codes = _code_literals(module)
    assert codes <= set(ErrorCode), f"unknown codes in {module.__name__}"
    spec = getattr(module, "SPEC", None)
    if isinstance(spec, ActionSpec):
        assert codes <= spec.answers, f"{module.__name__} raises codes its SPEC does not declare"
    else:  # a helper: what it raises, some action of its surface must answer
        surface = module.__name__.rsplit(".", 1)[0]
        declared = set(PIPELINE_CODES).union(
            *(s.answers for s in actions.specs() if s.handler.__module__.startswith(surface))
        )
        assert codes <= declared, f"{module.__name__} raises codes no action declares"


def test_every_spec_names_real_codes_and_a_scope_of_its_own() -> None:
    specs = actions.specs()
    assert len({spec.scope for spec in specs}) == len(specs)
    for spec in specs:
        assert all(ErrorCode(code) is code for code in spec.codes), spec.scope
        assert all(value > 0 for value in spec.caps.values()), spec.scope


def test_the_registry_holds_every_action_and_diagnostics_only_when_asked() -> None:
    served = actions.build()
    assert set(served) == {
        "workerHost.exec",
        "workerHost.fs_list",
        "workerHost.fs_read",
        "workerHost.fs_stat",
        "workerHost.fs_write",
        "workerHost.http_fetch",
    } | {s.scope for s in actions.specs() if s.surface not in ("workerHost", "workerDiag")}
    assert "workerDiag.probe" in actions.build(diagnostics=True)
