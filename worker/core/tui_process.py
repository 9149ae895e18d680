"""The TUI of `agentworker up` and `run`, in a process of its own.

The worker runs headless with its console socket (console_socket.py) and starts the
TUI as its child, attached over that socket exactly as `agentworker ui` attaches:
a redraw then never holds a call in flight. The worker stays the parent: it keeps
the worker lock and the pid `agentworker kill` and `pause` signal; the child
inherits the terminal. The rules (docs/architecture.md, "The TUI's own process"):

- The child exits 0 when the person quits (q, Ctrl+C, a SIGINT or SIGTERM): the
  worker then stops, as it did when the TUI ran in its loop.
- The child ending any other way (a crash, killed): the worker restores the
  terminal, says so on it and serves on headless; calls that need the person
  follow the rules with no UI attached (refused with `scope_required`, a prompt
  already waiting refused so at its timeout), and `agentworker ui` can attach.
- The worker stopping tells the child ("stopped") and waits for it to leave the
  terminal; the worker dying closes the socket, and the child says so, with the
  log's path, and exits non-zero. Either way nothing is left behind.
- From the child's start until it ends it counts as an attached UI, so a call that
  needs the person while the TUI is still starting waits for its prompt.
- While the child owns the terminal, whatever the worker writes to its standard
  output and error (a library's warning, gRPC's C core) goes to the log file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import termios
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

log = logging.getLogger(__name__)

# What the TUI's driver writes on its way out, for when the child could not: the
# keyboard protocol popped, mouse, focus, paste and resize reports off, lines wrap
# again, the alternate screen left, the cursor shown.
_RESET: Final = (
    b"\x1b[<u\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1015l\x1b[?1006l\x1b[?1004l"
    b"\x1b[?2004l\x1b[?2048l\x1b[?7h\x1b[?1049l\x1b[?25h"
)
# How long a stopping worker waits for the child to leave after it was told.
LEAVE_GRACE_S: Final = 5.0


class TuiProcess:
    """One TUI child of this worker (see the module summary)."""

    def __init__(
        self, proc: asyncio.subprocess.Process, terminal: list[Any] | None, log_file: Path
    ) -> None:
        self.proc = proc
        self.log_file = log_file
        self._terminal = terminal  # the modes to put back should the child not
        self._saved_fds: dict[int, int] = {}

    @classmethod
    async def start(cls, argv: Sequence[str], log_file: Path) -> TuiProcess:
        terminal: list[Any] | None = None
        with contextlib.suppress(termios.error, OSError):
            terminal = termios.tcgetattr(0)
        proc = await asyncio.create_subprocess_exec(*argv)
        tui = cls(proc, terminal, log_file)
        tui._output_to_log()
        log.info("TUI started (pid %d)", proc.pid)
        return tui

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def wait(self) -> int:
        """The child's exit status (negative: the signal that ended it)."""
        return await self.proc.wait()

    def ended_by_the_person(self) -> bool:
        """The child exited 0: the person quit (or it saw the worker stop)."""
        return self.proc.returncode == 0

    async def close(self) -> None:
        """The worker is stopping (and told the child so, if it had attached): ask it
        to leave (SIGTERM, its quit), end it if it does not, take the terminal back."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.proc.returncode is not None:
                break
            if sig == signal.SIGKILL:
                log.warning("the TUI did not leave when told; ending it")
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LEAVE_GRACE_S):
                    await self.proc.wait()
        self.take_back_terminal()

    def take_back_terminal(self) -> None:
        """The child is gone: this process writes to the terminal again, and the
        terminal's modes are put back if the child could not do it itself."""
        for fd, saved in self._saved_fds.items():
            with contextlib.suppress(OSError, ValueError):
                (sys.stdout if fd == 1 else sys.stderr).flush()
            os.dup2(saved, fd)
            os.close(saved)
        self._saved_fds = {}
        code = self.proc.returncode
        if code is None or code == 0 or self._terminal is None:
            return
        with contextlib.suppress(termios.error, OSError):
            termios.tcsetattr(0, termios.TCSADRAIN, self._terminal)
            if code < 0:  # killed by a signal: it left the screen as it was
                os.write(1 if os.isatty(1) else 0, _RESET)
        self._terminal = None

    def _output_to_log(self) -> None:
        """Standard output and error that are the terminal go to the log file while
        the child draws there."""
        terminals = [fd for fd in (1, 2) if _isatty(fd)]
        if not terminals:
            return
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        target = os.open(self.log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            for fd in terminals:
                self._saved_fds[fd] = os.dup(fd)
                os.dup2(target, fd)
        finally:
            os.close(target)


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit status {code}"
