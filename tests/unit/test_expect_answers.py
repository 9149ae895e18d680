"""How `expect_answers` finds what an expect script sends to a password prompt
(review19 A3): Tcl's forms of an answer, a prompt that names nothing, and any text at
all read without raising, its answers in order, apart and inside it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.core.expect_answers import READ_CHARS, answers, asks_secret


def _sent(script: str) -> list[str]:
    return [script[start:end] for start, end in answers(script)]


FOUND = [
    ('expect "*assword*"; send "X\\r"', ['"X\\r"']),
    ('expect "*assword*" { send "X\\r" }', ['"X\\r"']),
    ('expect { "*assword*" { send -- {X\\r} } }', ["{X\\r}"]),
    ('expect "*:"; sleep 1; exp_send X\\r', ["X\\r"]),
    ('expect -timeout 5 -re {.*: $}; send -i $id -- "-X"', ['"-X"']),
    ('expect { "yes/no" { send "yes\\r"; exp_continue } "*assword*" { send "X" } }', ['"X"']),
    ('expect "Name:"; send "me\\r"; expect eof', []),
    ('send "X\\r"', []),  # no prompt yet
    ('expect "Password:"; send {X unclosed', ["{X unclosed"]),
    # review23 C19: a procedure defined before the prompt and called after it
    ('proc p {} { send "X\r" }; spawn ssh h; expect "*assword*"; p', ['"X\r"']),
    ('proc p {} { send "me\r" }; expect "Name:"; p', []),  # no password prompt
]


@pytest.mark.parametrize(("script", "sent"), FOUND, ids=[repr(s)[:40] for s, _ in FOUND])
def test_the_answers_to_a_password_prompt_are_found(script: str, sent: list[str]) -> None:
    assert _sent(script) == sent


def test_past_what_is_read_every_value_sent_is_masked() -> None:
    """A script past READ_CHARS is read as Tcl that far (a megabyte of args, as a
    recording keeps them, would hold the worker's loop seconds); after it, every value
    sent is taken, one cut by the edge whole."""
    lead = 'expect "Name:"; send me; ' * (READ_CHARS // 25)
    script = lead + 'send -i $id -- {X y\\r}; exp_send "Z'
    sent = _sent(script)
    assert sent[-2:] == ["{X y\\r}", '"Z'] and "me" in sent
    assert _sent(lead[:READ_CHARS]) == []


@pytest.mark.parametrize(
    ("pattern", "secret"),
    [
        *[("*assword*", True), ("Enter pass phrase", True), ("PIN:", True), ("*:", True)],
        *[("Name*", False), ("yes/no", False), ("eof", False), ("spinning", False)],
    ],
)
def test_a_pattern_asks_for_a_secret_when_it_names_one_or_nothing(
    pattern: str, secret: bool
) -> None:
    assert asks_secret(pattern) is secret


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([*'ab -\n\t;{}"\\[$*:', "expect", "send", "assw"]), max_size=60))
def test_any_text_is_read_without_raising(pieces: list[str]) -> None:
    script = "".join(pieces)
    at = 0
    for start, end in answers(script):
        assert at <= start < end <= len(script), (script, answers(script))
        at = end
