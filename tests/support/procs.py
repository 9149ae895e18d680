"""A program that resists being killed, and finding processes by a marker in their
command line: to prove a sandbox left none behind."""

from __future__ import annotations

import os
import textwrap
import time
import uuid

# Run as `python3 -c STUBBORN <marker>`: ignores SIGTERM and leaves a setsid'd,
# double-forked grandchild that does too, so only killing every process stops it.
# Prints "started" once running; the marker in argv lets `processes_with` find both.
STUBBORN = textwrap.dedent(
    """
    import os, signal, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(600)
        os._exit(0)
    print("started", flush=True)
    time.sleep(600)
    """
)


def marker() -> str:
    return f"aw-marker-{uuid.uuid4().hex}"


def processes_with(text: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read()
        except OSError:
            continue
        if text.encode() in cmdline and int(entry) != os.getpid():
            found.append(int(entry))
    return found


def wait_until_gone(text: str, within_s: float = 3.0) -> list[int]:
    """The pids still carrying `text` after waiting up to `within_s` (empty when all died)."""
    deadline = time.monotonic() + within_s
    left = processes_with(text)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = processes_with(text)
    return left
