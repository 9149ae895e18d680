"""How often worker streams may say Hello at the hub (worker.hub.hellos.Hellos): a
bucket per worker id, one for the ids new to the hub and one for all. A fleet saying
Hello together from one connection (one process, one NAT address), new or coming back
after a restart of the hub, is never refused; a hostile client looping on one id or on
fresh ids is refused RESOURCE_EXHAUSTED "busy: ..." with retry-after-ms, before
anything is written to hub.db, in one log line; a real worker refused so waits as told.
A real hub in the test's loop (worker.app.start_hub) and a real worker process; the
fleet and the hostile client are plain gRPC streams (the far side of the boundary)."""

from __future__ import annotations

import asyncio
import logging
import random
import re
import signal
import sqlite3
import uuid
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from tests.support.cluster import cluster
from tests.support.hub_inproc import (
    hub_in_process,
    own_channel,
    probe,
    real_worker,
    stop_worker,
    token_of,
    until_connected,
)
from worker.core.connection import Backoff
from worker.hub.hellos import (
    HELLO_BURST,
    HELLO_BURST_PER_WORKER,
    HELLO_RETRY_MIN_S,
    HELLOS_PER_S_PER_WORKER,
    NEW_WORKER_BURST,
)
from worker.hub.rates import Rate
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.protocol import PROTOCOL_MAX, PROTOCOL_MIN, RETRY_AFTER_KEY, STREAM_METHOD
from worker.wire.transport import worker_metadata

# A fleet: more workers than a per-address bound would let in, from one process.
FLEET = 1_200
STREAMS_PER_CONNECTION = 100
# How a stream ends that the hub could not take in time, loaded (its Hello not read
# within its handshake time, or the call left waiting in gRPC's queue): a capacity of
# the machine, not a bound, and a worker dials again after its backoff.
TRANSIENT = (
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.UNKNOWN,
)
ROUNDS = 5


@dataclass(frozen=True)
class NotSent:
    """A Hello this client could not send: its connection went before the write
    (gRPC's "Failed execute_batch" INTERNAL, seen at a load of 20 and more). The hub
    never read it, so it refused nothing; a worker dials again."""

    error: grpc.aio.AioRpcError


def _transient(answer: object) -> bool:
    """A stream the hub could not take in time, or whose Hello never reached it."""
    if isinstance(answer, NotSent):
        return True
    return isinstance(answer, grpc.aio.AioRpcError) and answer.code() in TRANSIENT


def test_the_workers_own_backoff_never_meets_the_bound() -> None:
    """The real Backoff (its defaults: base 0.5 s, cap 30 s) against the real bucket at
    the hub's rate for a worker id, each session failing at once (the backoff is never
    started over): 2,000 seeded runs of 10 minutes each, none refused (100,000 unseeded
    ones needed a burst of 13.4 at most, docs/architecture.md)."""
    state = random.getstate()
    random.seed(20261128)  # Backoff draws from the module's generator
    try:
        for _ in range(2_000):
            rate = Rate(HELLO_BURST_PER_WORKER, HELLOS_PER_S_PER_WORKER)
            t = 0.0
            while t < 600.0:
                assert rate.wait_s("w", t) == 0.0, f"refused at {t:.2f} s"
                rate.take("w", t)
                t += Backoff().delay(t)
    finally:
        random.setstate(state)


def test_a_rate_keeps_the_keys_that_acted_last() -> None:
    rate = Rate(2, 1.0, keys=3)
    for key in "abcd":  # "a" acted longest ago: forgotten, full again
        rate.take(key, 0.0)
        rate.take(key, 0.0)
    assert len(rate) == 3
    assert rate.wait_s("a", 0.0) == 0.0
    assert rate.wait_s("d", 0.0) == pytest.approx(1.0)
    assert rate.wait_s("d", 0.5) == pytest.approx(0.5)
    assert Rate(1, 0.0).wait_s("x", 0.0) == 0.0


def _hello_of(worker_id: str) -> pb.Hello:
    return pb.Hello(
        worker_id=worker_id,
        instance_id=uuid.uuid4().hex,
        version="fleet",
        protocol_min=PROTOCOL_MIN,
        protocol_max=PROTOCOL_MAX,
        surfaces=["workerDiag"],
        actions=["workerDiag.probe"],
        max_concurrency=8,
    )


async def _hello(
    channel: grpc.aio.Channel, metadata: tuple[tuple[str, str], ...], hello: pb.Hello
) -> tuple[grpc.aio.StreamStreamCall, object]:
    """A stream on `channel` that says `hello`, and the hub's first answer: a
    ServerEnvelope (the Welcome), or the refusal (an AioRpcError). The stream is left
    open."""
    call = channel.stream_stream(
        STREAM_METHOD,
        request_serializer=None,
        response_deserializer=pb.ServerEnvelope.FromString,
    )(metadata=metadata)
    opening = pb.WorkerEnvelope(messages=[pb.WorkerMessage(hello=hello)])
    try:
        await call.write(opening.SerializeToString())
    except grpc.aio.AioRpcError as exc:
        return call, NotSent(exc)
    try:
        reply = await call.read()
    except grpc.aio.AioRpcError as exc:
        return call, exc
    if reply is grpc.aio.EOF:
        raise AssertionError(f"ended: {await call.code()} {await call.details()}")
    return call, reply


async def _hello_once(
    channel: grpc.aio.Channel, metadata: tuple[tuple[str, str], ...], hello: pb.Hello
) -> object:
    """`_hello`, the stream then ended: a worker that drops at once."""
    call, answer = await _hello(channel, metadata, hello)
    call.cancel()
    return answer


def _welcomed(answer: object) -> bool:
    return isinstance(answer, pb.ServerEnvelope) and answer.messages[0].HasField("welcome")


def _busy(answer: object) -> int:
    """The retry-after-ms of a refusal busy; 0 for a Welcome."""
    if _welcomed(answer):
        return 0
    assert isinstance(answer, grpc.aio.AioRpcError), answer
    assert answer.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, answer
    assert (answer.details() or "").startswith("busy: "), answer.details()
    retry = int(dict(answer.trailing_metadata() or ())[RETRY_AFTER_KEY])
    assert retry > 0
    return retry


def _rows(home: Path) -> int:
    db = sqlite3.connect(home / "hub.db")
    try:
        return int(db.execute("SELECT COUNT(*) FROM workers").fetchone()[0])
    finally:
        db.close()


@pytest.mark.timeout(600)  # 2,400 handshakes and a restart: minutes at a load of 30
def test_a_fleet_saying_hello_together_is_never_refused(tmp_path: Path) -> None:
    """1,200 workers new to a real `agentworker hub` say Hello at once from one address
    and one process (100 streams to a connection, as benchmarks/bench_hub_scale.py),
    and again together after the hub restarted: every one is welcomed, both times."""
    assert FLEET <= NEW_WORKER_BURST and FLEET <= HELLO_BURST
    home = tmp_path / "home"
    ids = [f"fleet-{n}" for n in range(FLEET)]
    keys = [uuid.uuid4().hex for _ in ids]

    async def together(address: str) -> None:
        """The fleet says Hello at once; a stream the hub could not take in time (see
        TRANSIENT) says it again, as a worker would. None is refused."""
        channels = [own_channel(address) for _ in range(0, FLEET, STREAMS_PER_CONNECTION)]
        token = token_of(home, "hub-workers.token")
        opened: list[tuple[grpc.aio.StreamStreamCall, object]] = []
        try:
            waiting = list(range(FLEET))
            for _ in range(ROUNDS):
                answers = await asyncio.gather(
                    *(
                        _hello(
                            channels[n // STREAMS_PER_CONNECTION],
                            worker_metadata(token, keys[n]),
                            _hello_of(ids[n]),
                        )
                        for n in waiting
                    )
                )
                opened += answers
                late = [
                    n for n, (_, answer) in zip(waiting, answers, strict=True) if _transient(answer)
                ]
                refused = [
                    answer
                    for _, answer in answers
                    if not _welcomed(answer) and not _transient(answer)
                ]
                assert not refused, f"{len(refused)} refused, the first {refused[0]}"
                waiting = late
                if not waiting:
                    break
            assert not waiting, f"{len(waiting)} never welcomed"
        finally:
            for call, _ in opened:
                call.cancel()
            for channel in channels:
                await channel.close()

    # Keepalive as a hub's default, not the suite's 1 s: 1,200 streams in this process's
    # one loop on a loaded machine answer a ping late.
    with cluster(home, worker=False, keepalive_s=10.0, ping_timeout_s=20.0) as live:
        asyncio.run(together(live.listen))
        hub = live.procs[0]
        hub.signal(signal.SIGTERM)
        hub.wait(60)
        live.start_hub()  # the same hub.db: the fleet is known now
        asyncio.run(together(live.listen))
        assert live.status().known_workers == FLEET
        logs = "".join(proc.log() for proc in live.procs)
        assert "busy" not in logs, logs[-4000:]


def test_a_real_worker_refused_busy_waits_as_told(tmp_path: Path) -> None:
    home = tmp_path / "home"

    async def go() -> None:
        async with hub_in_process(home) as running:
            worker = real_worker(home, running.address)
            try:
                (worker_id,) = await until_connected(running, worker)
                hellos = running.hub.hellos
                # One Hello, then one each 2 s: the worker's next is refused, told ~2 s.
                hellos.per_worker = Rate(1, 0.5)
                hellos.per_worker.take(worker_id, asyncio.get_running_loop().time())
                session = running.hub.sessions[worker_id]
                session.close()  # the hub ends the stream: the worker dials again at once
                while running.hub.sessions.get(worker_id) in (None, session):
                    if not worker.running():
                        raise AssertionError(worker.log())
                    await asyncio.sleep(0.02)  # the hub runs in this loop
                assert hellos.refused == 1, "the worker came back after the wait it was told"
                log = worker.log()
                told = re.search(r"busy: .*retry in ([\d.]+) s", log)
                assert told, log
                after = log[told.end() :]
                waited = re.search(r"reconnecting to \S+ in ([\d.]+) s", after)
                assert waited, log
                assert float(waited[1]) >= float(told[1]) - 0.05, log  # both rounded
            finally:
                await stop_worker(worker)

    asyncio.run(go())


def test_hostile_clients_looping_are_refused_busy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="worker.hub")
    home = tmp_path / "home"

    async def go() -> None:
        async with hub_in_process(home) as running:
            person = real_worker(home, running.address)
            try:
                (person_id,) = await until_connected(running, person)
                person_session = running.hub.sessions[person_id]
                hellos = running.hub.hellos
                hellos.per_worker.per_s = 1e-9  # the bursts alone, so that counts are exact
                token = token_of(home, "hub-workers.token")
                channel = own_channel(running.address)  # one hostile client, one connection
                # One id looping on its own key: its burst, then refused.
                key = uuid.uuid4().hex
                looping = [
                    await _hello_once(channel, worker_metadata(token, key), _hello_of("loop"))
                    for _ in range(HELLO_BURST_PER_WORKER + 5)
                ]
                waits = [_busy(answer) for answer in looping]
                assert waits[:HELLO_BURST_PER_WORKER] == [0] * HELLO_BURST_PER_WORKER
                assert all(waits[HELLO_BURST_PER_WORKER:]), waits
                # Fresh ids: the burst of new ids (16 here), then refused, unwritten.
                hellos.new = Rate(16, 1e-9, keys=1)
                before = _rows(home)
                fresh = [(uuid.uuid4().hex, uuid.uuid4().hex) for _ in range(16 + 5)]
                answers = [
                    await _hello_once(channel, worker_metadata(token, k), _hello_of(w))
                    for w, k in fresh
                ]
                assert [bool(_busy(answer)) for answer in answers] == [False] * 16 + [True] * 5
                assert "new to this hub" in answers[-1].details()  # type: ignore[attr-defined]
                assert _rows(home) - before == 16
                # Every Hello of all: past its burst a known id is refused too, told to
                # wait at least HELLO_RETRY_MIN_S.
                hellos.all = Rate(2, 1e-9, keys=1)
                known, metadata = fresh[0][0], worker_metadata(token, fresh[0][1])
                last = [await _hello_once(channel, metadata, _hello_of(known)) for _ in "abc"]
                assert [_busy(answer) for answer in last][:2] == [0, 0]
                assert _busy(last[2]) >= HELLO_RETRY_MIN_S * 1000
                assert "all workers together" in last[2].details()  # type: ignore[attr-defined]
                await channel.close()
                # The person's worker was served all along, on its first stream.
                assert running.hub.sessions[person_id] is person_session
                control = own_channel(running.address)
                await probe(control, home, person_id)
                await control.close()
            finally:
                await stop_worker(person)
        assert hellos.refused == 11
        lines = [r.getMessage() for r in caplog.records if "busy since" in r.getMessage()]
        assert len(lines) == 1, lines  # one line a minute

    asyncio.run(go())
