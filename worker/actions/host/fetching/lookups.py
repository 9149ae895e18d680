"""Host name lookups for http_fetch, each in a thread of its own.

getaddrinfo cannot be interrupted: when the DNS server never answers, the thread stays
in it until the resolver gives up (10 s and more), whatever became of the call. On the
worker's shared pool (asyncio's `loop.getaddrinfo`), eight fetches at a time of names
under the agent's own silent DNS server held its threads, and another plan's fs_list
waited 9.8 s (review25 r6). Here a lookup runs in a daemon thread of its own, so it
holds nothing any other call needs. A lookup whose call stopped waiting (a timeout, a
cancel) and that is still in the resolver is counted `stuck`; past STUCK_MOST of them,
a fetch that needs a lookup is refused `busy` at once (a host opened by its IP address
needs none) until some end, so a silent DNS server costs at most that many threads.
Each agent (the lookup's `LOOKUP_FOR`, set by the fetch) may hold STUCK_PER_AGENT of
them: an agent that kept eight stuck under its own silent DNS server made every other
agent's fetches answer `busy` (review25 G5b); now only its own do, until the
worker-wide STUCK_MOST. By agent, not plan: one agent spreading its fetches over a
dozen plan ids reached the worker-wide bound again (review25 G5c).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import socket
import threading
from collections.abc import Callable
from typing import Any, Final

from worker.errors import WorkerError

# Lookups still in the resolver after their calls stopped waiting, at most: of one
# agent, and of every agent together.
STUCK_PER_AGENT: Final = 4
STUCK_MOST: Final = 32
# Whose lookup it is: the fetch's agent (set for the call's task by the fetch).
LOOKUP_FOR: contextvars.ContextVar[str] = contextvars.ContextVar("lookup_for", default="")

AddressInfo = list[tuple[Any, ...]]
Lookup = Callable[[str, int], AddressInfo]


def _getaddrinfo(host: str, port: int) -> AddressInfo:
    return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)


class _Asked:
    __slots__ = ("abandoned", "ended", "key")

    def __init__(self, key: str) -> None:
        self.key = key  # whose lookup (LOOKUP_FOR)
        self.ended = False  # the resolver answered (or failed)
        self.abandoned = False  # the call stopped waiting while it was in the resolver


class Lookups:
    """Lookups in threads of their own; `busy` past `stuck_most` stuck ones. The count
    is kept under a lock: the threads report their end from outside the loop."""

    def __init__(
        self,
        lookup: Lookup = _getaddrinfo,
        stuck_most: int = STUCK_MOST,
        stuck_per_agent: int = STUCK_PER_AGENT,
    ) -> None:
        self._lookup = lookup
        self._stuck_most = stuck_most
        self._stuck_per_agent = stuck_per_agent
        self._lock = threading.Lock()
        self._stuck = 0
        self._stuck_of: dict[str, int] = {}  # by LOOKUP_FOR, those with any

    @property
    def stuck(self) -> int:
        with self._lock:
            return self._stuck

    async def resolve(self, host: str, port: int) -> AddressInfo:
        key = LOOKUP_FOR.get()
        with self._lock:
            stuck, own = self._stuck, self._stuck_of.get(key, 0)
        if own >= self._stuck_per_agent or stuck >= self._stuck_most:
            whose = (
                f"{own} of this agent's lookups are"
                if own >= self._stuck_per_agent
                else f"{stuck} lookups are"
            )
            raise WorkerError(
                "busy",
                f"the DNS server does not answer: {whose} still waiting for it after their "
                "calls stopped, so fetches that need one are refused until it answers. Try "
                "again later (a host opened in allow_hosts by its IP address needs no lookup)",
                {"stuck_lookups": stuck, "stuck_lookups_of_agent": own},
            )
        loop = asyncio.get_running_loop()
        done: asyncio.Future[AddressInfo] = loop.create_future()
        asked = _Asked(key)

        def work() -> None:
            result: AddressInfo = []
            error: BaseException | None = None
            try:
                result = self._lookup(host, port)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                error = exc
            with self._lock:
                asked.ended = True
                if asked.abandoned:  # nobody waits for it any more
                    self._stuck -= 1
                    left = self._stuck_of[asked.key] - 1
                    if left:
                        self._stuck_of[asked.key] = left
                    else:
                        del self._stuck_of[asked.key]
                    return
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits either
                loop.call_soon_threadsafe(_deliver, done, result, error)

        threading.Thread(target=work, name="agentworker-lookup", daemon=True).start()
        try:
            return await done
        except asyncio.CancelledError:
            with self._lock:
                if not asked.ended:
                    asked.abandoned = True
                    self._stuck += 1
                    self._stuck_of[key] = self._stuck_of.get(key, 0) + 1
            raise


def _deliver(
    done: asyncio.Future[AddressInfo], result: AddressInfo, error: BaseException | None
) -> None:
    if done.done():
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(result)


# The worker's lookups (one process, one count).
lookups: Final = Lookups()
