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
import gc
import importlib
import logging
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

import worker
from worker.cli._common import EXIT_INTERRUPTED

if TYPE_CHECKING:
    from worker.app import Frontend

# The verb groups (modules of worker.cli), in the order `--help` lists them.
GROUPS = (
    "serve",
    "remote",
    "plans",
    "grants",
    "allowlist",
    "sandbox",
    "replay",
    "telemetry",
    "service",
    "doctor",
    "killed",
    "pause",
    "reload",
)
# Each verb and the group that adds it: a command that names its verb imports and
# builds that group's parsers only (tests/unit/test_cli_imports.py holds the two
# lists to each other).
VERBS: Final = {
    "up": "serve",
    "hub": "serve",
    "run": "serve",
    "ui": "serve",
    "call": "remote",
    "workers": "remote",
    "status": "remote",
    "kill": "plans",
    "lift": "plans",
    "grant": "grants",
    "grants": "grants",
    "revoke": "grants",
    "allowlist": "allowlist",
    "sandbox": "sandbox",
    "replay": "replay",
    "record": "replay",
    "telemetry": "telemetry",
    "audit": "telemetry",
    "service": "service",
    "doctor": "doctor",
    "killed": "killed",
    "pause": "pause",
    "resume": "pause",
    "reload": "reload",
}
# The verbs that ask the hub one thing and end, in a fraction of a second: their
# process runs without the cyclic garbage collector (see `entry`). A verb that may
# run for long (serving, replaying) keeps it.
BRIEF: Final = frozenset({"call", "workers", "status", "kill", "lift"})
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for `cmd | head`
# The top-level options that take a value (the verb is the first word after them).
_VALUED = ("--home", "--log-file")


def group(name: str) -> ModuleType:
    return importlib.import_module(f"worker.cli.{name}")


def verb_of(argv: list[str]) -> str | None:
    """The verb `argv` names, if it names one before any help flag; else None (then
    the whole parser is built, and `--help` lists every verb)."""
    words = iter(argv)
    for word in words:
        if word in ("-h", "--help") or word == "--":
            return None
        if word.startswith("--") and "=" not in word:
            # argparse takes any unambiguous prefix of a long option
            if len(word) > 2 and any(option.startswith(word) for option in _VALUED):
                next(words, None)
            continue
        if word.startswith("-"):
            continue
        return word if word in VERBS else None
    return None


def terminal_columns() -> int:
    """What `shutil.get_terminal_size().columns` answers (COLUMNS when a positive number,
    else the terminal on standard output, else 80), without importing shutil: that
    loads bz2 and lzma, about 3 ms of every command's start, and argparse asks for the
    width at each parser and argument it builds, so `call` paid it for no help shown."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns > 0:
        return columns
    try:
        columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        columns = 0
    return columns or 80


class HelpFormatter(argparse.HelpFormatter):
    """argparse's own formatter, its width found by `terminal_columns` (as argparse
    does with shutil: the columns less 2)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if len(args) < 4 and kwargs.get("width") is None:
            kwargs["width"] = terminal_columns() - 2
        super().__init__(*args, **kwargs)


class ArgumentParser(argparse.ArgumentParser):
    """Every parser of the command line, its verbs' too (add_subparsers makes them of
    the parent's class), formats with HelpFormatter unless told otherwise."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The command line; with `verb`, only that verb's group is imported and added."""
    top = ArgumentParser(
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
    for name in (VERBS[verb],) if verb in VERBS else GROUPS:
        group(name).add_parsers(sub)
    return top


# gRPC's experiments this program turns off (GRPC_EXPERIMENTS, unless set already):
# the EventEngine listener and client, which read a connection's socket in a thread
# of EventEngine's pool and hand each message to the thread that polls the
# completion queue, which hands it to the event loop. Off, that polling thread reads
# the socket itself, as gRPC did before them: one thread hop less for every message
# each way (a unary call's server, 10.4 voluntary context switches a call -> 6.1),
# and about 0.1 ms less on a Dispatch through `hub` + `run`, one at a time, where
# each call crosses four sockets. gRPC reads the variable once, at its first import,
# so it is set before any verb runs (a gRPC that no longer knows a name says so once,
# "Unknown experiment", and goes on).
GRPC_SETTINGS: Final = "-event_engine_listener,-event_engine_client"
# gRPC's fork handlers off (GRPC_ENABLE_FORK_SUPPORT, unless set already): this program
# forks only to exec (a sandbox started as a plan's own uid, sandbox.plan_uids: Popen
# with `user=` forks where it would vfork). With them on, the child restarted gRPC's
# poller thread, which found its epoll descriptor closed by close_fds and wrote
# "epoll_wait error: Bad file descriptor" to the child's stderr, bubblewrap's: the
# sandbox was then taken for one bubblewrap could not build (2 execs in 360 runs of
# test_workbench_uids at load ~10, `sandbox_unavailable`).
GRPC_FORK_SUPPORT: Final = "false"


def entry(frontend: Frontend | None = None) -> int:
    """The process's own way in: the installed command (ui.launch.main, which hands
    in the TUI) and `python -m worker`. Around `main`, which tests call in-process
    and which therefore never touches the garbage collector:

    - a BRIEF verb runs with the cyclic collector off: importing gRPC, protobuf and
      asyncio set it off some 40 times (about 10 ms of `call`) in search of cycles
      that a process ending a moment later has no need to free;
    - once any verb has returned, what is left is hidden from the collector
      (gc.freeze), so the exit does not search all of it for cycles: that took about
      20 ms after `call` had answered, which a script waiting for it waited through.

    Objects left in a cycle are then released with the process, not finalized:
    everything of ours is closed by then, and logging flushes at exit either way.

    Pydantic's plugins are off unless the environment says otherwise: agentworker
    uses none, and looking for them read every installed package's entry points
    (5-9 ms of each start that builds a model).

    gRPC's sockets are read by its own polling thread, and its fork handlers are off,
    unless the environment says otherwise (GRPC_EXPERIMENTS, GRPC_ENABLE_FORK_SUPPORT,
    read once, as gRPC is first imported: see GRPC_SETTINGS, GRPC_FORK_SUPPORT)."""
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    os.environ.setdefault("GRPC_EXPERIMENTS", GRPC_SETTINGS)
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", GRPC_FORK_SUPPORT)
    if verb_of(sys.argv[1:]) in BRIEF:
        gc.disable()
    code = main(frontend=frontend)
    gc.freeze()
    return code


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
    words = sys.argv[1:] if argv is None else argv
    args = parser(verb_of(words)).parse_args(words)
    args.frontend = frontend
    if args.log_file:
        args.log_file.parent.mkdir(parents=True, exist_ok=True)
    had = list(logging.getLogger().handlers)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        **({"filename": str(args.log_file)} if args.log_file else {"stream": sys.stderr}),
    )
    from worker.cli._common import LOG_FORMAT, ShownFormatter, shown

    for handler in logging.getLogger().handlers:  # a server's ids reach these lines
        if handler not in had:
            handler.setFormatter(ShownFormatter(LOG_FORMAT))
    # httpx and httpcore log each request's full URL at INFO, query string included:
    # a token in a fetched URL would land in the log.
    for chatty in ("httpx", "httpcore"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    # Imported once a verb is chosen, and only there: Paths needs no pydantic, but the
    # errors load the sandbox package, which `call` has no use for.
    from worker.cli._common import settle_token
    from worker.paths import Paths

    try:
        paths = Paths.at(args.home) if args.home else Paths.from_env()
        settle_token(args)
        code: int = args.handler(paths, args)
        return code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:
        # A StartupError or WorkerError exists only once worker.errors was loaded.
        errors = sys.modules.get("worker.errors")
        if errors is None or not isinstance(exc, errors.StartupError | errors.WorkerError):
            raise
        # A message may carry a hub's words (a status's details) or a server's ids.
        print(f"agentworker: {shown(exc.message)}", file=sys.stderr)
        return exc.exit_code if isinstance(exc, errors.StartupError) else 1


if __name__ == "__main__":
    sys.exit(main())
