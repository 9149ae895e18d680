"""Whether the hub serves a worker stream's Hello, by the operator's decisions
(worker.hub.enrolment), and the operator's verbs on them (ControlService.DecideWorker).

A Hello is served when its (worker id, key) is accepted. Accepted without asking:
- `up`'s own worker (the stream in this process, worker.wire.inproc);
- a worker whose key is one made for this hub (transport.OWN_HUB_NAME, or the address
  it listens on: `own_names`) from this hub's data folder's worker.key: the same user,
  the same AGENTWORKER_HOME (`agentworker hub` and `agentworker run` on one machine);
  whoever can read that file can read hub.token too;
- any new worker id, while `[hub] accept_new_workers` is on (off by default: with it,
  anyone holding the workers' token is a worker of this hub and is given plans).
Every other Hello waits for the operator (pending) or is refused.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import grpc

from worker.hub.audit_log import shown
from worker.hub.enrolment import DecisionError, Enrolment, Enrolments
from worker.hub.hellos import PacedLines, StreamKey, hello_description
from worker.ids import id_problem
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.protocol import ENROLMENT_KEY
from worker.wire.transport import (
    OWN_HUB_NAME,
    fingerprint_of_digest,
    key_for_server,
    worker_key_digest_of,
)

log = logging.getLogger(__name__)


# How the hub ends a served worker's stream it no longer serves (Session.refusal).
Ended = tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class Refusal:
    why: str  # ENROLMENT_KEY's value
    message: str

    code: grpc.StatusCode = grpc.StatusCode.PERMISSION_DENIED
    # A stream connected under the id with the key accepted from an older version of
    # the worker is served no more (Enrolments.verdict's `superseded`).
    ends_older: bool = False


def pending_message(worker_id: str, fingerprint: str) -> str:
    return (
        f"worker {worker_id!r} is not accepted by this hub yet (its key's fingerprint "
        f"{fingerprint}): the hub's operator runs `agentworker workers accept {worker_id}` "
        "once the fingerprint matches the one this worker printed at its start. Until "
        "then it is given no calls; it tries again meanwhile"
    )


def taken_message(worker_id: str, fingerprint: str) -> str:
    return (
        f"worker id {worker_id!r} belongs to another worker at this hub: it is accepted "
        f"with another key, and this worker's key (fingerprint {fingerprint}) is not it. "
        "A worker's id and key live together in its data folder (worker_id, worker.key): "
        "move both, or remove worker_id there to get a new id. If this worker's key was "
        "made anew, the hub's operator accepts it "
        f"with `agentworker workers accept {worker_id} --fingerprint {fingerprint}`"
    )


def upgraded_message(worker_id: str, fingerprint: str) -> str:
    return (
        f"worker {worker_id!r} now proves a key made for this hub (fingerprint "
        f"{fingerprint}), no longer its worker.key itself, which this hub accepted from an "
        "older version of it (a server it dialled learns nothing it could pose as it with "
        "elsewhere): the hub's operator runs `agentworker workers accept "
        f"{worker_id} --fingerprint {fingerprint}` once the fingerprint matches the one this "
        "worker printed at its start. Until then it is given no calls; it tries again "
        "meanwhile"
    )


def superseded_message(worker_id: str, fingerprint: str) -> str:
    return (
        f"worker {worker_id!r}'s key of fingerprint {fingerprint} is its worker.key itself, "
        "which this hub accepted from an older version of the worker; a key made for this "
        "hub has since come under that id, so this one is served no more (every server "
        "the worker dialled was sent it). The hub's operator accepts the new key with "
        f"`agentworker workers accept {worker_id} --fingerprint F` once F matches the one "
        "the worker printed at its start"
    )


def refused_message(worker_id: str, fingerprint: str) -> str:
    return (
        f"the operator of this hub refused worker {worker_id!r} (key fingerprint "
        f"{fingerprint}): it is given no calls here. `agentworker workers forget "
        f"{worker_id}` on the hub undoes that"
    )


NO_KEY_MESSAGE: Final = (
    "this worker sent no worker key (a worker from before keys, or not agentworker's): "
    "a hub serves a worker only with the key its operator accepted; upgrade the worker"
)


class Admission:
    def __init__(
        self,
        enrolments: Enrolments,
        own_key: Callable[[], str],
        *,
        accept_new: bool = False,
    ) -> None:
        self.enrolments = enrolments
        # This hub's data folder's worker.key ('' while there is none): read when a
        # Hello comes, since `run` may make the file after the hub started.
        self._own_key = own_key
        # The names this hub's own worker may know it by (transport.key_for_server): set
        # as the hub binds its address, before any Hello.
        self.own_names: tuple[str, ...] = (OWN_HUB_NAME,)
        # The digests of the keys made from it for them, kept once read: the file is
        # made once.
        self._own_digests: frozenset[str] = frozenset()
        self.accept_new = accept_new
        self.pending_lines = PacedLines()
        if accept_new:
            log.warning(
                "hub: [hub] accept_new_workers is on: every new worker id is accepted at its "
                "first Hello, and anyone holding hub-workers.token is given plans, calls, "
                "args and blobs here; turn it off once your workers are accepted"
            )
        if enrolments.migrated:
            log.warning(
                "hub: %d worker(s) this hub.db knew from before enrolment are accepted with "
                "the key each first came with; `agentworker workers` lists them, `agentworker "
                "workers refuse ID` refuses one you do not recognise",
                enrolments.migrated,
            )

    def admit(self, hello: pb.Hello, key: StreamKey, *, local: bool) -> Refusal | None:
        """None when the Hello is served (accepted now if it may be, see the module);
        else why not, recorded for the operator when it waits for them: its description
        alone (a Hello naming 8 MiB of ids under fresh worker ids grew hub.db by that
        much each, review28 r6)."""
        hello = hello_description(hello)
        worker_id, key_digest, per_server = hello.worker_id, key.digest, key.per_server
        fingerprint = fingerprint_of_digest(key_digest) or "none"
        verdict = self.enrolments.verdict(worker_id, key_digest, per_server=per_server)
        if verdict.ahead:  # accepted by its fingerprint: the row takes the whole digest
            self.enrolments.accept(
                worker_id, key_digest, hello, by="operator", per_server=per_server
            )
            log.info(
                "hub: worker %s accepted ahead, by its key's fingerprint %s",
                shown(worker_id),
                fingerprint,
            )
            return None
        if verdict.state == "accepted":
            self.enrolments.seen(worker_id, key_digest, hello)
            return None
        if not key_digest and not local:
            if verdict.taken:
                return Refusal("key_mismatch", taken_message(worker_id, fingerprint))
            return Refusal("no_key", NO_KEY_MESSAGE)
        if verdict.state == "refused":
            return Refusal("refused", refused_message(worker_id, fingerprint))
        if verdict.superseded:
            return Refusal("pending", superseded_message(worker_id, fingerprint))
        if verdict.upgraded and not self._ours(key_digest, local=local):
            # Not taken for a rogue (which would stop the worker): it waits for the
            # operator, who accepted its older key, to accept this one.
            self.enrolments.waiting(worker_id, key_digest, hello, per_server=True)
            self.pending_lines.log(
                "worker %s now proves a key made for this hub (fingerprint %s), no longer "
                "the worker.key this hub accepted: `agentworker workers accept %s "
                "--fingerprint %s` once it matches what the worker printed at its start",
                shown(worker_id),
                fingerprint,
                shown(worker_id),
                fingerprint,
            )
            return Refusal("pending", upgraded_message(worker_id, fingerprint), ends_older=True)
        if verdict.taken:  # whoever it is: an id is its accepted key's (`up`'s own too)
            # The operator may take it.
            self.enrolments.waiting(worker_id, key_digest, hello, per_server=per_server)
            log.warning(
                "refused a Hello for worker %s: its key (fingerprint %s) is not the one "
                "accepted for that id",
                shown(worker_id),
                fingerprint,
            )
            return Refusal("key_mismatch", taken_message(worker_id, fingerprint))
        ours = self._ours(key_digest, local=local)
        if ours:  # the hub's own user's worker
            self.enrolments.accept(worker_id, key_digest, hello, by="own", per_server=per_server)
            log.info("hub: worker %s accepted (%s)", shown(worker_id), ours)
            return None
        if self.accept_new:
            self.enrolments.accept(
                worker_id, key_digest, hello, by="first_contact", per_server=per_server
            )
            log.info(
                "hub: worker %s accepted on first contact (key fingerprint %s): "
                "[hub] accept_new_workers is on",
                shown(worker_id),
                fingerprint,
            )
            return None
        self.enrolments.waiting(worker_id, key_digest, hello, per_server=per_server)
        self.pending_lines.log(
            "worker %s waits to be accepted (key fingerprint %s): `agentworker workers "
            "accept %s` once it matches what the worker printed at its start",
            shown(worker_id),
            fingerprint,
            shown(worker_id),
        )
        return Refusal("pending", pending_message(worker_id, fingerprint))

    def _ours(self, key_digest: str, *, local: bool) -> str:
        """Why a Hello is the hub's own user's worker ('' when it is not). A row an older
        version accepted for its worker.key itself (sent as it was then) gives way to
        the key made from it for this hub: upgraded, not taken."""
        if local:
            return "`up`'s own worker, in this process"
        if not self._own_digests:
            own_key = self._own_key()
            if own_key:
                self._own_digests = frozenset(
                    worker_key_digest_of(key_for_server(own_key, name)) for name in self.own_names
                )
        if key_digest and key_digest in self._own_digests:
            return "its key is one made for this hub from its data folder's worker.key"
        return ""

    def decide(
        self, request: pb.DecideWorkerRequest, connected: str | None = None
    ) -> tuple[pb.DecideWorkerResponse, Ended | None]:
        """The operator's decision about `request.worker_id`, and how the stream of a
        worker no longer served by it ends (None: it still is). `connected`: the key
        digest of the id's stream connected now, if any. DecisionError when it names no
        worker known here, or more than one key without --fingerprint."""
        worker_id, fingerprint = request.worker_id, request.fingerprint
        problem = id_problem("worker_id", worker_id, required=True)
        if problem is not None:
            raise DecisionError(problem[1])
        if request.decision == pb.DecideWorkerRequest.FORGET:
            if not self.enrolments.forget(worker_id):
                raise DecisionError(
                    f"this hub has no decision about worker {worker_id!r}", not_found=True
                )
            message = (
                f"forgot every decision about worker {worker_id!r}: its next Hello waits to "
                "be accepted again"
            )
            log.warning("hub: %s", message)
            forgot: tuple[tuple[str, str], ...] = ((ENROLMENT_KEY, "forgotten"),)
            ended: Ended = (
                grpc.StatusCode.UNAVAILABLE,
                f"the hub's operator forgot worker {worker_id!r}: say Hello again",
                forgot,
            )
            return pb.DecideWorkerResponse(worker_id=worker_id, message=message), ended
        if request.decision == pb.DecideWorkerRequest.ACCEPT:
            row = self.enrolments.decide(worker_id, fingerprint, "accepted")
            message = (
                f"accepted worker {worker_id!r} with the key of fingerprint {row.fingerprint}: "
                "it is served from its next Hello (it tries again on its own); a Hello under "
                "that id with any other key is refused"
            )
            log.warning("hub: %s", message)
            response = pb.DecideWorkerResponse(
                worker_id=worker_id,
                fingerprint=row.fingerprint,
                enrolment="accepted",
                message=message,
            )
            if connected is None or hmac.compare_digest(connected, row.key_digest):
                return response, None
            # The stream connected under the id came with the key accepted before (a
            # rogue accepted on first contact, say): it is served no more (review28 r2).
            shown_key = fingerprint_of_digest(connected) or "none"
            mismatch: tuple[tuple[str, str], ...] = ((ENROLMENT_KEY, "key_mismatch"),)
            return response, (
                grpc.StatusCode.PERMISSION_DENIED,
                taken_message(worker_id, shown_key),
                mismatch,
            )
        if request.decision == pb.DecideWorkerRequest.REFUSE:
            row = self.enrolments.decide(worker_id, fingerprint, "refused")
            message = (
                f"refused worker {worker_id!r} with the key of fingerprint {row.fingerprint}: "
                f"its Hellos are refused; `agentworker workers forget {worker_id}` undoes it"
            )
            log.warning("hub: %s", message)
            response = pb.DecideWorkerResponse(
                worker_id=worker_id,
                fingerprint=row.fingerprint,
                enrolment="refused",
                message=message,
            )
            if self.enrolments.verdict(worker_id, "").taken:  # another key still accepted
                return response, None
            trailing: tuple[tuple[str, str], ...] = ((ENROLMENT_KEY, "refused"),)
            ended = (
                grpc.StatusCode.PERMISSION_DENIED,
                refused_message(worker_id, row.fingerprint),
                trailing,
            )
            return response, ended
        raise DecisionError("the decision is one of accept, refuse, forget")


def enrolment_info(row: Enrolment) -> pb.WorkerInfo:
    """A worker known only by its enrolment row (waiting, or refused), as ListWorkers
    shows it."""
    hello = row.hello
    return pb.WorkerInfo(
        worker_id=row.worker_id,
        instance_id=hello.instance_id,
        version=hello.version,
        connected=False,
        actions=hello.actions,
        gui_available=hello.gui_available,
        last_seen_unix_ms=row.seen_ms,
        max_concurrency=hello.max_concurrency,
        enrolment=row.state,
        fingerprint=row.fingerprint,
    )
