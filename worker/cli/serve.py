"""`agentworker up`, `hub`, `run` and `ui`: the long-running verbs (worker.app assembles
them), with the TUI when the `agentworker` command hands one in and a terminal shows it."""

from __future__ import annotations

import argparse
import contextlib
import logging
import logging.handlers
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

from worker.cli._common import EXIT_OK, LOG_FORMAT, ShownFormatter, add_token_flags, config_of

if TYPE_CHECKING:
    from worker.app import Frontend, TuiLaunch
    from worker.config import Paths

SANDBOX_HELP = (
    "sandbox mode (the workbench): serve workbenchHost.* with a contained workspace per "
    "plan instead of your shared folders; refuses to start if bubblewrap cannot work here"
)


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    up = sub.add_parser("up", help="run hub and worker together on loopback (the default setup)")
    up.add_argument("--listen", help="hub address (default from config: 127.0.0.1:7421)")
    up.add_argument("--sandbox", action="store_true", help=SANDBOX_HELP)
    _add_headless_flag(up)
    up.set_defaults(handler=_up)

    hub = sub.add_parser("hub", help="run the reference hub alone")
    hub.add_argument("--listen", help="address to serve (loopback unless TLS is configured)")
    hub.add_argument(
        "--accept-new-workers",
        action="store_true",
        help="serve any new worker id at its first Hello, without `agentworker workers "
        "accept`. RISK: anyone holding hub-workers.token becomes a worker of this hub and "
        "is given new sandbox plans, their calls, args and blobs (keys, secrets); and a "
        "worker id first seen from them is theirs. Use it only while enrolling workers "
        "you started yourself, on a network only they reach",
    )
    hub.set_defaults(handler=_hub)

    run = sub.add_parser(
        "run", help="run a worker alone; with no flags it joins this machine's hub"
    )
    run.add_argument("--server", help="hub or agent server address, host:port")
    add_token_flags(run)
    run.add_argument("--tls-ca", type=Path, help="CA certificate to verify a TLS server")
    run.add_argument("--max-concurrency", type=int, help="calls executed at once (default 8)")
    run.add_argument("--sandbox", action="store_true", help=SANDBOX_HELP)
    _add_headless_flag(run)
    run.set_defaults(handler=_run)

    ui = sub.add_parser(
        "ui",
        help="open the TUI on the worker already running on this machine (approvals, calls, "
        "kill switch)",
        description="Attaches over a local socket only your user can open. While attached, "
        "calls that need your approval wait for you here.",
    )
    ui.set_defaults(handler=_ui)


def _add_headless_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--headless",
        action="store_true",
        help="no TUI even on a terminal (the default with no terminal); calls that need "
        "approval are refused unless `agentworker ui` is attached",
    )


def _tui(paths: Paths, args: argparse.Namespace) -> TuiLaunch | None:
    """How to start the TUI when it can be shown (a frontend, a terminal, no
    --headless): in a process of its own, attached over the console socket. While it
    runs, the log goes to a file so nothing draws over the screen."""
    frontend: Frontend | None = args.frontend
    on_terminal = sys.stdin.isatty() and sys.stdout.isatty()
    if frontend is None or args.headless or not on_terminal:
        return None
    from worker.app import TuiLaunch

    log_file = args.log_file.resolve() if args.log_file else _log_to_file(paths)
    return TuiLaunch(frontend.command(paths.ui_socket, log_file), log_file)


# The log file is rotated (review10 finding 12): at most LOG_FILES files of
# LOG_FILE_BYTES each, `agentworker.log` then `.1` (newer) to `.3` (oldest).
LOG_FILE_BYTES: Final = 5 * 1024 * 1024
LOG_FILES: Final = 4


def _log_to_file(
    paths: Paths, name: str = "agentworker.log", max_bytes: int = LOG_FILE_BYTES
) -> Path:
    paths.ensure()
    log_file = paths.data_dir / name
    handler = logging.handlers.RotatingFileHandler(
        log_file, maxBytes=max_bytes, backupCount=LOG_FILES - 1, encoding="utf-8"
    )
    handler.setFormatter(ShownFormatter(LOG_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    print(f"agentworker: logging to {log_file}", file=sys.stderr)
    return log_file


def _up(paths: Paths, args: argparse.Namespace) -> int:
    import asyncio

    from worker import memory

    memory.hold_collection()  # until the worker is built (`settle`)
    from worker import app

    memory.keep_large_buffers()

    app.prepare(paths, sandbox=args.sandbox)
    config = config_of(paths, args)
    tui = _tui(paths, args)
    with _told_not_traced(tui), _refused_as_unreachable():
        asyncio.run(app.run_up(paths, config, sandbox=args.sandbox, tui=tui, built=memory.settle))
    return EXIT_OK


def _hub(paths: Paths, args: argparse.Namespace) -> int:
    import asyncio

    from worker import app, memory

    memory.keep_large_buffers()

    paths.ensure()
    asyncio.run(app.run_hub(paths, config_of(paths, args), args.listen))
    return EXIT_OK


def _run(paths: Paths, args: argparse.Namespace) -> int:
    import asyncio

    from worker import memory

    memory.hold_collection()  # until the worker is built (`settle`)
    from worker import app

    memory.keep_large_buffers()

    app.prepare(paths, sandbox=args.sandbox)
    config = config_of(paths, args)
    target = app.worker_target(paths, config)
    tui = _tui(paths, args)
    with _told_not_traced(tui), _refused_as_unreachable():
        asyncio.run(
            app.run_worker(
                paths, config, target, sandbox=args.sandbox, tui=tui, built=memory.settle
            )
        )
    return EXIT_OK


def _ui(paths: Paths, args: argparse.Namespace) -> int:
    """Attach the TUI to the worker already running with this data folder."""
    import asyncio

    from worker.core.console_socket import SocketLink
    from worker.errors import UsageError

    frontend: Frontend | None = args.frontend
    if frontend is None:
        raise UsageError("the TUI comes with the `agentworker` command; run `agentworker ui`")
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("`agentworker ui` needs a terminal")
    _log_to_file(paths, "agentworker-ui.log")
    link = SocketLink(paths.ui_socket)
    asyncio.run(frontend.serve(link))
    return EXIT_OK


@contextlib.contextmanager
def _told_not_traced(tui: TuiLaunch | None) -> Iterator[None]:
    """With a TUI the person is at a terminal: a worker that fails on an unexpected
    error says so there, and where its log holds the traceback."""
    from worker.errors import StartupError, WorkerError

    try:
        yield
    except (StartupError, WorkerError):
        raise
    except Exception as exc:
        if tui is None:
            raise
        logging.getLogger("agentworker").exception("the worker failed")
        raise StartupError(  # exit status 1, the message on the terminal
            f"the worker stopped on an unexpected error ({type(exc).__name__}: {exc}); "
            f"the details are in {tui.log_file}"
        ) from exc


@contextlib.contextmanager
def _refused_as_unreachable() -> Iterator[None]:
    """A server that refuses this worker for good (bad token, no permission) ends the
    verb as a HubUnreachableError, with the server's reason."""
    from worker.core.connection import FatalConnectionError
    from worker.errors import HubUnreachableError

    try:
        yield
    except FatalConnectionError as exc:
        raise HubUnreachableError(str(exc)) from exc
