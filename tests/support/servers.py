"""One worker's data folder pointed at one server, then another (real hubs, real
`agentworker run` subprocesses): what a worker keeps per server is checked across them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from sandbox.workspaces import plan_key
from tests.support.cluster import Cluster, Proc, wait_for, write_config
from worker.core.connection import server_key

START_S = 60.0


def workers_token(hub: Cluster) -> Path:
    return hub.home / "hub-workers.token"


def key_of(hub: Cluster) -> str:
    """The key the worker knows `hub` by (`run --server ADDR --token-file FILE`)."""
    return server_key(hub.listen, workers_token(hub).read_text().strip(), tls=False)


class Worker:
    """One data folder; `at(hub)` runs `agentworker run [--sandbox]` on it against `hub`
    (with its workers' token), after stopping the run before."""

    def __init__(
        self, home: Path, listen: str, *, sandbox: bool = True, extra_config: str = ""
    ) -> None:
        self.home = home
        self.sandbox = sandbox
        write_config(home, listen, extra_config)
        self.proc: Proc | None = None
        self.sessions = 0

    @property
    def worker_id(self) -> str:
        return (self.home / "worker_id").read_text().strip()

    def at(self, hub: Cluster) -> Proc:
        self.stop()
        seen = {w.instance_id for w in hub.workers()}
        self.sessions += 1
        self.proc = hub.spawn(
            f"worker-{self.home.name}-{self.sessions}",
            "run",
            *(["--sandbox"] if self.sandbox else []),
            "--headless",
            "--server",
            hub.listen,
            "--token-file",
            str(workers_token(hub)),
            env={"AGENTWORKER_HOME": str(self.home)},
        )
        wait_for(
            lambda: any(w.connected and w.instance_id not in seen for w in hub.workers()),
            START_S,
            self.proc,
        )
        return self.proc

    def stop(self) -> None:
        if self.proc is not None and self.proc.running():
            self.proc.signal(signal.SIGTERM)
            self.proc.wait(START_S)
        self.proc = None

    def folder(self, server: str, plan: str) -> Path:
        return self.home / "workbench" / plan_key(plan, server)

    def cli(self, *argv: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTWORKER_")}
        return subprocess.run(
            [sys.executable, "-m", "worker", *argv],
            env={**env, "AGENTWORKER_HOME": str(self.home)},
            capture_output=True,
            text=True,
            timeout=START_S,
            check=False,
        )

    def listed(self) -> list[dict[str, Any]]:
        done = self.cli("sandbox", "list", "--json")
        assert done.returncode == 0, done
        rows: list[dict[str, Any]] = json.loads(done.stdout)
        return rows
