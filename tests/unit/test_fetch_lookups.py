"""http_fetch's host lookups run in threads of their own (review25 r6): a DNS server
that never answers holds none of the threads other calls need, and past STUCK_MOST
lookups abandoned in the resolver, fetches that need one are refused `busy`. The
resolver here is a stand-in for the far side (a DNS server that answers when told)."""

from __future__ import annotations

import asyncio
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from worker.actions.host.fetching.lookups import LOOKUP_FOR, AddressInfo, Lookups
from worker.errors import WorkerError

ANSWER: AddressInfo = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", 443))]


class SilentDns:
    """A resolver that answers only once `answer` is set; counts who is inside it."""

    def __init__(self) -> None:
        self.answer = threading.Event()
        self.inside = threading.Semaphore(0)

    def __call__(self, host: str, port: int) -> AddressInfo:
        self.inside.release()
        self.answer.wait()
        return ANSWER

    def entered(self, count: int) -> None:
        for _ in range(count):
            assert self.inside.acquire(timeout=10)


async def _abandon(lookups: Lookups, dns: SilentDns, count: int, agent: str = "") -> None:
    """`count` lookups of `agent` that stop waiting (as a call's timeout stops them)
    while inside."""
    LOOKUP_FOR.set(agent)  # copied into each task made below
    tasks = [asyncio.create_task(lookups.resolve(f"h{i}.slow.test", 443)) for i in range(count)]
    await asyncio.to_thread(dns.entered, count)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def test_a_silent_dns_server_holds_no_thread_of_the_loops_pool() -> None:
    dns = SilentDns()
    lookups = Lookups(dns, stuck_most=4)

    async def main() -> str:
        # The worker's pool, as small as can be: a lookup taking its one thread would
        # keep the file job below waiting until the resolver answers.
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
        hanging = asyncio.create_task(lookups.resolve("a.slow.test", 443))
        await asyncio.to_thread(dns.entered, 1)
        done = await asyncio.to_thread(lambda: "the file job ran")
        dns.answer.set()
        assert await hanging == ANSWER
        return done

    assert asyncio.run(main()) == "the file job ran"


def test_past_the_most_stuck_lookups_a_fetch_is_busy_until_they_end() -> None:
    dns = SilentDns()
    lookups = Lookups(dns, stuck_most=3)

    async def main() -> None:
        await _abandon(lookups, dns, 3)
        assert lookups.stuck == 3
        with pytest.raises(WorkerError) as refused:
            await lookups.resolve("b.slow.test", 443)
        assert (
            refused.value.code == "busy" and "DNS server does not answer" in refused.value.message
        )
        dns.answer.set()  # the resolver gives up on them at last: their threads end
        while lookups.stuck:
            await asyncio.sleep(0.01)
        assert await lookups.resolve("c.test", 443) == ANSWER

    asyncio.run(main())


def test_a_lookup_that_fails_raises_its_error_to_the_caller() -> None:
    def broken(host: str, port: int) -> AddressInfo:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with pytest.raises(socket.gaierror):
        asyncio.run(Lookups(broken).resolve("nowhere.test", 443))


def test_one_agents_stuck_lookups_make_that_agent_busy_not_the_others() -> None:
    """review25 G5b: one agent keeping eight lookups stuck under its own silent DNS
    server made every other agent's fetches answer busy (G5c: counted by plan, one
    agent over a dozen plans did still)."""
    dns = SilentDns()
    lookups = Lookups(dns, stuck_most=10, stuck_per_agent=3)

    async def main() -> None:
        await _abandon(lookups, dns, 3, agent="greedy")
        with pytest.raises(WorkerError) as refused:
            await lookups.resolve("more.slow.test", 443)  # still the greedy agent's context
        assert "3 of this agent's lookups" in refused.value.message
        LOOKUP_FOR.set("other")
        answering = asyncio.create_task(lookups.resolve("fine.test", 443))
        await asyncio.to_thread(dns.entered, 1)  # let in: the other agent is not refused
        dns.answer.set()
        assert await answering == ANSWER

    asyncio.run(main())
