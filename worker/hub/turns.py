"""Turns to read ControlService requests: a few at once, and a few of them per connection.

gRPC reads a request whole, up to the server's 32 MiB limit, so the hub reads each
request when its turn comes (worker.hub.server `_read_in_turn`): the reads under way
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
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable

_Entry = tuple[str, "asyncio.Future[None]"]  # a waiting call: its peer, its turn to come

# Peers whose last turn is remembered; past it, those neither holding nor waiting are
# forgotten (a forgotten peer counts as served longest ago).
PEERS_REMEMBERED = 1024


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
        for rank in range(len(self._queues)):
            keep: deque[_Entry] = deque()
            for entry in self._queues[rank]:
                now = rank_of(entry[0])
                (self._queue(now) if now > rank else keep).append(entry)
            self._queues[rank] = keep

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
                future.set_result(None)
