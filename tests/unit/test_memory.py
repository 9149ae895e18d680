"""worker.memory: with large buffers kept, a copy of a blob reuses freed pages instead
of faulting in fresh ones (what made a 16 MiB call through hub and worker twice as
slow). Each case runs in a process of its own, so the malloc settings stay there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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
