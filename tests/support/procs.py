"""A program that resists being killed, and finding processes by a marker in their
command line: to prove a sandbox left none behind."""

from __future__ import annotations

import os
import sys
import textwrap
import time
import uuid
from collections.abc import Sequence

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


# Run as `python3 -c DEFAULT_SIGINT ARGV...`: SIGINT back to its default, then ARGV
# in its place (exec keeps a default disposition). A job a non-interactive shell starts
# in the background (a CI script, `make check &`) ignores SIGINT, and so does every
# process it starts: the program would never see the Ctrl-C a test sends.
DEFAULT_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execvp(sys.argv[1], sys.argv[1:])"
)


def as_a_terminal_starts(argv: Sequence[str]) -> list[str]:
    """`argv` started with SIGINT at its default, as a shell on a terminal starts it."""
    return [sys.executable, "-c", DEFAULT_SIGINT, *argv]


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
