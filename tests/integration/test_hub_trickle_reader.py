"""A worker stream that reads a trickle (its HTTP/2 window opened a little at a time)
takes each envelope in time, so the check for a stream that reads nothing never let it
go, and every KillPlan (sent to every session) waited in its outbox for as long as
callers went on: +19 MB in 200 s (review18 F7). Now a worker is sent at most KILL_PAGE
kills it has not confirmed, and less than a page of them waiting in its outbox (a
stream may say it recorded kills it never read), then a page at a time as it confirms
and reads them. A worker that comes back is sent every kill from hub.db.

A real hub (worker.app.start_hub) in the test's loop; the hostile stream is raw HTTP/2
(tests.support.trickle_stream), the far side of the boundary."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

from tests.support.hub_inproc import (
    Caller,
    DrivenHub,
    driven_hub,
    hand_hello,
    probe_request,
    token_of,
    worker_cli,
)
from tests.support.trickle_stream import TrickleStream
from worker.hub.server import KILL_PAGE
from worker.hub.session import Session
from worker.wire.framing import MAX_ENVELOPE_MESSAGES
from worker.wire.proto import agentworker_pb2 as pb

ROUNDS = 20
KILLS_A_ROUND = 50
GRANT = 8 * 1024  # bytes of window a round: a fifth of the kills made meanwhile


async def _trickle(hub: DrivenHub, worker_id: str, grant: int = GRANT) -> TrickleStream:
    """A trickle stream connected, `grant` bytes of window open: its session in the hub
    (closed as the test ends)."""
    stream = TrickleStream(hub.address, token_of(hub.home, "hub-workers.token"), worker_id)
    await stream.open()
    hub.at_close(stream.close)
    await stream.grant(grant)
    await hub.until(lambda: worker_id in hub.sessions)
    return stream


async def _kills(caller: Caller, tag: str) -> None:
    """KILLS_A_ROUND KillPlans of made-up plans, a reason of 512 bytes each."""
    await asyncio.gather(*(caller.kill(f"{tag}-{n}", "r" * 512) for n in range(KILLS_A_ROUND)))


def test_a_stream_reading_a_trickle_holds_a_page_of_kills_and_is_sent_every_one_back(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"

    async def go() -> None:
        async with driven_hub(home) as hub:
            stream = await _trickle(hub, "trickle")
            session = hub.sessions["trickle"]
            for n in range(ROUNDS):
                await _kills(hub.caller, f"p{n}")
                await stream.grant(GRANT)  # confirming none
                # Kept (it reads what it is sent), and never more than a page
                # behind: before, every kill made waited here (qsize 700 and on).
                assert hub.sessions.get("trickle") is session
                assert session.outbox.qsize() <= KILL_PAGE + 8, (n, session.outbox.qsize())
            await stream.close()
            await hub.until(lambda: "trickle" not in hub.sessions)

            # Its worker back, reading and confirming as a worker does: every kill comes.
            worker = hub.hand(hello=hand_hello("trickle"), key=stream.key)
            made = ROUNDS * KILLS_A_ROUND
            got = 0
            while got < made:
                kills = await worker.until("kill_plan", got + 1)
                got = len(kills)
                beat = pb.Heartbeat(kills_through=kills[-1].seq)
                worker.send(pb.WorkerMessage(heartbeat=beat))
            plans = {k.plan_id for k in kills}
            assert len(kills) == made
            assert plans == {f"p{r}-{n}" for r in range(ROUNDS) for n in range(KILLS_A_ROUND)}

    asyncio.run(go())


def test_a_stream_saying_it_recorded_kills_it_never_read_is_sent_no_more_than_it_reads(
    tmp_path: Path,
) -> None:
    """Its every heartbeat says each kill made is recorded (the hub takes it up to the
    last it numbered), many heartbeats an envelope, read at once (a call to it waits):
    it is sent a page a heartbeat, and a kill as it is made, only while less than a
    page of them waits in its outbox."""
    home = tmp_path / "home"

    async def go() -> None:
        async with driven_hub(home) as hub:
            stream = await _trickle(hub, "liar")
            session = hub.sessions["liar"]
            waiting = asyncio.ensure_future(hub.caller.dispatch(probe_request("liar"), timeout=60))
            try:
                for n in range(ROUNDS):
                    await _kills(hub.caller, f"p{n}")
                    await stream.grant(GRANT, kills_through=2**40, beats=MAX_ENVELOPE_MESSAGES)
                    await stream.until_received(stream.received + 1)  # its heartbeats read
                    # Before, every kill made waited here (qsize 700 and on).
                    assert hub.sessions.get("liar") is session
                    assert session.outbox.qsize() <= 2 * KILL_PAGE + 8, (n, session.outbox.qsize())
            finally:
                waiting.cancel()

    asyncio.run(go())


def test_a_stream_let_go_for_reading_too_slowly_loses_no_call(tmp_path: Path) -> None:
    """Past OUTBOX_WAIT_S (made small here) the hub lets go of a stream that reads
    slower than it is written, the calls its callers wait for queued on it; its worker
    back gets each of them, and each caller its answer."""
    home = tmp_path / "home"

    async def go() -> None:
        async with driven_hub(home) as hub:
            # Its window opened for its Welcome and a few heartbeats: what comes after
            # waits in its outbox.
            stream = await _trickle(hub, "slow", grant=512)
            session = hub.sessions["slow"]
            hub.hub.outbox_wait_s = 0.2  # the heartbeat timer looks every heartbeat_s
            calls = [
                asyncio.ensure_future(hub.caller.dispatch(probe_request("slow"), timeout=60))
                for _ in range(5)
            ]
            try:
                async with asyncio.timeout(60):  # before: kept for as long as it lived
                    await hub.until(lambda: "slow" not in hub.sessions)
                assert session.refusal is not None and "waited" in session.refusal[1]
                worker = hub.hand(hello=hand_hello("slow"), key=stream.key)
                sent = await worker.until("request", len(calls))
                for request in sent:
                    result = pb.ActionResult(
                        correlation_id=request.correlation_id,
                        status=pb.ActionResult.OK,
                        result_json="{}",
                    )
                    worker.send(pb.WorkerMessage(result=result))
                answers = await asyncio.gather(*calls)
                assert [a.result.status for a in answers] == [pb.ActionResult.OK] * 5
                assert {a.result.correlation_id for a in answers} == {
                    r.correlation_id for r in sent
                }
            finally:
                for call in calls:
                    call.cancel()

    asyncio.run(go())


def test_a_real_worker_records_every_kill_of_a_burst_past_a_page(tmp_path: Path) -> None:
    """A worker KILL_PAGE kills behind is sent the rest a page at a time as it confirms
    them: the real worker (`agentworker run`), stopped while 300 kills are made, records
    every one once it runs again, and confirms the last."""
    home = tmp_path / "home"

    async def go() -> None:
        async with driven_hub(home) as hub:
            worker = await hub.real_worker()
            (worker_id,) = hub.sessions
            paged = []  # the pages sent mid-session (the first goes at the Hello)
            send_page = hub.hub._send_kill_page

            def page(session: Session) -> None:
                paged.append(session.kills_sent)
                send_page(session)

            hub.hub._send_kill_page = page  # type: ignore[method-assign]
            worker.signal(signal.SIGSTOP)  # a slow worker: it reads and confirms nothing
            try:
                await asyncio.gather(*(_kills(hub.caller, f"p{n}") for n in range(6)))
                assert hub.sessions[worker_id].kills_paging  # KILL_PAGE went, no more
            finally:
                worker.signal(signal.SIGCONT)
            issued = hub.store.kills_issued()
            async with asyncio.timeout(60):
                await hub.until(
                    lambda: (
                        (session := hub.sessions.get(worker_id)) is not None
                        and session.kills_through >= issued
                    )
                )
            assert not hub.sessions[worker_id].kills_paging  # the burst all went
            assert paged, "the worker kept up: no page went mid-session"
        listed = await asyncio.to_thread(worker_cli, home, "killed", "--json")
        assert listed.returncode == 0, listed.stderr
        plans = {row["plan"] for row in json.loads(listed.stdout)}
        assert plans == {f"p{r}-{n}" for r in range(6) for n in range(KILLS_A_ROUND)}

    asyncio.run(go())
