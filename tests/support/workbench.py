"""Sandbox-mode workers (`agentworker run --sandbox`) on a real hub, and calls to them.

Each sandbox worker has a home of its own (its own data folder, so its own
workspaces and worker id) and joins the one hub with `--server` and `--token`,
as workers on other machines would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sandbox.workspaces import FILES, plan_key
from tests.support.cluster import Cluster, Proc, cluster, wait_for, write_config
from worker.core.connection import server_key
from worker.hub.client import ControlClient, result_to_dict
from worker.hub.placement import placement_token
from worker.paths import PLACEMENT_KEY_FILE
from worker.wire.proto import agentworker_pb2 as pb

SURFACE = "workbenchHost"
# Set (to a range of uids no account uses, "A-B"), every sandbox worker of the suite
# gives its plans a uid of their own ([sandbox] uids): run as root, the workbench tests
# then test that mode. Each such worker's home is then made where others may pass
# through (its place in the cluster's folder a link to it): pytest's folder is 700.
UIDS_SWITCH = "AGENTWORKER_TEST_SANDBOX_UIDS"


def passable_home(place: Path) -> Path:
    """A fresh home in a folder others may pass through (mode 711), linked from `place`
    (so the suite finds it where it looks); the home's path."""
    import atexit
    import shutil
    import tempfile

    real = Path(tempfile.mkdtemp(prefix="agentworker-uids-", dir="/tmp"))
    atexit.register(shutil.rmtree, real, True)
    real.chmod(0o711)
    home = real / place.name
    home.mkdir(mode=0o700)
    place.parent.mkdir(parents=True, exist_ok=True)
    place.symlink_to(home)
    return home


def start_sandbox_worker(
    live: Cluster, name: str, extra_config: str = "", env: dict[str, str] | None = None
) -> Proc:
    """A sandbox worker with a home of its own under the cluster's folder; waits until
    the hub lists it connected."""
    home = live.home.parent / name
    uids = os.environ.get(UIDS_SWITCH)
    if uids and "uids =" not in extra_config:
        extra_config = _with_uids(extra_config, uids)
    if "uids =" in extra_config:  # plans' uids pass through to their workspaces
        home = passable_home(home) if not home.exists() else home.resolve()
    write_config(home, live.listen, extra_config)
    before = {w.worker_id for w in live.workers() if w.connected}
    proc = live.spawn(
        name,
        "run",
        "--sandbox",
        "--server",
        live.listen,
        "--token",
        live.token,
        env={"AGENTWORKER_HOME": str(home), **(env or {})},
    )
    wait_for(
        lambda: len({w.worker_id for w in live.workers() if w.connected} - before) == 1, 20, proc
    )
    return proc


def _with_uids(extra_config: str, uids: str) -> str:
    """`extra_config` with `uids` in its [sandbox] section (made if it has none)."""
    line = f'uids = "{uids}"\n'
    if "[sandbox]\n" in extra_config:
        return extra_config.replace("[sandbox]\n", "[sandbox]\n" + line, 1)
    return f"{extra_config}\n[sandbox]\n{line}"


def worker_id_of(live: Cluster, name: str) -> str:
    return (live.home.parent / name / "worker_id").read_text().strip()


def placement_token_of(live: Cluster, worker_id: str, plan: str) -> str:
    """A placement token of the cluster's hub for `plan` on worker `worker_id` (made with
    the hub's hub-placements.key), of no epoch: what a hub from before epochs gave, and
    still proof to a hub with no record of the plan (a real worker holds one of the
    plan's epoch now: held_token_of)."""
    key = (live.home / PLACEMENT_KEY_FILE).read_text().strip().encode()
    return placement_token(key, worker_id, plan)


def held_token_of(live: Cluster, name: str, plan: str) -> str:
    """The placement token worker `name` keeps for `plan` (its plan.json, beside the
    workspace's files): the hub's, of the plan's creation (worker.hub.epochs)."""
    meta = files_of(live, name, plan).parent / "plan.json"
    return str(json.loads(meta.read_text()).get("placement_token", ""))


def key_of(live: Cluster, plan: str) -> str:
    """The folder name of plan `plan`'s workspace at a worker start_sandbox_worker
    started: a digest of the plan and of the key it knows the hub by."""
    return plan_key(plan, server_key(live.listen, live.token, tls=False))


def files_of(live: Cluster, name: str, plan: str) -> Path:
    """Where worker `name` keeps plan `plan`'s workspace on the host."""
    return live.home.parent / name / "workbench" / key_of(live, plan) / FILES


@contextlib.contextmanager
def sandbox_cluster(
    base: Path, *, extra_config: str = "", env: dict[str, str] | None = None
) -> Iterator[Cluster]:
    """A hub and one sandbox worker named `bench`."""
    with cluster(base / "hub", worker=False) as live:
        start_sandbox_worker(live, "bench", extra_config, env)
        yield live


async def _dispatch(
    client: ControlClient, action: str, args: dict[str, Any], blob: bytes, **fields: Any
) -> tuple[dict[str, Any], bytes]:
    response = await client.dispatch(
        agent_id=fields.pop("agent_id", "anyone"),
        surface=SURFACE,
        action=action,
        args_json=json.dumps(args),
        blob=blob,
        **fields,
    )
    return result_to_dict(response), bytes(response.result.blob)


def call(
    live: Cluster, plan: str, action: str, args: dict[str, Any], blob: bytes = b"", **fields: Any
) -> tuple[dict[str, Any], bytes]:
    """`workbenchHost.<action>` in plan `plan`: (what `agentworker call` prints, the blob)."""
    result: tuple[dict[str, Any], bytes] = live.run(
        lambda c: _dispatch(c, action, args, blob, plan_id=plan, **fields)
    )
    return result


def run(
    live: Cluster, plan: str, argv: list[str], *, blob: bytes = b"", **fields: Any
) -> tuple[dict[str, Any], bytes]:
    """workbenchHost.exec of `argv` in plan `plan`."""
    args: dict[str, Any] = {"argv": argv}
    for key in ("cwd", "timeout_s"):
        if key in fields:
            args[key] = fields.pop(key)
    return call(live, plan, "exec", args, blob, **fields)


def teardown(live: Cluster, plan: str, worker_id: str = "") -> dict[str, Any]:
    reply = live.run(
        lambda c: c.stub.Teardown(
            pb.TeardownRequest(plan_id=plan, worker_id=worker_id), metadata=c.metadata, timeout=60
        )
    )
    return result_to_dict(reply)


def in_parallel(live: Cluster, calls: list[tuple[str, list[str], dict[str, Any]]]) -> list[Any]:
    """Several exec calls at once over one client: (plan, argv, fields) each."""

    async def go(client: ControlClient) -> list[Any]:
        async def one(plan: str, argv: list[str], fields: dict[str, Any]) -> Any:
            args: dict[str, Any] = {"argv": argv}
            for key in ("cwd", "timeout_s"):
                if key in fields:
                    args[key] = fields.pop(key)
            return await _dispatch(client, "exec", args, b"", plan_id=plan, **fields)

        return await asyncio.gather(*(one(plan, argv, dict(f)) for plan, argv, f in calls))

    result: list[Any] = live.run(go)
    return result
