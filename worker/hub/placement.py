"""Sandbox mode's placements: which worker holds each plan's workspace.

A plan's calls go where its files are (docs/architecture.md, "Sandbox mode"): the
worker the hub placed it on (hub.db keeps the record), a new plan on the least loaded
sandbox worker. A connecting worker says which workspaces it holds (its Hello), and
the hub takes its word where its own record is silent, never against it, and only
with the placement token the hub gave that worker for the plan (`placement_token`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Final, Protocol

from worker.clock import now_ms
from worker.errors import WorkerError
from worker.hub.audit_log import shown
from worker.hub.epochs import new_epoch
from worker.hub.hellos import HELLO_PLANS, PacedLines
from worker.hub.store import HubStore
from worker.ids import id_problem
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.protocol import WORKBENCH_SURFACE

log = logging.getLogger(__name__)

# Unproven claims named in one log line (the count is always said).
UNPROVEN_NAMED: Final = 3


def placement_token(key: bytes, worker_id: str, plan_id: str, epoch: str = "") -> str:
    """The hub's proof, to the worker it placed `plan_id` on, that it did (sent with
    each of the plan's calls, said back in the worker's Hello): a MAC under the hub's
    placement key, so the hub needs no record to check it (its record may be lost,
    hub-placements.key is kept apart from hub.db) and a claimant needs the key to make
    one. Bound to the worker id, which the hub serves only with the worker's own key,
    and to the plan's creation `epoch` (worker.hub.epochs), which it carries:
    `EPOCH.MAC`. With no epoch (a placement from before epochs), the MAC alone."""
    if not epoch:
        pair = json.dumps([worker_id, plan_id]).encode("utf-8", "surrogatepass")
        return hmac.new(key, b"agentworker placement\0" + pair, hashlib.sha256).hexdigest()
    what = json.dumps([worker_id, plan_id, epoch]).encode("utf-8", "surrogatepass")
    mac = hmac.new(key, b"agentworker placement\0" + what, hashlib.sha256).hexdigest()
    return f"{epoch}.{mac}"


def token_epoch(token: str) -> str:
    """The epoch a placement token says it is of ('' for one from before epochs)."""
    epoch, dot, _ = token.rpartition(".")
    return epoch if dot else ""


class Worker(Protocol):
    """A connected worker as placements see it (worker.hub.server.Session)."""

    @property
    def worker_id(self) -> str: ...

    hello: pb.Hello
    heartbeat: pb.Heartbeat


class Placements:
    """Where sandbox plans' workspaces are, by the hub's record and the workers' word."""

    def __init__(
        self,
        store: HubStore,
        sessions: Mapping[str, Worker],
        open_calls: Mapping[str, int],
        key: bytes,
    ) -> None:
        self.store = store
        # The secret placement tokens are made with (never logged, never sent).
        self._key = key
        # The hub's connected workers and the calls each has open (its load, as the hub
        # sees it): the hub's own maps, read here.
        self.sessions = sessions
        self.open_calls = open_calls
        # plan -> the worker holding its workspace (sticky).
        self.by_plan: dict[str, str] = store.placements()
        # plan -> the epoch of its placement, which its tokens prove ('' from before).
        self.epochs: dict[str, str] = store.placement_epochs()
        # The epochs of the plans each connected worker proved it holds (its Hello).
        self.claimed: dict[str, dict[str, str]] = {}
        # What each connected worker holds, by its own word (its Hello) and by the plans
        # placed and used there since: plan -> last use (unix ms). See `learn`.
        self.held: dict[str, dict[str, int]] = {}
        # Plans placed on a worker's word alone (its Hello), since this hub started:
        # another worker's claim may contest those, never a placement the hub made.
        self.learned: set[str] = set()
        # Claims ignored, a line per Hello up to a burst, then a line a minute: anyone
        # with the workers' token can say Hello again and again, under new ids.
        self.unproven_lines = PacedLines()
        # Teardowns of plans never placed here forgotten past the bound kept, likewise.
        self.unplaced_lines = PacedLines()

    def token(self, worker_id: str, plan_id: str) -> str:
        """The placement token of `plan_id` on `worker_id`, sent with the plan's calls
        there (ActionRequest.placement_token)."""
        return placement_token(self._key, worker_id, plan_id, self.epochs.get(plan_id, ""))

    def _proven(self, worker_id: str, claim: pb.HeldPlan) -> str | None:
        """The epoch of the plan's creation the claim proves, if it brings the token this
        hub gave `worker_id` for it (compared in constant time: a claimant learns nothing
        from how long it took), of a creation not torn down since; else None."""
        if not claim.placement_token:
            return None
        epoch = token_epoch(claim.placement_token)
        given = claim.placement_token.encode("utf-8", "surrogatepass")
        made = placement_token(self._key, worker_id, claim.plan_id, epoch).encode()
        if not hmac.compare_digest(given, made):
            return None
        if self.store.ended_plans.void(claim.plan_id, epoch):
            return None  # torn down since: a new plan of that id is not this one
        return epoch

    def sandbox_workers(self) -> list[Worker]:
        prefix = f"{WORKBENCH_SURFACE}."
        return [
            session
            for session in self.sessions.values()
            if any(action.startswith(prefix) for action in session.hello.actions)
        ]

    def route(self, req: pb.DispatchRequest, pick_worker: Callable[[str], str]) -> str:
        """The worker for a call: for a sandbox plan, the one holding its workspace
        (placing a new plan on the least loaded sandbox worker); else `pick_worker`."""
        if req.surface != WORKBENCH_SURFACE:
            return pick_worker(req.worker_id)
        if not req.plan_id:
            raise WorkerError(
                "validation_error",
                f"{WORKBENCH_SURFACE} calls run in a plan's workspace: give the call a plan_id",
            )
        placed = self.by_plan.get(req.plan_id)
        if placed is not None:
            if req.worker_id and req.worker_id != placed:
                raise WorkerError(
                    "validation_error",
                    f"plan {req.plan_id!r} has its workspace on worker {placed!r}, not "
                    f"{req.worker_id!r}; send its calls there (or leave the worker out)",
                    {"plan_id": req.plan_id, "worker_id": placed},
                )
            if placed not in self.sessions:
                raise WorkerError(
                    "sandbox_unavailable",
                    f"plan {req.plan_id!r} has its workspace on worker {placed!r}, which is not "
                    "connected now. Try again once it is back (its files are kept there); a new "
                    "empty workspace elsewhere would lose them. Tear the plan down to start over.",
                    {"plan_id": req.plan_id, "worker_id": placed},
                )
            self.held.setdefault(placed, {})[req.plan_id] = now_ms()
            self.learned.discard(req.plan_id)  # used here: the hub's placement now
            if not self.epochs.get(req.plan_id):  # placed before epochs: its calls bring one
                self.place(req.plan_id, placed)
            return placed
        worker_id = req.worker_id or self.least_loaded(req.plan_id)
        self.place(req.plan_id, worker_id)
        self.held.setdefault(worker_id, {})[req.plan_id] = now_ms()
        log.info("plan %s placed on worker %s", req.plan_id, worker_id)
        return worker_id

    def place(
        self, plan_id: str, worker_id: str, *, learned: bool = False, epoch: str = ""
    ) -> None:
        """Place `plan_id` on `worker_id`, of the creation `epoch` a claim proved; a
        new one (worker.hub.epochs) if none is given."""
        epoch = epoch or new_epoch(self.store.ended_plans.ended_ms(plan_id))
        self.by_plan[plan_id] = worker_id
        self.epochs[plan_id] = epoch
        self.store.place(plan_id, worker_id, epoch)
        if learned:
            self.learned.add(plan_id)
        else:
            self.learned.discard(plan_id)

    def reload(self) -> None:
        """The hub's record read again (the store forgot workers, and their plans)."""
        self.by_plan = self.store.placements()
        self.epochs = self.store.placement_epochs()
        self.learned &= self.by_plan.keys()

    def unplace(self, plan_id: str) -> None:
        del self.by_plan[plan_id]
        self.epochs.pop(plan_id, None)
        self.store.unplace(plan_id)
        self.learned.discard(plan_id)

    def ended(self, plan_id: str, *, placed: bool = True) -> None:
        """`plan_id` was torn down: every token given for it so far proves nothing, so
        a worker that held it cannot claim a new plan of that id (worker.hub.epochs).
        `placed`: the hub had placed it, or a worker removed it (else the teardown is
        kept among UNPLACED_ENDED_KEPT at most)."""
        ended = self.store.ended_plans
        forgotten = ended.end(plan_id, placed=placed)
        if forgotten:
            self.unplaced_lines.log(
                "hub: forgot the oldest teardown of a plan never placed here, past the %d "
                "kept (tokens of such a plan from before a lost hub.db prove it again); "
                "teardowns of plans no one used come faster than they are forgotten",
                ended.unplaced_kept,
            )
        for claims in self.claimed.values():
            claims.pop(plan_id, None)

    def learn(self, session: Worker, plans: Iterable[pb.HeldPlan]) -> None:
        """Take a connecting worker's word for the workspaces it holds (its Hello), so
        a hub whose hub.db was lost, or restored from an older copy, routes each plan
        back to its files instead of placing it anew on an empty workspace.

        - A plan recorded on this worker that it no longer holds (swept, torn down, its
          data folder lost), and with no call still on its way there, is unplaced; if
          another connected worker holds it, it goes there.
        - A claim counts only for a plan placed on this worker by the hub's record, or
          with the placement token the hub gave this worker for it (`token`): anyone
          with the workers' token can say Hello under a new id and claim plan ids no
          one has used yet, and got their calls, args and blobs, when they came
          (review25 G8). A claim without it (a rogue, or a workspace an older worker
          made and no call reached since) is logged and ignored.
        - A plan it holds that the hub has no record of is placed here.
        - A plan recorded on another worker stays there: a claim never takes a plan
          from the worker the hub placed it on (or found it on at its start), away or
          not; only a teardown, or that worker saying it no longer holds it, frees it.
          Anyone with the workers' token can say Hello under a new id, and a plan's
          calls carry its files and secrets. Only a plan this hub placed on a claim
          alone (since it started) is contested: the workspace used last wins.
        """
        worker_id = session.worker_id
        # A worker's clock may run ahead (or lie): a last use in the future would win
        # every tie-break below for ever, so no claim is later than this hub's now.
        now = now_ms()
        claims = sorted(plans, key=lambda plan: plan.last_used_unix_ms, reverse=True)
        if len(claims) > HELLO_PLANS:
            log.warning(
                "worker %s says it holds %d plans; the hub takes the %d used last (the "
                "rest are placed anew when next used)",
                worker_id,
                len(claims),
                HELLO_PLANS,
            )
        held: dict[str, int] = {}
        epochs: dict[str, str] = {}
        unproven: list[str] = []
        for plan in claims[:HELLO_PLANS]:
            if id_problem("plan_id", plan.plan_id) is not None:  # never a call's plan id
                continue
            if self.by_plan.get(plan.plan_id) == worker_id:
                epochs.setdefault(plan.plan_id, self.epochs.get(plan.plan_id, ""))
            else:
                epoch = self._proven(worker_id, plan)
                if epoch is None:
                    unproven.append(plan.plan_id)
                    continue
                epochs.setdefault(plan.plan_id, epoch)
            held.setdefault(plan.plan_id, min(plan.last_used_unix_ms, now))
        del claims
        if unproven:
            self.unproven_lines.log(
                "worker %s says it holds %d plan(s) this hub did not place there, without "
                "the placement token it gives for one or with a wrong one (%s): ignored, "
                "their calls go where the hub places them",
                worker_id,
                len(unproven),
                ", ".join(repr(shown(plan_id)) for plan_id in unproven[:UNPROVEN_NAMED])
                + (", ..." if len(unproven) > UNPROVEN_NAMED else ""),
            )
        for plan_id in self.store.queued_teardowns(worker_id):
            held.pop(plan_id, None)  # its removal is on the way: not a home for the plan
        self.held[worker_id] = held
        self.claimed[worker_id] = epochs
        on_the_way = {
            call.request.plan_id
            for call in self.store.open_calls(worker_id)
            if call.state == "PENDING"
        }
        for plan_id, placed in list(self.by_plan.items()):
            if placed != worker_id or plan_id in held:
                continue
            if plan_id in on_the_way:  # placed here, its first call not yet delivered
                held[plan_id] = now_ms()
                continue
            self.unplace(plan_id)
            log.info("plan %s: worker %s no longer holds its workspace", plan_id, worker_id)
            self.settle(plan_id)
        learned = 0
        for plan_id in held:
            recorded = self.by_plan.get(plan_id)
            if recorded is None:
                self.place(plan_id, worker_id, learned=True, epoch=epochs.get(plan_id, ""))
                learned += 1
            elif recorded != worker_id and plan_id in self.learned:
                self.settle(plan_id)  # a claim against a claim
            elif recorded != worker_id:
                log.warning(
                    "plan %s: worker %s says it holds a workspace of it, but the plan is "
                    "placed on worker %s; its calls stay there",
                    plan_id,
                    worker_id,
                    recorded,
                )
        if learned:
            log.info("worker %s holds %d plan(s) this hub had no record of", worker_id, learned)

    def settle(self, plan_id: str) -> None:
        """Place `plan_id` on the connected worker whose workspace of it was used last,
        unless its record names a worker that is away (which keeps it)."""
        placed = self.by_plan.get(plan_id)
        if placed is not None and placed not in self.sessions:
            log.warning(
                "plan %s: its record names worker %s, which is away; other workers hold a "
                "workspace of it too, and its calls wait for %s",
                plan_id,
                placed,
                placed,
            )
            return
        holders = [
            (self.held[worker_id][plan_id], worker_id) for worker_id in self.holders(plan_id)
        ]
        if not holders:
            return
        _, latest = max(holders)
        if len(holders) > 1:
            log.warning(
                "plan %s has a workspace on %d workers (%s); its calls go to %s, used last",
                plan_id,
                len(holders),
                ", ".join(sorted(w for _, w in holders)),
                latest,
            )
        if placed != latest:
            epoch = self.claimed.get(latest, {}).get(plan_id, "")
            self.place(plan_id, latest, learned=True, epoch=epoch)

    def least_loaded(self, plan_id: str) -> str:
        candidates = [
            s for s in self.sandbox_workers() if s.heartbeat.state != pb.Heartbeat.DRAINING
        ]
        if not candidates:
            raise WorkerError(
                "sandbox_unavailable",
                f"no sandbox worker is connected to take plan {plan_id!r}; start one with "
                "`agentworker run --sandbox` (or `agentworker up --sandbox`)"
                + self.store.enrolments.waiting_hint(),
                {"plan_id": plan_id},
            )
        plans: dict[str, int] = {}
        for worker_id in self.by_plan.values():
            plans[worker_id] = plans.get(worker_id, 0) + 1

        # Busy: the calls this hub has open there (its own, exact count; a heartbeat's
        # in_flight lags by up to a beat), then the plans it holds.
        def load(session: Worker) -> tuple[int, int, str]:
            worker_id = session.worker_id
            return self.open_calls.get(worker_id, 0), plans.get(worker_id, 0), worker_id

        return min(candidates, key=load).worker_id

    def holders(self, plan_id: str) -> set[str]:
        """The connected workers holding a workspace of `plan_id`."""
        return {
            worker_id
            for worker_id, plans in self.held.items()
            if plan_id in plans and worker_id in self.sessions
        }
