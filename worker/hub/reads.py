"""How many of each kind of request the hub reads at once, and whose.

gRPC reads a message whole, up to MAX_MESSAGE_BYTES, as soon as the hub asks for it,
before anything can look at its size or its sender. So the hub asks in turns
(worker.hub.turns): a worker stream's first message (its Hello), its later messages
while the hub expects none, and ControlService requests by kind. Everything waiting
for a turn waits with its bytes unread, left with the sender by gRPC's flow control
(docs/architecture.md, "The hub").
"""

from __future__ import annotations

from typing import Final

from worker.hub.turns import Gate, LaterReads, Turns

# How many worker streams' first messages (their Hellos) are read at once, and how many
# of them one connection's: gRPC reads a stream message whole, up to MAX_MESSAGE_BYTES,
# when the hub asks for it, and the hub asked for every new stream's at once, before
# anything could look at it (review12 finding 09: 80 streams of the workers' token,
# each sending 31 MiB first, took the hub up 802 MiB, and it stayed). A stream waits
# for its turn with its first message unread (gRPC's flow control leaves it with the
# sender: 40 streams writing 31 MiB behind held turns, the hub +1 MiB), and
# HANDSHAKE_TIMEOUT_S counts from its turn. Reads at once cost about 3x their size each
# (48 streams of 31 MiB: +407 MiB before, +204 at two at once, +253 at four). A Hello is
# small and comes at once, so a fleet reconnecting is read two at a time without
# waiting long.
HELLO_READS_AT_ONCE: Final = 2
HELLO_READS_PER_CONNECTION: Final = 1
# A turn held without a Hello coming is given up, and its holder goes behind, as gRPC
# health's requests are (worker.hub.turns.Gate): four streams of the workers' token that
# never said Hello, reopened as the hub ended them, held both turns 10 s each and kept a
# restarted worker out as long as they were kept up (review14 finding 04). So:
# - a stream whose key a worker remembered here is bound to (hub.db: a worker coming
#   back) is read on turns of its own (`known_hello_reads`), a turn per key, and of one
#   key HELLO_STREAMS_PER_KEY wait at most: streams of keys the hub does not know never
#   stand in its way;
# - a turn held HELLO_PROMPT_S without its Hello goes to a stream waiting for one (at
#   once to one of a lower rank), and the silent stream's connection (for a known key:
#   the key) goes behind the others for HELLO_LATE_FOR_S, its address too while its
#   connections go late faster than HELLO_LATE_PER_ADDRESS in that time;
# - the streams waiting or read at once are bounded: HELLO_STREAMS_PER_CONNECTION of a
#   connection, HELLO_STREAMS_PER_ADDRESS of an address (a fleet behind one NAT says
#   Hello together: 1,200 in tests), HELLO_STREAMS_PER_LATE_ADDRESS while the address is
#   late, HELLO_WAITING waiting in all; another is refused busy, unread. For known keys
#   HELLO_STREAMS_PER_LATE_ADDRESS bounds the streams of late keys only, counted over
#   those alone: 12 keys x 2 silent streams from one address held all 16 places of its
#   keys together, and a restarted worker at that address (a NAT, the same host) was
#   refused busy for 45 s+ (review15 finding 04); a key that never went late is bounded
#   by its own HELLO_STREAMS_PER_KEY, and its stream waits behind no late key's.
# How many worker streams' later messages are read at once, and of them one
# connection's, while the hub expects none from their workers. gRPC reads a message whole,
# up to MAX_MESSAGE_BYTES, once the hub asks for it, and the hub asked every stream for
# its next message as soon as it had read one: 48 streams of the workers' token, each
# sending 31 MiB after a small Hello, took the hub's peak up 535 MiB (review14 finding
# 05). So a stream's next message is asked for at once only while the hub expects its
# worker's answers (calls open there, a scope request or a teardown asked); otherwise
# it waits for one of these turns, its message left with the sender (gRPC's flow
# control), and a message the hub comes to expect meanwhile is asked for at once. A
# worker with nothing to answer sends heartbeats and audit events, a few hundred bytes.
LATER_READS_AT_ONCE: Final = 2
LATER_READS_PER_CONNECTION: Final = 1
# A turn held LATER_SILENT_S without the message coming, while another stream waits for
# one, is given up and the silent stream ends (gRPC cannot take back a read it was asked
# for, and one left asked for outside a turn would be read whole outside the bound); its
# connection goes behind the others for HELLO_LATE_FOR_S, its address too while its
# connections go late faster than HELLO_LATE_PER_ADDRESS in that time (as for Hellos:
# worker.hub.turns.LaterReads). Two streams that said Hello and then nothing held both
# turns for ever, and no worker with no call open was read: heartbeats, audit events,
# and the confirmations the kill backlog's pages wait for (review15 finding 02). A
# worker sends a heartbeat every connection.heartbeat_s (5 s unless configured), so a
# worker's stream in its turn has a message well within this.
LATER_SILENT_S: Final = 15.0
HELLO_PROMPT_S: Final = 2.0
HELLO_LATE_FOR_S: Final = 60.0
HELLO_LATE_PER_ADDRESS: Final = 3
HELLO_STREAMS_PER_KEY: Final = 2
HELLO_STREAMS_PER_CONNECTION: Final = 256
HELLO_STREAMS_PER_ADDRESS: Final = 2048
HELLO_STREAMS_PER_LATE_ADDRESS: Final = 16
HELLO_WAITING: Final = 8192
HELLO_WAITING_LATE: Final = 16


# How many ControlService requests are read at once, by kind. gRPC reads a request
# whole, up to MAX_MESSAGE_BYTES whatever its method takes, before anything can look at
# its size (the caps above are checked after the read), so it is the read that is
# bounded: a call waits for its turn with its request unread, and the reads under way
# hold at most (2 + 4 + 2 + 2 + 2) x 32 MiB, and DISPATCH_UNARY_READS x 32 MiB more (below),
# however many calls come at once (sixteen 31 MiB
# ListWorkers at once took the hub from 63 to 525 MiB). Dispatch's reads are apart, so
# that blobs being received never hold up the others; KillPlan's (the kill switch) are
# apart from every other method's, Status's too (`agentworker status`), and the rest
# share theirs: two ListWorkers sent a byte at a time held up a KillPlan for the 30 s
# they were let take then, and Status calls that never sent their request held it 5 s
# a pair in turn, as long as they kept coming (review9 finding 05).
# A DispatchUpload is read in a turn of the uploads' own, every part of it (the turn is
# let go once its last part came): what uploads hold and how many go at once are
# bounded as Dispatch's reads are, and uploads whose callers stall hold back no
# Dispatch (review13 finding 05: two held Dispatch's turns up to 600 s).
CONTROL_READ_KIND: Final = {
    "Dispatch": "Dispatch",
    "DispatchUpload": "DispatchUpload",
    "KillPlan": "KillPlan",
    "Status": "Status",
}
# An upload holds its turn while its parts come (a 16 MiB one some 15 ms on loopback, a
# stalled one up to its deadline): uploads have turns of their own, so that stalled ones
# hold back no Dispatch (review13 finding 05), and no connection holds them all.
CONTROL_READS_AT_ONCE: Final = {"Dispatch": 2, "DispatchUpload": 4, "KillPlan": 2, "Status": 2}
CONTROL_READS_AT_ONCE_OTHERWISE: Final = 2
# ... of which one connection holds at most this many (a caller's other calls wait while
# other connections' calls are read: worker.hub.turns). Dispatch's two may both be one
# connection's (the agent server's blobs).
CONTROL_READS_PER_CONNECTION: Final = {"Dispatch": 2, "DispatchUpload": 2}
CONTROL_READS_PER_CONNECTION_OTHERWISE: Final = 1


# How long a request may take to arrive once its turn came (a caller sends it whole at
# once: a call whose request does not come must not keep the turn from the others).
# Dispatch's may carry 32 MiB over a slow link; the others' are small (64 KiB at most,
# RequestScope's 1 MiB), KillPlan's and Status's a few hundred bytes in practice.
# An upload's first message is small (the call and its blob's size); its parts have
# the call's deadline, and each its own time after the last (upload.PART_WITHIN_S).
CONTROL_READ_WITHIN_S: Final = {
    "Dispatch": 300.0,
    "DispatchUpload": 10.0,
    "KillPlan": 5.0,
    "Status": 5.0,
}
CONTROL_READ_WITHIN_S_OTHERWISE: Final = 10.0


def hello_reads(*, known: bool) -> Gate:
    """The turns to read worker streams' first messages: those of keys the hub knows
    (`known`, a turn per key) or the others' (a turn per connection); see
    HELLO_READS_AT_ONCE and HELLO_PROMPT_S."""
    return Gate(
        HELLO_READS_AT_ONCE,
        HELLO_READS_PER_CONNECTION,
        read_within_s=None,  # a stream waits with its message unread; its worker redials
        prompt_s=HELLO_PROMPT_S,
        waiting_most=HELLO_WAITING,
        waiting_late=HELLO_WAITING_LATE,
        calls_per_connection=HELLO_STREAMS_PER_KEY if known else HELLO_STREAMS_PER_CONNECTION,
        calls_per_address=HELLO_STREAMS_PER_ADDRESS,
        calls_per_late_address=HELLO_STREAMS_PER_LATE_ADDRESS,
        late_for_s=HELLO_LATE_FOR_S,
        late_per_address=HELLO_LATE_PER_ADDRESS,
        # A known key that never went late is bounded as if its address were not late:
        # its own two streams, whatever its address's other keys did (review15 04).
        late_address_counts_late=known,
    )


def later_reads() -> LaterReads:
    """The turns to read worker streams' later messages while the hub expects none of
    them (LATER_READS_AT_ONCE, LATER_SILENT_S)."""
    return LaterReads(
        LATER_READS_AT_ONCE,
        LATER_READS_PER_CONNECTION,
        silent_s=LATER_SILENT_S,
        late_for_s=HELLO_LATE_FOR_S,
        late_per_address=HELLO_LATE_PER_ADDRESS,
    )


def control_reads() -> dict[str, Turns]:
    """The turns to read ControlService requests, by kind (CONTROL_READ_KIND; "": the
    other methods')."""
    return {
        kind: Turns(
            CONTROL_READS_AT_ONCE.get(kind, CONTROL_READS_AT_ONCE_OTHERWISE),
            CONTROL_READS_PER_CONNECTION.get(kind, CONTROL_READS_PER_CONNECTION_OTHERWISE),
        )
        for kind in {"", *CONTROL_READ_KIND.values()}
    }


# How many Dispatch requests gRPC may read at once as a unary call's, before the hub's
# handler runs (worker.hub.services._ControlHandlers), beside Dispatch's reads in turn
# above. gRPC reads such a request whole, up to MAX_MESSAGE_BYTES, as it arrives, and
# nothing can time it out: a read is held until its bytes came or its call ended
# (CONTROL_READ_WITHIN_S does not apply). So they are few, and when none is free a
# Dispatch is read in its turn as before: callers that never send their request hold
# these at most, and every other Dispatch goes the slower way meanwhile.
DISPATCH_UNARY_READS: Final = 2


class UnaryReads:
    """How many Dispatch requests gRPC reads as a unary call's now, at most `slots`."""

    def __init__(self, slots: int = DISPATCH_UNARY_READS) -> None:
        self.slots = slots
        self.held = 0

    def take(self) -> bool:
        """One more, if one is free."""
        if self.held >= self.slots:
            return False
        self.held += 1
        return True

    def give_back(self) -> None:
        self.held -= 1
