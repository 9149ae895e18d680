"""A Dispatch whose call waits for the person is told so in its headers, sent ahead of
its answer (AWAITING_APPROVAL); an answer that comes while those headers are still on
their way reaches the caller. It did not: the answer's batch then sent the headers a
second time, gRPC refused it (GRPC_CALL_ERROR_TOO_MANY_OPERATIONS), and the caller
waited out its deadline: test_ask_binds_stdin's timeouts on CI. A real hub in this loop,
a hand-driven worker stream that sends the ack and the answer in one envelope."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.support.hub_inproc import driven_hub, probe_request
from worker.hub.client import AWAITING_APPROVAL
from worker.wire.proto import agentworker_pb2 as pb

CALLS = 20  # each a race the old code lost nearly every time


def test_an_answer_right_behind_its_waiting_headers_reaches_the_caller(tmp_path: Path) -> None:
    home = tmp_path / "home"

    async def go() -> None:
        async with driven_hub(home) as hub:
            worker = await hub.welcomed()
            for n in range(CALLS):
                request = probe_request(worker.worker_id)
                request.correlation_id, request.timeout_ms = f"asked-{n}", 60_000
                call = hub.caller.dispatch(request, timeout=120)
                await worker.until("request", n + 1)
                asked = pb.ActionAck(
                    correlation_ids=[request.correlation_id],
                    kind=pb.ActionAck.AWAITING_APPROVAL,
                )
                answer = pb.ActionResult(
                    correlation_id=request.correlation_id,
                    status=pb.ActionResult.OK,
                    result_json='{"approved": true}',
                )
                worker.send(pb.WorkerMessage(ack=asked), pb.WorkerMessage(result=answer))
                async with asyncio.timeout(30):  # a hang-catcher: it is a moment's work
                    reply = await call
                assert reply.result.result_json == '{"approved": true}', n
                assert AWAITING_APPROVAL in tuple(await call.initial_metadata()), n

    asyncio.run(go())
