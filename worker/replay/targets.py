"""Where a replay's steps run: a worker built in this process, or a hub's worker.

Both send the step as the ActionRequest a server would send, so it takes the whole
pipeline (ledger, validation, kill switch, scopes, policy, caps, telemetry):

- `in_process` builds a worker's dispatcher from a config and a grants profile and
  hands it each request through its public entry points (`submit`, `emit`, `ack`),
  as the worker's connection does, without a network in between. Its ledger and
  telemetry are its own (a fresh folder by default), but the person's stop is the
  person's (review10 finding 03): the pause switch of their data folder (`agentworker
  pause`, the stop hotkey, the TUI) and the plans killed there stop it, checked
  before each step and while one runs (`PersonsStop`);
- `through_hub` calls a hub's ControlService.Dispatch, which sends the request down
  a connected worker's stream (`agentworker call` does the same).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
import tempfile
import tomllib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from worker import app
from worker.actions import computer
from worker.config import Config, GrantSection, Paths
from worker.core.pause import PauseState
from worker.core.pipeline import Dispatcher, Outgoing
from worker.errors import WorkerError
from worker.hub.client import ControlClient
from worker.replay.expect import Answer
from worker.wire.framing import worker_message_of
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.protocol import error_pb

log = logging.getLogger(__name__)

# How often a running step looks at the person's kills and pause switch.
PERSON_CHECK_S = 0.5


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

    def __init__(self, dispatcher: Dispatcher, before: Callable[[], None] | None = None) -> None:
        self.dispatcher = dispatcher
        self._before = before  # run before each step: the person's kills brought in
        self._waiting: dict[str, asyncio.Future[pb.ActionResult]] = {}
        self._acks: list[str] = []
        # Why the person stopped this replay (a step answered `paused` or `plan_killed`
        # by their stop): the runner runs no further step.
        self.person_stop: str | None = None
        dispatcher.outbox.attach(self._emit)

    async def call(self, request: pb.ActionRequest, blob: bytes) -> Answer:
        if self._before is not None:
            self._before()
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
        answer = answer_of(result)
        if answer.error_code in ("paused", "plan_killed"):
            self.person_stop = f"stopped by the person: {answer.error_message}"
        return answer

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


class PersonsStop:
    """The plans killed in the person's data folder, read from its state.db read-only
    (the replay's worker has a ledger of its own), and brought into the replay's
    ledger as kills of the same plans: its kill switch then refuses their steps and
    stops a running one (`Dispatcher.kill_plan`)."""

    def __init__(self, person_dir: Path, dispatcher: Dispatcher) -> None:
        self.db_path = person_dir / "state.db"
        self.dispatcher = dispatcher
        self._brought: set[str] = set()

    def killed(self) -> list[tuple[str, str, str]]:
        """(plan, reason, killed by) of every plan killed there now."""
        if not self.db_path.exists():
            return []
        uri = f"{self.db_path.resolve().as_uri()}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=5)) as db:
            try:
                return list(db.execute("SELECT plan_id, reason, killed_by FROM killed_plans"))
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):  # no worker ever ran there
                    return []
                raise

    def bring_in(self) -> None:
        """Kill here every plan killed there since the last look (before each step,
        and every KILL_CHECK_S while one runs)."""
        for plan, reason, by in self.killed():
            if plan not in self._brought:
                self._brought.add(plan)
                self.dispatcher.kill_plan(plan, f"{reason} (killed by {by} on this machine)", by)


@contextlib.asynccontextmanager
async def in_process(
    config: Config,
    config_dir: Path,
    data_dir: Path | None = None,
    *,
    sandbox: bool = False,
    person_dir: Path | None = None,
) -> AsyncIterator[InProcess]:
    """A worker built from `config`: its ledger and telemetry in `data_dir`, or in a
    fresh folder removed afterwards (every step then runs anew). With `sandbox`, in
    sandbox mode: workbenchHost.* in a workspace per plan under the data dir. With
    `person_dir` (the person's data folder), its pause switch (and the stop hotkey,
    with a desktop) and its killed plans stop the replay as they stop the worker."""
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="replay-")))
        paths = Paths(config_dir=config_dir, data_dir=data_dir)
        stack.enter_context(app.worker_lock(paths))
        bench = await app.start_workbench(paths, config) if sandbox else None
        desktop = None if person_dir is None else computer.build(config, person_dir)
        dispatcher = app.build_dispatcher(paths, config, bench=bench, desktop=desktop)
        watch: asyncio.Task[None] | None = None
        hotkey: asyncio.Task[None] | None = None
        try:
            lost = dispatcher.recover()
            if lost:
                log.warning(
                    "%d call(s) of an earlier run in %s: outcome_unknown", len(lost), data_dir
                )
            stop = None if person_dir is None else PersonsStop(person_dir, dispatcher)
            target = InProcess(dispatcher, before=None if stop is None else stop.bring_in)
            if stop is not None:
                watch = asyncio.create_task(_watch_the_person(dispatcher, stop))
            if desktop is not None and desktop.available and bench is None:
                hotkey = asyncio.create_task(desktop.start_hotkey())
            try:
                yield target
            except BaseException:
                # Interrupted (Ctrl-C) or failed mid-step: the step under way is stopped,
                # not waited for (no one will read its answer), before the stores close.
                await dispatcher.drain(0)
                raise
            await dispatcher.drain(config.worker.drain_grace_s)
            target.flush_acks()
        finally:
            for task in (watch, hotkey):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
            if desktop is not None:
                desktop.close()
            dispatcher.close()
            if bench is not None:  # the plans' cgroups, and what runs in them
                await bench.close()


async def _watch_the_person(dispatcher: Dispatcher, stop: PersonsStop) -> None:
    """While a step runs: a pause (told at once when this process sees the switch
    change, else at the next look) or a kill made meanwhile stops it, as the
    worker's own check does (app._enforce_kills)."""
    loop = asyncio.get_running_loop()
    changed = asyncio.Event()

    def on_pause(_state: PauseState) -> None:  # any thread: the hotkey's
        loop.call_soon_threadsafe(changed.set)

    if dispatcher.pause is not None:
        dispatcher.pause.subscribe(on_pause)
    while True:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(PERSON_CHECK_S):
                await changed.wait()
        changed.clear()
        try:
            stop.bring_in()
        except sqlite3.Error as exc:
            log.warning("could not read the killed plans of %s: %s", stop.db_path, exc)
        if dispatcher.enforce_pause():
            log.info("stopped the running step: paused on this machine")


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
