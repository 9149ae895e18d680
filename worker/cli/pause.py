"""`agentworker pause` / `agentworker resume`: the global stop from the command line.

The switch is a file in the data folder (worker.core.pause), so this works with or
without a worker running: a running worker stops its calls within a moment and
refuses new ones with `paused` until `resume`; one started later starts paused.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from worker.config import Paths


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pause = sub.add_parser(
        "pause",
        help="emergency stop: pause every plan on this machine's worker until `resume` "
        "(running calls are stopped)",
    )
    pause.add_argument(
        "--reason", default="paused from the command line", help="said to every refused call"
    )
    pause.set_defaults(handler=run_pause)
    resume = sub.add_parser(
        "resume",
        help="hand control back: lift a pause (the TUI's `s`, `agentworker pause`)",
    )
    resume.set_defaults(handler=run_resume)


def run_pause(paths: Paths, args: argparse.Namespace) -> int:
    from worker.core.pause import PauseSwitch

    paths.ensure()
    PauseSwitch.in_dir(paths.data_dir).stop(args.reason, "cli")
    print("paused: every call answers `paused` until `agentworker resume`")
    return 0


def run_resume(paths: Paths, args: argparse.Namespace) -> int:
    from worker.core.pause import PauseSwitch

    paths.ensure()
    lifted = PauseSwitch.in_dir(paths.data_dir).resume()
    if not lifted.active:
        print("nothing was paused")
        return 1
    for what, pause in (("the stop", lifted.stop), ("the desktop takeover", lifted.takeover)):
        if pause is not None:
            print(f"lifted {what} ({pause.reason}, by {pause.by})")
    return 0
