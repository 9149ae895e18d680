"""Every action the worker can run, assembled from the modules that implement them.

Each folder here is a surface (`host/` is `workerHost`, `computer/` is
`workerComputer`); each public module in it that implements an action declares
`SPEC = ActionSpec(...)` beside its code. `build` imports the public modules of
every surface and collects their SPECs, so adding an action is adding one module
(docs/architecture.md, "Adding an action"). Modules whose names start with `_`
are private (a desktop backend for another operating system, say), and packages
inside a surface hold what an action loads when it first runs (host/fetching/):
neither is imported here.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from worker.core.registry import ActionSpec, Registry, table


def surfaces() -> Iterator[ModuleType]:
    """The surface packages under worker/actions/, by name."""
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.ispkg and not info.name.startswith("_"):
            yield importlib.import_module(f"{__name__}.{info.name}")


def modules(surface: ModuleType) -> Iterator[ModuleType]:
    """A surface's public modules, imported, by name."""
    for info in sorted(pkgutil.iter_modules(surface.__path__), key=lambda i: i.name):
        if not info.ispkg and not info.name.startswith("_"):
            yield importlib.import_module(f"{surface.__name__}.{info.name}")


def specs() -> list[ActionSpec[Any, Any]]:
    """Every SPEC declared under worker/actions/, diagnostics included."""
    found: list[ActionSpec[Any, Any]] = []
    for surface in surfaces():
        for module in modules(surface):
            spec = getattr(module, "SPEC", None)
            if isinstance(spec, ActionSpec):
                found.append(spec)
    return found


def build(*, diagnostics: bool = False) -> Registry:
    """The registry a worker serves: every action, the diagnostic ones only if asked."""
    return table(*(spec for spec in specs() if diagnostics or not spec.diagnostic))
