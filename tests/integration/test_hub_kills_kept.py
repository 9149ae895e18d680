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
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.cluster import Proc, write_config
from tests.support.hub_inproc import (
    DrivenHub,
    driven_hub,
    lift,
    probe_request,
    stop_worker,
    until_connected,
    worker_cli,
)
from worker.hub import store as store_module
from worker.wire.proto import agentworker_pb2 as pb


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


class RelayedWorker:
    """A real worker with a data folder of its own (`home`) dialling, with the workers'
    token of `hub_home`, the relay: one address whatever hub runs behind it."""

    def __init__(self, home: Path, hub_home: Path, relay: Relay, address: str) -> None:
        self.home = home
        self.hub_home = hub_home
        self.relay = relay
        self.address = address
        self.proc: Proc | None = None

    async def run(self, hub: DrivenHub) -> list[str]:
        """Start the worker, connected to `hub`: the hub's workers (`until_connected`)."""
        self.relay.port = port_of(hub.address)
        write_config(self.home, "127.0.0.1:1", keepalive_s=10.0, ping_timeout_s=20.0)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTWORKER_", "HTTP"))}
        env["AGENTWORKER_HOME"] = str(self.home)
        env["PYTHONUNBUFFERED"] = "1"
        token = str(self.hub_home / "hub-workers.token")
        argv = ["run", "--headless", "--server", self.address, "--token-file", token]
        self.proc = Proc("worker", argv, env, self.home / "worker.log").start()
        return await until_connected(hub.running, self.proc)

    async def back(self, hub: DrivenHub) -> None:
        """The worker running already, once it dialled `hub` (a hub started anew)."""
        assert self.proc is not None
        self.relay.port = port_of(hub.address)
        await until_connected(hub.running, self.proc)

    async def stop(self) -> None:
        if self.proc is not None:
            await stop_worker(self.proc)


@contextlib.asynccontextmanager
async def relayed_worker(home: Path, hub_home: Path) -> AsyncIterator[RelayedWorker]:
    """A worker behind a relay that outlives the hubs the test starts; stopped, and the
    relay closed, as it ends."""
    relay = Relay(0)  # no hub yet: `run` and `back` name it
    worker = RelayedWorker(home, hub_home, relay, await relay.start())
    try:
        yield worker
    finally:
        await worker.stop()
        await relay.close()


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def held_call(worker_id: str, plan_id: str, name: str) -> pb.DispatchRequest:
    """A probe that waits for a release that never comes. No mark: a mark is made in a
    thread, and a kill that came while that thread ran (a loaded machine's slow fsync)
    is rightly answered outcome_unknown, the mark perhaps made, not plan_killed."""
    req = probe_request(worker_id, plan_id)
    req.args_json = json.dumps({"hold": name})
    req.correlation_id = f"{name}-call"
    req.timeout_ms = 300_000
    return req


async def until_started(home: Path, name: str, worker: Proc | None) -> None:
    """Until the worker's ledger holds `held_call`'s call `name` (it runs, held)."""
    assert worker is not None
    while not await asyncio.to_thread(_in_ledger, home, f"{name}-call"):
        assert worker.running(), worker.log()
        await asyncio.sleep(0.02)  # another process's database: no event to wait on


def _in_ledger(home: Path, correlation_id: str) -> bool:
    if not (home / "state.db").exists():
        return False
    with contextlib.closing(sqlite3.connect(home / "state.db")) as db:
        row = db.execute("SELECT 1 FROM calls WHERE correlation_id = ?", (correlation_id,))
        return row.fetchone() is not None


def test_a_kill_lost_with_the_connection_reaches_the_worker_as_it_reconnects(
    tmp_path: Path,
) -> None:
    hub_home, home = tmp_path / "hub", tmp_path / "w"

    async def go() -> None:
        async with relayed_worker(home, hub_home) as worker, driven_hub(hub_home) as hub:
            (worker_id,) = await worker.run(hub)
            running_call = asyncio.ensure_future(
                hub.caller.dispatch(held_call(worker_id, "p", "p-run"), timeout=None)
            )
            await until_started(home, "p-run", worker.proc)
            old = hub.sessions[worker_id]
            worker.relay.holding = True  # what the hub sends now never arrives
            told = await hub.caller.kill("p")
            assert list(told.worker_ids) == [worker_id]
            worker.relay.drop()
            worker.relay.holding = False
            await hub.until(lambda: hub.sessions.get(worker_id) not in (None, old))

            # The kill came again with the new session: the running call stopped.
            reply = await asyncio.wait_for(running_call, 120)
            assert reply.result.error.code == "plan_killed", reply.result
            new_call = probe_request(worker_id, "p")
            assert (await hub.caller.outcome(new_call)).startswith("plan_killed")
            # Confirmed: the worker itself answers, and its person's lift holds.
            await hub.until_confirmed(worker_id)
            code = await hub.caller.outcome(new_call)
            assert code.startswith("plan_killed") and "at this hub" not in code, code
            # Off the loop: the hub runs in it, and must answer the worker meanwhile.
            await asyncio.to_thread(lift, home, "p")
            assert await hub.caller.outcome(new_call) == "ok"
            await worker.stop()

    asyncio.run(go())


def test_a_kill_reaches_the_worker_after_a_hub_restart_lost_it_on_its_way(
    tmp_path: Path,
) -> None:
    hub_home, home = tmp_path / "hub", tmp_path / "w"

    async def go() -> None:
        async with relayed_worker(home, hub_home) as worker:
            async with driven_hub(hub_home) as hub:
                (worker_id,) = await worker.run(hub)
                running_call = asyncio.ensure_future(
                    hub.caller.dispatch(held_call(worker_id, "p", "p-run"), timeout=None)
                )
                await until_started(home, "p-run", worker.proc)
                worker.relay.holding = True  # what the hub sends now never arrives
                told = await hub.caller.kill("p")
                assert list(told.worker_ids) == [worker_id]
                running_call.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await running_call
            # The hub stopped, and its connection to the worker with it, the kill unread.
            async with driven_hub(hub_home) as hub:
                worker.relay.holding = False
                await worker.back(hub)
                # The call that ran, asked for again by its id: the kill stopped it.
                again = await hub.caller.outcome(held_call(worker_id, "p", "p-run"))
                assert again.startswith("plan_killed"), again
                new_call = probe_request(worker_id, "p")
                assert (await hub.caller.outcome(new_call)).startswith("plan_killed")
                await hub.until_confirmed(worker_id)
                code = await hub.caller.outcome(new_call)
                assert code.startswith("plan_killed") and "at this hub" not in code, code
                listed = json.loads(
                    (await asyncio.to_thread(worker_cli, home, "killed", "--json")).stdout
                )
                assert [k["plan"] for k in listed] == ["p"], listed
                await worker.stop()

    asyncio.run(go())


@contextlib.asynccontextmanager
async def _tokens_rotated(worker: RelayedWorker, worker_id: str) -> AsyncIterator[DrivenHub]:
    """The person rotated hub-workers.token (the hub, started anew, makes another): the
    worker, started again, dialled the hub and confirmed every kill sent; it stops
    before the hub."""
    (worker.hub_home / "hub-workers.token").unlink()
    async with driven_hub(worker.hub_home) as hub:
        await worker.run(hub)
        await hub.until_confirmed(worker_id)
        yield hub
        await worker.stop()


def test_rotating_the_workers_token_keeps_the_persons_lifts_and_the_kills_in_force(
    tmp_path: Path,
) -> None:
    """The person rotates hub-workers.token: the worker comes back under another key and
    the hub sends every kill again; the kill the person lifted stays lifted, the other
    stays in force (review14 finding 07: every lift was undone)."""
    hub_home, home = tmp_path / "hub", tmp_path / "w"

    async def go() -> None:
        async with relayed_worker(home, hub_home) as worker:
            async with driven_hub(hub_home) as hub:
                (worker_id,) = await worker.run(hub)
                for plan in ("lifted", "kept"):
                    await hub.caller.kill(plan)
                await hub.until_confirmed(worker_id)
                await asyncio.to_thread(lift, home, "lifted")
                assert await hub.caller.outcome(probe_request(worker_id, "lifted")) == "ok"
                await worker.stop()
            async with _tokens_rotated(worker, worker_id) as hub:
                lifted = await hub.caller.outcome(probe_request(worker_id, "lifted"))
                assert lifted == "ok", lifted
                kept = await hub.caller.outcome(probe_request(worker_id, "kept"))
                assert kept.startswith("plan_killed") and "at this hub" not in kept, kept

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
        async with relayed_worker(home, hub_home) as worker:
            async with driven_hub(hub_home) as hub:
                (worker_id,) = await worker.run(hub)
                if hub_keeps == "apart":  # another worker, away from now on
                    await hub.away()
                assert await hub.caller.outcome(probe_request(worker_id, "victim")) == "ok"
                await hub.caller.kill("victim")
                await hub.until_confirmed(worker_id)
                for n in range(12):  # a caller's pairs of plans in use and their kills
                    await hub.caller.outcome(probe_request(worker_id, f"made-up-{n}"))
                    await hub.caller.kill(f"made-up-{n}", "x")
                await hub.until_confirmed(worker_id)
                with contextlib.closing(sqlite3.connect(hub_home / "hub.db")) as db:
                    whole = db.execute("SELECT 1 FROM kills WHERE plan_id = 'victim'")
                    assert whole.fetchone() is None
                    apart = db.execute("SELECT count(*) FROM kills_apart").fetchone()[0]
                    assert bool(apart) == (hub_keeps == "apart")
                await worker.stop()
            async with _tokens_rotated(worker, worker_id) as hub:
                code = await hub.caller.outcome(probe_request(worker_id, "victim"))
                assert code.startswith("plan_killed") and "at this hub" not in code, code

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

    async def go() -> None:
        async with relayed_worker(home, hub_home) as worker:
            async with driven_hub(hub_home) as hub:
                (worker_id,) = await worker.run(hub)
                await hub.caller.kill("old-0")
                with (
                    contextlib.closing(sqlite3.connect(hub_home / "hub.db")) as src,
                    contextlib.closing(sqlite3.connect(backup)) as dst,
                ):
                    src.backup(dst)
                for n in range(1, 6):
                    await hub.caller.kill(f"old-{n}")
                await hub.until_confirmed(worker_id)  # through 6
            for suffix in ("", "-wal", "-shm"):
                (hub_home / f"hub.db{suffix}").unlink(missing_ok=True)
            backup.rename(hub_home / "hub.db")
            async with driven_hub(hub_home) as hub:
                await worker.back(hub)
                await hub.caller.kill("p")
                code = await hub.caller.outcome(probe_request(worker_id, "p"))
                assert code.startswith("plan_killed"), code
                await hub.until_confirmed(worker_id)
                code = await hub.caller.outcome(probe_request(worker_id, "p"))
                assert code.startswith("plan_killed") and "at this hub" not in code, code
                await worker.stop()

    asyncio.run(go())
