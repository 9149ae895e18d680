"""The TUI as the worker's frontend, and the `agentworker` command that hands it in.

`worker.cli` never imports `ui`; this module's `main` is the installed
`agentworker` command: it passes the TUI to the worker's command line, which shows
it for `ui` on this process's loop, and for `up` and `run` (on a terminal, without
--headless) in a process of its own (ui/child.py) that the worker starts. Textual
is imported only once a TUI is really shown, so `agentworker call` and friends, and
a worker (headless or not), never load it.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # `agentworker --help` imports this module: keep it light
    from pathlib import Path

    from worker.core.console import Link


class Tui:
    """worker.app.Frontend: the Textual app."""

    async def serve(self, link: Link) -> None:
        """`agentworker ui`: the app on this process's loop until the person quits."""
        from ui.app import WorkerApp

        app = WorkerApp(link)
        await app.run_async()
        if app.failure is not None:
            raise app.failure

    def command(self, socket: Path, log_file: Path) -> list[str]:
        """The TUI's own process for `up` and `run`. `-P`: the folder the person runs
        the worker in is not searched for modules (a `textual.py` there is not ours).
        The one-file build is no interpreter: it is started again, told so by a flag
        (ui/frozen.py)."""
        if getattr(sys, "frozen", False):
            from ui.frozen import UI_CHILD_FLAG

            return [sys.executable, UI_CHILD_FLAG, str(socket), str(log_file)]
        return [sys.executable, "-P", "-m", "ui.child", str(socket), str(log_file)]


def main() -> int:
    # The command line reports StartupErrors itself, and imports worker.errors (which
    # loads the sandbox package) only once a verb runs: `--help` never needs it.
    from worker.cli.main import entry

    return entry(frontend=Tui())
