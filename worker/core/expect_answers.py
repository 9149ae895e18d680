"""What an expect script sends to a prompt for a password, found so it can be masked.

`expect -c 'spawn ssh h; expect "*assword*"; send "X\\r"'` puts the password in argv
(review17 E6), and expect's Tcl lets people write the answer in several places
(review19 A3): as the next command or a later one (`expect …; sleep 1; send …`), as the
pattern's action (`expect "*assword*" { send "X\\r" }`), in a block of patterns
(`expect { "yes/no" { … } "*assword*" { … } }`), by `exp_send`, and to a prompt that
names nothing (`expect "*:"`). So the script is read as Tcl words, and every
`send`/`exp_send` after a pattern that names a password, or names nothing (no letter in
it), up to the next pattern, is an answer: masking one that held no password costs
little, keeping one that did costs the password.

One pass of linear time: a single regular expression with no nested choice splits the
text into words, and each word is looked at once (review19 A7: a pattern that
backtracked held the worker's loop for minutes). Best effort: braces and quotes are read
as Tcl groups them, near enough; a variable's value (`send "$pw\\r"`) is not followed,
a script that defines a procedure and names a password prompt has every value it sends
taken, and an unclosed brace runs to the end of the text (more read, never less).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

# A Tcl word, near enough: a quoted string (to its closing quote, or the end), a brace,
# a command's end, or a bare run. Possessive, each choice told apart by its first
# character: no backtracking.
_TOKEN: Final = re.compile(r'"(?:[^"\\]++|\\.)*+"?|[{}]|[;\n]|(?:[^\s{};"\\]++|\\.)++', re.S)
# The same with a quote an ordinary character. The text masked is often the script as
# another layer quoted it again (a shell's `'"'"'`, a message's, the masking of other
# secrets in it), and one `"` left unclosed there would hide every command after it.
_QUOTE_BLIND_TOKEN: Final = re.compile(r"[{}]|[;\n]|(?:[^\s{};\\]++|\\.)++", re.S)
# Read as Tcl up to this much of a text: the reading is Python, a word at a time (a
# megabyte of short words took 2 s, and a recording masks args of a megabyte on the
# worker's loop), and scripts people write are far shorter. Past it every value sent
# is masked, found by one regular expression (`_ANY_SEND`), searched from a little
# before the edge so that a send cut by it is found whole.
READ_CHARS: Final = 32 * 1024
_STRADDLE: Final = 1024
_ANY_SEND: Final = re.compile(
    r"(?<![^\s{};\[])(?:exp_)?send\s++(?:-i\s++\S++\s++|-\S++\s++)*+"
    r'("(?:[^"\\]++|\\.)*+"?|\{[^}]*+\}?|[^\s;{}]++)'
)
_EXPECTS: Final = frozenset(
    prefix + name
    for prefix in ("", "exp_")
    for name in ("expect", "expect_before", "expect_after", "expect_background")
)
_SENDS: Final = frozenset({"send", "exp_send"})
_PROC: Final = re.compile(r"(?<![^\s{};\[])proc\s")
_OPTIONS_WITH_VALUE: Final = frozenset({"-timeout", "-i"})
# A pattern that asks for a secret: a password, a passphrase (`pass phrase` as openssl
# writes it), a PIN, a token.
_SECRET_PROMPT: Final = re.compile(r"assw|pass|\bpin\b|secret|token", re.I)
_LETTER: Final = re.compile(r"[^\W\d_]")


def answers(text: str) -> list[tuple[int, int]]:
    """Where each value sent to a prompt for a password stands in `text` (start, end:
    its quotes or braces included), in the order they come; none overlaps another.
    Read twice, with quotes as Tcl reads them and with quotes as plain characters
    (`_QUOTE_BLIND_TOKEN`): what either finds is taken. Past READ_CHARS, every value
    sent."""
    if "expect" not in text:
        return []  # no prompt, no answer
    read = text[:READ_CHARS]
    found = _read(read, _TOKEN) + _read(read, _QUOTE_BLIND_TOKEN)
    if _PROC.search(read) and _SECRET_PROMPT.search(read):
        # A procedure's sends run where it is called, which the reading does not
        # follow (`proc p {} { send "X\r" }; expect "*assword*"; p` kept X: review23
        # C19): with a password prompt anywhere, each value sent is an answer.
        found += [sent.span(1) for sent in _ANY_SEND.finditer(read)]
    if len(text) > READ_CHARS:
        found += [sent.span(1) for sent in _ANY_SEND.finditer(text, READ_CHARS - _STRADDLE)]
    merged: list[tuple[int, int]] = []
    found.sort()
    for start, end in found:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _read(text: str, token: re.Pattern[str]) -> list[tuple[int, int]]:
    reader = _Reader(text)
    for found in token.finditer(text):
        reader.take(found.group(), found.start(), found.end())
    reader.finish()
    return reader.found


def asks_secret(pattern: str) -> bool:
    """Whether the answer to an expect pattern is taken for a password: the pattern
    names one, or nothing at all (`*:`, `: `: a bare prompt, and a password's is the
    usual one)."""
    return _SECRET_PROMPT.search(pattern) is not None or _LETTER.search(pattern) is None


@dataclass
class _Frame:
    """What is being read between braces (or in the whole text).

    kind: "commands" (Tcl commands: the text itself, an action, an `if`'s body),
    "block" (an expect's patterns and actions in braces, across lines) or "word" (a
    braced word: a pattern, a value sent, an option's value; only its braces count).
    step: what the next word is: "pattern", "action", "value" (sent), or "" (nothing
    looked at). skip: the next word is an option's value (`-timeout 5`)."""

    kind: str
    start: int
    step: str = ""
    skip: bool = False
    options_done: bool = False  # `send -- -x`: `--` ends the options
    depth: int = 0  # in a word: braces opened inside it


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.frames = [_Frame("commands", 0)]
        self.secret_prompt = False  # a pattern of the last expect asks for a password
        self.found: list[tuple[int, int]] = []

    def take(self, piece: str, start: int, end: int) -> None:
        frame = self.frames[-1]
        if piece == "{":
            self.open(frame, end)
        elif piece == "}":
            self.close(frame, start)
        elif frame.kind == "word":
            return  # inside a braced word only braces count
        elif piece in (";", "\n"):
            if frame.kind == "commands":  # a block's patterns run across lines
                frame.step, frame.skip, frame.options_done = "", False, False
        else:
            self.word(frame, piece, start, end)

    def word(self, frame: _Frame, piece: str, start: int, end: int) -> None:
        # A command's name is looked for anywhere in a command, after `[` too: a script
        # quoted inside another (`sh -c "expect -c '…; send …'"`) is read, not skipped.
        name = piece.lstrip("[")
        if frame.kind == "commands" and (name in _EXPECTS or name in _SENDS):
            frame.step = "pattern" if name in _EXPECTS else "value"
            frame.skip = frame.options_done = False
            if name in _EXPECTS:
                self.secret_prompt = False  # until one of its patterns asks for one
        elif frame.skip:
            frame.skip = False
        elif (
            frame.step in ("pattern", "value") and piece.startswith("-") and not frame.options_done
        ):
            frame.skip = piece in _OPTIONS_WITH_VALUE
            frame.options_done = piece == "--"
        else:
            self.took(frame, start, end)

    def took(self, frame: _Frame, start: int, end: int) -> None:
        """A word (or a braced one) at `start`:`end`, as what comes next in `frame`. Its
        text is taken only for a pattern: slicing every braced action when it closes
        made a megabyte of nested, unclosed ones quadratic."""
        if frame.step == "pattern":
            # Any of an expect's patterns: its words may be split otherwise than Tcl
            # splits them (`expect 'Password '"'"'…'`, quoted again), and a block's
            # answers after a password's pattern are masked, those before it not.
            self.secret_prompt = self.secret_prompt or asks_secret(self.text[start:end])
            frame.step = "action"
        elif frame.step == "action":
            frame.step = "pattern"  # an expect takes patterns and actions in turn
        elif frame.step == "value":
            if self.secret_prompt:
                self.found.append((start, end))
            frame.step = ""
        frame.options_done = False

    def open(self, frame: _Frame, at: int) -> None:
        if frame.kind == "word":
            frame.depth += 1
        elif not frame.skip and frame.kind == "commands" and frame.step == "pattern":
            self.frames.append(_Frame("block", at, step="pattern"))  # expect { … }
        elif not frame.skip and frame.step in ("action", ""):
            self.frames.append(_Frame("commands", at))
        else:  # a braced pattern in a block, a value sent, an option's value
            self.frames.append(_Frame("word", at))

    def close(self, frame: _Frame, at: int) -> None:
        if frame.kind == "word" and frame.depth:
            frame.depth -= 1
            return
        if len(self.frames) == 1:
            return  # a brace never opened
        self.frames.pop()
        parent = self.frames[-1]
        if frame.kind == "block":
            parent.step = ""  # the expect is whole
        elif parent.skip:
            parent.skip = False
        else:
            self.took(parent, frame.start - 1, at + 1)

    def finish(self) -> None:
        """Close what the text left open: a value sent in braces never closed is still
        the value sent (to the text's end)."""
        while len(self.frames) > 1:
            self.frames[-1].depth = 0
            self.close(self.frames[-1], len(self.text))
        self.found = [(start, min(end, len(self.text))) for start, end in self.found]
