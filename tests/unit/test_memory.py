"""worker.memory: with large buffers kept, a copy of a blob reuses freed pages instead
of faulting in fresh ones (what made a 16 MiB call through hub and worker twice as
slow). Each case runs in a process of its own, so the malloc settings stay there."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from worker.memory import LARGE_CALL_BYTES, IdleGiveBack

REPOSITORY = Path(__file__).resolve().parents[2]
BLOB = 16 * 1024 * 1024
PAGES = BLOB // 4096

# A blob and a copy of it alive together, then both freed, as a call through the hub
# does; prints the page faults one round costs.
ROUNDS = f"""
import resource, sys
sys.path.insert(0, {str(REPOSITORY)!r})
from worker import memory
if sys.argv[1] == "keep":
    assert memory.keep_large_buffers(), "glibc refused the settings"
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
before = faults()
for _ in range(20):
    blob = b"x" * {BLOB}
    copy = blob + b"y"
    del blob, copy
print((faults() - before) // 20)
"""


def faults_per_round(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", ROUNDS, mode], capture_output=True, text=True, check=True
    )
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings")
def test_kept_buffers_reuse_their_pages_where_the_default_faults_them_in_afresh() -> None:
    # The default maps each buffer anew: both are faulted in, page by page, each round.
    assert faults_per_round("default") > PAGES
    # Kept: the pages are the heap's already; a round costs a small fraction of one blob.
    assert faults_per_round("keep") < PAGES // 8


# Large buffers freed while kept, then given back: prints resident MiB before and after.
GIVE_BACK = f"""
import os, sys
sys.path.insert(0, {str(REPOSITORY)!r})
from worker import memory
assert memory.keep_large_buffers()
def resident_mib():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 2**20
blobs = [b"x" * {BLOB} for _ in range(4)]
del blobs
kept = resident_mib()
memory.give_back()
print(kept, resident_mib())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings")
def test_the_memory_large_calls_freed_is_given_back() -> None:
    out = subprocess.run([sys.executable, "-c", GIVE_BACK], capture_output=True, text=True)
    kept, given_back = map(int, out.stdout.split())
    assert kept - given_back >= 3 * BLOB // 2**20  # most of the 64 MiB freed went back


def test_large_calls_ending_share_one_timer_and_the_give_back_waits_for_the_last() -> None:
    """Each large call used to cancel the timer and make a new one (hub and worker, every
    call): now a call that ends while it is armed only notes its end, and the timer,
    firing before the idle time since that end is over, waits out the rest."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        idle = IdleGiveBack(idle_s=3600)
        idle.ended(LARGE_CALL_BYTES - 1)  # a small call: nothing to give back
        assert idle._timer is None
        idle.ended(LARGE_CALL_BYTES)
        armed = idle._timer
        assert armed is not None
        idle.ended(LARGE_CALL_BYTES)
        assert idle._timer is armed  # no second timer
        idle._last_end += 60  # as if the last call ended a minute after the first
        armed.cancel()
        idle._due(loop)  # the first one's hour is up, the last one's is not
        assert idle.given_back == 0
        assert idle._timer is not None and idle._timer.when() == idle._last_end + 3600
        idle.close()

        quick = IdleGiveBack(idle_s=0)
        quick.ended(LARGE_CALL_BYTES)
        while quick._timer is not None:  # due at once: fires within a turn or two
            await asyncio.sleep(0)
        assert quick.given_back == 1

    asyncio.run(scenario())
