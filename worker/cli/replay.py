"""`agentworker replay FILE`: run a script of actions and check every answer.

Only argparse is imported at the top: `agentworker --help` must not load the
engine (or grpc); `run` imports what the verb needs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from worker.cli._common import (
    EXIT_INTERRUPTED,
    add_served_flags,
    add_token_flags,
    hub_failure,
    hub_target,
    shown,
)

if TYPE_CHECKING:
    from worker.config import Paths
    from worker.core.ledger import State
    from worker.core.telemetry import Telemetry
    from worker.replay.runner import Report
    from worker.replay.script import Script

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1  # a step missed its expectation, or a line is malformed/invalid


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    replay = sub.add_parser(
        "replay",
        help="run a script of actions (JSON Lines) and check each answer",
        description="Runs each step through the worker's whole pipeline: in this process, "
        "against a worker built from your config (or --config) and grants (or --grants), or "
        "through a hub to a connected worker (--server). The format: docs/replay.md; "
        "`agentworker replay --schema` prints its JSON Schema.",
    )
    replay.set_defaults(handler=run)
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
    replay.add_argument(
        "--agent-writable-ok",
        action="store_true",
        help="run a script that lies in a folder agents can write (a shared rw folder, "
        "the workspace, sandbox workspaces): read it first, an agent may have changed it",
    )
    local = replay.add_argument_group("in this process (the default)")
    local.add_argument("--config", type=Path, help="config.toml to build the worker from")
    local.add_argument(
        "--grants",
        type=Path,
        help="a grants profile: [[grant]] tables used instead of the config's",
    )
    local.add_argument(
        "--sandbox",
        action="store_true",
        help="a worker in sandbox mode: workbenchHost.* in a contained workspace per plan",
    )
    local.add_argument(
        "--data-dir",
        type=Path,
        help="keep the worker's ledger and telemetry here (default: a fresh folder, removed after)",
    )
    hub = replay.add_argument_group("through a hub")
    hub.add_argument("--server", help="hub address, host:port")
    add_token_flags(hub)
    hub.add_argument("--tls-ca", type=Path, help="CA certificate to verify a TLS hub")
    hub.add_argument("--worker", default="", help="worker id, when several are connected")

    recording = sub.add_parser(
        "record",
        help="write a plan's calls as a replay script; `record start PLAN` keeps their args",
        description="agentworker record start PLAN: from now on, this machine's worker keeps "
        "the args of the plan's calls (secret-looking values masked) and their results. "
        "agentworker record PLAN -o FILE: the plan's calls as a script, each step expecting "
        "what happened. agentworker record stop PLAN: keep no more. A plan is one server's "
        "(another server's plan of the same id is another plan): start records the plan of "
        "the server the worker here serves, or served last, unless the flags below name "
        "another; PLAN and stop take the server whose plan of the id was recorded, and say "
        "which when several were.",
    )
    recording.add_argument(
        "words", nargs="+", metavar="PLAN | start PLAN | stop PLAN", help="what to do"
    )
    recording.add_argument(
        "-o",
        "--output",
        type=Path,
        help="the script to write (default: stdout); request blobs go to FILE's folder, "
        "in STEM.blobs/",
    )
    recording.add_argument(
        "--timing",
        action="store_true",
        help="keep the session's pace: each step waits (wait_ms) as long as the plan paused "
        "before that call",
    )
    add_served_flags(recording)
    recording.set_defaults(handler=record)


def run(paths: Paths, args: argparse.Namespace) -> int:
    from worker.errors import UsageError
    from worker.replay import script as script_format

    if args.schema:
        sys.stdout.write(script_format.schema_text())
        return EXIT_OK
    if args.script is None:
        raise UsageError("name the script to replay: agentworker replay FILE")
    if args.server and (args.config or args.grants or args.data_dir or args.sandbox):
        raise UsageError(
            "--config, --grants, --data-dir and --sandbox build a worker in this process; "
            "through a hub (--server) the connected worker runs the steps with its own",
        )
    if not args.dry_run and not args.agent_writable_ok:
        _refuse_agent_writable(paths, args)
    script = script_format.load(args.script, run_label=args.run)
    if args.dry_run:
        return _print(_dry_run(paths, args, script), args.json)
    import asyncio

    from worker.errors import StartupError
    from worker.replay import Report, interrupted

    mode = f"hub {args.server}" if args.server else "in-process"
    report = Report(script=str(script.path or "-"), mode=mode)
    try:
        asyncio.run(_replay(paths, args, script, report))
    except KeyboardInterrupt:  # what ran is reported, and how to go on
        _print(interrupted(report, script, _interrupted_why(args, report)), args.json)
        return EXIT_INTERRUPTED
    except StartupError as failed:
        if not report.steps:  # nothing ran: the failure says it all
            raise
        # The hub failed mid-way (review28 L4): the steps that ran are reported too,
        # with the failure as the reason the rest did not run, and its exit code.
        why = f"step {len(report.steps) + 1} got no answer ({failed.message}): " + _go_on(args)
        _print(interrupted(report, script, why), args.json)
        print(f"agentworker: {shown(failed.message)}", file=sys.stderr)
        return failed.exit_code
    return _print(report, args.json)


def _interrupted_why(args: argparse.Namespace, report: Report) -> str:
    under_way = len(report.steps) + 1
    if args.server:
        return f"interrupted (Ctrl-C) at step {under_way}: " + _go_on(args)
    return f"interrupted (Ctrl-C) at step {under_way}: it was stopped, and no later step ran"


def _go_on(args: argparse.Namespace) -> str:
    """How a replay through a hub stopped mid-way goes on."""
    label = f" with --run {shown(args.run)}" if args.run else ""
    return (
        f"it may still run on the worker. Replay the same script{label} through the same "
        "hub to go on: the steps that ran are answered from its record, not run again"
    )


def _refuse_agent_writable(paths: Paths, args: argparse.Namespace) -> None:
    """A UsageError naming the file and its folder when a file the replay reads lies
    in a folder agents can write (worker.replay.writable), unless the person says
    they read it (--agent-writable-ok)."""
    from worker.config import load
    from worker.errors import UsageError
    from worker.replay import config_for_replay
    from worker.replay.writable import agent_writable_places, files_read, writable_place_of

    places = agent_writable_places(load(paths), paths)
    given = None
    if args.config is not None and not args.server:
        given = config_for_replay(load(paths), args.config, None)
    for file in files_read(args.script, args.config, args.grants, given):
        place = writable_place_of(file, places)
        if place is not None:
            raise UsageError(
                f"{file} lies in {place.path}, a folder agents can write: an agent may "
                "have changed it since it was written (a step naming another agent, a "
                "program of its own). Read it (agentworker replay --dry-run shows each "
                "step), then run with --agent-writable-ok, or copy it to a folder only "
                "you write"
            )


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


async def _replay(paths: Paths, args: argparse.Namespace, script: Script, report: Report) -> None:
    from worker.config import load
    from worker.replay import config_for_replay, in_process, replay, through_hub
    from worker.replay.render import ProgressBar

    bar = ProgressBar(sys.stderr) if sys.stderr.isatty() else None

    async def run_on(target: Any) -> None:
        """The script's steps on `target` (a hub or the worker in this process)."""
        await replay(
            script, target, mode=report.mode, fail_fast=args.fail_fast, progress=bar, report=report
        )

    try:
        if args.server:
            # Dialled as the other verbs dial: this machine's hub, also named by its
            # address, only once it is known to be this user's (review28 r3); a hub that
            # does not answer as asked is said so, not a traceback.
            import grpc

            named = hub_target(paths, args)
            try:
                async with through_hub(named.target, named.token, named.tls_ca, args.worker) as hub:
                    await run_on(hub)
            except grpc.aio.AioRpcError as exc:
                raise hub_failure(exc, named.address) from exc
            return
        if args.config is None:
            from worker import app

            app.prepare(paths)  # a worker's first start: config.toml and the workspace
        config = config_for_replay(load(paths), args.config, args.grants)
        config_dir = args.config.resolve().parent if args.config else paths.config_dir
        # The person's pause switch and killed plans stop the replay too (review10 03).
        async with in_process(
            config, config_dir, args.data_dir, sandbox=args.sandbox, person_dir=paths.data_dir
        ) as worker:
            await run_on(worker)
    finally:
        if bar is not None:
            bar.close()


def _print(report: Report, as_json: bool) -> int:
    from worker.cli._common import json_shown
    from worker.replay.render import summary

    if as_json:
        print(json_shown(report.to_json(), indent=2))
    else:
        print(summary(report))
    return EXIT_OK if report.ok else EXIT_FAILED


def record(paths: Paths, args: argparse.Namespace) -> int:
    from worker.core.ledger import State
    from worker.core.telemetry import Telemetry
    from worker.errors import WorkerError

    words: list[str] = args.words
    if len(words) > 2 or (len(words) == 2 and words[0] not in ("start", "stop")):
        raise WorkerError(
            "validation_error",
            "write `agentworker record PLAN`, `record start PLAN` or `record stop PLAN`",
        )
    paths.ensure()
    state = State(paths.data_dir / "state.db")
    try:
        telemetry = Telemetry(state.connection)
        if len(words) == 2:
            return _switch(paths, args, state, telemetry, words[0], words[1])
        return _write_script(paths, args, state, words[0])
    finally:
        state.close()


def _named(args: argparse.Namespace) -> bool:
    """Whether the flags name a server (else the CLI chooses, and says which)."""
    return bool(args.server_key or args.server or args.token or args.tls_ca)


def _server_of_plan(
    paths: Paths, args: argparse.Namespace, state: State, plan: str, candidates: list[str]
) -> tuple[str, str]:
    """The server whose plan `record PLAN` or `record stop PLAN` means, and how it was
    chosen: the one the flags name; else the only one of `candidates` (the servers
    with the plan recorded); else, of several, the one the worker here serves or
    served last; else a UsageError naming them."""
    from worker.cli._common import server_named, shown
    from worker.errors import UsageError

    served = state.served()
    if _named(args) or not candidates:
        return server_named(paths, args, served)
    if len(candidates) == 1:
        return candidates[0], "the only server with this plan recorded"
    if served in candidates:
        return served, "the server the worker here serves, or served last"
    raise UsageError(
        f"plan {shown(plan)} was recorded for several servers: "
        + ", ".join(shown(c) for c in candidates)
        + f"; name one: agentworker record {shown(plan)} --server-key KEY"
    )


def _switch(
    paths: Paths,
    args: argparse.Namespace,
    state: State,
    telemetry: Telemetry,
    verb: str,
    plan: str,
) -> int:

    from worker.cli._common import server_named, shown
    from worker.errors import UsageError

    recordings = telemetry.recordings
    if verb == "start":
        served = state.served()
        if served is None and not _named(args):
            raise UsageError(
                f"which server's plan {shown(plan)} to record is not known: a plan id is "
                "one server's, and no worker has served a server from this data folder yet. "
                "Start the worker (`agentworker up`, or `agentworker run --server ADDRESS "
                "--token-file FILE`) and run this again, or name the server as `run` does: "
                f"agentworker record start {shown(plan)} --server ADDRESS --token-file FILE"
            )
        server, how = server_named(paths, args, served)
        started = recordings.start(server, plan, f"cli:{os.getuid()}")
        print(
            f"recording plan {shown(plan)}" + ("" if started else " (it already was)") + ": "
            f"its calls keep their args for `agentworker record {shown(plan)}` until "
            f"`record stop {shown(plan)}`"
        )
        print(
            f"  of server {shown(server)} ({how}); another server's plan of this id is not recorded"
        )
        return EXIT_OK
    being = [who for who, recorded, _, _ in recordings.plans() if recorded == plan]
    server, how = _server_of_plan(paths, args, state, plan, being)
    stopped = recordings.stop(server, plan)
    if stopped:
        print(
            f"plan {shown(plan)} of server {shown(server)} ({how}): recording stopped; what "
            "was kept stays (pruned with the telemetry)"
        )
        return EXIT_OK
    others = "".join(
        f"; it is for server {shown(who)} (--server-key {shown(who)})" for who in being
    )
    print(f"plan {shown(plan)} of server {shown(server)} was not being recorded{others}")
    return EXIT_FAILED


def _write_script(paths: Paths, args: argparse.Namespace, state: State, plan: str) -> int:
    from worker.cli._common import shown
    from worker.core.ledger import UNRECORDED_SERVER
    from worker.core.recording import Recordings
    from worker.errors import WorkerError
    from worker.replay.record import record as record_plan
    from worker.replay.record import servers_of_plan

    output: Path | None = args.output
    called = servers_of_plan(state.connection, plan)
    recordings = Recordings(state.connection)
    # Whose plan: the servers with calls of it recorded, else those it is recorded for
    # (none came yet), else those with calls of it.
    being = sorted({who for who, recorded, _, _ in recordings.plans() if recorded == plan})
    server, how = _server_of_plan(
        paths, args, state, plan, recordings.servers(plan) or being or called
    )
    stem = output.stem if output is not None else "script"
    recorded = record_plan(state.connection, server, plan, f"{stem}.blobs", timing=args.timing)
    others = [who for who in called if who != server]
    if len(recorded.lines) == 1:
        elsewhere = "".join(
            f"; server {shown(who)} has calls in a plan of this id (--server-key {shown(who)})"
            for who in others
        )
        raise WorkerError(
            "not_found",
            f"no calls of plan {plan} of server {server} ({how}) in this machine's "
            f"telemetry{elsewhere}",
        )
    if output is None:
        if recorded.blobs:
            raise WorkerError(
                "validation_error",
                f"calls of plan {plan} carry request blobs: give -o FILE so they can be "
                "written beside the script",
            )
        sys.stdout.write(recorded.text())
    else:
        from worker.cli._written_beside import LinkedError, write_beside

        try:  # never through a link the agent may have planted (review25 G4)
            write_beside(output, recorded.text(), recorded.blobs)
        except LinkedError as exc:
            raise WorkerError("validation_error", str(exc)) from None
        except OSError as exc:
            where = exc.filename or output.parent
            raise WorkerError(
                "internal_error", f"cannot write the script {output} ({where}: {exc.strerror})"
            ) from None
    where = f" to {output}" if output is not None else ""
    notes = [f"plan {shown(plan)} of server {shown(server)} ({how})"]
    if recorded.without_args:
        notes.append(
            f"{recorded.without_args} call(s) without args, as comments (recording was off: "
            f"`agentworker record start {shown(plan)}` before the session)"
        )
    if recorded.redacted:
        notes.append(f"{recorded.redacted} step(s) with secret-looking values masked (***)")
    for who in others:
        before = " (from before recordings were kept per server)"
        notes.append(
            f"server {shown(who)}{before if who == UNRECORDED_SERVER else ''} has calls in a "
            f"plan of this id too, left out (--server-key {shown(who)} writes them)"
        )
    print(
        f"wrote {recorded.steps} step(s){where}" + "".join(f"; {n}" for n in notes),
        file=sys.stderr,
    )
    return EXIT_OK
