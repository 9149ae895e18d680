"""What several verbs share: exit codes, the config a verb runs with, the hub client.

Only the standard library at the top: every verb module imports this, and
`agentworker --help` imports every verb module (see worker.cli.main).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from worker.config import Config, Paths
    from worker.hub.client import ControlClient

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1  # the action, check or lookup answered no; StartupErrors have their own

Verb = Callable[["Paths", argparse.Namespace], int]


def add_server_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", help="hub address (default: this machine's hub)")
    p.add_argument("--token", help="bearer token (default: the local hub's token file)")


def config_of(paths: Paths, args: argparse.Namespace) -> Config:
    """The config file, then AGENTWORKER_* variables, then this verb's flags."""
    from worker.config import load

    worker_flags = {
        "server": getattr(args, "server", None),
        "token": getattr(args, "token", None),
        "tls_ca": getattr(args, "tls_ca", None),
        "max_concurrency": getattr(args, "max_concurrency", None),
    }
    hub_flags = {"listen": getattr(args, "listen", None)}
    return load(paths, {"worker": worker_flags, "hub": hub_flags})


def with_client(
    paths: Paths,
    args: argparse.Namespace,
    body: Callable[[ControlClient], Coroutine[Any, Any, int]],
) -> int:
    """Run `body` against the hub (this machine's, or --server); the one place a gRPC
    failure talking to it becomes a HubUnreachableError."""
    import asyncio

    import grpc

    from worker.errors import HubUnreachableError
    from worker.hub.client import ControlClient

    config = config_of(paths, args)

    async def go() -> int:
        client = ControlClient.local(paths, config, args.server, args.token)
        try:
            return await body(client)
        finally:
            await client.close()

    try:
        return asyncio.run(go())
    except grpc.aio.AioRpcError as exc:
        raise HubUnreachableError(f"the hub answered {exc.code().name}: {exc.details()}") from exc


def iso(unix_ms: int) -> str:
    return (
        datetime.fromtimestamp(unix_ms / 1000, UTC).isoformat(timespec="seconds")
        if unix_ms
        else "never"
    )
