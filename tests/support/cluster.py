"""Start a real hub and a real worker as subprocesses, each isolated in its own home.

Both share one AGENTWORKER_HOME (the worker reads the hub's token file from it, as
on a person's machine) but keep separate databases. Tests talk to the hub through
its ControlService over loopback gRPC, exactly as the agent server would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from tests.support.bounds import Bound
from worker.hub.client import ControlClient, result_to_dict
from worker.wire.proto import agentworker_pb2 as pb

CONFIG = """\
[hub]
listen = "{listen}"
default_timeout_s = 30
held_blobs_mib = {held_blobs_mib}
accept_new_workers = {accept_new_workers}

[[root]]
path = "{workspace}"
mode = "rw"

[[grant]]
agent = "tester"
scopes = ["workerHost.*", "workerDiag.*"]

[worker]
diagnostics = true
drain_grace_s = {drain_grace_s}
max_concurrency = {max_concurrency}
max_accepted = {max_accepted}
max_unacked_mib = {max_unacked_mib}

[connection]
keepalive_time_s = {keepalive_s}
ping_timeout_s = {ping_timeout_s}
heartbeat_s = {heartbeat_s}
backoff_base_s = {backoff_base_s}
backoff_cap_s = {backoff_cap_s}
"""


PORT_ATTEMPTS = 3
# How long a hub or a worker may take to start: a ceiling for a machine under heavy
# load (a start took over 15 s at a load of 30 on 2 cores), not a pace; an exit is
# seen at once.
START_WITHIN_S = 60.0
# The clusters the running test made, for its report should it fail (tests/conftest.py).
CLUSTERS_MADE: list[Cluster] = []


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Proc:
    """One agentworker subprocess with its output in a file."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        log = self.log_path.open("ab")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "worker", *self.argv],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def signal(self, sig: int) -> None:
        assert self.popen is not None
        self.popen.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL: no cleanup, no goodbye — a crash."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)

    def wait(self, timeout: float) -> int:
        assert self.popen is not None
        return self.popen.wait(timeout)

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class Cluster:
    home: Path
    listen: str
    env: dict[str, str]
    procs: list[Proc] = field(default_factory=list)

    @property
    def workspace(self) -> Path:
        return self.home / "workspace"

    @property
    def token(self) -> str:
        return (self.home / "hub.token").read_text().strip()

    def spawn(self, name: str, *argv: str, env: dict[str, str] | None = None) -> Proc:
        proc = Proc(name, list(argv), {**self.env, **(env or {})}, self.home / f"{name}.log")
        self.procs.append(proc.start())
        return proc

    def start_hub(self) -> Proc:
        hub = self.spawn("hub", "hub")
        wait_for(
            lambda: (self.home / "hub.token").exists() and self._hub_answers(), START_WITHIN_S, hub
        )
        return hub

    def start_worker(self, *argv: str) -> Proc:
        worker = self.spawn("worker", "run", *argv)
        wait_for(self._worker_in, START_WITHIN_S, worker)
        return worker

    def spawn_worker_at(self, name: str, home: Path) -> Proc:
        """A real worker (`agentworker run`) with the home `home`, dialling this hub by
        its address and token as a worker on another machine would; not waited for."""
        return self.spawn(
            name,
            "run",
            "--server",
            self.listen,
            "--token",
            self.token,
            env={"AGENTWORKER_HOME": str(home)},
        )

    def _worker_in(self) -> bool:
        try:  # a status call past its 2 s under heavy load is asked again, not a failure
            return self.status().connected_workers >= 1
        except grpc.aio.AioRpcError:
            return False

    def _hub_answers(self) -> bool:
        try:
            self.status()
            return True
        except (grpc.aio.AioRpcError, OSError):
            return False

    def cli(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """`agentworker <argv>` with this cluster's environment, as the person runs it."""
        return subprocess.run(
            [sys.executable, "-m", "worker", *argv],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    # ------------------------------------------------------------- control calls

    def run(self, coro_fn: Any, *, token: str | None = None) -> Any:
        """`coro_fn(client)` on a new client, with the hub's token read now unless given."""

        async def go() -> Any:
            client = ControlClient.connect(self.listen, token or self.token)
            try:
                return await coro_fn(client)
            finally:
                await client.close()

        return asyncio.run(go())

    def status(self) -> pb.StatusResponse:
        return self.run(
            lambda c: c.stub.Status(pb.StatusRequest(), metadata=c.metadata, timeout=30)
        )

    def workers(self) -> list[pb.WorkerInfo]:
        reply = self.run(
            lambda c: c.stub.ListWorkers(pb.ListWorkersRequest(), metadata=c.metadata, timeout=30)
        )
        return list(reply.workers)

    def call(self, action: str, args: str = "{}", **fields: Any) -> dict[str, Any]:
        """Dispatch one action as agent `tester` and return what `agentworker call` prints."""
        surface, _, name = action.rpartition(".")
        request = {"agent_id": "tester", "surface": surface, "action": name, "args_json": args}
        request.update(fields)
        response = self.run(lambda c: c.dispatch(**request))
        return result_to_dict(response)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.running():
                proc.signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def wait_for(condition: Any, timeout: float, proc: Proc | None = None) -> None:
    """Until `condition()`; AssertionError past `timeout` s, stretched by the machine's
    load (tests.support.bounds), or at once if `proc` exits."""
    bound = Bound(timeout)
    while not bound.passed():
        if condition():
            return
        if proc is not None and not proc.running():
            raise AssertionError(f"{proc.name} exited early:\n{proc.log()}")
        time.sleep(0.05)
    detail = f"\n{proc.name} log:\n{proc.log()}" if proc else ""
    raise AssertionError(f"condition not met within {bound}{detail}")


async def until_worker_connected(client: ControlClient, timeout: float = 20.0) -> None:
    """Wait until the hub answers and has a worker; a hub still starting is retried.
    The bound stretches with the machine's load (tests.support.bounds)."""
    bound = Bound(timeout)
    while not bound.passed():
        with contextlib.suppress(grpc.aio.AioRpcError):  # not listening yet
            status = await client.stub.Status(pb.StatusRequest(), metadata=client.metadata)
            if status.connected_workers:
                return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no worker connected within {bound}")


def write_config(home: Path, listen: str, extra_config: str = "", **settings: Any) -> None:
    """The suite's config.toml; `extra_config` is TOML appended as is (more roots, policy)."""
    values = {
        "keepalive_s": 1.0,
        "ping_timeout_s": 1.0,
        "drain_grace_s": 10,
        "max_concurrency": 8,
        "max_accepted": 4096,
        "max_unacked_mib": 256,
        "backoff_base_s": 0.1,
        "backoff_cap_s": 1.0,
        "held_blobs_mib": 256,
        "heartbeat_s": 0.5,
        # Tests' hubs serve a new worker id at its first Hello (the setting's default
        # is off): most tests open worker streams under made-up ids, or start workers
        # in homes of their own, to test other things. The enrolment tests
        # (tests/integration/test_worker_enrolment.py) turn it off.
        "accept_new_workers": True,
    }
    values.update(settings)
    values = {k: str(v).lower() if isinstance(v, bool) else v for k, v in values.items()}
    home.mkdir(parents=True, exist_ok=True)
    (home / "workspace").mkdir(exist_ok=True)
    text = CONFIG.format(listen=listen, workspace=home / "workspace", **values)
    (home / "config.toml").write_text(text + "\n" + extra_config)


@contextlib.contextmanager
def cluster(
    home: Path, *, hub: bool = True, worker: bool = True, extra_config: str = "", **settings: Any
) -> Iterator[Cluster]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("AGENTWORKER_", "HTTP", "HTTPS"))
    }
    env["AGENTWORKER_HOME"] = str(home)
    env["PYTHONUNBUFFERED"] = "1"
    for attempt in range(PORT_ATTEMPTS):
        # A port free a moment ago may be taken before the hub binds it (another test's
        # process, on a busy machine): then the hub says so, and a new port is tried.
        listen = f"127.0.0.1:{free_port()}"
        write_config(home, listen, extra_config, **settings)
        c = Cluster(home=home, listen=listen, env=env)
        CLUSTERS_MADE.append(c)
        try:
            if hub:
                c.start_hub()
            break
        except AssertionError as exc:
            c.stop_all()
            if "address is in use" not in str(exc) or attempt == PORT_ATTEMPTS - 1:
                raise
    try:
        if worker:
            c.start_worker()
        yield c
    finally:
        c.stop_all()


def call_in_background(live: Cluster, action: str, args: str, **fields: Any) -> dict[str, Any]:
    """Start a dispatch on a thread; the dict fills with the outcome or the RPC error."""
    box: dict[str, Any] = {}

    def go() -> None:
        try:
            box["out"] = live.call(action, args, **fields)
        except grpc.aio.AioRpcError as exc:
            box["rpc_error"] = exc.code()

    box["thread"] = threading.Thread(target=go, daemon=True)
    box["thread"].start()
    return box


def release(data_dir: Path, hold: str) -> None:
    """Let a `workerDiag.probe` held with `{"hold": hold}` finish."""
    folder = data_dir / "diag"
    folder.mkdir(exist_ok=True)
    (folder / f"{hold}.release").touch()
