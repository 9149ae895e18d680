"""Every action the worker can run, in one table (DESIGN.md §4)."""

from __future__ import annotations

from typing import Any

from worker.actions import diag, fs_stat
from worker.registry import ActionSpec, Registry, table

HOST = "workerHost"
DIAG = "workerDiag"


def build(*, diagnostics: bool = False) -> Registry:
    specs: list[ActionSpec[Any, Any]] = [
        ActionSpec(
            HOST,
            "fs_stat",
            fs_stat.FsStatArgs,
            fs_stat.FsStatResult,
            fs_stat.fs_stat,
            "type, size, mode, owner and times of a path inside the roots",
        ),
    ]
    if diagnostics:
        specs.append(
            ActionSpec(
                DIAG,
                "probe",
                diag.ProbeArgs,
                diag.ProbeResult,
                diag.probe,
                "sleep, mark a side effect, echo the blob (tests and benchmarks)",
                takes_blob=True,
            )
        )
    return table(*specs)
