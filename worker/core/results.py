"""Where a call's answer goes: recorded in the ledger, then sent, then its telemetry row.

The pipeline's last part (DESIGN.md §2). `Results` takes finished results, records
many in one commit, sends them through the `Outbox`, and writes their telemetry rows
later, many in one commit: when the server acks them (before the ack lets the ledger
forget them), or `TELEMETRY_DELAY_S` after the first of them left, whichever comes
first. It also sends the small messages that are not results: STARTED acks (batched
for `ACK_DELAY_S`), duplicate acks and audit events.

The `Outbox` is the one way out: the connection attaches its session's writer while a
stream is up and detaches it when the stream ends; offline, messages go nowhere (a
result is durable and re-sent after the next handshake). On a session with a hub in
this process (`agentworker up`) a result with a blob, or a large one, goes to the hub
by reference, not framed into the stream (`worker.wire.local.HandedResult`).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from worker.core.ledger import ACKED_CAP_EVERY, State
from worker.core.telemetry import CAP_EVERY_ROWS, Telemetry
from worker.db import in_steps
from worker.wire.framing import Buffer, result_part
from worker.wire.local import HandedResult, handed, result_key
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.protocol import at_rest, blob_gone

log = logging.getLogger(__name__)

# How long a STARTED ack waits to share a message with others (or to be made moot).
ACK_DELAY_S = 0.005
# How long the telemetry rows of results sent wait for the server's ack, which writes
# them (one commit for all the rows since the last), before they are written anyway
# (the reference hub acks every STORE_DELAY_S, 50 ms).
# Not right after each result: work on the loop just after a send holds the GIL that
# gRPC needs to put the result on the wire, and a commit per call cost every call
# ~0.05 ms of round trip and the worker a commit each (see "The control path").
TELEMETRY_DELAY_S = 0.1

# A message to the server: a WorkerMessage, or an envelope part already built (a
# result's bytes are made once, for the ledger and the wire alike; see framing.py).
Outgoing = pb.WorkerMessage | bytes
Emit = Callable[[Outgoing], None]


class Outbox:
    """The worker's messages to the server: to the attached session, or nowhere."""

    def __init__(self, sink: Emit | None = None) -> None:
        self._sink = sink
        self._hand: Callable[[HandedResult], None] | None = None

    def attach(self, sink: Emit, hand: Callable[[HandedResult], None] | None = None) -> None:
        """Send to `sink`; with `hand`, the session's hub is in this process and takes a
        result with a blob, or a large one, by reference (`result`)."""
        self._sink = sink
        self._hand = hand

    def detach(self) -> None:
        self._sink = None
        self._hand = None

    @property
    def attached(self) -> bool:
        return self._sink is not None

    def __call__(self, msg: Outgoing) -> None:
        if self._sink is not None:
            self._sink(msg)

    def result(self, result: pb.ActionResult, data: bytes, blob: Buffer) -> None:
        """A result, serialized as `data` (without its blob), and its blob: framed in
        (one copy), or handed over by reference to a hub in this process."""
        if self._sink is None:
            return
        if self._hand is not None and handed(data, blob):
            self._hand(HandedResult(result_key(result), data, blob))
        else:
            self._sink(result_part(data, blob))


@dataclass(frozen=True)
class Finished:
    """A finished call's result as it leaves: the result without its blob, the blob,
    and for an effect-free call (which was never claimed) its digest and plan: its
    result is held in memory until acked instead of recorded first."""

    result: pb.ActionResult
    blob: Buffer = b""
    held: tuple[str, str] | None = None
    check: bytes | None = None  # the blob's check, when its handler computed it


def _at_rest(result: pb.ActionResult) -> bytes | None:
    """The result (without its blob) as the ledger keeps it once acked, serialized; None
    when it is kept as it was sent (see protocol.at_rest)."""
    kept = at_rest(result)
    return None if kept is None else kept.SerializeToString()


class Results:
    def __init__(self, state: State, telemetry: Telemetry, outbox: Outbox) -> None:
        self.state = state
        self.telemetry = telemetry
        self.outbox = outbox
        # Waiting for flush(), each with its result serialized (once: for its size, the
        # ledger and the wire alike; a 1.5 MB listing took 0.25 ms a serialization).
        self._finished: list[tuple[Finished, bytes]] = []
        self._pending_bytes = 0  # their results and blobs
        self._flush_scheduled = False
        self._telemetry_timer: asyncio.TimerHandle | None = None
        self._capping: asyncio.Future[None] | None = None  # telemetry's caps, under way
        self._capping_acked: asyncio.Future[None] | None = None  # the ledger's, under way
        # STARTED acks wait a moment and leave together; a call whose result is out
        # by then needs none (the result says more than "started").
        self._started: dict[str, None] = {}
        self._started_timer: asyncio.TimerHandle | None = None
        self.on_flushed: Callable[[], None] = lambda: None

    @property
    def pending(self) -> int:
        """Results finished but not yet recorded."""
        return len(self._finished)

    @property
    def pending_bytes(self) -> int:
        """What the results not yet recorded will add to the unacked ones (see State):
        counted as each is added, so a new call's budget check does not sum them again."""
        return self._pending_bytes

    # ------------------------------------------------------------- results

    def add(self, finished: Finished, *, now: bool) -> None:
        """Queue a finished result: recorded and sent at once when `now`, else in the
        next loop turn together with any others that finish meanwhile."""
        data = finished.result.SerializeToString()
        self._finished.append((finished, data))
        self._pending_bytes += len(data) + len(finished.blob)
        if now:
            self.flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Record the results finished since the last flush (one commit for all of
        them), then send them: none leaves unrecorded. Their telemetry rows are written
        just after, off the caller's path (see `ack`)."""
        self._flush_scheduled = False
        finished, self._finished = self._finished, []
        self._pending_bytes = 0
        encoded = [(f.result.correlation_id, data, f) for f, data in finished]
        recorded = [
            (cid, data, f.blob, _at_rest(f.result)) for cid, data, f in encoded if f.held is None
        ]
        checks = {cid: f.check for cid, _, f in encoded if f.held is None and f.check is not None}
        try:
            if recorded:
                self.state.finish_many(recorded, checks)
        except Exception:
            # Left RUNNING in the ledger: after a restart they answer outcome_unknown.
            log.exception("could not record %d result(s); they were not sent", len(recorded))
            encoded = [item for item in encoded if item[2].held is not None]
        for cid, data, f in encoded:
            if f.held is not None:  # effect-free: in memory until acked (see ledger)
                self.state.hold(cid, f.held[0], f.held[1], data, f.blob, _at_rest(f.result))
            self._started.pop(cid, None)
            self.outbox.result(f.result, data, f.blob)
        if not self._started and self._started_timer is not None:
            # Every call it was for has answered: no wake-up for nothing.
            self._started_timer.cancel()
            self._started_timer = None
        if encoded:
            self.telemetry.record_later([f.result.invocation for _cid, _data, f in encoded])
            self._write_telemetry_later()
        self.on_flushed()

    def _write_telemetry_later(self) -> None:
        """Write the queued telemetry rows with the server's next ack, or after
        TELEMETRY_DELAY_S if none comes first; at once with no loop running."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.write_telemetry()
            return
        if self._telemetry_timer is None:
            self._telemetry_timer = loop.call_later(TELEMETRY_DELAY_S, self._telemetry_due)

    def _telemetry_due(self) -> None:
        self._telemetry_timer = None
        self.write_telemetry()  # should the disk say no, the next result tries again

    def write_telemetry(self) -> bool:
        """Write the queued telemetry rows; False if they could not be (they stay
        queued, their results unacked, and recover() writes them should the worker
        stop first)."""
        if self._telemetry_timer is not None:
            self._telemetry_timer.cancel()
            self._telemetry_timer = None
        try:
            self.telemetry.flush()
        except sqlite3.Error:
            log.exception("could not write telemetry rows; will try again")
            return False
        if self.telemetry.written_since_cap >= CAP_EVERY_ROWS and self._capping is None:
            # A flood of rows is bounded now, not at the hourly housekeeping; in steps,
            # other calls running between them (at once with no loop running).
            try:
                self._capping = asyncio.get_running_loop().create_task(self._cap())
            except RuntimeError:
                try:
                    self.telemetry.cap_rows()
                except sqlite3.Error:
                    log.exception("could not apply telemetry's caps; will try again")
        return True

    async def _cap(self) -> None:
        try:
            if capped := await self.telemetry.cap_rows_in_steps():
                log.warning("telemetry: forgot the %d oldest rows past their caps", capped)
        except sqlite3.Error:
            log.exception("could not apply telemetry's caps; the hourly housekeeping will")
        finally:
            self._capping = None

    def ack(self, correlation_ids: list[str]) -> None:
        """The server stored these results: the ledger may forget them after its TTL.
        Their telemetry rows are written first, so a result is never both acked and
        missing its row (recover() restores rows from unacked results only); if they
        cannot be, the acks wait for the server to ack a re-send."""
        if self.write_telemetry():
            self.state.ack(correlation_ids)
            if self.state.acked_since_cap >= ACKED_CAP_EVERY and self._capping_acked is None:
                try:  # a flood of calls is bounded now, not at the hourly housekeeping
                    loop = asyncio.get_running_loop()
                except RuntimeError:
                    return  # the hourly housekeeping will
                self._capping_acked = loop.create_task(self._cap_acked())

    async def _cap_acked(self) -> None:
        try:
            if forgot := await in_steps(self.state.cap_acked()):
                log.warning("ledger: forgot the %d oldest acked calls past their bound", forgot)
        except sqlite3.Error:
            log.exception("could not bound the ledger's acked calls; the hourly housekeeping will")
        finally:
            self._capping_acked = None

    def resend_unacked(self) -> None:
        """After a handshake: every result the server has not acked goes out again."""
        for message in self.unacked_messages():
            self.outbox(message)

    def unacked_messages(self) -> Iterator[Outgoing]:
        """Each result the server has not acked, as it goes out again, oldest first; a
        blob kept in a file is read as its turn comes, not all at once."""
        for unacked in self.state.unacked_results():
            blob = unacked.blob
            if blob is None:
                if self.state.is_acked(unacked.correlation_id):
                    continue  # acked (its file let go) since this resend began
                # Its file was lost (a power cut): the outcome, not cut bytes.
                gone = blob_gone(pb.ActionResult.FromString(unacked.result), unacked.blob_bytes)
                yield pb.WorkerMessage(result=gone)
                continue
            yield result_part(unacked.result, blob)

    # ------------------------------------------------------------- other messages

    def started(self, cid: str) -> None:
        """Say the call started, in a moment, with others (or not at all if its result
        leaves first)."""
        if self._started_timer is None:
            loop = asyncio.get_running_loop()
            self._started_timer = loop.call_later(ACK_DELAY_S, self._flush_started)
        self._started[cid] = None

    def _flush_started(self) -> None:
        self._started_timer = None
        if self._started:
            ack = pb.ActionAck(correlation_ids=list(self._started), kind=pb.ActionAck.STARTED)
            self.outbox(pb.WorkerMessage(ack=ack))
        self._started = {}

    def ack_request(self, cid: str, kind: pb.ActionAck.Kind, message: str = "") -> None:
        ack = pb.ActionAck(correlation_ids=[cid], kind=kind, message=message)
        self.outbox(pb.WorkerMessage(ack=ack))

    def send(self, msg: Outgoing) -> None:
        """A message outside the ledger (a refusal of what was never claimed, a replay)."""
        self.outbox(msg)

    def replay(self, result: pb.ActionResult, blob: Buffer) -> None:
        """A recorded result sent again (a duplicate of a finished call), with its blob."""
        self.outbox.result(result, result.SerializeToString(), blob)

    def audit(self, kind: str, req: pb.ActionRequest, detail: dict[str, Any]) -> None:
        event = self.telemetry.audit(
            kind,
            correlation_id=req.correlation_id,
            plan_id=req.plan_id,
            agent_id=req.agent_id,
            detail={"action": f"{req.surface}.{req.action}", **detail},
        )
        self.outbox(pb.WorkerMessage(audit=event))
