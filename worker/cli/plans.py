"""`agentworker kill` and `lift`: a plan's kill switch, held by this machine's ledger."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from worker.cli._common import EXIT_FAILED, EXIT_OK, add_server_flags, shown, with_client

if TYPE_CHECKING:
    from worker.config import Paths
    from worker.core.ledger import State
    from worker.hub.client import ControlClient

HUB_NOTICE_TIMEOUT_S: Final = 5.0
HUB_UNTOLD: Final = "workers on other machines still run the plan"


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    add_server_flags(kill)
    kill.set_defaults(handler=_kill)

    lift = sub.add_parser("lift", help="lift a plan's kill (local only)")
    lift.add_argument("plan", help="a plan id killed earlier (`agentworker killed` lists them)")
    lift.set_defaults(handler=_lift)


def local_state(paths: Paths) -> State:
    """This machine's ledger: kills and grants live there, hub or no hub."""
    from worker.core.ledger import State

    paths.ensure()
    return State(paths.data_dir / "state.db")


def _kill(paths: Paths, args: argparse.Namespace) -> int:
    """Record the kill in this machine's ledger first: it holds with no hub running and
    across restarts, and the worker here stops the plan's running calls within a
    moment. Then tell the hub, which passes it to every connected worker."""
    import grpc

    from worker.cli.reload import nudge
    from worker.errors import StartupError
    from worker.wire.proto import agentworker_pb2 as pb

    state = local_state(paths)
    try:
        state.kill_plan(args.plan, args.reason, "cli")
    finally:
        state.close()
    nudge(paths)  # the worker here stops the plan's running calls now
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
        told = _listed(reply.worker_ids) or "none connected"
        print(f"the hub told its workers: {told}")
        if reply.queued_worker_ids:
            away = _listed(reply.queued_worker_ids)
            print(f"and will tell these when they next connect: {away}")
        return EXIT_OK

    try:
        return with_client(paths, args, body)
    except StartupError as exc:  # no hub on this machine, say
        print(f"the hub was not told ({exc.message}): {HUB_UNTOLD}")
        return EXIT_OK


# Workers named in a line of `kill`'s answer; the rest are counted (a hub remembers up
# to 1,024 workers away, and tells each).
WORKERS_NAMED: Final = 8


def _listed(worker_ids: Sequence[str]) -> str:
    named = ", ".join(shown(w) for w in worker_ids[:WORKERS_NAMED])
    more = len(worker_ids) - WORKERS_NAMED
    return f"{named} and {more:,} more" if more > 0 else named


def _lift(paths: Paths, args: argparse.Namespace) -> int:
    state = local_state(paths)
    lifted = state.lift_kill(args.plan)
    plan = shown(args.plan)
    if lifted:
        print(f"plan {plan}: kill lifted")
        return EXIT_OK
    print(f"plan {plan} was not killed (`agentworker killed` lists the plans that are)")
    return EXIT_FAILED
