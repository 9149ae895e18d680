"""A desktop notification when a prompt starts waiting, where a desktop session exists.

The platform's own tool is used (`notify-send` on Linux, `osascript` on macOS),
started without a shell and not waited for. The text is fixed: nothing an agent
sent goes into it. With no desktop session (headless, over ssh) there is none;
the terminal bell still rings.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable

Notifier = Callable[[str, str], None]


def _none(_title: str, _body: str) -> None:
    return None


def desktop_notifier() -> Notifier:
    """The notifier this session supports, or one that does nothing."""
    if sys.platform == "darwin" and shutil.which("osascript"):
        program = shutil.which("osascript") or "osascript"

        def mac(title: str, body: str) -> None:
            script = f"display notification {_quoted(body)} with title {_quoted(title)}"
            _spawn([program, "-e", script])

        return mac
    has_session = os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    tool = shutil.which("notify-send")
    if sys.platform.startswith("linux") and has_session and tool:

        def linux(title: str, body: str) -> None:
            _spawn([tool, "--app-name=agentworker", "--urgency=critical", title, body])

        return linux
    return _none


def _quoted(text: str) -> str:
    """An AppleScript string literal (the texts are ours; quoted all the same)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _spawn(argv: list[str]) -> None:
    # No notification is no reason to disturb the person: a failure is let go.
    with contextlib.suppress(OSError):
        subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
