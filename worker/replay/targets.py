"""Where a replay's steps run: a worker built in this process, or a hub's worker.

Both send the step as the ActionRequest a server would send, so it takes the whole
pipeline (ledger, validation, kill switch, scopes, policy, caps, telemetry):

- `in_process` builds a worker's dispatcher from a config and a grants profile and
  hands it each request through its public entry points (`submit`, `emit`, `ack`),
  as the worker's connection does, without a network in between;
- `through_hub` calls a hub's ControlService.Dispatch, which sends the request down
  a connected worker's stream (`agentworker call` does the same).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import tempfile
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from worker import app
from worker.config import Config, GrantSection, Paths
from worker.core.pipeline import Dispatcher, Outgoing
from worker.errors import WorkerError
from worker.hub.client import ControlClient
from worker.replay.expect import Answer
from worker.wire.framing import worker_message_of
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.protocol import error_pb

log = logging.getLogger(__name__)


class Target(Protocol):
    async def call(self, request: pb.ActionRequest, blob: bytes) -> Answer: ...


def answer_of(result: pb.ActionResult) -> Answer:
    ok = result.status == pb.ActionResult.OK
    return Answer(
        status="ok" if ok else "error",
        error_code=None if ok else result.error.code,
        error_message=None if ok else result.error.message,
        result=json.loads(result.result_json) if result.result_json else None,
        blob=bytes(result.blob),
        replayed=result.replayed,
    )


# ----------------------------------------------------------------- in process


class InProcess:
    """Requests straight into a dispatcher, results straight back (and acked, as a
    hub acks what it stored: the ledger may then forget them)."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self._waiting: dict[str, asyncio.Future[pb.ActionResult]] = {}
        self._acks: list[str] = []
        dispatcher.outbox.attach(self._emit)

    async def call(self, request: pb.ActionRequest, blob: bytes) -> Answer:
        if blob:
            request.blob = blob
        cid = request.correlation_id
        future: asyncio.Future[pb.ActionResult] = asyncio.get_running_loop().create_future()
        self._waiting[cid] = future
        try:
            self.dispatcher.submit(request)
            result = await future
        finally:
            self._waiting.pop(cid, None)
        return answer_of(result)

    def _emit(self, message: Outgoing) -> None:
        msg = worker_message_of(message) if isinstance(message, bytes) else message
        kind = msg.WhichOneof("kind")
        if kind == "result":
            self._resolve(msg.result)
            if msg.result.correlation_id and not msg.result.replayed:
                self._ack_soon(msg.result.correlation_id)
        elif kind == "ack" and msg.ack.kind in (
            pb.ActionAck.REJECTED_ARGS_MISMATCH,
            pb.ActionAck.REJECTED_DRAINING,
        ):
            code = (
                "args_mismatch" if msg.ack.kind == pb.ActionAck.REJECTED_ARGS_MISMATCH else "busy"
            )
            for cid in msg.ack.correlation_ids:
                error = WorkerError(code, msg.ack.message or "the worker refused the call")
                self._resolve(
                    pb.ActionResult(
                        correlation_id=cid, status=pb.ActionResult.ERROR, error=error_pb(error)
                    )
                )

    def _resolve(self, result: pb.ActionResult) -> None:
        future = self._waiting.get(result.correlation_id)
        if future is not None and not future.done():
            future.set_result(result)

    def _ack_soon(self, cid: str) -> None:
        if not self._acks:
            asyncio.get_running_loop().call_soon(self.flush_acks)
        self._acks.append(cid)

    def flush_acks(self) -> None:
        acks, self._acks = self._acks, []
        self.dispatcher.ack(acks)


class _GrantsProfile(BaseModel):
    """A grants profile file: `[[grant]]` tables, as in config.toml."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    grant: list[GrantSection] = []


def read_toml(path: Path, what: str) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise WorkerError("validation_error", f"cannot read the {what} {path}: {exc}") from exc


def _validated(model: type[BaseModel], raw: dict[str, Any], path: Path) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise WorkerError("validation_error", f"{path} is invalid: {problems}") from exc


def config_for_replay(base: Config, config_file: Path | None, grants_file: Path | None) -> Config:
    """The replay worker's config: `config_file` (or the person's own), with the grants
    of `grants_file` in place of its own when one is given."""
    config = base
    if config_file is not None:
        config = _validated(Config, read_toml(config_file, "config file"), config_file)
    if grants_file is not None:
        profile = _validated(_GrantsProfile, read_toml(grants_file, "grants profile"), grants_file)
        config = config.model_copy(update={"grant": list(profile.grant)})
    return config


@contextlib.asynccontextmanager
async def in_process(
    config: Config, config_dir: Path, data_dir: Path | None = None, *, sandbox: bool = False
) -> AsyncIterator[InProcess]:
    """A worker built from `config`: its ledger and telemetry in `data_dir`, or in a
    fresh folder removed afterwards (every step then runs anew). With `sandbox`, in
    sandbox mode: workbenchHost.* in a workspace per plan under the data dir."""
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="replay-")))
        paths = Paths(config_dir=config_dir, data_dir=data_dir)
        stack.enter_context(app.worker_lock(paths))
        bench = await app.start_workbench(paths, config) if sandbox else None
        dispatcher = app.build_dispatcher(paths, config, bench=bench)
        try:
            lost = dispatcher.recover()
            if lost:
                log.warning(
                    "%d call(s) of an earlier run in %s: outcome_unknown", len(lost), data_dir
                )
            target = InProcess(dispatcher)
            yield target
            await dispatcher.drain(config.worker.drain_grace_s)
            target.flush_acks()
        finally:
            dispatcher.close()
            if bench is not None:  # the plans' cgroups, and what runs in them
                await bench.close()


# ----------------------------------------------------------------- through a hub


class ThroughHub:
    def __init__(self, client: ControlClient, worker_id: str = "") -> None:
        self.client = client
        self.worker_id = worker_id

    async def call(self, request: pb.ActionRequest, blob: bytes) -> Answer:
        response = await self.client.dispatch(
            worker_id=self.worker_id,
            correlation_id=request.correlation_id,
            plan_id=request.plan_id,
            agent_id=request.agent_id,
            task_id=request.task_id,
            surface=request.surface,
            action=request.action,
            args_json=request.args_json,
            blob=blob,
            timeout_ms=request.timeout_ms,
        )
        return answer_of(response.result)


@contextlib.asynccontextmanager
async def through_hub(
    address: str, token: str, tls_ca: Path | None = None, worker_id: str = ""
) -> AsyncIterator[ThroughHub]:
    client = ControlClient.connect(address, token, tls_ca)
    try:
        yield ThroughHub(client, worker_id)
    finally:
        await client.close()
