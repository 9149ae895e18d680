"""What the TUI puts on the screen of a text that came from the server: one path.

Every text a server chose (ids, actions, args, results, errors, reasons, a prompt's
preview, the link's detail, a grant's fields, a command's reply) reaches a widget
through `shown` (as a plain string) or `server_text` (as one of the prompt's or
the detail pane's rows), never as it came, and never as markup. Both make it inert
(worker.core.approvals.inert: every control, escape, bidi and invisible character
shown as a visible escape such as `\\e` or `\\u202e`): the worker sends its texts
inert already, inert changes nothing of an inert text, and a screen that draws a
raw one (the lift confirmation drew the raw plan id: review5's 04) cannot happen
by a caller forgetting. Rich and Textual strip only BEL, BS, VT, FF and CR: an ESC
drawn as is reaches the person's terminal.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from rich.text import Text

from worker.core.approvals import MAX_ID_CHARS, inert

# A run of whitespace in a server's text, or one whitespace character other than a space.
_WHITESPACE: Final = re.compile(r"\s{2,}|[^\S ]")
_CUT: Final = re.compile(r" … \(\+[\d,]+ chars\)$")


def shown(value: object, *, lines: bool = False) -> str:
    """`value` as the TUI may draw it: inert, whole. `lines`: its line breaks stay
    (the worker's own layout of a prompt's preview), each line inert."""
    text = str(value)
    if lines:
        return "\n".join(inert(line, None) for line in text.split("\n"))
    return inert(text, None)


def plan_shown(raw: str) -> str:
    """A plan id, given whole as the server sent it, as the TUI names the plan it acts
    on: inert, and whole (a plan id is at most MAX_ID_CHARS; the worker's rows cut
    them at 200, where two ids that differ after it look alike)."""
    return inert(raw, MAX_ID_CHARS)


def server_text(raw: object, *, one_line: bool, foreign: bool = False) -> Text:
    """A server's text for one of the prompt's rows (or the calls' detail pane's, or
    the lift confirmation's): inert (`shown`), a run of whitespace (or a space that
    is not a plain one) shown counted and marked, never as the blank it is, and on
    one line cut with an ellipsis when `one_line`; with `foreign`, each character
    outside ASCII marked (an id's: see `id_text`)."""
    return _marked(shown(raw), one_line=one_line, foreign=foreign)


def id_text(raw: object) -> Text:
    """An id (agent, plan, task, call) for one of the prompt's or the detail pane's
    rows: as `server_text` on one line, and each character outside ASCII marked, the
    first few named ahead of it. Ids are names machines give, and a letter of another
    script drawn like a Latin one (Cyrillic small a, U+0430, for a) passes for another
    agent's or plan's id on screen."""
    body, cut = _cut_off(shown(raw))
    foreign = [char for char in body if not char.isascii()]
    text = _marked(body, one_line=True, foreign=bool(foreign))
    text.append(cut)
    if foreign:
        text = Text.assemble((f"⟨not ASCII: {_named(foreign)}⟩", "reverse"), " ", text)
        text.no_wrap, text.overflow = True, "ellipsis"
    return text


def cell_text(raw: object) -> Text:
    """An id for a cell of the calls table: inert, each character outside ASCII marked."""
    body, cut = _cut_off(shown(raw))
    text = _marked(body, one_line=True, foreign=not body.isascii())
    text.append(cut)
    return text


def _named(chars: Sequence[str]) -> str:
    """The first three of `chars` by code point, and an ellipsis if there are more."""
    return " ".join(f"U+{ord(c):04X}" for c in chars[:3]) + (" …" if len(chars) > 3 else "")


def _cut_off(value: str) -> tuple[str, str]:
    """`value` and the worker's note on an id it cut short, apart (or '')."""
    cut = _CUT.search(value)
    return (value[: cut.start()], cut.group()) if cut else (value, "")


def _marked(value: str, *, one_line: bool, foreign: bool) -> Text:
    text = Text(no_wrap=one_line, overflow="ellipsis" if one_line else "fold")
    append = _append_marking_foreign if foreign else Text.append
    at = 0
    for match in _WHITESPACE.finditer(value):
        append(text, value[at : match.start()])
        run = match.group()
        if run.strip(" "):
            text.append(f"⟨{_named(run)}⟩", style="reverse")
        else:
            text.append(f"⟨{len(run)} spaces⟩", style="reverse")
        at = match.end()
    append(text, value[at:])
    return text


def _append_marking_foreign(text: Text, segment: str) -> None:
    for char in segment:
        text.append(char, style=None if char.isascii() else "reverse")
