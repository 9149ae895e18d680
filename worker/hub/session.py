"""A connected worker's stream as the hub holds it: its outbox (one writer), what the
worker said of it (Hello, heartbeats, kills confirmed) and what waits on it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import grpc

from worker.clock import now_ms
from worker.hub.outbox import Outbox
from worker.wire.framing import Chunked, message_part, when_idle
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.protocol import PARTS_PROTOCOL, PROTOCOL_MIN

Trailing = tuple[tuple[str, str], ...]  # a refusal's trailing metadata

# While a worker has other calls of this hub's in hand, a new request waits for the
# worker's next results, or this long at most, and then leaves with every message
# queued meanwhile, in one stream message (see Hub._hold).
HOLD_S = 0.002
# Messages the hub expects no answer to, so that sending one changes nothing of what a
# reader waiting for a later-read turn would look at (Hub._expects): a heartbeat; a kill,
# whose confirmation a heartbeat brings.
_ANSWERED_BY_NONE: Final = frozenset({"heartbeat", "kill_plan"})


@dataclass
class Session:
    """One connected worker stream."""

    hello: pb.Hello
    session_id: str
    # The digest of the worker key its stream came with ('' none): an operator's accept
    # of another key for its id ends it (worker.hub.admission.Admission.decide).
    key_digest: str = ""
    # Serialized ServerMessages framed as envelope parts (see framing.py): a request's
    # blob is framed in, never copied into a message object. It knows how long its
    # oldest has waited, and the bytes of kills and heartbeats in it (Hub._behind).
    outbox: Outbox = field(default_factory=Outbox)
    # The protocol this stream speaks (the Welcome's choice): 2 takes blobs in parts.
    protocol: int = PROTOCOL_MIN
    # Requests whose blobs go in parts on this stream, by call id (see `send`).
    transfers: dict[str, Chunked] = field(default_factory=dict)
    heartbeat: pb.Heartbeat = field(default_factory=pb.Heartbeat)
    closed: bool = False
    # Set once the worker's next results came and the loop has nothing else to run (or
    # after HOLD_S): the outbox's writer waits on it (see Hub._hold).
    held: asyncio.Future[None] | None = None
    settling: asyncio.Future[None] | None = None  # the `held` that `settle` will set
    # Calls the worker said are running (acked STARTED or DUPLICATE_RUNNING) and has
    # not answered yet: slow ones, whose results nothing waits for (see Hub._hold).
    running: set[str] = field(default_factory=set)
    # The ids its Hello named (running, or answered and not acked), whose results may
    # come again: taken off as they come (at most HELLO_RESENT_IDS).
    resent: set[str] = field(default_factory=set)
    # Calls sent to its worker whose results it owes though no caller may wait for them
    # (Hub._expects): those its Hello named that are open here, and those sent again at
    # its Hello; taken off as their results come, or as they are abandoned.
    owed: set[str] = field(default_factory=set)
    # Messages the hub did not ask for, so far (see UNSOLICITED_PER_STREAM), and the
    # ids to ack at the end of the envelope being read (results not kept).
    unsolicited: int = 0
    acks: list[str] = field(default_factory=list)
    # Why the hub ends the stream (a status and its details), once it must.
    # How its stream ends when the hub ends it: code, message (and trailing metadata).
    refusal: tuple[grpc.StatusCode, str] | tuple[grpc.StatusCode, str, Trailing] | None = None
    # While its reader waits for a turn of `later_reads`, the future that turn comes by
    # (Turns.ask): resolved False as the hub sends the worker something other than a
    # heartbeat, so that the reader looks again whether it expects answers (Hub._next).
    waiting: asyncio.Future[bool] | None = None
    # While gRPC has not taken the envelope last handed to it (the worker does not read:
    # HTTP/2's flow control holds it), what its taking resolves (Hub._next waits on it
    # before it asks for a later-read turn; see `wrote`).
    writing: asyncio.Future[None] | None = None
    writing_since: float = 0.0  # the loop's time the envelope was handed over
    # Set once the hub let go of it (Hub._ended): what it held is dropped, once.
    ended: bool = False
    # When it began (unix ms): the time it was connected counts for its worker's row.
    started_ms: int = field(default_factory=now_ms)
    # The hub's kills the worker confirmed recording, through this one (KillPlan.seq):
    # from its Hello (0 for another epoch's), then its heartbeats.
    kills_through: int = 0
    # The backlog of kills it is sent a page at a time (Hub._send_kill_page): while
    # `kills_paging` (from its Hello, and again whenever it is KILL_PAGE kills behind),
    # through which one the kills went on this stream (`kills_sent`: in pages, or as
    # they were made), and the resent calls held back until their plan's kill has gone
    # ahead of them.
    kills_paging: bool = True
    kills_sent: int = 0
    held_resends: set[str] = field(default_factory=set)
    # What to do when it ends: uploads handed to its worker as they come stop (see
    # worker.hub.delivery.hand_upload), by call id.
    on_close: dict[str, Callable[[], None]] = field(default_factory=dict)

    @property
    def worker_id(self) -> str:
        return self.hello.worker_id

    def send(self, msg: pb.ServerMessage | bytes | Chunked, *, answered: bool = True) -> None:
        """Queue a message, an envelope part already built (bytes), or a request with
        its blob in parts (whole, for a worker that does not take parts). A reader
        waiting for a later-read turn is woken to look again whether the hub now
        expects an answer, unless the message is one the hub expects none to
        (`answered` False, a heartbeat, a kill: confirmed by heartbeats, read in
        turns). Woken for each kill, 1,000 idle readers each withdrew from the queue
        and asked again: a KillPlan cost 77 ms of the hub's loop (review16 F8). Those
        are counted in the outbox (`Outbox.unasked_bytes`): nothing else bounds them."""
        if self.closed:
            return
        if isinstance(msg, pb.ServerMessage) and msg.WhichOneof("kind") in _ANSWERED_BY_NONE:
            answered = False
        if not answered and isinstance(msg, bytes | pb.ServerMessage):
            part = msg if isinstance(msg, bytes) else message_part(msg.SerializeToString())
            self.outbox.put_unasked(part)
            return
        waiting = self.waiting
        if waiting is not None and not waiting.done():
            waiting.set_result(False)
        if isinstance(msg, Chunked):
            if self.protocol < PARTS_PROTOCOL:
                self.outbox.put_nowait(msg.inline())
                return
            # One transfer of a call at a time: a second (a retry, a second caller)
            # would interleave its parts with the first's under the same id.
            cid = msg.request.correlation_id
            going = self.transfers.get(cid)
            if going is not None and not going.finished:
                return  # the one under way brings the same call; the worker acks it once
            self.transfers = {c: t for c, t in self.transfers.items() if not t.finished}
            self.transfers[cid] = msg
            self.outbox.put_nowait(msg)
        else:
            part = msg if isinstance(msg, bytes) else message_part(msg.SerializeToString())
            self.outbox.put_nowait(part)

    def writes(self) -> None:
        """An envelope goes to gRPC: `writing` until it has taken it (`wrote`)."""
        loop = asyncio.get_running_loop()
        self.writing = loop.create_future()
        self.writing_since = loop.time()

    def wrote(self) -> None:
        if self.writing is not None and not self.writing.done():
            self.writing.set_result(None)
        self.writing = None

    def release(self) -> None:
        """Let a held batch go (see Hub._hold)."""
        if self.held is not None and not self.held.done():
            self.held.set_result(None)
        self.held = None

    def settle(self) -> None:
        """The worker's results came: let the held batch go once the loop has nothing
        else to run (see Hub._hold)."""
        held = self.held
        if held is None or held.done() or self.settling is held:
            return
        self.settling = held

        def go() -> None:
            if self.held is held:  # not let go meanwhile (HOLD_S), nor another batch's
                self.release()

        when_idle(go, HOLD_S)

    def stuck_for(self) -> float:
        """How long gRPC has held the envelope last handed to it (0: none held)."""
        if self.writing is None:
            return 0.0
        return asyncio.get_running_loop().time() - self.writing_since

    def drop_queued(self) -> None:
        """Let go of every message not yet handed to gRPC."""
        while not self.outbox.empty():
            self.outbox.get_nowait()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.outbox.put_nowait(None)
            self.release()
            for stop in self.on_close.values():
                stop()
            self.on_close.clear()
