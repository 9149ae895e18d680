"""A worker on a slow link: a link that keeps delivering bytes is alive.

review21: calls of ~1 MiB args waiting for a worker away went to it, when it dialled
in, batched with its Welcome into envelopes of up to 32 MiB. The worker hears nothing
of an envelope until it came whole, and counts its silence limit from the Welcome:
on a link of 0.35 MB/s the second envelope (23 MiB) took 66 s, past its 15 s, so it
dialled again, was sent them all again, and no call came through (20 calls: none in
300 s). And a worker reading such a link steadily, minutes behind its backlog, was let
go by the hub for its oldest message's age (OUTBOX_WAIT_S), and at the default keepalive
the link went every ~5 s, a ping's ack behind the hub's sending. Here a real hub (in this
loop, so that its timings can be made small) and a real worker (`agentworker run`)
dialling it through a relay that carries what the hub sends at RATE
(tests.support.tcp_proxy), with the suite's heartbeats (0.5 s: the worker takes the hub
for gone after 1.5 s of silence)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from tests.support.hub_inproc import DrivenHub, driven_hub, stop_worker
from tests.support.tcp_proxy import FreezableProxy
from worker.hub.session import Session
from worker.wire.framing import MAX_ENVELOPE_BYTES
from worker.wire.proto import agentworker_pb2 as pb

RATE = 8e6  # bytes a second from the hub to the worker
# A call's args: an unknown field the worker refuses (validation_error) once it has
# them, of about a MiB (within the 1 Mi characters a worker takes).
PAD = "x" * (1024 * 1024 - 4096)


def _padded(worker_id: str) -> pb.DispatchRequest:
    return pb.DispatchRequest(
        worker_id=worker_id,
        agent_id="tester",
        surface="workerHost",
        action="fs_stat",
        args_json=json.dumps({"path": ".", "pad": PAD}),
        timeout_ms=600_000,
    )


@asynccontextmanager
async def _back_to_a_backlog(
    hub: DrivenHub, calls: int, rate: float = RATE, env: dict[str, str] | None = None
) -> AsyncIterator[tuple[Session, FreezableProxy, list[asyncio.Future[pb.DispatchResponse]]]]:
    """A real worker (`env`: its AGENTWORKER_* settings) met once over a link of `rate`,
    away while `calls` calls of ~1 MiB args are made for it, then back over the link:
    its session, the relay and the calls under way (cancelled as the test ends)."""
    proxy = FreezableProxy(int(hub.address.rsplit(":", 1)[1]), down_bytes_per_s=rate)
    made: list[asyncio.Future[pb.DispatchResponse]] = []
    try:
        first = await hub.real_worker(proxy.address, env)
        (worker_id,) = hub.sessions
        await stop_worker(first)
        await hub.until(lambda: worker_id not in hub.sessions)
        made += [
            asyncio.ensure_future(hub.caller.dispatch(_padded(worker_id), timeout=600))
            for _ in range(calls)
        ]
        await hub.until(lambda: hub.store.pending_for(worker_id)[0] == calls)
        await hub.real_worker(proxy.address, env)
        yield hub.sessions[worker_id], proxy, made
    finally:
        for call in made:
            call.cancel()
        await asyncio.gather(*made, return_exceptions=True)
        proxy.close()


async def _answered_or_dropped(
    hub: DrivenHub, session: Session, calls: list[asyncio.Future[pb.DispatchResponse]]
) -> list[str]:
    """Each call's error code once all are answered; AssertionError as soon as the
    session ends first (the worker dialled again, or the hub let go of it)."""
    answered = asyncio.ensure_future(asyncio.gather(*calls))
    worker_id = session.worker_id
    dropped = asyncio.ensure_future(hub.until(lambda: hub.sessions.get(worker_id) is not session))
    try:
        await asyncio.wait((answered, dropped), return_when=asyncio.FIRST_COMPLETED)
        why = session.refusal or "the worker dialled again"
        assert not dropped.done(), f"the session ended before its calls were answered: {why}"
    finally:
        dropped.cancel()
    return [reply.result.error.code for reply in answered.result()]


def test_calls_sent_again_past_an_envelopes_worth_come_over_a_slow_link_at_once(
    tmp_path: Path,
) -> None:
    """56 calls of ~1 MiB args (56 MiB, seven seconds of the link; more than one
    envelope's worth, MAX_ENVELOPE_BYTES) wait for the worker: it takes each as it comes
    and never dials again (before: the second envelope, 24 MiB, took 3 s to come and
    the worker dialled again after its 1.5 s of silence, and again, each time)."""
    calls = 56
    assert calls * len(PAD) > MAX_ENVELOPE_BYTES + 2 * 1.5 * RATE  # twice the silence limit

    async def go() -> None:
        async with (
            driven_hub(tmp_path / "home") as hub,
            _back_to_a_backlog(hub, calls) as (session, proxy, made),
        ):
            codes = await _answered_or_dropped(hub, session, made)
            assert codes == ["validation_error"] * calls
            assert proxy.accepted == 2  # met once, back once: never dialled again

    asyncio.run(go())


def test_a_worker_reading_a_slow_link_steadily_is_kept_however_old_its_backlog(
    tmp_path: Path,
) -> None:
    """OUTBOX_WAIT_S made 2 s here: the worker's backlog of 32 calls of ~1 MiB args
    takes four seconds of the link, so what waits behind it waits longer than that,
    but the stream takes a MiB every eighth of a second: it is kept (before: let go
    at the first heartbeat past 2 s, and sent its calls again)."""
    calls = 32
    assert calls * len(PAD) > 2.0 * RATE * 1.5

    async def go() -> None:
        async with driven_hub(tmp_path / "home") as hub:
            hub.hub.outbox_wait_s = 2.0
            async with _back_to_a_backlog(hub, calls) as (session, proxy, made):
                codes = await _answered_or_dropped(hub, session, made)
                assert codes == ["validation_error"] * calls
                assert proxy.accepted == 2

    asyncio.run(go())


def test_a_pings_ack_behind_a_slow_links_backlog_does_not_end_the_link(tmp_path: Path) -> None:
    """The worker's keepalive pings every second and gives 1 s for nothing to come
    (AGENTWORKER_PING_TIMEOUT_S); the hub's ack waits behind what it sends down a link
    of 1 MB/s (its socket's buffer, gRPC's write under way), and ended the link when it
    took longer than that. The ack now has PING_ACK_S."""
    calls = 8
    env = {"AGENTWORKER_KEEPALIVE_S": "1", "AGENTWORKER_PING_TIMEOUT_S": "1"}

    async def go() -> None:
        async with (
            driven_hub(tmp_path / "home") as hub,
            _back_to_a_backlog(hub, calls, rate=1e6, env=env) as (session, proxy, made),
        ):
            codes = await _answered_or_dropped(hub, session, made)
            assert codes == ["validation_error"] * calls
            assert proxy.accepted == 2

    asyncio.run(go())
