"""A caller repeating a call the hub has just answered, before the hub's group commit
stored that answer, has the call sent to its worker again; the worker's answer reaches
the caller even when the commit lands while it is on its way (it was dropped as a
result "answered already", and the caller waited out its deadline)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.hub_inproc import HandWorker, caller_metadata, hub_in_process, own_channel
from worker.hub import server
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.proto import agentworker_pb2_grpc as pb_grpc


def test_a_repeat_answered_after_the_commit_reaches_its_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "STORE_DELAY_S", 3600.0)  # the test commits, below
    home = tmp_path / "home"

    async def go() -> None:
        async with hub_in_process(home) as running:
            worker = HandWorker(running.address, home)
            await worker.until("welcome")
            channel = own_channel(running.address)
            stub = pb_grpc.ControlServiceStub(channel)
            metadata = caller_metadata(home)
            request = pb.DispatchRequest(
                correlation_id="again-1",
                worker_id=worker.worker_id,
                agent_id="tester",
                surface="workerDiag",
                action="probe",
                args_json="{}",
                timeout_ms=60_000,
            )
            first = asyncio.ensure_future(stub.Dispatch(request, metadata=metadata, timeout=120))
            await worker.until("request")
            result = pb.ActionResult(
                correlation_id="again-1", status=pb.ActionResult.OK, result_json='{"n": 1}'
            )
            worker.send(pb.WorkerMessage(result=result))
            assert (await first).result.result_json == '{"n": 1}'
            # Not committed yet: the repeat goes to the worker again ...
            repeat = asyncio.ensure_future(stub.Dispatch(request, metadata=metadata, timeout=120))
            (_, again) = await worker.until("request", 2)
            assert again.correlation_id == "again-1" and again.attempt == 2
            running.hub.store_results()  # ... and the group commit lands meanwhile
            replayed = pb.ActionResult()
            replayed.CopyFrom(result)
            replayed.replayed = True
            worker.send(pb.WorkerMessage(result=replayed))
            async with asyncio.timeout(60):
                answer = await repeat
            assert answer.result.status == pb.ActionResult.OK
            assert answer.result.result_json == '{"n": 1}' and answer.result.replayed
            # Both answers are acked to the worker once stored (none is held back).
            running.hub.store_results()
            acked: list[str] = []
            while acked.count("again-1") < 2:
                acked = [cid for ack in await worker.until("ack") for cid in ack.correlation_ids]
                if acked.count("again-1") < 2:
                    worker.came.clear()
                    await worker.came.wait()
            # A third repeat is answered from the store, not sent again.
            third = await stub.Dispatch(request, metadata=metadata, timeout=120)
            assert third.result.result_json == '{"n": 1}' and third.result.replayed
            assert len(worker.received["request"]) == 2
            await worker.close()
            await channel.close()

    asyncio.run(go())
