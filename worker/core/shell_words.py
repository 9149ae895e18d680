"""A shell script's simple commands, read as far as finding the passwords in them takes.

Redaction reads the scripts an argv carries (`sh -c '…'`, `env -S '…'`, `ssh host '…'`)
to find the passwords the commands in them take. shlex is no shell, and each place it
differs hid a password (review15 finding 03): it reads a newline as a space (a
password on line 2 was an operand of line 1's command), a `#` inside a word as a
comment, gives up on an unclosed quote, and knows no backticks, `$(…)` inside double
quotes, here-strings or here-documents. This reads what redaction needs in one pass of
linear time, and never raises:

- words, their quotes and escapes removed, with where each stands in the script (so a
  masked word is written back in its place and the rest stays as it was written);
- the operators between commands (`;`, `&&`, `||`, `|`, `&`, a newline, parentheses,
  `$(`, backticks), and redirections with their target (`< f`, `2>&1`, `<<< word`);
- here-documents' bodies, as the stdin of the command that opened them.

Best effort by design: aliases, functions, parameter values and `eval`'s text are not
followed. An unclosed quote or substitution runs to the end of the script: more is
read as words, never less.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

# Longest first: the first that fits at a position is the operator there.
_OPERATORS: Final = (
    "&>>",
    "<<<",
    "<<-",
    "&&",
    "||",
    ";;",
    ";&",
    "|&",
    "&>",
    "<<",
    ">>",
    "<&",
    ">&",
    "<>",
    ">|",
    ";",
    "&",
    "|",
    "(",
    ")",
    "<",
    ">",
)
_OPERATOR_CHARS: Final = frozenset(";&|()<>")
REDIRECTIONS: Final = frozenset(
    {"<", ">", ">>", "<<", "<<-", "<<<", "<&", ">&", "<>", ">|", "&>", "&>>"}
)
_PIPES: Final = frozenset({"|", "|&"})
_BLANKS: Final = frozenset(" \t\r")
_ESCAPED_IN_DOUBLE_QUOTES: Final = frozenset('$`"\\')
# Runs of characters that are only themselves, taken at once (a character at a time
# cost twice shlex's time).
_PLAIN: Final = re.compile(r"[^ \t\r\n;&|()<>'\"\\$`]+")
_PLAIN_IN_DOUBLE_QUOTES: Final = re.compile(r'[^"\\$`]+')


@dataclass(frozen=True, slots=True)
class Token:
    """A word (`text` its value, quotes removed), an operator, or a here-document's
    body; `start`:`end` is where it stands in the script."""

    kind: str  # "word", "op" or "body"
    text: str
    start: int
    end: int


@dataclass(slots=True)
class Command:
    """A simple command: its words (redirections and their targets left out), what it
    is fed on stdin from the script itself (here-strings' words, here-documents'
    bodies), the command whose output it reads (`a | b`: a is b's; `b < <(a)`, a
    process substitution on its stdin, too), and whether it runs in a process
    substitution `<(…)`, whose output another command reads as a file (`cat <(a)`,
    `exec 3< <(a)`)."""

    words: list[Token] = field(default_factory=list)
    fed: list[Token] = field(default_factory=list)
    piped_from: Command | None = None
    substituted: bool = False


class _Reader:
    """One pass over a script: `tokens` holds what it read."""

    def __init__(self, script: str) -> None:
        self.script = script
        self.tokens: list[Token] = []
        self.word: list[str] = []
        self.word_start = -1  # -1: no word begun
        # Where the reading is: "dq" inside double quotes, "sub" inside `$(`, "bq"
        # inside backticks; with the parentheses opened inside each `$(`.
        self.frames: list[str] = []
        self.parens: list[int] = []
        self.delimiter_next: bool | None = None  # after `<<` (True: `<<-`, tabs stripped)
        self.heredocs: list[tuple[str, bool]] = []  # bodies owed after the next newline

    def begin(self, at: int) -> None:
        if self.word_start < 0:
            self.word_start = at

    def flush(self, at: int) -> None:
        if self.word_start < 0:
            return
        text = "".join(self.word)
        self.tokens.append(Token("word", text, self.word_start, at))
        if self.delimiter_next is not None:
            self.heredocs.append((text, self.delimiter_next))
            self.delimiter_next = None
        self.word, self.word_start = [], -1

    def op(self, text: str, at: int) -> None:
        self.tokens.append(Token("op", text, at, at + len(text)))

    def read(self) -> list[Token]:
        at, end = 0, len(self.script)
        while at < end:
            if self.frames and self.frames[-1] == "dq":
                at = self.in_double_quotes(at)
            else:
                at = self.outside_quotes(at)
        self.flush(end)
        return self.tokens

    def in_double_quotes(self, at: int) -> int:
        script, char = self.script, self.script[at]
        following = script[at + 1 : at + 2]
        if char == '"':
            self.frames.pop()
            return at + 1
        if char == "\\":
            if following == "\n":
                return at + 2
            if following in _ESCAPED_IN_DOUBLE_QUOTES and following:
                self.word.append(following)
                return at + 2
        if char == "$" and following == "(":
            return self.open_substitution(at)
        if char == "`":
            return self.backtick(at)
        run = _PLAIN_IN_DOUBLE_QUOTES.match(script, at)
        self.word.append(char if run is None else run.group())
        return at + 1 if run is None else run.end()

    def outside_quotes(self, at: int) -> int:
        script, char = self.script, self.script[at]
        following = script[at + 1 : at + 2]
        if char in _BLANKS:
            self.flush(at)
            return at + 1
        if char == "\n":
            self.flush(at)
            self.op("\n", at)
            return self.heredoc_bodies(at + 1)
        if char == "#" and self.word_start < 0:  # a comment, up to the line's end
            newline = script.find("\n", at)
            return len(script) if newline < 0 else newline
        if char == "\\":
            if following == "\n":  # a line continued
                return at + 2
            self.begin(at)
            self.word.append(following)
            return at + 2
        if char == "'":
            self.begin(at)
            close = script.find("'", at + 1)
            close = len(script) if close < 0 else close
            self.word.append(script[at + 1 : close])
            return close + 1
        if char == "$" and following == "'":
            return self.ansi_c(at)
        if char == '"':
            self.begin(at)
            self.frames.append("dq")
            return at + 1
        if char == "$" and following == "(":
            return self.open_substitution(at)
        if char == "$" and following == "{":
            self.begin(at)
            close = script.find("}", at)
            close = len(script) - 1 if close < 0 else close
            self.word.append(script[at : close + 1])
            return close + 1
        if char == "`":
            return self.backtick(at)
        if char in _OPERATOR_CHARS:
            return self.operator(at)
        self.begin(at)
        run = _PLAIN.match(script, at)
        self.word.append(char if run is None else run.group())
        return at + 1 if run is None else run.end()

    def operator(self, at: int) -> int:
        script = self.script
        text = next(op for op in _OPERATORS if script.startswith(op, at))
        if text == ")" and self.frames and self.frames[-1] == "sub":
            if self.parens[-1] == 0:  # the `$(` closes
                self.flush(at)
                self.op(")", at)
                self.frames.pop()
                self.parens.pop()
                self.resume(at + 1)
                return at + 1
            self.parens[-1] -= 1
        elif text == "(" and self.frames and self.frames[-1] == "sub":
            self.parens[-1] += 1
        self.flush(at)
        self.op(text, at)
        if text in ("<<", "<<-"):
            self.delimiter_next = text == "<<-"
        return at + len(text)

    def open_substitution(self, at: int) -> int:
        self.flush(at)
        self.op("$(", at)
        self.frames.append("sub")
        self.parens.append(0)
        return at + 2

    def backtick(self, at: int) -> int:
        self.flush(at)
        self.op("`", at)
        if self.frames and self.frames[-1] == "bq":
            self.frames.pop()
            self.resume(at + 1)
        else:
            self.frames.append("bq")
        return at + 1

    def resume(self, at: int) -> None:
        """After a substitution inside double quotes, the quoted text goes on as a word."""
        if self.frames and self.frames[-1] == "dq":
            self.begin(at)

    def ansi_c(self, at: int) -> int:
        """`$'…'`: its escapes kept as written (a password spelled with them is not
        the word redaction sees, and is masked as the word is)."""
        self.begin(at)
        script, scan = self.script, at + 2
        while scan < len(script) and script[scan] != "'":
            scan += 2 if script[scan] == "\\" else 1
        self.word.append(script[at + 2 : min(scan, len(script))])
        return scan + 1

    def heredoc_bodies(self, at: int) -> int:
        """The bodies of the here-documents opened on the line that just ended."""
        script = self.script
        while self.heredocs and at < len(script):
            delimiter, tabs = self.heredocs.pop(0)
            start = at
            while at < len(script):
                newline = script.find("\n", at)
                line_end = len(script) if newline < 0 else newline
                line = script[at:line_end]
                if (line.lstrip("\t") if tabs else line) == delimiter:
                    self.tokens.append(Token("body", script[start:at], start, at))
                    at = line_end
                    break
                at = line_end + 1
            else:
                self.tokens.append(Token("body", script[start:], start, len(script)))
                at = len(script)
        self.heredocs.clear()
        return at


def tokens(script: str) -> list[Token]:
    """The words, operators and here-document bodies of `script`, in order."""
    return _Reader(script).read()


def commands(script: str) -> list[Command]:
    """`script`'s simple commands, in order (an empty one left out)."""
    found: list[Command] = []
    current = Command()
    redirect = ""  # a redirection whose target is the next word
    bodies_owed: list[Command] = []  # whose here-document bodies come next
    # `cmd < <(…)`: the command whose stdin the `<(` about to open feeds, and where.
    stdin_subst: tuple[Command, int] | None = None
    # For each parenthesis open (`(`, `$(`): whether it opened a process substitution.
    opened: list[bool] = []
    previous: Token | None = None
    for token in tokens(script):
        fed_by_subst = stdin_subst if token.text == "(" else None
        stdin_subst = None
        if token.kind == "op" and token.text in ("(", "$(", ")"):
            _track_parenthesis(opened, token, previous)
        previous = token
        if token.kind == "body":
            (bodies_owed.pop(0) if bodies_owed else current).fed.append(token)
            continue
        if redirect and token.kind == "word":
            if redirect == "<<<":
                current.fed.append(token)
            elif redirect in ("<<", "<<-"):
                bodies_owed.append(current)
            redirect = ""
            continue
        second_lt = redirect == "<" and token.text == "<"  # `< <(`, perhaps
        redirect = ""
        if token.kind == "word":
            current.words.append(token)
            continue
        if token.text in REDIRECTIONS:
            words = current.words
            if words and words[-1].end == token.start and words[-1].text.isdigit():
                words.pop()  # 2>&1: the 2 is the descriptor, no argument
            redirect = token.text
            stdin_subst = (current, token.end) if second_lt else None
            continue
        if current.words or current.fed:
            found.append(current)
        current = Command(piped_from=current if token.text in _PIPES else None)
        current.substituted = any(opened)
        if fed_by_subst is not None and fed_by_subst[1] == token.start:
            fed_by_subst[0].piped_from = current  # its words come next
    if current.words or current.fed:
        found.append(current)
    return found


def _track_parenthesis(opened: list[bool], token: Token, previous: Token | None) -> None:
    """Keep `opened` (see `commands`) as a parenthesis opens or closes: `<(` is a `<`
    just before a `(`. A `)` that closes nothing (`case`'s `a)`) is passed over."""
    if token.text == ")":
        if opened:
            opened.pop()
        return
    opened.append(
        token.text == "("
        and previous is not None
        and previous.text == "<"
        and previous.kind == "op"
        and previous.end == token.start
    )
