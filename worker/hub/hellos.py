"""What a worker stream may cost the hub as it opens: the size of its Hello, how often
Hellos may come (per worker id, for new ids, for all), and how streams refused before
their Hello are logged.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
from dataclasses import dataclass
from typing import Final, NamedTuple

import grpc

from worker.hub.audit_log import shown
from worker.hub.rates import Rate
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.transport import WORKER_KEY_HEADER, is_per_server

log = logging.getLogger(__name__)


# What one worker stream may make the hub hold (anyone with the workers' token can open
# one, under a worker id of its choosing). A Hello of at most HELLO_BYTES: its ids and
# plans are used as the stream opens and then let go; the rest (what ListWorkers shows,
# kept for the session and in hub.db) is at most HELLO_DESCRIBED_BYTES. A stream that
# sends more than UNSOLICITED_PER_STREAM messages the hub did not ask for (results for
# calls it never sent this worker or has answered already, decisions on no scope
# request, acks of calls sent elsewhere, a second Hello), more than its Hello's re-sent
# ids, is closed RESOURCE_EXHAUSTED; each of them is acked or dropped at once, never
# held. A hostile stream sending sixteen 30 MiB results for unknown calls took the hub
# from 64 to 463 MiB, and 400,000 small ones an envelope held its loop 5 s each.
HELLO_BYTES: Final = 8 * 1024 * 1024
# Plans a Hello may place (sandbox mode), the ones used last: a worker holds max_plans
# (64 by default); 120,000 claimed in one Hello held the hub's loop over 30 s and grew
# hub.db by 78 MB.
HELLO_PLANS: Final = 4096
HELLO_DESCRIBED_BYTES: Final = 64 * 1024
UNSOLICITED_PER_STREAM: Final = 1024
# Re-sent ids a Hello may name (running_ids and unacked_ids), kept until their results came.
HELLO_RESENT_IDS: Final = 65_536


# How often worker streams may say Hello: each costs the hub its parsing, a write to
# hub.db and log lines, and anyone with hub-workers.token dialling in a tight loop paid
# them without a bound. As token buckets (worker.hub.rates.Rate, `Hellos`), checked once
# a Hello is read and its key is the id's (so a Hello naming another worker's id costs
# that worker nothing), before anything is written: a burst, then so many a second.
# - One worker id: 30, then 1 a second. The worker's own backoff never meets it (full
#   jitter; a session that fails at once does not start it over): at worst 13.4 of the
#   burst in 100,000 simulated runs of sessions failing at once (median 4.8). A Hello
#   under an id accepted with another key is counted under (id, its key), and among
#   the new ids (it writes a row): it costs that worker nothing (review28 r1).
# - Ids new to this hub (a new row in hub.db), of all: 4,096 at once, then 32 a second:
#   a fleet deployed at once is taken whole, a flood of made-up ids is not.
# - Every Hello, of all: 8,192 at once, then 256 a second: a fleet reconnecting
#   together after a restart of the hub or of the network is taken whole.
# Nothing is counted per connection or per address: a fleet behind one NAT address,
# or many workers in one process on one connection (benchmarks/bench_hub_scale.py:
# 1,000 of them, 100 streams a connection), says Hello from one. A worker in the hub's
# process (`up`) is not counted. A Hello past a bound is refused RESOURCE_EXHAUSTED,
# "busy: ...", with how long to wait in its trailing metadata (RETRY_AFTER_KEY, at
# least HELLO_RETRY_MIN_S for the bounds of all), which the worker waits at least;
# refusals are logged one line a minute.
HELLO_BURST_PER_WORKER: Final = 30
HELLOS_PER_S_PER_WORKER: Final = 1.0
NEW_WORKER_BURST: Final = 4096
NEW_WORKERS_PER_S: Final = 32.0
HELLO_BURST: Final = 8192
HELLOS_PER_S: Final = 256.0
HELLO_RETRY_MIN_S: Final = 1.0
RETRY_AFTER_MAX_S: Final = 60.0
REFUSALS_LOGGED_EVERY_S: Final = 60.0
# Streams refused before their Hello (it does not decode, say) are logged one line
# each, this many at once, then one a minute (`PacedLines`).
REFUSED_LINES_BURST: Final = 10


def hello_description(hello: pb.Hello) -> pb.Hello:
    """The Hello without the ids and plans a worker names as it connects (used then and
    let go): what the hub keeps for the session and in hub.db."""
    described = pb.Hello()
    described.CopyFrom(hello)
    for name in ("running_ids", "unacked_ids", "plans"):
        described.ClearField(name)
    return described


def hello_refusal(hello: pb.Hello) -> str | None:
    """Why the hub refuses a Hello for its size (RESOURCE_EXHAUSTED), or None."""
    size = hello.ByteSize()
    if size > HELLO_BYTES:
        return (
            f"the Hello is {size:,} bytes, over the {HELLO_BYTES:,} a hub takes: it names "
            f"{len(hello.running_ids) + len(hello.unacked_ids):,} call ids and "
            f"{len(hello.plans):,} plans; a worker with more than that to tell cannot "
            "connect to this hub"
        )
    described = hello_description(hello).ByteSize()
    if described > HELLO_DESCRIBED_BYTES:
        return (
            f"the Hello's description of the worker (its version, surfaces and actions) is "
            f"{described:,} bytes, over the {HELLO_DESCRIBED_BYTES:,} a hub keeps"
        )
    return None


class PacedLines:
    """Warnings of one kind, as one line each up to `burst` at once and then one a
    minute (a client looping on a refusal would write the log full), each saying how
    many were left out since the last one."""

    def __init__(self, burst: int = REFUSED_LINES_BURST) -> None:
        self.rate = Rate(burst, 1 / 60, keys=1)
        self.left_out = 0

    def log(self, message: str, *args: object) -> None:
        now = asyncio.get_running_loop().time()
        if self.rate.wait_s("", now):
            self.left_out += 1
            return
        self.rate.take("", now)
        if self.left_out:
            message += " (and %d more like it not logged since the last)"
            args = (*args, self.left_out)
            self.left_out = 0
        log.warning(message, *args)


class BusyStream(Exception):  # noqa: N818 (a refusal, not a fault)
    """A stream refused before its Hello was read, past a bound of the hello reads."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Busy:
    """A Hello refused past a bound: what to tell the worker, and how long to wait."""

    message: str
    retry_ms: int


class Hellos:
    """How often worker streams may say Hello: a bucket per worker id, one for the ids
    new to this hub and one for all (see HELLO_BURST_PER_WORKER and below)."""

    def __init__(self) -> None:
        self.per_worker = Rate(HELLO_BURST_PER_WORKER, HELLOS_PER_S_PER_WORKER)
        self.new = Rate(NEW_WORKER_BURST, NEW_WORKERS_PER_S, keys=1)
        self.all = Rate(HELLO_BURST, HELLOS_PER_S, keys=1)
        self.refused = 0  # Hellos refused, in all
        self._unlogged = 0  # ... since the last line about them
        self._logged_at: float | None = None

    def admit(self, worker_id: str, *, new: bool, other_key: str = "") -> Busy | None:
        """Count a Hello of `worker_id` (`new`: an id this hub does not know), or say
        why it is refused (then nothing is counted). `other_key`: the digest of a key
        that is not the one accepted for the id, whose Hellos are counted apart from
        the worker's (review28 r1: a rogue's kept the worker itself refused busy)."""
        now = asyncio.get_running_loop().time()
        whose = f"worker {shown(worker_id)!r}"
        if other_key:
            worker_id, whose = f"{worker_id}\n{other_key}", f"{whose} with this key"
        checks = [(self.per_worker, worker_id, whose, 0.0)]
        if new:
            checks.append((self.new, "", "workers new to this hub", HELLO_RETRY_MIN_S))
        checks.append((self.all, "", "all workers together", HELLO_RETRY_MIN_S))
        for rate, key, whose, at_least_s in checks:
            wait_s = rate.wait_s(key, now)
            if wait_s:
                return self._refuse(now, whose, rate, max(wait_s, at_least_s))
        for rate, key, _, _ in checks:
            rate.take(key, now)
        return None

    def _refuse(self, now: float, whose: str, rate: Rate, wait_s: float) -> Busy:
        self.refused += 1
        self._unlogged += 1
        if self._logged_at is None or now - self._logged_at >= REFUSALS_LOGGED_EVERY_S:
            log.warning(
                "hub: refused %d worker Hello(s) busy since the last line like this (the "
                "last: %s, past %g at once, then %g a second)",
                self._unlogged,
                whose,
                rate.burst,
                rate.per_s,
            )
            self._unlogged = 0
            self._logged_at = now
        retry_ms = max(1, math.ceil(min(wait_s, RETRY_AFTER_MAX_S) * 1000))
        return Busy(
            f"busy: {whose} said Hello more often than this hub takes ({rate.burst:g} at "
            f"once, then {rate.per_s:g} a second); retry in {retry_ms / 1000:.1f} s",
            retry_ms,
        )


class StreamKey(NamedTuple):
    """The worker key a stream came with: its sha256 ('' without one), and whether it is
    a key made for this server (transport.key_for_server) or an older worker's
    worker.key itself."""

    digest: str
    per_server: bool


def stream_key(context: grpc.aio.ServicerContext) -> StreamKey:
    for key, value in context.invocation_metadata() or ():
        if key == WORKER_KEY_HEADER:
            raw = value.encode() if isinstance(value, str) else bytes(value)
            if not raw:
                break
            return StreamKey(hashlib.sha256(raw).hexdigest(), is_per_server(raw.decode("latin-1")))
    return StreamKey("", per_server=False)
