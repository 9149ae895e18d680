"""`agentworker`: run the worker, the hub or both, and talk to them.

Start here:   agentworker up            hub + worker on this machine (loopback)
Then try:     agentworker call fs_stat '{"path": "."}' --agent me

Each verb group is a module of its own (serve, remote, plans, grants, allowlist,
sandbox, replay, telemetry, service, doctor, killed, reload, pause) that adds its parsers
and imports what its verb needs only when the verb runs: building the parser, and
so `--help`, loads neither grpc nor httpx nor pydantic (a test holds it to that).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import worker
from worker.cli import (
    allowlist,
    doctor,
    grants,
    killed,
    pause,
    plans,
    reload,
    remote,
    replay,
    sandbox,
    serve,
    service,
    telemetry,
)

if TYPE_CHECKING:
    from worker.app import Frontend

GROUPS = (
    serve,
    remote,
    plans,
    grants,
    allowlist,
    sandbox,
    replay,
    telemetry,
    service,
    doctor,
    killed,
    pause,
    reload,
)
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for `cmd | head`


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="agentworker",
        description="Let a remote AI agent work on this computer, inside the scopes you grant, "
        "with every call logged. Run `agentworker up` to start.",
        epilog="Files: config.toml in the user config dir, data in the user data dir; "
        "AGENTWORKER_HOME (or --home) puts both in one folder.",
    )
    top.add_argument("--home", type=Path, help="keep config and data in this folder")
    top.add_argument("-v", "--verbose", action="store_true", help="log debug detail")
    top.add_argument("--version", action="version", version=f"agentworker {worker.__version__}")
    top.add_argument(
        "--log-file", type=Path, help="append the log to this file instead of standard error"
    )
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.add_parsers(sub)
    return top


def main(argv: list[str] | None = None, frontend: Frontend | None = None) -> int:
    """The command line. `frontend` is the TUI, which the `agentworker` command hands
    in from `ui/` (the worker never imports it); without one, the worker runs headless."""
    try:
        return _main(argv, frontend)
    except BrokenPipeError:
        # The reader went away (`agentworker … | head`): stop quietly, as other tools do.
        # Later writes (the interpreter flushes stdout at exit) go to /dev/null, so no
        # second error is printed either.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _main(argv: list[str] | None, frontend: Frontend | None) -> int:
    args = parser().parse_args(argv)
    args.frontend = frontend
    if args.log_file:
        args.log_file.parent.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        **({"filename": str(args.log_file)} if args.log_file else {"stream": sys.stderr}),
    )
    # httpx and httpcore log each request's full URL at INFO, query string included:
    # a token in a fetched URL would land in the log.
    for chatty in ("httpx", "httpcore"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    # Imported once a verb is chosen: the errors pull in the sandbox, Paths pydantic.
    from worker.config import Paths
    from worker.errors import StartupError, WorkerError

    try:
        paths = Paths.at(args.home) if args.home else Paths.from_env()
        code: int = args.handler(paths, args)
        return code
    except StartupError as exc:
        print(f"agentworker: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except WorkerError as exc:  # an action's answer met here
        print(f"agentworker: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
