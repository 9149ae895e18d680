"""`agentworker reload`: have the running worker read config.toml again.

It sends SIGHUP to the worker holding this home's lock (its pid is in the lock
file). Roots, grants and the per-call settings ([exec], [fs], [http]) take effect
for the next calls; [hub], [worker] and [connection] need a restart, and the
worker's log says so when they changed.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from worker.config import Paths


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    reload = sub.add_parser(
        "reload",
        help="make the running worker read config.toml again (roots, grants)",
        description="Sends SIGHUP to this home's running worker (`up` or `run`). Roots and "
        "grants change for the next calls; [hub], [worker] and [connection] need a restart.",
    )
    reload.set_defaults(handler=run)


def running_worker(paths: Paths) -> int | None:
    """The pid of the worker holding this home's lock, or None when none runs."""
    lock = paths.data_dir / "worker.lock"
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # held: a worker runs
            text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            return int(text) if text.isdigit() else None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def nudge(paths: Paths) -> bool:
    """Tell this home's running worker (SIGUSR1) to look at its ledger and pause switch
    now: a kill or a pause just written here stops its running calls at once, instead
    of at the worker's next safety-net check. False when no worker runs."""
    pid = running_worker(paths)
    if pid is None:
        return False
    try:
        os.kill(pid, signal.SIGUSR1)
    except OSError:  # gone meanwhile, or not ours to signal: the safety net still checks
        return False
    return True


def run(paths: Paths, args: argparse.Namespace) -> int:
    pid = running_worker(paths)
    if pid is None:
        print(
            f"agentworker: no worker runs with {paths.data_dir}; the next "
            "`agentworker up` (or `run`) reads config.toml as it starts",
            file=sys.stderr,
        )
        return 1
    os.kill(pid, signal.SIGHUP)
    print(
        f"asked the worker (pid {pid}) to read {paths.config_file} again; its log says what changed"
    )
    return 0
