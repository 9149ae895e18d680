"""`agentworker sandbox list`, `teardown PLAN` and `claim PLAN`: sandbox mode's plans.

`list` reads this machine's workspaces directly (it needs no hub): each plan, the
server it belongs to, the disk its workspace takes, when a call last used it and the
uid its programs run as, if it has one of its own ([sandbox] uids).
`teardown` goes through the hub, which finds the worker holding the plan; that
worker stops the plan's running calls and removes its workspace (of that hub's
plan: another server's workspace of the same plan id stays). Tearing down a plan
twice, or one that never ran, succeeds. `claim` gives a workspace no server reaches
(made before workspaces were kept per server, whose server the worker could not
tell) to a server, named as `run` names it; a claimed one can then be torn down.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

from worker.cli._common import (
    EXIT_FAILED,
    EXIT_OK,
    add_served_flags,
    add_server_flags,
    shown,
    with_client,
)

if TYPE_CHECKING:
    from worker.config import Paths
    from worker.wire.proto import agentworker_pb2 as pb

TEARDOWN_TIMEOUT_S: Final = 60.0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sandbox = sub.add_parser(
        "sandbox",
        help="sandbox mode's per-plan workspaces: list them, tear one down",
        description="Example: agentworker sandbox list; agentworker sandbox teardown PLAN",
    )
    sandbox.set_defaults(handler=run)
    verbs = sandbox.add_subparsers(dest="sandbox_command", required=True, metavar="ACTION")
    listing = verbs.add_parser("list", help="plans with a workspace here: size, last use")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    teardown = verbs.add_parser(
        "teardown",
        help="remove a plan's workspace and stop its programs (through the hub)",
    )
    teardown.add_argument("plan", help="the plan id")
    teardown.add_argument("--worker", default="", help="worker id (default: the one holding it)")
    teardown.add_argument("--json", action="store_true", help="machine-readable output")
    add_server_flags(teardown)
    claim = verbs.add_parser(
        "claim",
        help="give an unclaimed workspace (from before workspaces were kept per server) to "
        "a server",
        description="The server is named as `agentworker run` names it: --server ADDR with "
        "--token-file FILE (the worker's token) and --tls-ca; or --server-key KEY as `sandbox "
        "list` shows it. With none, the server the worker here serves (or served last).",
    )
    claim.add_argument("plan", help="the plan id")
    add_served_flags(claim)


def run(paths: Paths, args: argparse.Namespace) -> int:
    if args.sandbox_command == "list":
        return _list(paths, args)
    if args.sandbox_command == "claim":
        return _claim(paths, args)
    return _teardown(paths, args)


def _list(paths: Paths, args: argparse.Namespace) -> int:
    from sandbox.workspaces import UNCLAIMED, Workspaces
    from worker.config import load

    config = load(paths)
    workspaces = Workspaces(
        paths.workbench,
        quota_bytes=config.sandbox.quota_mb * 1024**2,
        max_entries=config.sandbox.max_entries,
    )
    plans = workspaces.plans()
    rows = [
        {
            "plan_id": plan.plan_id,
            "server": plan.server,
            "bytes": plan.bytes_used,
            "quota_bytes": workspaces.quota_bytes,
            "created": _iso(plan.created_unix),
            "last_used": _iso(plan.last_used_unix),
            "folder": str(workspaces.base / plan.key),
            "uid": plan.uid,  # its programs run as it ([sandbox] uids); None: the worker's
        }
        for plan in plans
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
    elif not rows:
        print(f"no plan workspaces in {paths.workbench}")
    else:
        for plan in plans:
            used = _iso(plan.last_used_unix)
            if plan.server == UNCLAIMED:
                whose = "unclaimed: no server reaches it (`agentworker sandbox claim PLAN`)"
            else:
                whose = f"server {shown(plan.server)}"
            uid = "" if plan.uid is None else f"  uid {plan.uid}"
            print(
                f"{shown(plan.plan_id)}  {_size(plan.bytes_used)}  last used {used}{uid}  {whose}"
            )
    return EXIT_OK


def _claim(paths: Paths, args: argparse.Namespace) -> int:
    from sandbox.workspaces import WorkspaceError, Workspaces
    from worker.cli._common import config_of, server_named
    from worker.cli.plans import local_state

    config = config_of(paths, args)
    state = local_state(paths)
    try:
        server, how = server_named(paths, args, state.served())
    finally:
        state.close()
    workspaces = Workspaces(paths.workbench, quota_bytes=config.sandbox.quota_mb * 1024**2)
    try:
        workspaces.claim(args.plan, server)
    except WorkspaceError as exc:
        print(f"plan {shown(args.plan)}: {shown(exc.message)}")
        return EXIT_FAILED
    print(
        f"plan {shown(args.plan)}: its workspace is server {shown(server)}'s now ({how}); "
        "that server's calls of the plan reach it (a running worker names it to the server "
        "at its next connect)"
    )
    return EXIT_OK


def _teardown(paths: Paths, args: argparse.Namespace) -> int:
    from worker.hub.client import ControlClient, result_to_dict
    from worker.wire.proto import agentworker_pb2 as pb

    replies: list[pb.DispatchResponse] = []

    # Through with_client, as every verb talking to a hub: it sent --server X this
    # machine's hub.token when no token was given (review28 r4), and a hub that did not
    # answer was a traceback.
    async def go(client: ControlClient) -> int:
        replies.append(
            await client.stub.Teardown(
                pb.TeardownRequest(worker_id=args.worker, plan_id=args.plan),
                metadata=client.metadata,
                timeout=TEARDOWN_TIMEOUT_S,
            )
        )
        return EXIT_OK

    with_client(paths, args, go)
    [reply] = replies
    out = result_to_dict(reply)
    if args.json:
        print(json.dumps(out, indent=2))
    elif reply.result.status == pb.ActionResult.OK:
        removed = out.get("result", {}).get("removed")
        where = f" on worker {shown(reply.worker_id)}" if reply.worker_id else ""
        said = "workspace removed" if removed else "had no workspace (nothing to remove)"
        print(f"plan {args.plan}: {said}{where}")
    else:
        error = f"{out['error']['code']}: {out['error']['message']}"
        print(f"plan {args.plan}: {shown(error)}")
    return EXIT_OK if reply.result.status == pb.ActionResult.OK else EXIT_FAILED


def _iso(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, UTC).isoformat(timespec="seconds")


def _size(count: int) -> str:
    size = float(count)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"
