"""The windows the agent may not focus or click: the person's own line to the worker.

A prompt opens in the terminal that runs the TUI. An agent that could bring that
terminal to the front just before asking for something out of scope would have the
person's typing, meant for another window, answer the prompt (review10 finding 14).
So window_focus, a click, a wheel or the ends of a drag, and keys typed while the
keyboard focus is there (the person may have left it so), are refused on any window
that belongs to:

- the worker itself or one of its ancestors (the terminal running `agentworker up`
  is the parent of its shell, which is the worker's parent); and
- an attached UI (`agentworker ui`, the TUI process of `up`; their pids come from
  the console socket's SO_PEERCRED) or one of its ancestors.

A window belongs to a process by its pid (`_NET_WM_PID`, else the X server's
X-Resource), or by the `WINDOWID` a terminal puts in its children's environment.
Pid 1 (init, or a container's) never counts. A terminal server that owns every
terminal window of the session (gnome-terminal-server) protects all of them; a
terminal multiplexer's client (tmux, screen) is not an ancestor, so its terminal is
not found: a known gap, said in docs/architecture.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import psutil

from worker.errors import WorkerError

MAX_DEPTH: Final = 64  # ancestors followed per process; a chain is rarely over 10


@dataclass(frozen=True)
class OwnUi:
    """The processes and windows that are the person's line to this worker."""

    pids: frozenset[int]
    window_ids: frozenset[int]

    def owns(self, window_id: int, pid: int | None) -> bool:
        return window_id in self.window_ids or (pid is not None and pid in self.pids)

    def refuse(self, window_id: int, pid: int | None, what: str) -> None:
        """`permission_denied` if `what` (an action on the window) would reach it."""
        if self.owns(window_id, pid):
            raise WorkerError(
                "permission_denied",
                f"{what}: window {window_id} belongs to this worker's own terminal or "
                "approval UI, which only the person uses (a prompt may open there); "
                "act on another window",
                {"window": window_id, "pid": pid},
            )


def own_ui(ui_pids: Iterable[int]) -> OwnUi:
    """This worker's and the attached UIs' processes with their ancestors, read now
    (a process that ended meanwhile is skipped)."""
    pids: set[int] = set()
    window_ids: set[int] = set()
    for start in {os.getpid(), *ui_pids}:
        try:
            process = psutil.Process(start)
            window_id = process.environ().get("WINDOWID", "")
        except (psutil.Error, OSError):
            continue
        if window_id.isdigit():
            window_ids.add(int(window_id))
        for depth, member in enumerate([process, *_ancestors(process)]):
            if member.pid <= 1 or depth > MAX_DEPTH:
                break
            pids.add(member.pid)
    return OwnUi(frozenset(pids), frozenset(window_ids))


def _ancestors(process: psutil.Process) -> list[psutil.Process]:
    try:
        return process.parents()
    except (psutil.Error, OSError):
        return []
