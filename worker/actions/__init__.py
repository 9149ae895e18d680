"""Every action the worker can run, in one table (DESIGN.md §4)."""

from __future__ import annotations

from typing import Any

from worker.actions.host import diag, exec_cmd, fs_list, fs_read, fs_stat, fs_write, http_fetch
from worker.core.registry import ActionSpec, Registry, table

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
        ActionSpec(
            HOST,
            "fs_read",
            fs_read.FsReadArgs,
            fs_read.FsReadResult,
            fs_read.fs_read,
            "up to 1 MiB of a regular file inside the roots (offset/length), in the blob",
        ),
        ActionSpec(
            HOST,
            "fs_write",
            fs_write.FsWriteArgs,
            fs_write.FsWriteResult,
            fs_write.fs_write,
            "create, overwrite (atomically) or append to a file in a read-write root; "
            "the blob is the content, at most 16 MiB",
            takes_blob=True,
        ),
        ActionSpec(
            HOST,
            "fs_list",
            fs_list.FsListArgs,
            fs_list.FsListResult,
            fs_list.fs_list,
            "a folder's entries inside the roots, a few levels deep, symlinks never entered",
        ),
        ActionSpec(
            HOST,
            "http_fetch",
            http_fetch.HttpFetchArgs,
            http_fetch.HttpFetchResult,
            http_fetch.http_fetch,
            "one HTTP(S) request to a public address (or a host opened in [http]); the blob "
            "is the request body, the result blob the response body, at most 5 MiB",
            takes_blob=True,
        ),
        ActionSpec(
            HOST,
            "exec",
            exec_cmd.ExecArgs,
            exec_cmd.ExecResult,
            exec_cmd.exec_command,
            "run an allowlisted program (argv, no shell) in a sandbox; the blob is its stdin",
            takes_blob=True,
            sandboxed=True,
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
