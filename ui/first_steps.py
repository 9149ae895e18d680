"""The commands the empty calls pane suggests, laid out to be copied.

A command wrapped by the terminal is copied as two lines, and a shell runs the first
half alone. `up` names the program by its full path when it is not on PATH
(`/home/me/src/agentworker/.venv/bin/agentworker grant ...`), which wrapped every
command at 80 columns: the folder goes on PATH once, first, and the commands then use
the bare name, as the README's own setup does.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Sequence
from typing import Final

PROGRAM: Final = "agentworker"
# Characters a double-quoted shell word would still read specially.
_SPECIAL_IN_QUOTES: Final = frozenset('"$`\\!')


def lines_to_try(steps: Sequence[str]) -> list[str]:
    """`steps` as the lines to show: as given, unless each starts with the same full
    path of the program; then that folder's PATH line and the commands with its name."""
    heads = {step.split(" ", 1)[0] for step in steps}
    if len(heads) != 1:
        return list(steps)
    head = heads.pop()
    folder, name = posixpath.split(head)
    if name != PROGRAM or not folder.startswith("/"):
        return list(steps)
    return [_on_path(folder), *(PROGRAM + step[len(head) :] for step in steps)]


def _on_path(folder: str) -> str:
    if _SPECIAL_IN_QUOTES.isdisjoint(folder):
        return f'export PATH="{folder}:$PATH"'
    return f'export PATH={shlex.quote(folder)}:"$PATH"'
