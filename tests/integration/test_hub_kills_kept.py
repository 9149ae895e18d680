"""A kill the hub answered reaches the worker even when the connection drops before the
worker reads it, and when the hub restarts in between; until the worker confirms it,
the hub refuses the plan's calls to it, and once it has, the person's lift at the worker
lets the plan run again (review12 finding 02: the hub answered "told", kept nothing, and
the plan's running call and a new one ran after the reconnect).

A real hub (worker.app.start_hub) in the test's loop and a real worker process with a
data folder of its own, dialling the hub through a relay in the test's loop that can
hold back what the hub sends and drop the connection, what it held with it: the kill is
lost on its way, as with a link that failed, at an exact point."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cluster import Proc, write_config
from tests.support.hub_inproc import (
    HandWorker,
    caller_metadata,
    hub_in_process,
    own_channel,
    probe_request,
    stop_worker,
    until_connected,
)
from worker import app
from worker.hub import store as store_module
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.proto import agentworker_pb2_grpc as pb_grpc


class Relay:
    """TCP between workers and the hub at `port`: what the hub sends is passed on, or
    read and kept back while `holding`; `drop` ends every connection, what was kept back
    with it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.holding = False
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _relay(
        self, from_worker: asyncio.StreamReader, to_worker: asyncio.StreamWriter
    ) -> None:
        try:
            from_hub, to_hub = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:  # no hub there (it restarts): the worker dials again
            to_worker.transport.abort()
            return
        link = (to_worker, to_hub)
        self._links.add(link)
        await asyncio.gather(
            self._pump(from_worker, to_hub, from_hub=False),
            self._pump(from_hub, to_worker, from_hub=True),
            return_exceptions=True,
        )
        self._links.discard(link)
        for writer in link:
            writer.transport.abort()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, from_hub: bool
    ) -> None:
        try:
            while data := await reader.read(65536):
                if from_hub and self.holding:
                    continue  # kept back, and gone with the connection
                writer.write(data)
                await writer.drain()
        finally:
            writer.transport.abort()

    def drop(self) -> None:
        for link in list(self._links):
            for writer in link:
                writer.transport.abort()

    async def close(self) -> None:
        self.drop()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def worker_via(home: Path, hub_home: Path, address: str) -> Proc:
    """A real worker with a data folder of its own, dialling `address` with the hub's
    workers' token."""
    write_config(home, "127.0.0.1:1", keepalive_s=10.0, ping_timeout_s=20.0)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTWORKER_", "HTTP"))}
    env["AGENTWORKER_HOME"] = str(home)
    env["PYTHONUNBUFFERED"] = "1"
    token = str(hub_home / "hub-workers.token")
    argv = ["run", "--headless", "--server", address, "--token-file", token]
    return Proc("worker", argv, env, home / "worker.log").start()


def cli(home: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTWORKER_")}
    env["AGENTWORKER_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "worker", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def held_call(worker_id: str, plan_id: str, name: str) -> pb.DispatchRequest:
    """A probe that marks its start and then waits for a release that never comes."""
    req = probe_request(worker_id, plan_id)
    req.args_json = json.dumps({"mark": name, "hold": name})
    req.correlation_id = f"{name}-call"
    req.timeout_ms = 300_000
    return req


async def until_started(home: Path, name: str, worker: Proc) -> None:
    while not (home / "diag" / f"{name}.marks").exists():
        assert worker.running(), worker.log()
        await asyncio.sleep(0.02)  # the worker makes the mark: a file, no event to wait on


async def until_reconnected(running: app.RunningHub, worker_id: str, old: object) -> None:
    while running.hub.sessions.get(worker_id) in (None, old):
        await asyncio.sleep(0.02)  # the hub runs in this loop


async def until_confirmed(running: app.RunningHub, worker_id: str) -> None:
    """Until the worker's heartbeat confirmed every kill the hub keeps for it."""
    last = max(k.seq for k in running.hub.store.kills_after(worker_id, 0))
    while (session := running.hub.sessions.get(worker_id)) is None or (
        session.kills_through < last
    ):
        await asyncio.sleep(0.02)  # the hub runs in this loop


async def code_of(stub: pb_grpc.ControlServiceStub, home: Path, req: pb.DispatchRequest) -> str:
    reply = await stub.Dispatch(req, metadata=caller_metadata(home), timeout=120)
    if reply.result.status == pb.ActionResult.OK:
        return "ok"
    return f"{reply.result.error.code}: {reply.result.error.message}"


def test_a_kill_lost_with_the_connection_reaches_the_worker_as_it_reconnects(
    tmp_path: Path,
) -> None:
    hub_home, home = tmp_path / "hub", tmp_path / "w"

    async def go() -> None:
        async with hub_in_process(hub_home) as running:
            relay = Relay(port_of(running.address))
            worker = worker_via(home, hub_home, await relay.start())
            channel = own_channel(running.address)
            stub = pb_grpc.ControlServiceStub(channel)
            metadata = caller_metadata(hub_home)
            try:
                (worker_id,) = await until_connected(running, worker)
                running_call = asyncio.ensure_future(
                    stub.Dispatch(held_call(worker_id, "p", "p-run"), metadata=metadata)
                )
                await until_started(home, "p-run", worker)
                old = running.hub.sessions[worker_id]
                relay.holding = True  # what the hub sends now never arrives
                told = await stub.KillPlan(
                    pb.KillPlanRequest(plan_id="p", reason="stop"), metadata=metadata, timeout=60
                )
                assert list(told.worker_ids) == [worker_id]
                relay.drop()
                relay.holding = False
                await until_reconnected(running, worker_id, old)

                # The kill came again with the new session: the running call stopped.
                reply = await asyncio.wait_for(running_call, 120)
                assert reply.result.error.code == "plan_killed", reply.result
                new_call = probe_request(worker_id, "p")
                assert (await code_of(stub, hub_home, new_call)).startswith("plan_killed")
                # Confirmed: the worker itself answers, and its person's lift holds.
                await until_confirmed(running, worker_id)
                code = await code_of(stub, hub_home, new_call)
                assert code.startswith("plan_killed") and "at this hub" not in code, code
                # Off the loop: the hub runs in it, and must answer the worker meanwhile.
                assert (await asyncio.to_thread(cli, home, "lift", "p")).returncode == 0
                assert await code_of(stub, hub_home, new_call) == "ok"
            finally:
                await channel.close()
                await stop_worker(worker)
                await relay.close()

    asyncio.run(go())


def test_a_kill_reaches_the_worker_after_a_hub_restart_lost_it_on_its_way(
    tmp_path: Path,
) -> None:
    hub_home, home = tmp_path / "hub", tmp_path / "w"

    async def go() -> None:
        relay: Relay | None = None
        worker: Proc | None = None
        try:
            async with hub_in_process(hub_home) as running:
                relay = Relay(port_of(running.address))
                worker = worker_via(home, hub_home, await relay.start())
                (worker_id,) = await until_connected(running, worker)
                channel = own_channel(running.address)
                stub = pb_grpc.ControlServiceStub(channel)
                metadata = caller_metadata(hub_home)
                running_call = asyncio.ensure_future(
                    stub.Dispatch(held_call(worker_id, "p", "p-run"), metadata=metadata)
                )
                await until_started(home, "p-run", worker)
                relay.holding = True  # what the hub sends now never arrives
                told = await stub.KillPlan(
                    pb.KillPlanRequest(plan_id="p", reason="stop"), metadata=metadata, timeout=60
                )
                assert list(told.worker_ids) == [worker_id]
                running_call.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await running_call
                await channel.close()
            # The hub stopped, and its connection to the worker with it, the kill unread.
            async with hub_in_process(hub_home) as running:
                relay.port = port_of(running.address)
                relay.holding = False
                await until_connected(running, worker)
                channel = own_channel(running.address)
                stub = pb_grpc.ControlServiceStub(channel)
                try:
                    # The call that ran, asked for again by its id: the kill stopped it.
                    again = await code_of(stub, hub_home, held_call(worker_id, "p", "p-run"))
                    assert again.startswith("plan_killed"), again
                    new_call = probe_request(worker_id, "p")
                    assert (await code_of(stub, hub_home, new_call)).startswith("plan_killed")
                    await until_confirmed(running, worker_id)
                    code = await code_of(stub, hub_home, new_call)
                    assert code.startswith("plan_killed") and "at this hub" not in code, code
                    listed = json.loads(
                        (await asyncio.to_thread(cli, home, "killed", "--json")).stdout
                    )
                    assert [k["plan"] for k in listed] == ["p"], listed
                finally:
                    await channel.close()
                    await stop_worker(worker)
        finally:
            if worker is not None:
                await stop_worker(worker)
            if relay is not None:
                await relay.close()

    asyncio.run(go())


def test_rotating_the_workers_token_keeps_the_persons_lifts_and_the_kills_in_force(
    tmp_path: Path,
) -> None:
    """The person rotates hub-workers.token: the worker comes back under another key and
    the hub sends every kill again; the kill the person lifted stays lifted, the other
    stays in force (review14 finding 07: every lift was undone)."""
    hub_home, home = tmp_path / "hub", tmp_path / "w"

    async def go() -> None:
        relay: Relay | None = None
        worker: Proc | None = None
        try:
            async with hub_in_process(hub_home) as running:
                relay = Relay(port_of(running.address))
                address = await relay.start()  # the same address across the hub's restart
                worker = worker_via(home, hub_home, address)
                (worker_id,) = await until_connected(running, worker)
                channel = own_channel(running.address)
                stub = pb_grpc.ControlServiceStub(channel)
                try:
                    for plan in ("lifted", "kept"):
                        await stub.KillPlan(
                            pb.KillPlanRequest(plan_id=plan, reason="stop"),
                            metadata=caller_metadata(hub_home),
                            timeout=60,
                        )
                    await until_confirmed(running, worker_id)
                    assert (await asyncio.to_thread(cli, home, "lift", "lifted")).returncode == 0
                    assert await code_of(stub, hub_home, probe_request(worker_id, "lifted")) == "ok"
                finally:
                    await channel.close()
                    await stop_worker(worker)
            (hub_home / "hub-workers.token").unlink()  # rotated: the hub makes another
            async with hub_in_process(hub_home) as running:
                relay.port = port_of(running.address)
                worker = worker_via(home, hub_home, address)
                await until_connected(running, worker)
                await until_confirmed(running, worker_id)
                channel = own_channel(running.address)
                stub = pb_grpc.ControlServiceStub(channel)
                try:
                    lifted = await code_of(stub, hub_home, probe_request(worker_id, "lifted"))
                    assert lifted == "ok", lifted
                    kept = await code_of(stub, hub_home, probe_request(worker_id, "kept"))
                    assert kept.startswith("plan_killed") and "at this hub" not in kept, kept
                finally:
                    await channel.close()
                    await stop_worker(worker)
        finally:
            if worker is not None:
                await stop_worker(worker)
            if relay is not None:
                await relay.close()

    asyncio.run(go())


@pytest.mark.parametrize("hub_keeps", ["apart", "pruned"])
def test_a_kill_the_hub_keeps_apart_or_pruned_stays_in_force_after_the_tokens_rotation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hub_keeps: str
) -> None:
    """review19 A5: a kill the worker recorded whole binds the key it came under; the
    person rotates hub-workers.token, and the hub sends every kill again: one it keeps
    only by digest now ("apart": past KILLS_HELD kills another worker, away, had not
    confirmed) the worker took for lifted since, one it pruned ("pruned": past
    KILLS_KEPT, every worker confirmed) it sent none of, and the plan ran for the new
    key. The worker carries the old key's kills over to the new one."""
    monkeypatch.setattr(store_module, "KILLS_HELD", 10)
    if hub_keeps == "pruned":
        monkeypatch.setattr(store_module, "KILLS_KEPT", 5)
    hub_home, home = tmp_path / "hub", tmp_path / "w"

    async def go() -> None:
        relay: Relay | None = None
        worker: Proc | None = None
        try:
            async with hub_in_process(hub_home) as running:
                relay = Relay(port_of(running.address))
                address = await relay.start()  # the same address across the hub's restart
                worker = worker_via(home, hub_home, address)
                (worker_id,) = await until_connected(running, worker)
                if hub_keeps == "apart":  # another worker, away from now on
                    away = HandWorker(running.address, hub_home)
                    await away.until("welcome")
                    await away.close()
                    while away.worker_id in running.hub.sessions:
                        await asyncio.sleep(0.01)  # the hub runs in this loop
                channel = own_channel(running.address)
                stub = pb_grpc.ControlServiceStub(channel)
                md = caller_metadata(hub_home)
                try:
                    assert await code_of(stub, hub_home, probe_request(worker_id, "victim")) == "ok"
                    await stub.KillPlan(
                        pb.KillPlanRequest(plan_id="victim", reason="stop"), metadata=md, timeout=60
                    )
                    await until_confirmed(running, worker_id)
                    for n in range(12):  # a caller's pairs of plans in use and their kills
                        await code_of(stub, hub_home, probe_request(worker_id, f"made-up-{n}"))
                        await stub.KillPlan(
                            pb.KillPlanRequest(plan_id=f"made-up-{n}", reason="x"),
                            metadata=md,
                            timeout=60,
                        )
                    await until_confirmed(running, worker_id)
                    with contextlib.closing(sqlite3.connect(hub_home / "hub.db")) as db:
                        whole = db.execute("SELECT 1 FROM kills WHERE plan_id = 'victim'")
                        assert whole.fetchone() is None
                        apart = db.execute("SELECT count(*) FROM kills_apart").fetchone()[0]
                        assert bool(apart) == (hub_keeps == "apart")
                finally:
                    await channel.close()
                    await stop_worker(worker)
            (hub_home / "hub-workers.token").unlink()  # rotated: the hub makes another
            async with hub_in_process(hub_home) as running:
                relay.port = port_of(running.address)
                worker = worker_via(home, hub_home, address)
                await until_connected(running, worker)
                await until_confirmed(running, worker_id)
                channel = own_channel(running.address)
                stub = pb_grpc.ControlServiceStub(channel)
                try:
                    code = await code_of(stub, hub_home, probe_request(worker_id, "victim"))
                    assert code.startswith("plan_killed") and "at this hub" not in code, code
                finally:
                    await channel.close()
                    await stop_worker(worker)
        finally:
            if worker is not None:
                await stop_worker(worker)
            if relay is not None:
                await relay.close()

    asyncio.run(go())


def test_a_kill_made_after_hub_db_was_restored_from_a_backup_reaches_the_worker(
    tmp_path: Path,
) -> None:
    """hub.db restored from a backup numbers its next kills with seqs the worker already
    confirmed: the hub sees a mark past any seq it numbered, and numbers kills in a new
    epoch, so the next kill reaches the worker and its plan is refused (review15 finding
    08: the kill was never sent, and the plan's call ran)."""
    hub_home, home = tmp_path / "hub", tmp_path / "w"
    backup = tmp_path / "hub.db.backup"

    async def kill(stub: pb_grpc.ControlServiceStub, plan: str) -> None:
        await stub.KillPlan(
            pb.KillPlanRequest(plan_id=plan, reason="stop"),
            metadata=caller_metadata(hub_home),
            timeout=60,
        )

    async def go() -> None:
        relay: Relay | None = None
        worker: Proc | None = None
        try:
            async with hub_in_process(hub_home) as running:
                relay = Relay(port_of(running.address))
                worker = worker_via(home, hub_home, await relay.start())
                (worker_id,) = await until_connected(running, worker)
                channel = own_channel(running.address)
                stub = pb_grpc.ControlServiceStub(channel)
                try:
                    await kill(stub, "old-0")
                    with (
                        contextlib.closing(sqlite3.connect(hub_home / "hub.db")) as src,
                        contextlib.closing(sqlite3.connect(backup)) as dst,
                    ):
                        src.backup(dst)
                    for n in range(1, 6):
                        await kill(stub, f"old-{n}")
                    await until_confirmed(running, worker_id)  # through 6
                finally:
                    await channel.close()
            for suffix in ("", "-wal", "-shm"):
                (hub_home / f"hub.db{suffix}").unlink(missing_ok=True)
            backup.rename(hub_home / "hub.db")
            async with hub_in_process(hub_home) as running:
                relay.port = port_of(running.address)
                await until_connected(running, worker)
                channel = own_channel(running.address)
                stub = pb_grpc.ControlServiceStub(channel)
                try:
                    await kill(stub, "p")
                    code = await code_of(stub, hub_home, probe_request(worker_id, "p"))
                    assert code.startswith("plan_killed"), code
                    await until_confirmed(running, worker_id)
                    code = await code_of(stub, hub_home, probe_request(worker_id, "p"))
                    assert code.startswith("plan_killed") and "at this hub" not in code, code
                finally:
                    await channel.close()
                    await stop_worker(worker)
        finally:
            if worker is not None:
                await stop_worker(worker)
            if relay is not None:
                await relay.close()

    asyncio.run(go())
