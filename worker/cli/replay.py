"""`agentworker replay FILE`: run a script of actions and check every answer.

Only argparse is imported at the top: `agentworker --help` must not load the
engine (or grpc); `run` imports what the verb needs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from worker.config import Paths
    from worker.replay.runner import Report
    from worker.replay.script import Script

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1  # a step missed its expectation, or a line is malformed/invalid
EXIT_USAGE: Final = 2


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    replay = sub.add_parser(
        "replay",
        help="run a script of actions (JSON Lines) and check each answer",
        description="Runs each step through the worker's whole pipeline: in this process, "
        "against a worker built from your config (or --config) and grants (or --grants), or "
        "through a hub to a connected worker (--server). The format: docs/replay.md; "
        "`agentworker replay --schema` prints its JSON Schema.",
    )
    replay.add_argument("script", metavar="FILE", type=Path, nargs="?", help="the script")
    replay.add_argument("--schema", action="store_true", help="print the format's JSON Schema")
    replay.add_argument(
        "--dry-run",
        action="store_true",
        help="check every step and its args against the action's model; run nothing",
    )
    replay.add_argument(
        "--fail-fast", action="store_true", help="stop at the first step that falls short"
    )
    replay.add_argument("--json", action="store_true", help="print a machine-readable report")
    replay.add_argument(
        "--run",
        default="",
        metavar="LABEL",
        help="mixed into every step's correlation id: a new label runs every step again, "
        "where the same script replayed through the same hub is answered from its record",
    )
    local = replay.add_argument_group("in this process (the default)")
    local.add_argument("--config", type=Path, help="config.toml to build the worker from")
    local.add_argument(
        "--grants",
        type=Path,
        help="a grants profile: [[grant]] tables used instead of the config's",
    )
    local.add_argument(
        "--data-dir",
        type=Path,
        help="keep the worker's ledger and telemetry here (default: a fresh folder, removed after)",
    )
    hub = replay.add_argument_group("through a hub")
    hub.add_argument("--server", help="hub address, host:port")
    hub.add_argument("--token", help="bearer token (default: the local hub's token file)")
    hub.add_argument("--tls-ca", type=Path, help="CA certificate to verify a TLS hub")
    hub.add_argument("--worker", default="", help="worker id, when several are connected")


def run(paths: Paths, args: argparse.Namespace) -> int:
    from worker.errors import WorkerError
    from worker.replay import script as script_format

    if args.schema:
        sys.stdout.write(script_format.schema_text())
        return EXIT_OK
    if args.script is None:
        raise WorkerError("validation_error", "name the script to replay: agentworker replay FILE")
    if args.server and (args.config or args.grants or args.data_dir):
        raise WorkerError(
            "validation_error",
            "--config, --grants and --data-dir build a worker in this process; through a hub "
            "(--server) the connected worker runs the steps with its own",
        )
    script = script_format.load(args.script, run_label=args.run)
    if args.dry_run:
        report = _dry_run(paths, args, script)
    else:
        import asyncio

        report = asyncio.run(_replay(paths, args, script))
    return _print(report, args.json)


def _dry_run(paths: Paths, args: argparse.Namespace, script: Script) -> Report:
    from worker import actions
    from worker.config import load
    from worker.replay import config_for_replay, validate

    diagnostics = False
    if not args.server:
        config = config_for_replay(load(paths), args.config, args.grants)
        diagnostics = config.worker.diagnostics
    return validate(script, actions.build(diagnostics=diagnostics or _wants_diag(script)))


def _wants_diag(script: Script) -> bool:
    """Through a hub the worker's own config decides; the dry run then knows the
    diagnostic actions too, rather than calling them unknown."""
    return any(e.step.surface_action[0] == "workerDiag" for e in script.entries)


async def _replay(paths: Paths, args: argparse.Namespace, script: Script) -> Report:
    from worker.config import load
    from worker.replay import config_for_replay, in_process, replay, through_hub
    from worker.replay.render import ProgressBar
    from worker.wire.transport import read_token

    bar = ProgressBar(sys.stderr) if sys.stderr.isatty() else None
    try:
        if args.server:
            config = load(paths)
            token = args.token or read_token(paths.token_file)
            tls_ca = args.tls_ca or config.worker.tls_ca
            async with through_hub(args.server, token, tls_ca, args.worker) as hub:
                return await replay(
                    script, hub, mode=f"hub {args.server}", fail_fast=args.fail_fast, progress=bar
                )
        if args.config is None:
            from worker import app

            app.prepare(paths)  # a worker's first start: config.toml and the workspace
        config = config_for_replay(load(paths), args.config, args.grants)
        config_dir = args.config.resolve().parent if args.config else paths.config_dir
        async with in_process(config, config_dir, args.data_dir) as worker:
            return await replay(
                script, worker, mode="in-process", fail_fast=args.fail_fast, progress=bar
            )
    finally:
        if bar is not None:
            bar.close()


def _print(report: Report, as_json: bool) -> int:
    import json

    from worker.replay.render import summary

    if as_json:
        print(json.dumps(report.to_json(), indent=2, ensure_ascii=False))
    else:
        print(summary(report))
    return EXIT_OK if report.ok else EXIT_FAILED
