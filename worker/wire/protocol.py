"""Facts both ends of the stream must agree on."""

from __future__ import annotations

import hashlib
import json
from typing import Final

import worker
from worker.errors import WorkerError
from worker.wire.proto import agentworker_pb2 as pb

_WORKER_SERVICE: Final = pb.DESCRIPTOR.services_by_name["WorkerService"]
WORKER_SERVICE: Final = _WORKER_SERVICE.full_name
STREAM_METHOD: Final = f"/{WORKER_SERVICE}/{_WORKER_SERVICE.methods_by_name['Stream'].name}"

# Sandbox mode's surface: a plan's calls go to the worker holding its workspace.
WORKBENCH_SURFACE: Final = "workbenchHost"

PROTOCOL_MIN: Final = 1
PROTOCOL_MAX: Final = 1


VERSION: Final = worker.__version__


def call_digest(req: pb.ActionRequest, blob: bytes | None = None) -> str:
    """What makes two deliveries of one correlation id 'the same call'; `blob`, when
    given, stands for the request's own (kept apart from it)."""
    h = hashlib.sha256()
    for part in (req.surface, req.action, req.plan_id, req.agent_id, req.args_json):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    h.update(req.blob if blob is None else blob)
    return h.hexdigest()


def error_pb(error: WorkerError) -> pb.Error:
    """The error as it travels in an ActionResult."""
    return pb.Error(
        code=error.code,
        message=error.message,
        details_json=json.dumps(error.details, default=str),
        retryable=error.retryable,
    )


# The longest deadline a call may have, at both ends (the most `[worker]` and `[hub]`
# default_timeout_s allow). A longer one — or a wrapped-around `timeout_ms` such as
# 2**32 - 1, which would be 49.7 days — is cut to this, with a line in the log.
MAX_TIMEOUT_MS: Final = 86_400_000
