"""Calling workerHost actions through the real hub, with the result blob kept.

`Cluster.call` summarises the blob as a size; the filesystem and fetch tests
need its bytes. `shared_cluster` starts one hub and worker for a whole test
module (a module's tests use their own folders in its workspace).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.support.cluster import Cluster, cluster, wait_for
from worker.hub.client import ControlClient, result_to_dict


async def dispatch(
    client: ControlClient, action: str, args: dict[str, Any], blob: bytes, **fields: Any
) -> tuple[dict[str, Any], bytes]:
    """`workerHost.<action>` as agent `tester`: (what `call` prints, the blob)."""
    response = await client.dispatch(
        agent_id="tester",
        surface="workerHost",
        action=action,
        args_json=json.dumps(args),
        blob=blob,
        **fields,
    )
    return result_to_dict(response), bytes(response.result.blob)


def call(
    live: Cluster, action: str, args: dict[str, Any], blob: bytes = b"", **fields: Any
) -> tuple[dict[str, Any], bytes]:
    """Dispatch `workerHost.<action>` as agent `tester`: (what `call` prints, the blob)."""
    result: tuple[dict[str, Any], bytes] = live.run(
        lambda c: dispatch(c, action, args, blob, **fields)
    )
    return result


def call_many(
    live: Cluster, requests: list[tuple[str, dict[str, Any], bytes]], in_flight: int = 16
) -> list[tuple[dict[str, Any], bytes]]:
    """Many calls over one client, `in_flight` at a time; answers in request order."""

    async def go(client: ControlClient) -> list[tuple[dict[str, Any], bytes]]:
        slots = asyncio.Semaphore(in_flight)

        async def one(
            action: str, args: dict[str, Any], blob: bytes
        ) -> tuple[dict[str, Any], bytes]:
            async with slots:
                return await dispatch(client, action, args, blob)

        return await asyncio.gather(*(one(*request) for request in requests))

    result: list[tuple[dict[str, Any], bytes]] = live.run(go)
    return result


def error_code(out: dict[str, Any]) -> str | None:
    return out["error"]["code"] if out.get("status") == "error" else None


@contextlib.contextmanager
def shared_cluster(
    home: Path, *, extra_config: str = "", worker_env: dict[str, str] | None = None
) -> Iterator[Cluster]:
    """A hub and a worker; the worker runs with `worker_env` added to its environment."""
    with cluster(home, worker=False, extra_config=extra_config) as live:
        worker = live.spawn("worker", "run", env=worker_env)
        wait_for(lambda: live.status().connected_workers >= 1, 60, worker)
        yield live
