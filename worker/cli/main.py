"""`agentworker`: run the worker, the hub or both, and talk to them.

Start here:   agentworker up            hub + worker on this machine (loopback)
Then try:     agentworker call fs_stat '{"path": "."}' --agent me
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc

import worker
from worker import app
from worker.cli import allowlist as cli_allowlist
from worker.cli import doctor as cli_doctor
from worker.cli import killed as cli_killed
from worker.cli import reload as cli_reload
from worker.cli import replay as cli_replay
from worker.cli import sandbox as cli_sandbox
from worker.cli import service as cli_service
from worker.cli import telemetry as cli_telemetry
from worker.config import Config, Paths, load
from worker.core.connection import FatalConnectionError, Target
from worker.core.console_socket import SocketLink, socket_path
from worker.core.ledger import State
from worker.errors import HubUnreachableError, StartupError, UsageError, WorkerError
from worker.hub.client import ControlClient, result_to_dict
from worker.wire.proto import agentworker_pb2 as pb

EXIT_OK, EXIT_ACTION_ERROR = 0, 1
EXIT_UNAVAILABLE = HubUnreachableError.exit_code

log = logging.getLogger("agentworker")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentworker",
        description="Let a remote AI agent work on this computer, inside the scopes you grant, "
        "with every call logged. Run `agentworker up` to start.",
        epilog="Files: config.toml in the user config dir, data in the user data dir; "
        "AGENTWORKER_HOME (or --home) puts both in one folder.",
    )
    parser.add_argument("--home", type=Path, help="keep config and data in this folder")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail")
    parser.add_argument("--version", action="version", version=f"agentworker {worker.__version__}")
    parser.add_argument(
        "--log-file", type=Path, help="append the log to this file instead of standard error"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="run hub and worker together on loopback (the default setup)")
    up.add_argument("--listen", help="hub address (default from config: 127.0.0.1:7421)")
    up.add_argument("--sandbox", action="store_true", help=SANDBOX_HELP)
    _add_headless_flag(up)

    hub = sub.add_parser("hub", help="run the reference hub alone")
    hub.add_argument("--listen", help="address to serve (loopback unless TLS is configured)")

    run = sub.add_parser(
        "run", help="run a worker alone; with no flags it joins this machine's hub"
    )
    run.add_argument("--server", help="hub or agent server address, host:port")
    run.add_argument("--token", help="bearer token (default: the local hub's token file)")
    run.add_argument("--tls-ca", type=Path, help="CA certificate to verify a TLS server")
    run.add_argument("--max-concurrency", type=int, help="calls executed at once (default 8)")
    run.add_argument("--sandbox", action="store_true", help=SANDBOX_HELP)
    _add_headless_flag(run)

    sub.add_parser(
        "ui",
        help="open the TUI on the worker already running on this machine (approvals, calls, "
        "kill switch)",
        description="Attaches over a local socket only your user can open. While attached, "
        "calls that need your approval wait for you here.",
    )

    call = sub.add_parser(
        "call",
        help="run one action through the hub and print the result as JSON",
        description='Example: agentworker call fs_stat \'{"path": "."}\' --agent me. '
        "ACTION is surface.action; a bare name means workerHost.NAME.",
    )
    call.add_argument("action", metavar="ACTION")
    call.add_argument("args", metavar="JSON", nargs="?", default="{}", help="the action's args")
    call.add_argument("--plan", default="", help="plan id (kill switch and grants are per plan)")
    call.add_argument("--agent", default="cli", help="agent id the call is made as (default cli)")
    call.add_argument("--worker", default="", help="worker id, when several are connected")
    call.add_argument("--task", default="", help="task id, for telemetry")
    call.add_argument("--id", default="", help="correlation id; reuse one to retry safely")
    call.add_argument("--timeout", type=float, default=0, help="deadline in seconds")
    call.add_argument("--blob-in", type=Path, help="send this file's bytes as the request blob")
    call.add_argument("--blob-out", type=Path, help="write the result blob to this file")
    _add_server_flags(call)

    workers = sub.add_parser("workers", help="list the workers the hub knows")
    workers.add_argument("--json", action="store_true", help="machine-readable output")
    _add_server_flags(workers)

    status = sub.add_parser("status", help="connected / disconnected / unconfigured")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    _add_server_flags(status)

    kill = sub.add_parser(
        "kill",
        help="kill a plan: stop its running calls and refuse the rest, here and through the "
        "hub, until `lift`",
    )
    kill.add_argument("plan", help="the plan id the server gave the calls (--plan of `call`)")
    kill.add_argument(
        "--reason",
        default="killed from the command line",
        help="said in every refused call's error message and in the audit log",
    )
    _add_server_flags(kill)

    lift = sub.add_parser("lift", help="lift a plan's kill (local only)")
    lift.add_argument("plan", help="a plan id killed earlier (`agentworker killed` lists them)")

    grant = sub.add_parser(
        "grant",
        help="grant a scope to an agent (local only)",
        description="Example: agentworker grant 'workerHost.fs_*' --agent planner --for 8h",
    )
    grant.add_argument("scope", help="a scope or pattern, e.g. workerHost.fs_stat, workerHost.*")
    grant.add_argument("--agent", default="*", help="agent id or pattern (default: any)")
    grant.add_argument("--plan", default="*", help="plan id or pattern (default: any)")
    grant.add_argument("--for", dest="duration", help="expire after e.g. 30m, 8h, 7d")

    grants = sub.add_parser("grants", help="list grants made with `grant`")
    grants.add_argument("--json", action="store_true", help="machine-readable output")

    revoke = sub.add_parser("revoke", help="remove a grant made with `grant`")
    revoke.add_argument("grant_id", type=int)

    cli_allowlist.add_parser(sub)
    cli_replay.add_parser(sub)
    cli_sandbox.add_parser(sub, _add_server_flags)
    cli_telemetry.add_parser(sub)
    cli_service.add_parsers(sub)
    cli_doctor.add_parsers(sub)
    cli_killed.add_parsers(sub)
    cli_reload.add_parsers(sub)
    return parser


SANDBOX_HELP = (
    "sandbox mode (the workbench): serve workbenchHost.* with a contained workspace per "
    "plan instead of your shared folders; refuses to start if bubblewrap cannot work here"
)


def _add_headless_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--headless",
        action="store_true",
        help="no TUI even on a terminal (the default with no terminal); calls that need "
        "approval are refused unless `agentworker ui` is attached",
    )


def _add_server_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", help="hub address (default: this machine's hub)")
    p.add_argument("--token", help="bearer token (default: the local hub's token file)")


def main(argv: list[str] | None = None, frontend: app.Frontend | None = None) -> int:
    """The command line. `frontend` is the TUI, which the `agentworker` command hands
    in from `ui/` (the worker never imports it); without one, the worker runs headless."""
    args = _parser().parse_args(argv)
    args.frontend = frontend
    if args.home:
        os.environ["AGENTWORKER_HOME"] = str(args.home)
    if args.log_file:
        args.log_file.parent.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        **({"filename": str(args.log_file)} if args.log_file else {"stream": sys.stderr}),
    )
    paths = Paths.from_env()
    try:
        handler = _COMMANDS[args.command]
        return handler(paths, args)
    except StartupError as exc:
        print(f"agentworker: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except WorkerError as exc:  # an action's answer met here (a broken allowlist, say)
        print(f"agentworker: {exc.message}", file=sys.stderr)
        return EXIT_ACTION_ERROR
    except FatalConnectionError as exc:
        print(f"agentworker: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except grpc.aio.AioRpcError as exc:
        print(f"agentworker: the hub answered {exc.code().name}: {exc.details()}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except KeyboardInterrupt:
        return 130


def _config(paths: Paths, args: argparse.Namespace) -> Config:
    worker_flags = {
        "server": getattr(args, "server", None),
        "token": getattr(args, "token", None),
        "tls_ca": getattr(args, "tls_ca", None),
        "max_concurrency": getattr(args, "max_concurrency", None),
    }
    hub_flags = {"listen": getattr(args, "listen", None)}
    return load(paths, {"worker": worker_flags, "hub": hub_flags})


# ----------------------------------------------------------------- long-running


def _tui(paths: Paths, args: argparse.Namespace) -> app.Frontend | None:
    """The TUI when it can be shown (a frontend, a terminal, no --headless); while it
    runs, the log goes to a file so nothing draws over the screen."""
    frontend: app.Frontend | None = args.frontend
    on_terminal = sys.stdin.isatty() and sys.stdout.isatty()
    if frontend is None or args.headless or not on_terminal:
        return None
    _log_to_file(paths)
    return frontend


def _log_to_file(paths: Paths, name: str = "agentworker.log") -> None:
    paths.ensure()
    log_file = paths.data_dir / name
    handler = logging.FileHandler(log_file, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    print(f"agentworker: logging to {log_file}", file=sys.stderr)


def _up(paths: Paths, args: argparse.Namespace) -> int:
    app.prepare(paths)
    config = _config(paths, args)
    asyncio.run(app.run_up(paths, config, sandbox=args.sandbox, frontend=_tui(paths, args)))
    return EXIT_OK


def _hub(paths: Paths, args: argparse.Namespace) -> int:
    paths.ensure()
    asyncio.run(app.run_hub(paths, _config(paths, args), args.listen))
    return EXIT_OK


def _run(paths: Paths, args: argparse.Namespace) -> int:
    app.prepare(paths)
    config = _config(paths, args)
    target: Target = app.worker_target(paths, config)
    asyncio.run(
        app.run_worker(paths, config, target, sandbox=args.sandbox, frontend=_tui(paths, args))
    )
    return EXIT_OK


def _ui(paths: Paths, args: argparse.Namespace) -> int:
    """Attach the TUI to the worker already running with this data folder."""
    frontend: app.Frontend | None = args.frontend
    if frontend is None:
        raise UsageError("the TUI comes with the `agentworker` command; run `agentworker ui`")
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("`agentworker ui` needs a terminal")
    _log_to_file(paths, "agentworker-ui.log")
    link = SocketLink(socket_path(paths))
    asyncio.run(frontend.serve(link))
    return EXIT_OK


# ----------------------------------------------------------------- hub clients


def _with_client(
    paths: Paths,
    args: argparse.Namespace,
    body: Callable[[ControlClient], Coroutine[Any, Any, int]],
) -> int:
    config = _config(paths, args)

    async def go() -> int:
        client = ControlClient.local(paths, config, args.server, args.token)
        try:
            return await body(client)
        finally:
            await client.close()

    return asyncio.run(go())


def _call(paths: Paths, args: argparse.Namespace) -> int:
    surface, _, action = args.action.rpartition(".")
    blob = args.blob_in.read_bytes() if args.blob_in else b""

    async def body(client: ControlClient) -> int:
        response = await client.dispatch(
            worker_id=args.worker,
            correlation_id=args.id,
            plan_id=args.plan,
            agent_id=args.agent,
            task_id=args.task,
            surface=surface or "workerHost",
            action=action,
            args_json=args.args,
            blob=blob,
            timeout_ms=int(args.timeout * 1000),
        )
        if args.blob_out and response.result.blob:
            args.blob_out.write_bytes(response.result.blob)
        print(json.dumps(result_to_dict(response), indent=2, ensure_ascii=False))
        return EXIT_OK if response.result.status == pb.ActionResult.OK else EXIT_ACTION_ERROR

    return _with_client(paths, args, body)


def _workers(paths: Paths, args: argparse.Namespace) -> int:
    async def body(client: ControlClient) -> int:
        reply = await client.stub.ListWorkers(pb.ListWorkersRequest(), metadata=client.metadata)
        rows = [
            {
                "worker_id": w.worker_id,
                "connected": w.connected,
                "state": pb.Heartbeat.State.Name(w.state).lower(),
                "in_flight": w.in_flight,
                "max_concurrency": w.max_concurrency,
                "version": w.version,
                "last_seen": _iso(w.last_seen_unix_ms),
                "actions": list(w.actions),
            }
            for w in reply.workers
        ]
        if args.json:
            print(json.dumps(rows, indent=2))
        elif not rows:
            print("no workers yet: start one with `agentworker run` (or use `agentworker up`)")
        else:
            for r in rows:
                link = "connected" if r["connected"] else f"last seen {r['last_seen']}"
                print(
                    f"{r['worker_id']}  {link}  in flight {r['in_flight']}/{r['max_concurrency']}"
                )
        return EXIT_OK

    return _with_client(paths, args, body)


def _status(paths: Paths, args: argparse.Namespace) -> int:
    async def body(client: ControlClient) -> int:
        reply = await client.stub.Status(pb.StatusRequest(), metadata=client.metadata)
        state = pb.StatusResponse.State.Name(reply.state).lower()
        if args.json:
            print(
                json.dumps(
                    {
                        "state": state,
                        "connected_workers": reply.connected_workers,
                        "known_workers": reply.known_workers,
                        "version": reply.version,
                    }
                )
            )
        else:
            print(
                f"{state}: {reply.connected_workers} of {reply.known_workers} worker(s) connected"
            )
        return EXIT_OK if reply.state == pb.StatusResponse.CONNECTED else EXIT_ACTION_ERROR

    return _with_client(paths, args, body)


def _kill(paths: Paths, args: argparse.Namespace) -> int:
    """Record the kill in this machine's ledger first: it holds with no hub running and
    across restarts, and the worker here stops the plan's running calls within a
    moment. Then tell the hub, which passes it to every connected worker."""
    state = _local_state(paths)
    try:
        state.kill_plan(args.plan, args.reason, "cli")
    finally:
        state.close()
    print(f"plan {args.plan} killed at this machine's worker (until `agentworker lift`)")

    async def body(client: ControlClient) -> int:
        try:
            reply = await client.stub.KillPlan(
                pb.KillPlanRequest(plan_id=args.plan, reason=args.reason),
                metadata=client.metadata,
                timeout=HUB_NOTICE_TIMEOUT_S,
            )
        except grpc.aio.AioRpcError as exc:
            print(f"the hub was not told ({exc.code().name}): {HUB_UNTOLD}")
            return EXIT_OK
        told = ", ".join(reply.worker_ids) or "none connected"
        print(f"the hub told its workers: {told}")
        if reply.queued_worker_ids:
            away = ", ".join(reply.queued_worker_ids)
            print(f"and will tell these when they next connect: {away}")
        return EXIT_OK

    try:
        return _with_client(paths, args, body)
    except StartupError as exc:  # no hub on this machine, say
        print(f"the hub was not told ({exc.message}): {HUB_UNTOLD}")
        return EXIT_OK


HUB_NOTICE_TIMEOUT_S = 5.0
HUB_UNTOLD = "workers on other machines still run the plan"


# ----------------------------------------------------------------- local state


def _local_state(paths: Paths) -> State:
    paths.ensure()
    return State(paths.data_dir / "state.db")


def _lift(paths: Paths, args: argparse.Namespace) -> int:
    state = _local_state(paths)
    lifted = state.lift_kill(args.plan)
    print(f"plan {args.plan}: kill lifted" if lifted else f"plan {args.plan} was not killed")
    return EXIT_OK if lifted else EXIT_ACTION_ERROR


_DURATION = re.compile(r"^(\d+)([smhd])$")


def _parse_duration(text: str) -> timedelta:
    match = _DURATION.match(text.strip())
    if not match:
        raise UsageError(f"--for {text!r}: use a number and s, m, h or d (e.g. 8h)")
    amount, unit = int(match.group(1)), match.group(2)
    return timedelta(**{{"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[unit]: amount})


def _grant(paths: Paths, args: argparse.Namespace) -> int:
    if not re.fullmatch(r"[A-Za-z*]+\.[A-Za-z_*?]+", args.scope):
        raise UsageError(
            f"{args.scope!r} is not a scope: write surface.action, e.g. workerHost.fs_stat "
            "or workerHost.*",
        )
    expires = datetime.now(UTC) + _parse_duration(args.duration) if args.duration else None
    grant_id = _local_state(paths).add_grant(
        args.agent, args.scope, args.plan, expires, granted_by=f"cli:{os.getuid()}"
    )
    until = f" until {expires.isoformat(timespec='seconds')}" if expires else ""
    print(f"grant {grant_id}: {args.scope} for agent {args.agent}, plan {args.plan}{until}")
    return EXIT_OK


def _grants(paths: Paths, args: argparse.Namespace) -> int:
    rows = [
        {
            "id": g.id,
            "agent": g.agent,
            "scope": g.scope,
            "plan": g.plan,
            "expires": g.expires.isoformat() if g.expires else None,
            "granted_by": g.granted_by,
        }
        for g in _local_state(paths).grants()
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
    elif not rows:
        print("no grants made with `agentworker grant` (config.toml may hold more)")
    for r in rows if not args.json else []:
        print(f"{r['id']}: {r['scope']} agent={r['agent']} plan={r['plan']} expires={r['expires']}")
    return EXIT_OK


def _revoke(paths: Paths, args: argparse.Namespace) -> int:
    removed = _local_state(paths).revoke_grant(args.grant_id)
    print(f"grant {args.grant_id} revoked" if removed else f"no grant {args.grant_id}")
    return EXIT_OK if removed else EXIT_ACTION_ERROR


def _iso(unix_ms: int) -> str:
    return (
        datetime.fromtimestamp(unix_ms / 1000, UTC).isoformat(timespec="seconds")
        if unix_ms
        else "never"
    )


_COMMANDS: dict[str, Callable[[Paths, argparse.Namespace], int]] = {
    "up": _up,
    "hub": _hub,
    "run": _run,
    "ui": _ui,
    "call": _call,
    "workers": _workers,
    "status": _status,
    "kill": _kill,
    "lift": _lift,
    "grant": _grant,
    "grants": _grants,
    "revoke": _revoke,
    "allowlist": cli_allowlist.run,
    "replay": cli_replay.run,
    "sandbox": cli_sandbox.run,
    "record": cli_replay.record,
    "telemetry": cli_telemetry.run,
    "audit": cli_telemetry.run,
    "service": cli_service.run,
    "doctor": cli_doctor.run,
    "killed": cli_killed.run,
    "reload": cli_reload.run,
}

if __name__ == "__main__":
    sys.exit(main())
