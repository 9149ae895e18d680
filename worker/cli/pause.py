"""`agentworker pause` and `resume`: the person's emergency stop, from a terminal.

Both act on this machine's worker only, through the pause switch in its data
folder (worker/core/pause.py), so they work with no hub running. `resume` also hands
the desktop back after the worker paused the computer surface because the person
used it while the agent drove.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from worker.cli._common import EXIT_FAILED, EXIT_OK

if TYPE_CHECKING:
    from worker.config import Paths


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pause = sub.add_parser(
        "pause",
        help="emergency stop: pause every plan on this machine's worker until `resume` "
        "(local only)",
    )
    pause.add_argument(
        "--reason", default="paused from the command line", help="said to every refused call"
    )
    pause.set_defaults(handler=_pause)
    resume = sub.add_parser(
        "resume",
        help="hand control back: lift a pause, or the pause the worker set when you used "
        "the desktop (local only)",
    )
    resume.set_defaults(handler=_resume)


def _pause(paths: Paths, args: argparse.Namespace) -> int:
    from worker.core.pause import PauseSwitch

    paths.ensure()
    from worker.cli.reload import nudge

    PauseSwitch.in_dir(paths.data_dir).stop(args.reason, f"cli:{os.getuid()}")
    nudge(paths)  # the worker here stops its running calls now
    print("paused: every call answers `paused` until `agentworker resume`")
    return EXIT_OK


def _resume(paths: Paths, args: argparse.Namespace) -> int:
    from worker.core.pause import PauseSwitch

    paths.ensure()
    lifted = PauseSwitch.in_dir(paths.data_dir).resume()
    if not lifted.active:
        print("nothing was paused")
        return EXIT_FAILED
    for what, pause in (("the stop", lifted.stop), ("the desktop takeover", lifted.takeover)):
        if pause is not None:
            print(f"lifted {what} ({pause.reason}, by {pause.by})")
    return EXIT_OK
