"""How `shell_words` splits a script into simple commands (review15 finding 03): at
newlines, operators, substitutions and keywords' separators, words as a shell reads
them, here-strings and here-documents as the stdin of their command. Hypothesis writes
the scripts: commands of words, each quoted one of the ways a shell takes, joined by
any separator, must come back word for word; and any text at all is read without
raising, its tokens in order and inside it."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.core.shell_words import commands, tokens


def _words(script: str) -> list[list[str]]:
    return [[word.text for word in command.words] for command in commands(script)]


SPLIT = [
    ("cd /srv\nmysql -pX db", [["cd", "/srv"], ["mysql", "-pX", "db"]]),
    ("a;b&&c||d|e&f", [["a"], ["b"], ["c"], ["d"], ["e"], ["f"]]),
    ("if a -pX; then b; fi", [["if", "a", "-pX"], ["then", "b"], ["fi"]]),
    ("x=$(a -pX); echo $x", [["x="], ["a", "-pX"], ["echo", "$x"]]),
    ("x=`a -pX`", [["x="], ["a", "-pX"]]),
    ('echo "n: $(a "-pX") ok"', [["echo", "n: "], ["a", "-pX"], [" ok"]]),
    ("a 'b c' \"d $e\" f\\ g", [["a", "b c", "d $e", "f g"]]),
    ("a#b # comment's\nc", [["a#b"], ["c"]]),
    ("a \\\n  -pX", [["a", "-pX"]]),
    ("a 2>&1 >out <in", [["a"]]),
    ("${X:-a b} c", [["${X:-a b}", "c"]]),
    ("echo 'unclosed -pX", [["echo", "unclosed -pX"]]),
    ("x=$( (a) ; b )", [["x="], ["a"], ["b"]]),
    ("case $x in y) a -pX;; esac", [["case", "$x", "in", "y"], ["a", "-pX"], ["esac"]]),
]


@pytest.mark.parametrize(("script", "expected"), SPLIT, ids=[repr(s)[:30] for s, _ in SPLIT])
def test_a_script_splits_into_its_simple_commands(script: str, expected: list[list[str]]) -> None:
    assert _words(script) == expected


def test_here_strings_and_documents_are_their_commands_stdin() -> None:
    found = commands("a <<< X1; b <<EOF | c\nX2\nEOF\nd <<-E\n\tX3\n\tE\ne")
    assert [[fed.text for fed in command.fed] for command in found] == [
        ["X1"],
        ["X2\n"],
        [],
        ["\tX3\n"],
        [],
    ]
    assert [command.piped_from is not None for command in found] == [False] * 2 + [True] + [
        False
    ] * 2
    assert found[2].piped_from is found[1]


def test_a_process_substitution_on_stdin_is_what_the_command_reads() -> None:
    """`b < <(a)` reads a's output, as `a | b` does; `c <(d)` takes d's as a file."""
    found = commands("b -S < <(a X1) && c <(d X2)")
    assert [[word.text for word in command.words] for command in found] == [
        ["b", "-S"],
        ["a", "X1"],
        ["c"],
        ["d", "X2"],
    ]
    assert found[0].piped_from is found[1]
    assert [command.piped_from for command in found[1:]] == [None] * 3


def test_a_command_knows_it_runs_in_a_process_substitution() -> None:
    """`cat <(echo X)`, `exec 3< <(echo X)`: the output of what runs in `<(…)` is a file
    any command may read (review19 A3); `$(…)`, `( … )` and `>` are no such thing."""
    found = commands("cat <(echo X1; printf X2) | b; exec 3< <(c X3); $(d) > (e) (f)")
    assert [(command.words[0].text, command.substituted) for command in found] == [
        ("cat", False),
        ("echo", True),
        ("printf", True),
        ("b", False),
        ("exec", False),
        ("c", True),
        ("d", False),
        ("e", False),
        ("f", False),
    ]


def test_a_word_knows_where_it_was_written() -> None:
    script = "a -p'X y' \"$(b)\""
    word = commands(script)[0].words[1]
    assert (word.text, script[word.start : word.end]) == ("-pX y", "-p'X y'")


WORD = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=12)
SEPARATORS = st.sampled_from([";", "\n", "&&", "||", "|", "&", " ; ", " && ", " |\n", "\n\n"])


def _quoted(word: str, how: int) -> str:
    """`word` as a shell takes it: single-quoted, double-quoted with its specials
    escaped, or every character escaped (a newline escaped is a line joined, so it
    is single-quoted instead)."""
    if how == 0:
        return shlex.quote(word)
    if how == 1:
        return '"' + "".join("\\" + c if c in '$`"\\' else c for c in word) + '"'
    return "".join("'\n'" if c == "\n" else "\\" + c for c in word)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(WORD, st.integers(0, 2)), min_size=1, max_size=5),
        min_size=1,
        max_size=5,
    ),
    st.lists(SEPARATORS, min_size=5, max_size=5),
)
def test_any_words_quoted_any_way_come_back_as_written(
    script_words: list[list[tuple[str, int]]], separators: list[str]
) -> None:
    script = ""
    for command, separator in zip(script_words, separators, strict=False):
        script += " ".join(_quoted(word, how) for word, how in command) + separator
    assert _words(script) == [[word for word, _ in command] for command in script_words]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab -\n\t;&|()<>'\"`$\\{}#=!E")), max_size=200))
def test_any_text_is_read_without_raising(script: str) -> None:
    found = tokens(script)
    at = 0
    for token in found:
        assert at <= token.start <= token.end <= len(script), (script, found)
        at = token.start
    commands(script)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_any_unicode_is_read_without_raising(script: str) -> None:
    commands(script)
