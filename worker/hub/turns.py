"""Turns to read ControlService requests: a few at once, and a few of them per connection.

gRPC reads a request whole, up to the server's 32 MiB limit, so the hub reads each
request when its turn comes (worker.hub.server `_read_in_turn`): the reads under way
bound what requests hold. A turn is held until the request has arrived, so a caller
that sends its request slowly (a byte at a time) or not at all holds one meanwhile. One
connection holds at most `per_peer` of a kind's turns: the rest go to other
connections' calls first, whatever came earlier, so a caller on one connection cannot
take every turn of a kind (the person's `agentworker kill`, on a connection of its own,
then waits behind no one's slow read).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator


class Turns:
    """At most `slots` holders at once, at most `per_peer` of them for one peer (a
    connection: gRPC's `context.peer()`); waiting calls take turns in the order they
    came, passing those whose peer holds its share."""

    def __init__(self, slots: int, per_peer: int | None = None) -> None:
        self.slots = slots
        self.per_peer = min(slots, per_peer or slots)
        self._free = slots
        self._held: dict[str, int] = {}  # peer -> turns it holds (none: absent)
        self._waiting: deque[tuple[str, asyncio.Future[None]]] = deque()

    def held(self, peer: str | None = None) -> int:
        """Turns held now: by `peer`, or by all."""
        return self.slots - self._free if peer is None else self._held.get(peer, 0)

    def waiting(self) -> int:
        return sum(not future.done() for _, future in self._waiting)

    @contextlib.asynccontextmanager
    async def turn(self, peer: str) -> AsyncIterator[None]:
        await self._take(peer)
        try:
            yield
        finally:
            self._give_back(peer)

    def _may(self, peer: str) -> bool:
        return self._held.get(peer, 0) < self.per_peer

    def _hold(self, peer: str) -> None:
        self._free -= 1
        self._held[peer] = self._held.get(peer, 0) + 1

    async def _take(self, peer: str) -> None:
        # While a turn is free, no waiting call may take it (each was handed one as it
        # became free, or its peer holds its share): a newcomer does not pass one.
        if self._free and self._may(peer):
            self._hold(peer)
            return
        entry = (peer, asyncio.get_running_loop().create_future())
        self._waiting.append(entry)
        try:
            await entry[1]
        except asyncio.CancelledError:
            if entry[1].done() and not entry[1].cancelled():
                self._give_back(peer)  # handed a turn just as its call went away
            else:
                with contextlib.suppress(ValueError):
                    self._waiting.remove(entry)
            raise

    def _give_back(self, peer: str) -> None:
        held = self._held[peer] - 1
        if held:
            self._held[peer] = held
        else:
            del self._held[peer]
        self._free += 1
        self._hand_on()

    def _hand_on(self) -> None:
        """Free turns to the earliest waiting calls whose peers may hold one more."""
        passed: list[tuple[str, asyncio.Future[None]]] = []
        while self._free and self._waiting:
            peer, future = self._waiting.popleft()
            if future.done():  # its call went away
                continue
            if self._may(peer):
                self._hold(peer)
                future.set_result(None)
            else:
                passed.append((peer, future))
        self._waiting.extendleft(reversed(passed))
