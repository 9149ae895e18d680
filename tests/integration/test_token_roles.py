"""A token per role: `hub.token` for callers, `hub-workers.token` for workers. A
worker's machine holds only the second, which serves and never sends calls."""

from __future__ import annotations

import asyncio
import stat
import subprocess
import sys
from pathlib import Path

import grpc

from tests.support.cluster import cluster
from worker.hub.client import ControlClient
from worker.wire.auth import WORKERS_ONLY
from worker.wire.proto import agentworker_pb2 as pb


def test_the_workers_token_serves_but_cannot_call(tmp_path: Path) -> None:
    with cluster(tmp_path / "home", worker=False) as live:
        callers, workers = live.home / "hub.token", live.home / "hub-workers.token"
        for made in (callers, workers):
            assert stat.S_IMODE(made.stat().st_mode) == 0o600
        workers_token = workers.read_text().strip()
        assert workers_token and workers_token != live.token
        # A worker beside its hub picks the workers' token by itself, and serves.
        live.start_worker()
        assert live.call("workerDiag.probe")["status"] == "ok"

        async def with_workers_token() -> list[tuple[grpc.StatusCode, str]]:
            client = ControlClient.connect(live.listen, workers_token)
            refused = []
            try:
                asks = [
                    client.stub.Status(pb.StatusRequest(), metadata=client.metadata),
                    client.stub.ListWorkers(pb.ListWorkersRequest(), metadata=client.metadata),
                    client.stub.KillPlan(
                        pb.KillPlanRequest(plan_id="p", reason="r"), metadata=client.metadata
                    ),
                    client.stub.Dispatch(
                        pb.DispatchRequest(
                            agent_id="a", surface="workerDiag", action="probe", args_json="{}"
                        ),
                        metadata=client.metadata,
                    ),
                ]
                for ask in asks:
                    try:
                        await ask
                    except grpc.aio.AioRpcError as exc:
                        refused.append((exc.code(), exc.details()))
            finally:
                await client.close()
            return refused

        refusal = (grpc.StatusCode.PERMISSION_DENIED, WORKERS_ONLY)
        assert asyncio.run(with_workers_token()) == [refusal] * 4
        assert live.status().connected_workers == 1, "the killed plan was never killed"

        # The command line says which token to use instead.
        called = subprocess.run(
            [sys.executable, "-m", "worker", "call", "workerDiag.probe", "{}",
             "--agent", "a", "--token-file", str(workers)],
            env=live.env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert called.returncode == 5, called.stderr
        assert "takes this token from workers only" in called.stderr
        assert "hub.token" in called.stderr
