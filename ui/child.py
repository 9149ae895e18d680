"""The TUI's own process for `agentworker up` and `run`.

The worker starts it (worker/core/tui_process.py) as `python -m ui.child SOCKET LOG`
(the one-file build: `agentworker --ui-child SOCKET LOG`, see ui/frozen.py) once its
console socket listens, and it attaches there as `agentworker ui` does.
It owns the terminal while it runs. Its exit status is the worker's cue: 0 when
the person quit (q, Ctrl+C, SIGINT, SIGTERM, a hang-up), which stops the worker;
it also leaves with 0 when the worker told it that it stopped. A worker that went
away without saying so (killed, crashed) is reported on the terminal, with the
log's path, and the status is 1; a worker it could not reach, the StartupError's
own status. It logs to the worker's log file.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

WORKER_GONE = 1


def main(argv: list[str] | None = None) -> int:
    socket, log_file = (Path(a) for a in (sys.argv[1:] if argv is None else argv))
    # Told to leave before the app runs (Ctrl+C as the TUI starts, the worker
    # stopping): leave quietly. The app takes these signals over once it shows.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _leave)
    logging.basicConfig(
        level=logging.INFO,
        filename=str(log_file),
        format="%(asctime)s %(levelname)s %(name)s (TUI): %(message)s",
    )
    from ui.app import WorkerApp
    from worker.core.console_socket import SocketLink

    app = WorkerApp(SocketLink(socket), quit_stops_worker=True)
    app.run()
    if app.failure is not None:
        _say(f"{app.failure.message} (the worker's log: {log_file})")
        return app.failure.exit_code
    if app.worker_gone:
        _say(
            "the worker went away without stopping (killed, or it crashed); "
            f"what it logged is in {log_file}"
        )
        return WORKER_GONE
    return 0


def _leave(_signum: int, _frame: object) -> None:
    raise SystemExit(0)


def _say(text: str) -> None:
    print(f"agentworker: {text}", file=sys.stderr, flush=True)


def run_and_leave(argv: list[str] | None = None) -> None:
    """`main`, then leave at once: the worker waits for this process before it stops,
    and the interpreter's teardown after a Textual app takes a few hundred ms."""
    code = main(argv)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run_and_leave()
