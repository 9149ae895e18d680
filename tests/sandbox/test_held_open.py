"""What a sandbox's processes hold in files they removed but keep open: found by pid,
across a process tree, counted once per file, on the workspace's file system only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sandbox.held_open import _descendants_by_parent, descendants, held_open_bytes

# Two levels down from the process it is started as (so the tree is walked, not one
# pid), it holds: two descriptors of one removed 1 MiB file, a removed file in
# /dev/shm (another file system: memory), and a file that still has its name. Then it
# says so and waits to be killed.
HOLDER = r"""
import os, subprocess, sys, time
if int(sys.argv[2]) > 0:
    below = [sys.executable, "-c", sys.argv[3], sys.argv[1], str(int(sys.argv[2]) - 1), sys.argv[3]]
    subprocess.Popen(below).wait()
    sys.exit()
folder = sys.argv[1]
removed = os.open(os.path.join(folder, "removed"), os.O_CREAT | os.O_RDWR, 0o600)
os.write(removed, b"x" * (1 << 20))
os.unlink(os.path.join(folder, "removed"))
again = os.dup(removed)
shm = os.open("/dev/shm/held-open-test-%d" % os.getpid(), os.O_CREAT | os.O_RDWR, 0o600)
os.write(shm, b"y" * (1 << 20))
os.unlink("/dev/shm/held-open-test-%d" % os.getpid())
named = os.open(os.path.join(folder, "named"), os.O_CREAT | os.O_RDWR, 0o600)
os.write(named, b"z" * (1 << 20))
print("holding", flush=True)
time.sleep(600)
"""


def test_removed_files_held_by_a_process_tree_are_counted_once_on_its_device(
    tmp_path: Path,
) -> None:
    argv = [sys.executable, "-c", HOLDER, str(tmp_path), "2", HOLDER]
    with subprocess.Popen(argv, stdout=subprocess.PIPE) as top:
        try:
            assert top.stdout is not None and top.stdout.readline() == b"holding\n"
            assert len(descendants(top.pid)) == 2
            assert sorted(descendants(top.pid)) == sorted(_descendants_by_parent(top.pid))
            held = held_open_bytes(top.pid, os.stat(tmp_path).st_dev)
            assert (1 << 20) <= held < (2 << 20), held
            # Bounded: past its descriptors 0-2, the first look at the holder stops.
            assert held_open_bytes(top.pid, os.stat(tmp_path).st_dev, most=3) == 0
        finally:
            for pid in descendants(top.pid):
                os.kill(pid, 9)
            top.wait()
