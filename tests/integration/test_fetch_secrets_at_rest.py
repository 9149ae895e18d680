"""An http_fetch's response secrets leave nothing at rest once delivered (review25 G10),
inside `agentworker up` (the result handed to the hub by reference, its stub down the
stream) and with hub and worker apart (the result whole down the stream).

The response carries a session cookie, a token header and a token in its Location.
The caller gets them whole; a repeat of the call's id is answered from the hub's store,
masked; and once hub and worker stopped, no file of theirs holds the token: not
hub.db, not state.db (its ledger, telemetry), not their logs. Before the fix both
databases kept the cookie and the token whole for 24 h."""

from __future__ import annotations

import asyncio
import gc
import json
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_local_link import up
from tests.support.cluster import cluster
from tests.support.http_server import TestServer
from worker.hub.server import Hub
from worker.wire.proto import agentworker_pb2 as pb


@pytest.fixture(scope="module")
def server() -> Iterator[TestServer]:
    with TestServer() as running:
        yield running


def _fetch(url: str, correlation_id: str) -> pb.DispatchRequest:
    return pb.DispatchRequest(
        correlation_id=correlation_id,
        agent_id="tester",
        surface="workerHost",
        action="http_fetch",
        args_json=json.dumps({"url": url}),
    )


async def _dispatch(hub: Hub, request: pb.DispatchRequest) -> pb.ActionResult:
    return pb.DispatchResponse.FromString(await hub.dispatch_serialized(request, None)).result


def _acked(state_db: Path, correlation_id: str) -> bool:
    with sqlite3.connect(state_db) as db:
        row = db.execute(
            "SELECT acked FROM calls WHERE correlation_id = ?", (correlation_id,)
        ).fetchone()
    return row is not None and row[0] == 1


async def _until(condition: object) -> None:
    """Until `condition()` holds: the worker's ack comes on the hub's next commit."""
    assert callable(condition)
    async with asyncio.timeout(60):
        while not condition():
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("local", [True, False], ids=["up", "hub+run"])
def test_a_responses_secrets_reach_the_caller_and_leave_nothing_at_rest(
    tmp_path: Path, server: TestServer, local: bool
) -> None:
    secret = f"RESPSECRET{uuid.uuid4().hex[:12]}"
    cid = uuid.uuid4().hex
    fetch = _fetch(server.url("/login") + f"?secret={secret}", cid)
    allowed = f'[http]\nallow_hosts = ["127.0.0.1:{server.port}"]\n'

    async def scenario() -> tuple[pb.ActionResult, pb.ActionResult]:
        async with up(tmp_path, local=local, extra_config=allowed) as (hub, _link, _worker):
            first = await _dispatch(hub, fetch)
            await _until(lambda: _acked(tmp_path / "state.db", cid))
            hub.store.flush()
            return first, await _dispatch(hub, fetch)

    first, again = asyncio.run(scenario())
    assert first.status == pb.ActionResult.OK, first.error.message
    headers = dict(json.loads(first.result_json)["headers"])
    assert headers["Set-Cookie"] == f"session={secret}; HttpOnly", "the caller gets it whole"
    assert headers["X-Auth-Token"] == secret
    assert again.replayed and again.error.code == "blob_gone", again
    kept = json.loads(again.error.details_json)["result"]
    assert dict(kept["headers"])["X-Auth-Token"] == "***"
    assert secret not in again.SerializeToString().decode("latin-1")
    # A connection to state.db the in-process worker leaves to the garbage collector
    # holds its log open (a process that ends closes it): closed here, the log is
    # copied in and removed, as when `up` or `run` stops.
    gc.collect()
    held = [
        path.name
        for path in sorted(tmp_path.iterdir())
        if path.is_file() and secret.encode() in path.read_bytes()
    ]
    assert held == [], "the token is at rest"
    assert not first.result_json_at_rest, "the stores' form is not the caller's"


@pytest.mark.parametrize("local", [True, False], ids=["up", "hub+run"])
def test_a_repeat_of_a_bodyless_fetch_says_its_secrets_are_masked(
    tmp_path: Path, server: TestServer, local: bool
) -> None:
    """A fetch answered with headers alone (a sign-in's 204) has no blob to say it is
    gone: its repeat, the documented safe retry after a lost answer, was answered OK
    with `Set-Cookie: ***` as if the server had sent that (review26 H7). It answers
    `blob_gone` now, the masked outcome in its details, flagged `masked`."""
    secret = f"RESPSECRET{uuid.uuid4().hex[:12]}"
    cid = uuid.uuid4().hex
    fetch = _fetch(server.url("/login-no-body") + f"?secret={secret}", cid)
    allowed = f'[http]\nallow_hosts = ["127.0.0.1:{server.port}"]\n'

    async def scenario() -> tuple[pb.ActionResult, pb.ActionResult]:
        async with up(tmp_path, local=local, extra_config=allowed) as (hub, _link, _worker):
            first = await _dispatch(hub, fetch)
            await _until(lambda: _acked(tmp_path / "state.db", cid))
            hub.store.flush()
            return first, await _dispatch(hub, fetch)

    first, again = asyncio.run(scenario())
    assert first.status == pb.ActionResult.OK and not first.blob, first.error.message
    assert dict(json.loads(first.result_json)["headers"])["X-Auth-Token"] == secret
    assert again.replayed and again.error.code == "blob_gone", again
    details = json.loads(again.error.details_json)
    assert details["masked"] is True and details["status"] == "ok"
    assert dict(details["result"]["headers"])["Set-Cookie"] == "***"
    assert "masked" in again.error.message and "new correlation id" in again.error.message
    assert not again.error.retryable, "the same id never brings them back"


def test_agentworker_call_tells_the_person_a_repeat_shows_masked_secrets(
    tmp_path: Path, server: TestServer
) -> None:
    """`agentworker call --id` again (its help: "reuse one to retry safely") prints the
    record with its secrets masked; it fails, and says on stderr that the *** are not
    what the server sent and how to get them (review26 H7)."""
    secret = f"RESPSECRET{uuid.uuid4().hex[:12]}"
    args = json.dumps({"url": server.url("/login-no-body") + f"?secret={secret}"})
    allowed = f'[http]\nallow_hosts = ["127.0.0.1:{server.port}"]\n'
    with cluster(tmp_path, extra_config=allowed) as c:
        call = ("call", "http_fetch", args, "--agent", "tester", "--id", "login-1")
        first = c.cli(*call)
        again = c.cli(*call)
    assert first.returncode == 0 and secret in first.stdout, first.stdout + first.stderr
    assert "masked" not in first.stderr
    assert again.returncode != 0, again.stdout
    shown = json.loads(again.stdout)
    assert shown["error"]["code"] == "blob_gone" and shown["error"]["details"]["masked"] is True
    assert secret not in again.stdout
    assert "not what the server sent" in again.stderr and "new --id" in again.stderr
