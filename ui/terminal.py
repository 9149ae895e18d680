"""Textual's Linux driver, made to survive the terminal going away.

When a terminal hangs up (the window closed, ssh dropped), the kernel sends SIGHUP
and then SIGCONT. Textual's driver treats SIGCONT as "back from Ctrl+Z" and starts
application mode again: a second writer thread, whose first write to the dead
terminal raises and ends it. Its queue then fills, and the next write, or the
shutdown's, blocks the event loop for good (a wedged `agentworker up`, seen in CI).
This driver resumes only onto a live terminal and drops output a dead one cannot
take, so the worker stops as it should (worker/app.py, `hangup`).

It can also drop what waits in the terminal's input unread (`discard_typed_ahead`):
keys typed before the TUI attached to its worker, which would otherwise be read as
typed into it (review26).
"""

from __future__ import annotations

import contextlib
import os
import termios
from typing import IO, Any

from textual.drivers.linux_driver import LinuxDriver


class _DroppingWhenGone:
    """A file that swallows the error of writing to a hung-up terminal, and every
    write after it: nobody can read them, and the writer thread must live on."""

    def __init__(self, file: IO[str]) -> None:
        self._file = file
        self.gone = False

    def write(self, text: str) -> None:
        if not self.gone:
            try:
                self._file.write(text)
            except OSError:
                self.gone = True

    def flush(self) -> None:
        if not self.gone:
            try:
                self._file.flush()
            except OSError:
                self.gone = True

    def fileno(self) -> int:
        return self._file.fileno()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


class HangupSafeDriver(LinuxDriver):
    """LinuxDriver that outlives its terminal (see the module summary)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        assert self._file is not None
        self._file = _DroppingWhenGone(self._file)  # type: ignore[assignment]

    def resume_application_mode(self) -> None:
        if os.isatty(self.fileno):  # a hung-up terminal fails the ioctl behind isatty
            super().resume_application_mode()

    def discard_typed_ahead(self) -> None:
        """Drop the keys waiting in the terminal's input, unread (tcflush)."""
        with contextlib.suppress(OSError, termios.error):  # a hung-up terminal: nothing to drop
            if os.isatty(self.fileno):
                termios.tcflush(self.fileno, termios.TCIFLUSH)
