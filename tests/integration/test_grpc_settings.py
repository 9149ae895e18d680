"""gRPC's sockets are read by its own polling thread, and its fork handlers are off, in
every agentworker process (worker.cli.main.GRPC_SETTINGS, GRPC_FORK_SUPPORT, set
before gRPC is first imported) unless the
environment says otherwise; a hub and a worker started so serve calls over loopback,
one at a time, many at once and with blobs sent in parts."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cluster import cluster
from worker.cli.main import GRPC_FORK_SUPPORT, GRPC_SETTINGS
from worker.hub.client import ControlClient
from worker.wire.proto import agentworker_pb2 as pb

MIB = 1024 * 1024

# The installed command (ui.launch.main) runs `status`, which imports gRPC; a finder
# ahead of the others notes GRPC_EXPERIMENTS as gRPC's import begins (gRPC reads it
# then, and never again).
_PROBE = """
import contextlib, importlib.abc, io, json, os, sys
seen = []
class Spy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "grpc" and not seen:
            seen.append(os.environ.get("GRPC_EXPERIMENTS"))
            seen.append(os.environ.get("GRPC_ENABLE_FORK_SUPPORT"))
        return None
sys.meta_path.insert(0, Spy())
from ui.launch import main
sys.argv = ["agentworker", "status", "--json"]
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    main()
print(json.dumps(seen))
"""


def _seen_by_grpc(home: Path, **env: str) -> list[str | None]:
    ours = ("GRPC_EXPERIMENTS", "GRPC_ENABLE_FORK_SUPPORT")
    base = {k: v for k, v in os.environ.items() if k not in ours}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE],
        capture_output=True,
        text=True,
        check=True,
        env={**base, "AGENTWORKER_HOME": str(home), **env},
    )
    return list(json.loads(done.stdout.splitlines()[-1]))


def test_grpc_reads_its_sockets_on_its_polling_thread_unless_the_environment_says(
    tmp_path: Path,
) -> None:
    assert _seen_by_grpc(tmp_path) == [GRPC_SETTINGS, GRPC_FORK_SUPPORT]
    assert _seen_by_grpc(tmp_path, GRPC_EXPERIMENTS="-event_engine_client") == [
        "-event_engine_client",
        GRPC_FORK_SUPPORT,
    ]
    assert _seen_by_grpc(tmp_path, GRPC_EXPERIMENTS="") == ["", GRPC_FORK_SUPPORT]
    # gRPC's fork handlers restarted its poller in a child forked to exec a sandbox,
    # which wrote an epoll error into bubblewrap's stderr (GRPC_FORK_SUPPORT).
    assert _seen_by_grpc(tmp_path, GRPC_ENABLE_FORK_SUPPORT="true")[1] == "true"


def test_a_hub_and_worker_so_started_serve_calls_alone_many_at_once_and_with_blobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GRPC_EXPERIMENTS", raising=False)  # the processes' own setting
    with cluster(tmp_path / "home") as live:
        (live.workspace / "notes.txt").write_text("hello")
        out = live.call("workerHost.fs_stat", '{"path": "notes.txt"}')
        assert out["status"] == "ok" and out["result"]["size"] == 5, out

        async def burst(client: ControlClient) -> list[pb.DispatchResponse]:
            return await asyncio.gather(
                *(
                    client.dispatch(
                        agent_id="tester",
                        surface="workerHost",
                        action="fs_stat",
                        args_json='{"path": "notes.txt"}',
                    )
                    for _ in range(256)
                )
            )

        responses: list[pb.DispatchResponse] = live.run(burst)
        assert [r.result.status for r in responses] == [pb.ActionResult.OK] * 256
        assert len({r.result.correlation_id for r in responses}) == 256

        data = os.urandom(16 * MIB)  # in parts, down the stream
        wrote = live.call("workerHost.fs_write", '{"path": "big.bin"}', blob=data)
        assert wrote["status"] == "ok" and wrote["result"]["bytes_written"] == len(data), wrote
        assert (live.workspace / "big.bin").read_bytes() == data

        async def read_back(client: ControlClient) -> pb.DispatchResponse:
            return await client.dispatch(
                agent_id="tester",
                surface="workerHost",
                action="fs_read",
                args_json='{"path": "big.bin", "offset": 1048576, "length": 1048576}',
            )

        page: pb.DispatchResponse = live.run(read_back)
        assert page.result.status == pb.ActionResult.OK, page.result.error.message
        assert page.result.blob == data[MIB : 2 * MIB]
