"""The TUI as the worker's frontend, and the `agentworker` command that hands it in.

`worker.cli` never imports `ui`; this module's `main` is the installed
`agentworker` command: it passes the TUI to the worker's command line, which shows
it for `up`, `run` (on a terminal, without --headless) and `ui`. Textual is
imported only once a TUI is really shown, so `agentworker call` and friends, and
a headless worker, never load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # `agentworker --help` imports this module: keep it light
    import asyncio

    from worker.core.console import Link


class Tui:
    """worker.app.Frontend: the Textual app on the worker's own event loop."""

    async def serve(self, link: Link, stop: asyncio.Event | None = None) -> None:
        import asyncio

        from ui.app import WorkerApp

        app = WorkerApp(link, quit_stops_worker=stop is not None)
        watcher: asyncio.Task[None] | None = None
        if stop is not None:

            async def close_when_stopped() -> None:
                await stop.wait()
                app.exit()

            watcher = asyncio.create_task(close_when_stopped())
        try:
            await app.run_async()
        finally:
            if watcher is not None:
                watcher.cancel()
        if app.failure is not None:
            raise app.failure


def main() -> int:
    # The command line reports StartupErrors itself, and imports worker.errors (which
    # loads the sandbox package) only once a verb runs: `--help` never needs it.
    from worker.cli.main import entry

    return entry(frontend=Tui())
