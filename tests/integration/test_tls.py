"""Off loopback the token only travels over TLS; on TLS the whole path still works."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc

from tests.support.certs import make_ca_and_server
from tests.support.cluster import cluster, wait_for
from worker.hub.client import ControlClient
from worker.wire.proto import agentworker_pb2 as pb


def test_worker_and_caller_reach_a_tls_hub(tmp_path: Path) -> None:
    ca, cert, key = make_ca_and_server(tmp_path, "127.0.0.1")
    with cluster(tmp_path / "home", hub=False, worker=False) as live:
        tls_env = {"AGENTWORKER_TLS_CERT": str(cert), "AGENTWORKER_TLS_KEY": str(key)}
        hub = live.spawn("hub", "hub", env=tls_env)
        wait_for(lambda: (live.home / "hub.token").exists(), 60, hub)
        worker = live.spawn("worker", "run", "--server", live.listen, "--tls-ca", str(ca))

        async def worker_connected() -> bool:
            client = ControlClient.connect(live.listen, live.token, tls_ca=ca)
            try:
                reply = await client.stub.Status(pb.StatusRequest(), metadata=client.metadata)
            except grpc.aio.AioRpcError:  # the token file exists before the hub listens
                return False
            finally:
                await client.close()
            return bool(reply.connected_workers == 1)

        wait_for(lambda: asyncio.run(worker_connected()), 20, worker)


def test_hub_refuses_plaintext_off_loopback(tmp_path: Path) -> None:
    with cluster(tmp_path / "home", hub=False, worker=False) as live:
        hub = live.spawn("hub", "hub", "--listen", "0.0.0.0:0")
        assert hub.wait(20) != 0
        assert "refusing to serve plaintext on 0.0.0.0:0" in hub.log()
