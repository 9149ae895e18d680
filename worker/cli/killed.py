"""`agentworker killed [--json]`: the plans killed at this machine's worker.

A kill holds until the person lifts it (`agentworker lift PLAN`), across restarts;
this lists what is held, who killed it, when and why, so there is something to lift.
Their history (kills and lifts with their calls) is in `agentworker audit`.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from worker.config import Paths


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    killed = sub.add_parser(
        "killed",
        help="list the plans killed here (lift one with `agentworker lift PLAN`)",
    )
    killed.add_argument("--json", action="store_true", help="machine-readable output")
    killed.set_defaults(handler=run)


def run(paths: Paths, args: argparse.Namespace) -> int:
    from worker.cli._common import shown
    from worker.core.ledger import ANY_SERVER, MAX_SERVER_KILLS, State

    state_db = paths.data_dir / "state.db"
    rows = []
    apart = 0
    if state_db.exists():  # no worker has run here yet: nothing was ever killed
        state = State(state_db)
        try:
            rows = [
                {
                    "plan": plan,
                    "reason": reason,
                    "killed_by": by,
                    "killed_at": datetime.fromtimestamp(ms / 1000, UTC).isoformat(
                        timespec="seconds"
                    ),
                    # A server's kill binds its own plan of the id; the person's, all.
                    "server": server,
                }
                for plan, reason, by, ms, server in state.kills()
            ]
            apart = state.kills_kept_apart()
        finally:
            state.close()
    if args.json:
        print(json.dumps(rows, indent=2))
    elif not rows and not apart:
        print("no plan is killed")
    else:
        for r in rows:
            # A server's KillPlan names the plan and says the reason.
            whose = "every server's" if r["server"] == ANY_SERVER else f"server {r['server']}'s"
            print(
                f"{shown(r['plan'])}  killed {r['killed_at']} by {shown(r['killed_by'])}: "
                f"{shown(r['reason'])}  ({shown(whose)} plan of this id)"
            )
        if apart:
            # Their ids are not kept (ledger.MAX_KILLS_APART): a person names one to lift it.
            print(
                f"and {apart:,} more kills of plans in use from servers, kept apart past "
                f"the newest {MAX_SERVER_KILLS:,} of a server's (their plan ids not kept)"
            )
        print("lift one with `agentworker lift PLAN`")
    return 0
