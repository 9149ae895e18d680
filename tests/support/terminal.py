"""A program on a real pseudo-terminal, as a person's terminal runs it: what it
draws is read as it comes (a thread drains it, so the program never blocks on a
full terminal), and a test waits for text to appear or for the terminal to close."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Sequence
from pathlib import Path

AGENTWORKER = str(Path(sys.executable).parent / "agentworker")  # the installed command


class Terminal:
    """`argv` started on a new pty (its own session); `screen` is all it wrote."""

    def __init__(
        self, argv: Sequence[str], env: dict[str, str], *, columns: int = 120, rows: int = 36
    ) -> None:
        controller, terminal = pty.openpty()
        fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        self.controller = controller
        env = {**env, "TERM": "xterm-256color"}
        for name in ("TMUX", "TEXTUAL", "TEXTUAL_DRIVER", "NO_COLOR"):
            env.pop(name, None)
        self.proc = subprocess.Popen(
            list(argv),
            stdin=terminal,
            stdout=terminal,
            stderr=terminal,
            env=env,
            start_new_session=True,
        )
        os.close(terminal)  # the program's copies hold it open: EOF once they are gone
        self._seen = bytearray()
        self._changed = threading.Condition()
        self.closed = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.controller, 65536)
            except OSError:  # EIO: every process holding the terminal has closed it
                chunk = b""
            with self._changed:
                if not chunk:
                    self.closed = True
                else:
                    self._seen += chunk
                self._changed.notify_all()
            if not chunk:
                return

    @property
    def screen(self) -> str:
        with self._changed:
            return self._seen.decode(errors="replace")

    def mark(self) -> int:
        """Where the output is now: `expect(..., after=mark)` looks only past it."""
        with self._changed:
            return len(self._seen)

    def expect(self, text: str, *, after: int = 0, within_s: float = 60.0) -> None:
        """Wait until the program has written `text` (past `after`)."""
        wanted = text.encode()
        with self._changed:
            ok = self._changed.wait_for(
                lambda: wanted in self._seen[after:] or self.closed, within_s
            )
            if wanted not in self._seen[after:]:
                why = "the terminal closed" if ok else f"not within {within_s} s"
                raise AssertionError(f"{text!r} never showed ({why}):\n{self.tail()}")

    def until_closed(self, within_s: float = 60.0) -> None:
        """Wait until every process holding the terminal has let go of it."""
        with self._changed:
            if not self._changed.wait_for(lambda: self.closed, within_s):
                raise AssertionError(f"the terminal is still held open:\n{self.tail()}")

    def type(self, keys: str) -> None:
        os.write(self.controller, keys.encode())

    def tail(self, chars: int = 3000) -> str:
        return self.screen[-chars:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self._reader.join(30)
        with contextlib.suppress(OSError):
            os.close(self.controller)


def wait_gone(pid: int, within_s: float = 60.0) -> None:
    """Wait until process `pid` (a child or not) has ended: its pidfd turns readable."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        ready, _, _ = select.select([fd], [], [], within_s)
        assert ready, f"process {pid} still runs after {within_s} s"
    finally:
        os.close(fd)
