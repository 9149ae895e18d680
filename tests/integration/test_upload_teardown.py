"""A Teardown that comes while a call of its plan is still being uploaded: the call,
which takes its blob whole (workbenchHost.fs_write), is refused once its blob came,
and the plan's workspace stays gone (review13 finding 08: it ran after the teardown's
answer and made the workspace anew). A real hub and sandbox worker (bubblewrap), a
real caller over gRPC."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.integration.test_dispatch_upload import Upload
from tests.integration.test_stream_rules import MIB, error_code
from tests.support.workbench import call, files_of, sandbox_cluster
from worker.hub.client import ControlClient
from worker.wire.proto import agentworker_pb2 as pb

PLAN = "p-torn"


def test_a_teardown_while_a_call_of_its_plan_is_uploaded_refuses_the_call(
    tmp_path: Path,
) -> None:
    blob = os.urandom(3 * MIB)
    with sandbox_cluster(tmp_path) as live:
        made, _ = call(live, PLAN, "fs_write", {"path": "before.txt", "mode": "create"}, b"x")
        assert made["status"] == "ok", made
        assert files_of(live, "bench", PLAN).exists()

        async def scenario(client: ControlClient) -> tuple[pb.DispatchResponse, pb.ActionResult]:
            request = pb.DispatchRequest(
                agent_id="anyone",
                plan_id=PLAN,
                surface="workbenchHost",
                action="fs_write",
                args_json=json.dumps({"path": "big.bin", "mode": "overwrite"}),
            )
            upload = Upload(client, request, len(blob))
            await upload.begin()  # the hub sent the worker the request
            await upload.parts(blob, end=MIB)
            torn = await client.stub.Teardown(
                pb.TeardownRequest(plan_id=PLAN), metadata=client.metadata, timeout=60
            )
            await upload.parts(blob, start=MIB)
            return torn, await upload.answer()

        torn, written = live.run(scenario)
        assert torn.result.status == pb.ActionResult.OK, torn
        assert error_code(written) == "cancelled", written
        assert f"plan {PLAN!r} was torn down" in written.error.message
        assert not files_of(live, "bench", PLAN).exists()
