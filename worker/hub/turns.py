"""Turns to read ControlService requests: a few at once, and a few of them per connection.

gRPC reads a request whole, up to the server's 32 MiB limit, so the hub reads each
request when its turn comes (worker.hub.services `_read_in_turn`): the reads under way
bound what requests hold. A turn is held until the request has arrived, so a caller
that sends its request slowly (a byte at a time) or not at all holds one meanwhile. One
connection holds at most `per_peer` of a kind's turns: the rest go to other
connections' calls first, whatever came earlier, so a caller on one connection cannot
take every turn of a kind (the person's `agentworker kill`, on a connection of its own,
then waits behind no one's slow read). A turn given back goes to the waiting call of
the connection served longest ago (round-robin across connections), not to the call
that came first: a connection that queued many calls whose requests never come took a
turn after each of its own, and another caller's KillPlan waited behind them all, 5 s
each (review12 finding 03: 59 s behind 24); now behind one per connection at most.
A call may wait with a rank: it is handed a turn only when no call of a lower rank
waits (gRPC health ranks the calls of connections and addresses whose requests came
late so: worker.hub.health).
A Gate puts reads whose message should come with the call on turns so ranked, and
bounds those waiting: gRPC health's requests and worker streams' Hellos.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import itertools
import urllib.parse
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from worker.hub.rates import Rate

# A waiting call: its peer, and its turn to come (True once handed; a caller of `ask`
# may resolve it False itself to stop waiting: see `ask`).
_Entry = tuple[str, "asyncio.Future[bool]"]

# Peers whose last turn is remembered; past it, those neither holding nor waiting are
# forgotten (a forgotten peer counts as served longest ago).
PEERS_REMEMBERED = 1024
# A newcomer past a Gate's `waiting_most` takes the place of one of the latest this many
# waiting, if one of them is of a busier address or peer (Gate._push_out).
PUSH_OUT_LOOKS_AT = 256


class Turns:
    """At most `slots` holders at once, at most `per_peer` of them for one peer (a
    connection: gRPC's `context.peer()`); a turn goes to the waiting call of the peer
    that holds fewest and was handed one longest ago (its earliest), passing those
    whose peer holds its share; a call of a higher rank (0 unless said) takes a turn
    only when no call of a lower rank waits that may take it."""

    def __init__(self, slots: int, per_peer: int | None = None) -> None:
        self.slots = slots
        self.per_peer = min(slots, per_peer or slots)
        self._free = slots
        self._held: dict[str, int] = {}  # peer -> turns it holds (none: absent)
        # peer -> when it was last handed a turn (a count of turns handed). Forgotten for
        # peers neither holding nor waiting once past PEERS_REMEMBERED (as if long ago).
        self._served: dict[str, int] = {}
        self._handed = 0
        # Waiting calls by rank: a rank's are handed turns once no lower rank's may.
        self._queues: list[deque[_Entry]] = [deque()]

    def held(self, peer: str | None = None) -> int:
        """Turns held now: by `peer`, or by all."""
        return self.slots - self._free if peer is None else self._held.get(peer, 0)

    def waiting(self, rank: int | None = None) -> int:
        """Calls waiting for a turn: all, or those of `rank`."""
        queues = self._queues if rank is None else self._queues[rank : rank + 1]
        return sum(not future.done() for queue in queues for _, future in queue)

    def wanting(self, rank: int = 0) -> int:
        """Waiting calls of `rank` that a turn given back could go to (their peer holds
        less than its share)."""
        queues = self._queues[rank : rank + 1]
        return sum(not f.done() and self._may(peer) for queue in queues for peer, f in queue)

    @contextlib.asynccontextmanager
    async def turn(self, peer: str, *, rank: int = 0) -> AsyncIterator[None]:
        await self._take(peer, rank)
        try:
            yield
        finally:
            self._give_back(peer)

    def ask(self, peer: str, rank: int = 0) -> asyncio.Future[bool] | None:
        """A turn for `peer` without a task to wait in: None when it holds one now,
        else the future its turn comes by (resolved True). The caller may resolve the
        future False itself to stop waiting (nothing is handed to it then), and ends
        either way with `withdraw` unless it goes on to hold the turn, which it gives
        back with `give_back`. A reader that waits for either of two things (a turn, or
        something else) so keeps one future and no task (worker.hub.server: Hub._next)."""
        if self._free and self._may(peer):
            self._hold(peer)
            return None
        entry = (peer, asyncio.get_running_loop().create_future())
        self._queue(rank).append(entry)
        return entry[1]

    def withdraw(self, peer: str, turn: asyncio.Future[bool]) -> None:
        """`turn` (from `ask`) is waited for no more: a turn handed to it goes back, a
        wait still queued leaves the queue."""
        if turn.done() and not turn.cancelled() and turn.result():
            self.give_back(peer)
            return
        if not turn.done():
            turn.cancel()
        for queue in self._queues:
            for entry in queue:
                if entry[1] is turn:
                    queue.remove(entry)
                    return

    def give_back(self, peer: str) -> None:
        """A turn taken by `ask` (held at once, or handed) goes back."""
        self._give_back(peer)

    def _may(self, peer: str) -> bool:
        return self._held.get(peer, 0) < self.per_peer

    def _hold(self, peer: str) -> None:
        self._free -= 1
        self._held[peer] = self._held.get(peer, 0) + 1
        self._handed += 1
        self._served[peer] = self._handed
        if len(self._served) > PEERS_REMEMBERED:
            present = {p for queue in self._queues for p, f in queue if not f.done()}
            present.update(self._held)
            self._served = {p: at for p, at in self._served.items() if p in present}

    def _queue(self, rank: int) -> deque[_Entry]:
        while len(self._queues) <= rank:
            self._queues.append(deque())
        return self._queues[rank]

    async def _take(self, peer: str, rank: int) -> None:
        # While a turn is free, no waiting call may take it (each was handed one as it
        # became free, or its peer holds its share): a newcomer does not pass one.
        if self._free and self._may(peer):
            self._hold(peer)
            return
        entry = (peer, asyncio.get_running_loop().create_future())
        self._queue(rank).append(entry)
        try:
            await entry[1]
        except asyncio.CancelledError:
            if entry[1].done() and not entry[1].cancelled():
                self._give_back(peer)  # handed a turn just as its call went away
            else:
                for queue in self._queues:
                    with contextlib.suppress(ValueError):
                        queue.remove(entry)
            raise

    def put_behind(self, rank_of: Callable[[str], int]) -> None:
        """Waiting calls whose peer's rank (`rank_of`) is now above their queue's go to the
        end of their rank's."""
        self.rerank(rank_of, ahead=False)

    def rerank(self, rank_of: Callable[[str], int], *, ahead: bool = True) -> None:
        """Waiting calls whose peer's rank (`rank_of`) is now another than their queue's
        (above it; below it too unless not `ahead`) go to the end of their rank's."""
        moved: list[tuple[int, _Entry]] = []
        for rank in range(len(self._queues)):
            keep: deque[_Entry] = deque()
            for entry in self._queues[rank]:
                now = rank_of(entry[0])
                if now > rank or (ahead and now < rank):
                    moved.append((now, entry))
                else:
                    keep.append(entry)
            self._queues[rank] = keep
        for now, entry in moved:
            self._queue(now).append(entry)

    def _give_back(self, peer: str) -> None:
        held = self._held[peer] - 1
        if held:
            self._held[peer] = held
        else:
            del self._held[peer]
        self._free += 1
        self._hand_on()

    def _hand_on(self) -> None:
        """Free turns to waiting calls whose peers may hold one more, of the lowest rank
        first: within a rank, the earliest call of the peer that holds fewest turns and
        was handed one longest ago."""
        for queue in self._queues:
            while self._free and queue:
                while queue and queue[0][1].done():  # their calls went away
                    queue.popleft()
                best: int | None = None
                best_key = (0, 0)
                for at, (peer, future) in enumerate(queue):
                    if future.done() or not self._may(peer):
                        continue
                    key = (self._held.get(peer, 0), self._served.get(peer, 0))
                    if best is None or key < best_key:
                        best, best_key = at, key
                if best is None:
                    break
                peer, future = queue[best]
                del queue[best]
                self._hold(peer)
                future.set_result(True)


@functools.lru_cache(maxsize=4096)
def address_of(peer: str) -> str:
    """Where a connection comes from, as gRPC names it (`context.peer()`): its address
    without the port ("ipv4:10.0.0.7"); for IPv6 its /64, which one host or site holds
    whole ("ipv6:2001:db8::/64"), an IPv4 one mapped into IPv6 as IPv4; any other peer
    (a Unix socket's "unix:") as it is."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return peer
    host = urllib.parse.unquote(rest.rsplit(":", 1)[0]).strip("[]").split("%", 1)[0]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return peer
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return f"ipv4:{ip.ipv4_mapped}"
        return f"ipv6:{ipaddress.IPv6Network((ip, 64), strict=False)}"
    return f"ipv4:{ip}"


@dataclass(eq=False)
class _Waiter:
    """A read waiting for its turn (admitted: Gate.admit)."""

    peer: str
    address: str
    budget: asyncio.Timeout
    pushed_out: bool = False  # its place went to a read of a peer and address waiting less


@dataclass(eq=False)
class _Holder:
    """A read holding a turn, its message not come yet."""

    budget: asyncio.Timeout
    since: float
    rank: int
    start: float  # when its call began
    gave_up: bool = False  # its turn went to a waiting read
    timer: asyncio.TimerHandle | None = None


class Unread(Exception):  # noqa: N818 (an outcome, not a fault)
    """A read that ended without its message: `why` is "waited" (no turn came within
    its time), "pushed_out" (its place among those waiting went to a read of a peer and
    address waiting less: Gate.admit), "gave_up" (its turn went to a waiting read while
    its message had not come) or "late" (its message did not come within its time)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


_NONE: Any = object()  # no message read


class Gate:
    """Reads whose message should come with the call (a health request, a worker
    stream's Hello), on turns (`reads`, a Turns), bounded against callers whose message
    never comes: gRPC health's (worker.hub.health) and the worker streams' first
    messages (worker.hub.server, on worker.hub.reads) use it.

    - A read has `read_within_s` from its start (None: no bound), waiting and reading
      together, and `turn_within_s` from its turn (None: no bound).
    - `admit` bounds the reads waiting or under way: a peer's (`calls_per_connection`),
      an address's (`calls_per_address`; `calls_per_late_address` while the address is
      late, or with `late_address_counts_late` the reads of late peers only, counted
      over those alone), all (`waiting_most` waiting), and of rank 2 `waiting_late`
      waiting. Past `waiting_most`, a newcomer takes the place of a waiting read that
      ranks after it, or is of an address with more reads, or of the same address and
      a peer with more (the latest such; it ends "pushed_out"): callers that fill the
      places do not keep out one that has none (review14 finding 03).
    - A read that held a turn without its message coming within `ready_s` (it came
      later, or never) makes its peer late for `late_for_s`, and its address too while
      its peers go late faster than `late_per_address` in that time. Reads are ranked:
      0, 1 if their address is late, 2 if their peer is; a read waits behind those of
      lower ranks (worker.hub.turns). A message sent with the call is there as its turn
      comes, so only a peer that holds turns without sending goes late: one that sent
      1.7 s into each turn, under the 2 s it took not to come then, was never late, and
      such callers kept every health check out (review14 finding 03). A peer whose last
      read's message came within `ready_s` of its call's start (of the latest
      PEERS_REMEMBERED) ranks 0 though its address is late: a load balancer checking on
      the connection it keeps goes ahead of the new connections of its address, which
      callers that hold turns can open for each call. (A message read at once after a
      longer wait for the turn proves nothing: it may have come late.)
    - A read whose message has not come gives its turn up to a waiting read that could
      take it: at once if that one's rank is lower, `prompt_s` into the turn if it is
      the same.
    A peer is what holds turns and goes late: a connection (gRPC's `context.peer()`)
    for health; for worker streams of a known key, that key."""

    def __init__(
        self,
        slots: int,
        per_peer: int,
        *,
        read_within_s: float | None,
        turn_within_s: float | None = None,
        prompt_s: float,
        ready_s: float | None = None,
        waiting_most: int,
        waiting_late: int,
        calls_per_connection: int,
        calls_per_address: int | None = None,
        calls_per_late_address: int | None = None,
        late_for_s: float,
        late_per_address: int,
        late_address_counts_late: bool = False,
    ) -> None:
        self.reads = Turns(slots, per_peer)
        # The bounds, attributes so that a test may make them small.
        self.read_within_s = read_within_s
        self.turn_within_s = turn_within_s
        self.prompt_s = prompt_s
        self.ready_s = prompt_s if ready_s is None else ready_s
        self.waiting_most = waiting_most
        self.waiting_late = waiting_late
        self.calls_per_connection = calls_per_connection
        self.calls_per_address = calls_per_address
        self.calls_per_late_address = calls_per_late_address
        self.late_address_counts_late = late_address_counts_late
        self.late_for_s = late_for_s
        self.calls: dict[str, int] = {}  # peer -> reads waiting or under way
        self.address_calls: dict[str, int] = {}  # address -> the same
        # address -> those of them whose peer was late as they came (rank 2)
        self.late_address_calls: dict[str, int] = {}
        self._addresses: dict[str, str] = {}  # peer -> its address, while it reads
        # Reads waiting for their turn (a dict for its order: the latest last), and how
        # many of them were pushed out and have not left yet.
        self._waiting: dict[_Waiter, None] = {}
        self._pushed_out = 0
        self.late_connections = Rate(1, 1 / late_for_s)
        self.late_addresses = Rate(late_per_address, late_per_address / late_for_s)
        # Peers whose last read's message came within `ready_s` of its call's start (the
        # latest last).
        self.prompt_peers: OrderedDict[str, None] = OrderedDict()
        self._holders: set[_Holder] = set()

    def rank(self, peer: str, address: str, now: float) -> int:
        """2 if `peer`'s messages came late, 1 if its address's did and its own last did
        not come in time, else 0: a read waits behind those of lower ranks."""
        if self.late_connections.wait_s(peer, now) > 0:
            return 2
        if peer in self.prompt_peers:
            return 0
        return int(self.late_addresses.wait_s(address, now) > 0)

    def admit(self, peer: str, address: str, now: float) -> str | None:
        """None when a read of `peer` may wait for its turn; else which bound it is past:
        "peer", "address", "all" or "late"."""
        rank = self.rank(peer, address, now)
        if self.calls.get(peer, 0) >= self.calls_per_connection:
            return "peer"
        if self.late_address_counts_late:
            # The late-address bound counts late peers' reads only, and binds them only:
            # a peer that never went late is bounded as its address's were not late.
            late_calls = self.late_address_calls.get(address, 0)
            late_most = self.calls_per_late_address
            if rank == 2 and late_most is not None and late_calls >= late_most:
                return "address"
            per_address = self.calls_per_address
        else:
            per_address = self.calls_per_late_address if rank else self.calls_per_address
        if per_address is not None and self.address_calls.get(address, 0) >= per_address:
            return "address"
        if rank == 2 and self.reads.waiting(2) >= self.waiting_late:
            return "late"
        if self.reads.waiting() - self._pushed_out >= self.waiting_most and not self._push_out(
            peer, address, rank, now
        ):
            return "all"
        return None

    def _push_out(self, peer: str, address: str, rank: int, now: float) -> bool:
        """Whether a waiting read gave its place to a newcomer of `peer`: the latest of
        those that rank after it, or whose address has more reads than the newcomer's
        would, or whose peer at the same address has more (looked for among the latest
        PUSH_OUT_LOOKS_AT: a newcomer past the bound costs the loop little). Fair places:
        a flood from one address (or one connection) loses its latest waiting reads to a
        caller from another (or another connection), not that caller its chance."""
        mine = self.address_calls.get(address, 0), self.calls.get(peer, 0)
        victim: _Waiter | None = None
        for waiter in itertools.islice(reversed(self._waiting), PUSH_OUT_LOOKS_AT):
            if waiter.pushed_out or waiter.peer == peer:
                continue
            same = waiter.address == address
            theirs = (
                self.rank(waiter.peer, waiter.address, now),
                self.address_calls[waiter.address],
                self.calls[waiter.peer],
            )
            ours = (rank, mine[0] + (not same), mine[1] + 1)
            if theirs[0] > ours[0] or (theirs[0] == ours[0] and theirs[1:] > ours[1:]):
                victim = waiter
                break
        if victim is None:
            return False
        victim.pushed_out = True
        self._pushed_out += 1
        victim.budget.reschedule(now)  # it leaves now, unread
        return True

    async def read(
        self,
        peer: str,
        address: str,
        read: Callable[[], Awaitable[Any]],
        *,
        start: float | None = None,
        turn_within_s: float | None = _NONE,
    ) -> Any:
        """What `read()` gave, read in `peer`'s turn (admitted: see `admit`); Unread if it
        gave nothing in time. `start`: when the call began (now unless said)."""
        loop = asyncio.get_running_loop()
        start = loop.time() if start is None else start
        if turn_within_s is _NONE:
            turn_within_s = self.turn_within_s
        rank = self.rank(peer, address, start)
        late = self.late_address_counts_late and rank == 2
        self.calls[peer] = self.calls.get(peer, 0) + 1
        self.address_calls[address] = self.address_calls.get(address, 0) + 1
        if late:
            self.late_address_calls[address] = self.late_address_calls.get(address, 0) + 1
        self._addresses[peer] = address
        message = _NONE
        holder: _Holder | None = None
        waiter: _Waiter | None = None
        within = None if self.read_within_s is None else start + self.read_within_s
        try:
            async with asyncio.timeout_at(within) as budget:
                loop.call_soon(self._give_turns)  # once this read waits, if it does
                waiter = _Waiter(peer, address, budget)
                self._waiting[waiter] = None
                async with self.reads.turn(peer, rank=rank):
                    self._stop_waiting(waiter)
                    if waiter.pushed_out:  # handed a turn as it was pushed out
                        raise TimeoutError
                    now = loop.time()  # its rank now: its peer may have gone late
                    if turn_within_s is not None:
                        until = now + turn_within_s
                        budget.reschedule(until if within is None else min(within, until))
                    holder = _Holder(budget, now, self.rank(peer, address, now), start)
                    self._holders.add(holder)
                    holder.timer = loop.call_at(now + self.prompt_s, self._give_turns)
                    try:
                        message = await read()
                    finally:  # before its turn is handed on
                        self._let_go(peer, address, holder, message is _NONE)
        except TimeoutError:
            pass
        finally:
            if waiter is not None:
                self._stop_waiting(waiter)
            self._leave(peer, address, late)
        if message is _NONE:
            if holder is None:
                raise Unread("pushed_out" if waiter is not None and waiter.pushed_out else "waited")
            raise Unread("gave_up" if holder.gave_up else "late")
        return message

    def _stop_waiting(self, waiter: _Waiter) -> None:
        if waiter in self._waiting:
            del self._waiting[waiter]
            self._pushed_out -= waiter.pushed_out

    def _leave(self, peer: str, address: str, late: bool) -> None:
        if late:
            left = self.late_address_calls[address] - 1
            if left:
                self.late_address_calls[address] = left
            else:
                del self.late_address_calls[address]
        left = self.calls[peer] - 1
        if left:
            self.calls[peer] = left
        else:
            del self.calls[peer]
            del self._addresses[peer]
        left = self.address_calls[address] - 1
        if left:
            self.address_calls[address] = left
        else:
            del self.address_calls[address]

    def _let_go(self, peer: str, address: str, holder: _Holder, unread: bool) -> None:
        """A read ends its turn: one that held it without its message coming within
        `ready_s` (it came later, its time ran out, it gave the turn up, or its caller
        went) makes its peer late, and counts against its address (`late_per_address`);
        the waiting reads of those go behind the others of lower ranks."""
        self._holders.discard(holder)
        if holder.timer is not None:
            holder.timer.cancel()
        now = asyncio.get_running_loop().time()
        if not unread and now - holder.since < self.ready_s:
            if now - holder.start >= self.ready_s:
                return  # it waited: when its message came is not known
            ahead = peer not in self.prompt_peers and self.calls.get(peer, 0) > 1
            self.prompt_peers[peer] = None
            self.prompt_peers.move_to_end(peer)
            if len(self.prompt_peers) > PEERS_REMEMBERED:
                self.prompt_peers.popitem(last=False)
            if ahead:  # its other reads waiting go ahead of its address's, as it does now
                self.reads.rerank(lambda waiting: self.rank(waiting, self._where(waiting), now))
            return
        self.prompt_peers.pop(peer, None)
        waits_s = self.late_connections.wait_s(peer, now)
        if not waits_s:  # a peer late anew: its address counts it
            self.late_addresses.take(address, now)
        if waits_s < self.late_for_s:  # late twice as long at most
            self.late_connections.take(peer, now)
        self.reads.put_behind(lambda waiting: self.rank(waiting, self._where(waiting), now))

    def _where(self, peer: str) -> str:
        return self._addresses.get(peer, peer)

    def _give_turns(self) -> None:
        """Turns held by reads whose messages have not come go to waiting reads that
        could take them: at once to one of a lower rank, `prompt_s` into the turn to one
        of the same (a freed turn goes to the lowest rank waiting: Turns)."""
        now = asyncio.get_running_loop().time()
        wanting = [self.reads.wanting(rank) for rank in range(3)]
        for holder in sorted(self._holders, key=lambda h: (-h.rank, h.since)):
            lowest = next((rank for rank, count in enumerate(wanting) if count), None)
            if lowest is None:
                return
            if (
                holder.gave_up
                or lowest < holder.rank
                or (lowest == holder.rank and now - holder.since >= self.prompt_s)
            ):
                wanting[lowest] -= 1  # this holder's turn goes to that read
                if not holder.gave_up:
                    holder.gave_up = True
                    holder.budget.reschedule(now)


@dataclass(eq=False)
class LaterHolder:
    """A later read holding its turn, its message not come yet."""

    peer: str
    address: str
    since: float
    rank: int
    give_up: Callable[[], None]  # ends its stream (its read cannot be taken back)
    timer: asyncio.TimerHandle | None = None
    gave_up: bool = False  # its turn went to a waiting read
    returned: bool = False  # its turn went back


class LaterReads:
    """Turns to read worker streams' later messages (Turns, one per connection), bounded
    in time: a read that held its turn `silent_s` without its message coming while
    another read waits that could take it gives the turn up, and its stream ends
    (`give_up`: gRPC cannot take back a read asked for, and one left asked for outside
    a turn would be read whole outside the bound). Its connection then goes late for
    `late_for_s`, and its address too while its connections go late faster than
    `late_per_address` in that time: reads are ranked as Gate's (0, 1 if their address
    is late, 2 if their connection is), and a read waits behind those of lower ranks.
    A worker sends a heartbeat every few seconds, so a worker's stream holding a turn
    has its message within `silent_s`; a stream that says nothing holds a turn at most
    that long, and then waits behind the others (review15 finding 02: two streams that
    said Hello and then nothing held both turns for ever)."""

    def __init__(
        self,
        slots: int,
        per_peer: int,
        *,
        silent_s: float,
        late_for_s: float,
        late_per_address: int,
    ) -> None:
        self.turns = Turns(slots, per_peer)
        self.silent_s = silent_s  # an attribute, so that a test may make it small
        self.late_for_s = late_for_s
        self.late_connections = Rate(1, 1 / late_for_s)
        self.late_addresses = Rate(late_per_address, late_per_address / late_for_s)
        self._holders: set[LaterHolder] = set()
        self._addresses: dict[str, str] = {}  # peer -> its address, while it waits
        self.gave_up = 0  # turns given up so far (streams ended so)

    def held(self, peer: str | None = None) -> int:
        return self.turns.held(peer)

    def waiting(self, rank: int | None = None) -> int:
        return self.turns.waiting(rank)

    def rank(self, peer: str, address: str, now: float) -> int:
        """2 if `peer`'s reads held turns silent, 1 if its address's did, else 0."""
        if self.late_connections.wait_s(peer, now) > 0:
            return 2
        return int(self.late_addresses.wait_s(address, now) > 0)

    def ask(self, peer: str, address: str) -> asyncio.Future[bool] | None:
        """As Turns.ask, ranked: None when `peer` holds a turn now, else the future its
        turn comes by. A holder silent long enough gives its turn up to this one."""
        loop = asyncio.get_running_loop()
        turn = self.turns.ask(peer, self.rank(peer, address, loop.time()))
        if turn is not None:
            self._addresses[peer] = address
            turn.add_done_callback(lambda _: self._addresses.pop(peer, None))
            loop.call_soon(self._give_turns)
        return turn

    def withdraw(self, peer: str, turn: asyncio.Future[bool]) -> None:
        self.turns.withdraw(peer, turn)

    def hold(self, peer: str, address: str, give_up: Callable[[], None]) -> LaterHolder:
        """`peer` holds a turn (from `ask`) and its read is asked for: its holder, to hand
        to `give_back` once the read ended."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        holder = LaterHolder(peer, address, now, self.rank(peer, address, now), give_up)
        holder.timer = loop.call_at(now + self.silent_s, self._give_turns)
        self._holders.add(holder)
        return holder

    def give_back(self, holder: LaterHolder) -> None:
        """The holder's read ended (or it gave up): its turn goes back, once."""
        if holder.returned:
            return
        holder.returned = True
        self._holders.discard(holder)
        if holder.timer is not None:
            holder.timer.cancel()
        self.turns.give_back(holder.peer)

    def _give_turns(self) -> None:
        """Holders silent `silent_s` give their turns up to waiting reads of their rank
        or lower, the latest ranked first."""
        now = asyncio.get_running_loop().time()
        if all(now - holder.since < self.silent_s for holder in self._holders):
            # None silent long enough (the common case: asked at each read's ask): the
            # count of those wanting, a walk of every waiting read, is not needed.
            return
        wanting = [self.turns.wanting(rank) for rank in range(3)]
        for holder in sorted(self._holders, key=lambda h: (-h.rank, h.since)):
            if now - holder.since < self.silent_s:
                continue
            lowest = next((rank for rank, count in enumerate(wanting) if count), None)
            if lowest is None or lowest > holder.rank:
                continue
            wanting[lowest] -= 1
            holder.gave_up = True
            self.gave_up += 1
            waits_s = self.late_connections.wait_s(holder.peer, now)
            if not waits_s:  # a connection late anew: its address counts it
                self.late_addresses.take(holder.address, now)
            if waits_s < self.late_for_s:
                self.late_connections.take(holder.peer, now)
            self.turns.put_behind(
                lambda peer: self.rank(peer, self._addresses.get(peer, peer), now)
            )
            self.give_back(holder)
            holder.give_up()
