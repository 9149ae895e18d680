"""Telemetry's args preview: short, and never holding a secret."""

from __future__ import annotations

import gc
import json
import re
import subprocess
import sys

import pydantic_core
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.core import redaction
from worker.core.redaction import (
    KEPT_CHARS,
    KEPT_DETAIL_CHARS,
    MASK,
    NESTED_AT_MOST,
    PREVIEW_CHARS,
    args_for_replay,
    args_preview,
    head_masked,
    masked_detail,
    masked_message,
    masked_text,
    nests_deeper,
)


def test_short_harmless_args_are_kept_as_sent() -> None:
    assert args_preview('{"path": "notes.md"}') == '{"path": "notes.md"}'


def test_secret_looking_keys_are_masked_at_any_depth() -> None:
    args = {"url": "https://x", "headers": {"Authorization": "Bearer abc", "X-Api-Key": "k"}}
    preview = json.loads(args_preview(json.dumps(args)))
    assert preview["headers"] == {"Authorization": "***", "X-Api-Key": "***"}
    assert "abc" not in args_preview(json.dumps({"password": "abc", "token": "abc"}))


def test_long_values_are_cut_and_the_preview_stays_short() -> None:
    preview = args_preview(json.dumps({"text": "y" * 10_000, "more": ["z" * 500] * 20}))
    assert len(preview) <= PREVIEW_CHARS
    assert "y" * 81 not in preview


def test_args_that_are_not_json_say_so() -> None:
    assert args_preview("{not json" + " " * PREVIEW_CHARS) == "<invalid json>"


def test_every_query_value_fragment_and_url_password_is_masked_names_stay() -> None:
    url = "https://u:pw@example.com/p?access_token=T1&page=2&flag#frag"
    preview = json.loads(args_preview(json.dumps({"url": url})))
    assert preview["url"] == "https://u:***@example.com/p?access_token=***&page=***&***#***"
    argv = {"argv": ["curl", "see https://x.test/?sig=S2 now"]}
    assert "S2" not in args_preview(json.dumps(argv))


def test_every_header_value_is_masked_whatever_its_name() -> None:
    args = {"url": "https://x", "headers": {"X-Trace": "H1", "Accept": "text/html"}}
    preview = json.loads(args_preview(json.dumps(args)))
    assert preview["headers"] == {"X-Trace": "***", "Accept": "***"}


def test_content_never_reaches_the_preview() -> None:
    for key in ("content", "data", "body", "text"):
        preview = args_preview(json.dumps({"path": "a.txt", key: "the person's words"}))
        assert "person" not in preview and json.loads(preview)[key] == "***"


SIGNATURE = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"


def test_args_are_parsed_before_anything_is_decided() -> None:
    """JSON may write a URL as `https:\\/\\/…` (PHP's json_encode does) or a key as
    `tok\\u0065n`: the text then shows neither, the args do."""
    escaped = (
        '{"url":"https:\\/\\/bucket.s3.amazonaws.com\\/r.pdf?X-Amz-Signature=' + SIGNATURE + '"}'
    )
    assert json.loads(escaped)["url"].startswith("https://")
    assert SIGNATURE[:8] not in args_preview(escaped)
    assert "abc" not in args_preview('{"tok\\u0065n": "abc"}')


def test_args_that_did_not_parse_are_not_kept() -> None:
    """Short invalid args (a raw escape in a string) were kept as sent."""
    assert args_preview('{"path": "\x1b[2J"}') == "<invalid json>"


def test_secrets_in_an_argv_are_masked() -> None:
    token = "ghp_16C7e42F292c6912E7710c838347Ae178B4a"
    argvs = [
        ["git", "-c", "http.extraheader=AUTHORIZATION: basic eC1hY2Nlc3M6Z2hwXzE2", "fetch"],
        ["gh", "auth", "login", "--with-token", "s3cr3t-value"],
        ["mysql", "--password=s3cr3t-value", "-u", "root"],
        ["env", "AWS_SECRET_ACCESS_KEY=s3cr3t-value", "make"],
        ["curl", "-H", "X-Api-Key: s3cr3t-value", "https://x.test/"],
        ["curl", "-H", "Authorization: Bearer s3cr3t-value", "https://x.test/"],
        ["tool", "--token-file", "/tmp/t", "run", token],
    ]
    for argv in argvs:
        preview = args_preview(json.dumps({"argv": argv}))
        assert "s3cr3t" not in preview and "eC1h" not in preview and token not in preview, preview
    kept = json.loads(args_preview(json.dumps({"argv": ["git", "-C", "proj", "status"]})))
    assert kept == {"argv": ["git", "-C", "proj", "status"]}


def test_tokens_in_url_paths_are_masked_hashes_are_not() -> None:
    urls = {
        "https://api.telegram.org/bot123456:ABC-DEF1234ghIkl-zyx57W2v1u123ew11/getMe": "ABC-DEF",
        "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX": "XXXX",
        "https://discord.com/api/webhooks/1234567/AbCdEf123-_xyzXYZ987abc": "AbCdEf",
        "https://x.test/v1/s/Zk3Q9xLm2Rt7Wp4Yb8Nc1Vd6/download": "Zk3Q9",
    }
    for url, secret in urls.items():
        assert secret not in args_preview(json.dumps({"url": url})), url
    commit = "https://github.com/o/r/commit/9f86d081884c7d659a2feaa0c55ad015a3bf4f1b"
    assert json.loads(args_preview(json.dumps({"url": commit}))) == {"url": commit}


def test_a_megabyte_of_suspect_strings_costs_one_parse() -> None:
    """Only what the preview can show is searched: 4,000 strings of 256 secret-looking
    words each would take seconds of pattern searching otherwise."""
    args = json.dumps({"argv": ["token: " * 36] * 4_000})
    assert len(args_preview(args)) <= PREVIEW_CHARS


def test_args_nested_past_what_any_action_takes_are_never_parsed_or_walked() -> None:
    """Parsing, walking and writing args again each recurse once or more a level, and a
    finalizer the garbage collector ran near Python's recursion limit met it itself
    (RecursionError in `__del__`): test_fuzz_stream failed so at load. Each collection
    here runs a finalizer that needs 150 frames, and none may find them missing."""
    short: list[int] = []
    collecting = True

    def descend(levels: int) -> int:
        return descend(levels - 1) if levels else 0

    class Probe:
        def __init__(self) -> None:
            self.me = self  # a cycle: only the collector frees it

        def __del__(self) -> None:
            if not collecting:
                return
            try:
                descend(150)
            except RecursionError:
                short.append(1)
            Probe()  # garbage for the next collection

    thresholds = gc.get_threshold()
    gc.set_threshold(1)  # a collection at about every allocation
    Probe()
    try:
        for depth in (NESTED_AT_MOST, NESTED_AT_MOST + 1, 900, 5000):
            for text in ("[" * depth + "]" * depth, '{"a": ' * depth + "1" + "}" * depth):
                preview = args_preview(text)
                args, _ = args_for_replay(text)
                if depth > NESTED_AT_MOST:
                    assert preview == "<json nested too deeply>" and args is None
                else:
                    assert preview != "<json nested too deeply>", depth
    finally:
        collecting = False
        gc.set_threshold(*thresholds)
    assert short == []
    assert not nests_deeper('["' + "[" * 5000 + '"]')  # brackets in a string do not nest
    assert nests_deeper('[["\\"", ' * 201 + "]" * 201)


def test_a_message_quoting_a_call_keeps_none_of_its_secrets() -> None:
    """Refusals quote the URL or the argv (review10 01): as kept at rest, masked."""
    said = [
        "'http://127.0.0.1:9/x?access_token=QSECRET0123' is a loopback address",
        "no rule allows `grep -r --password=ARGSECRET0 .`",
        "no rule allows `grep -r --password ARGSECRET1 .`",
        "argv ['curl', '--password', 'ARGSECRET2', 'x']",
        "https://user:ARGSECRET3@example.com/r.git is not allowed",
        "curl -H 'Authorization: Bearer HDRSECRET0123456789' x",
    ]
    for text in said:
        masked = masked_message(text)
        assert "SECRET" not in masked, masked
        assert MASK in masked, masked
    assert masked_message("`rm` is not an allowed program") == "`rm` is not an allowed program"


def test_a_detail_is_masked_at_any_depth_argv_included() -> None:
    detail = {
        "url": "http://h/x?token=QSECRET0123",
        "argv": ["grep", "--password", "ARGSECRET4", "-r", "."],
        "tried": {"grep": ["option --api-key=ARGSECRET5 not allowed"]},
        "count": 3,
    }
    masked = masked_detail(detail)
    assert "SECRET" not in json.dumps(masked), masked
    assert masked["argv"] == ["grep", "--password", MASK, "-r", "."]
    assert masked["count"] == 3


def test_known_programs_short_password_options_are_masked() -> None:
    """mysql -pX, sshpass -p X, curl -u user:pw (review11): options no name gives away."""
    cases = {
        ("mysql", "-ps3cr3t-value", "-u", "root", "db"): ["mysql", "-p" + MASK, "-u", "root", "db"],
        ("/usr/bin/sshpass", "-p", "s3cr3t-value", "ssh", "h"): [
            "/usr/bin/sshpass", "-p", MASK, "ssh", "h",
        ],
        ("sshpass", "-ps3cr3t-value", "ssh", "h"): ["sshpass", "-p" + MASK, "ssh", "h"],
        ("curl", "-u", "me:s3cr3t-value", "https://x.test/"): [
            "curl", "-u", MASK, "https://x.test/",
        ],
        ("curl", "--user=me:s3cr3t-value", "-p", "https://x.test/"): [
            "curl", "--user=" + MASK, "-p", "https://x.test/",
        ],
        ("smbclient", "-Ume%s3cr3t-value", "//h/s"): ["smbclient", "-U" + MASK, "//h/s"],
    }  # fmt: skip
    for argv, expected in cases.items():
        assert json.loads(args_preview(json.dumps({"argv": list(argv)})))["argv"] == expected
        assert masked_detail(list(argv)) == expected
    # The same letters mean nothing secret to other programs, and a lone -p asks mysql
    # on the terminal: the next word is the database.
    for argv in (["grep", "-p", "pattern"], ["mysql", "-p", "db"], ["cp", "-u", "a", "b"]):
        assert masked_detail(argv) == argv


def _all_three(argv: list[str]) -> list[list[str]]:
    """An argv as a preview, an audit detail and a recording keep it."""
    replay, _ = args_for_replay(json.dumps({"argv": argv}))
    assert replay is not None
    return [
        json.loads(args_preview(json.dumps({"argv": argv})))["argv"],
        masked_detail(argv),
        json.loads(replay)["argv"],
    ]


def test_a_password_option_in_a_cluster_of_short_options_is_masked() -> None:
    """getopt, popt, curl and MySQL's my_getopt read -vpX as -v then -p X: the option
    that takes the password may come last in a cluster, its value joined or next."""
    secret = "s3cr3t-value"
    cases = {
        ("curl", "-vu", "me:" + secret, "https://x.test/"): ["curl", "-vu", MASK, "https://x.test/"],
        ("curl", "-vume:" + secret, "https://x.test/"): ["curl", "-vu" + MASK, "https://x.test/"],
        ("curl", "-sSLU", "me:" + secret, "x"): ["curl", "-sSLU", MASK, "x"],
        ("sshpass", "-vp", secret, "ssh", "h"): ["sshpass", "-vp", MASK, "ssh", "h"],
        ("sshpass", "-vp" + secret, "ssh", "h"): ["sshpass", "-vp" + MASK, "ssh", "h"],
        ("mysql", "-hhost", "-uroot", "-p" + secret, "db"): [
            "mysql", "-hhost", "-uroot", "-p" + MASK, "db",
        ],
        ("mysql", "-Bp" + secret, "db"): ["mysql", "-Bp" + MASK, "db"],
        ("mysqldump", "-vvp" + secret, "db"): ["mysqldump", "-vvp" + MASK, "db"],
        ("smbclient", "-NU", "me%" + secret, "//h/s"): ["smbclient", "-NU", MASK, "//h/s"],
        ("smbclient", "-NUme%" + secret, "//h/s"): ["smbclient", "-NU" + MASK, "//h/s"],
        # smbclient's second operand is the password; sshpass's command is read as its own.
        ("smbclient", "//h/s", secret, "-N"): ["smbclient", "//h/s", MASK, "-N"],
        ("sshpass", "-p", secret, "mysql", "-Bp" + secret): [
            "sshpass", "-p", MASK, "mysql", "-Bp" + MASK,
        ],
        # A password that is the word "secret" is no secret-looking flag: db stays.
        ("mysql", "-psecret", "db"): ["mysql", "-p" + MASK, "db"],
    }  # fmt: skip
    for argv, expected in cases.items():
        assert _all_three(list(argv)) == [expected] * 3, argv


def test_clusters_without_a_password_option_are_left_as_they_are() -> None:
    """Letters that are another option's value (curl -XPUT is no -U, mysql -hpdb is a
    host), a lone -p that asks mysql on the terminal, options after `--` or after the
    command sshpass runs (ssh -p 22 is a port), and programs not known to take a
    password (ls -lp) are shown as sent."""
    for argv in (
        ["curl", "-v", "https://x.test/"],
        ["curl", "-sSLo", "out.html", "https://x.test/"],
        ["curl", "-XPUT", "-H", "-ua", "https://x.test/"],
        ["curl", "-dupe=1", "https://x.test/"],
        ["curl", "--", "-uX"],
        ["mysql", "-hpdb", "-uproot", "db"],
        ["mysql", "-vp", "db"],
        ["mysql", "-e", "-pselect", "db"],
        ["sshpass", "-f", "file", "ssh", "-p", "22", "-vp", "2", "h"],
        ["smbclient", "-L", "host", "-N"],
        ["ls", "-lp"],
        ["grep", "-rp", "x", "."],
    ):
        assert _all_three(argv) == [argv] * 3, argv


@settings(max_examples=300, deadline=None)
@given(
    flags=st.text(alphabet="vsSLkfiIjJlnNOqR0123456789#", max_size=6),
    # (-E takes file:password: its password is masked, tests/unit/test_argv_secrets.py)
    value_letter=st.sampled_from(list("AbcCdDeFHKmoPQrtTwxXyYz")),
    value=st.text(alphabet="uUpP:%abz-", min_size=1, max_size=12),
    secret_letter=st.sampled_from(["u", "U"]),
    joined=st.booleans(),
)
def test_curl_clusters_are_read_as_curl_reads_them(
    flags: str, value_letter: str, value: str, secret_letter: str, joined: bool
) -> None:
    """Any cluster of curl's plain flags ending in -u or -U hides the password joined
    to it or after it; one ending in an option that takes a value shows that value,
    whatever letters it holds."""
    password = "pw:" + value
    argv = ["curl", f"-{flags}{secret_letter}" + (password if joined else ""), "x"]
    if not joined:
        argv.insert(2, password)
    masked = masked_detail(argv)
    assert password not in json.dumps(masked)
    assert masked[1].startswith(f"-{flags}{secret_letter}")
    shown = ["curl", f"-{flags}{value_letter}{value}", "x"]
    assert masked_detail(shown) == shown


def test_a_refusal_keeps_a_bounded_cut_of_what_it_quotes_and_never_half_a_password() -> None:
    """review19 A7: masking ran over the whole of a refusal's message and detail on the
    worker's loop; at rest they are cut first (KEPT_CHARS a string, KEPT_DETAIL_CHARS a
    detail), at a space, and a password the argv held is masked before the cut."""
    secret = "hunter2hunter2"
    straddling = "x " * ((KEPT_CHARS - 15) // 2) + f"--password {secret} " + "y " * 5000
    for known in ((secret,), ()):  # known from the argv, or found by the patterns
        kept = masked_message(straddling, known)
        assert len(kept) < KEPT_CHARS + 64 and "more characters not kept" in kept
        assert "hunt" not in kept and kept.count("--password") == 1, kept[-80:]
    detail = masked_detail({"argv": ["sh", "-c", "z " * KEPT_DETAIL_CHARS] * 20})
    assert len(json.dumps(detail)) < KEPT_DETAIL_CHARS + 20 * 64


def test_masking_expect_sends_takes_time_in_proportion_to_the_text() -> None:
    """review19 A7: one pattern for an expect and its send backtracked cubically (12 KB of
    "expect assw " held the loop 15 s; this 128 KB, hours). Run apart, with a bound
    hundreds of times what linear matching takes (~0.1 s), so a return cannot fail."""
    script = (
        "from worker.core.redaction import masked_text;"
        "masked_text('expect assw ' * 11000); masked_text('expect assw;send ' * 8000);"
        # review19 A3's forms, each ~131,000 characters: blocks left open, braced values
        # never closed, quotes never closed.
        'masked_text(\'expect { "*:" { send "x" } \' * 4700);'
        "masked_text('expect \"*:\" { exp_send {' * 6000);"
        "masked_text('\"send ' * 21000); masked_text('expect \"*assword*\"; sleep 1; send ' * 3400)"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    masked = masked_text('spawn su; expect "*assword*"; send hunter2\\r; interact')
    assert "hunter2" not in masked and f'send "{MASK}"' in masked


def test_args_left_inside_a_string_are_measured_in_time_in_proportion_to_them() -> None:
    """Args that are no JSON, or cut at 1 MiB, can end inside a string: `nests_deeper`
    looked for its close from each escaped quote in it again (quadratic: 48 KB of
    `\\"{` held a preview 10 s, 131 KB more than a minute). Run apart, with a bound
    thousands of times what one pass takes (~1 ms), so a return cannot fail."""
    script = (
        "from worker.core.redaction import args_preview, argv_secrets, nests_deeper;"
        'args = \'{"argv": ["x", "\' + \'\\\\"{\' * 43_600;'
        "assert args_preview(args) == '<invalid json>' and argv_secrets(args) == ()"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)


@pytest.mark.parametrize(
    ("head", "shown", "secrets"),
    [
        # A flag's value found by its place, whole or cut through by the head's end.
        (
            '{"cwd": "x", "argv": ["echo", "--password", "HUNTER2SECRET", "xx',
            '{"cwd": "x", "argv": ["echo", "--password", "***", "xx"]}',
            ("HUNTER2SECRET",),
        ),
        ('{"argv": ["x", "--password", "HUNTER2SEC', '{"argv": ["x", "--password", "***"]}', None),
        (
            '{"argv": ["x", "--password", "HUNTER2\\u00',
            '{"argv": ["x", "--password", "***"]}',
            None,
        ),
        (
            '{"argv": ["mysql", "-pSECRETPASS", "-e", "SEL',
            '{"argv": ["mysql", "-p***", "-e", "SEL"]}',
            None,
        ),
        # Any other member: its text, masked as text, as far as the head goes.
        (
            '{"path": "a", "content": "password=hunter2 and',
            '{"path": "a", "content": "password=*** and"}',
            (),
        ),
        ('{"path": "a", "content": "say \\"hi', '{"path": "a", "content": "say \\"hi"}', ()),
        ('{"a": [1, {"b": "c', '{"a": [1]}', ()),
        ('{"a":', "{}", ()),
    ],
)
def test_a_head_of_args_is_masked_by_its_members(
    head: str, shown: str, secrets: tuple[str, ...] | None
) -> None:
    """review27 I3: args too long to parse for a screen were masked as text, which
    finds no flag's value by its place in an argv."""
    masked = head_masked(head)
    assert masked is not None
    assert masked[0] == shown
    if secrets is not None:
        assert masked[1] == secrets
    assert head_masked('["not", "an object') is None


# What `_plain` answered as one regex (before it looked for texts and words apart): a
# marker anywhere, or a program's name where neither side continues it as a word.
_PROGRAM_NAMES = sorted(redaction._NOT_PLAIN_WORDS)
_ONE_REGEX = re.compile(
    redaction._MARKERS
    + r"|://|\\|header|content|data|body|text"
    + r"|(?<![a-z0-9_.+-])(?:"
    + "|".join(map(re.escape, _PROGRAM_NAMES))
    + r")(?![a-z0-9_.+-])"
)
_PIECES = st.one_of(
    st.sampled_from(
        [*_PROGRAM_NAMES, *redaction._NOT_PLAIN_TEXTS, "MySQL", "sudo-x", "xsudo", "bench.txt"]
    ),
    st.text(alphabet='abcdkps-_.+/ :\\"{}[]0123AXİ', max_size=3),
)


@settings(max_examples=500, deadline=None)
@given(st.lists(_PIECES, max_size=8).map("".join))
def test_plain_args_are_told_as_the_one_regex_told_them(text: str) -> None:
    assert redaction._plain(text) == (_ONE_REGEX.search(text.lower()) is None)


def test_each_program_name_is_one_word_and_each_marker_plain_text() -> None:
    """`_plain` finds a name as a whole word, and a marker with `in`: neither may hold
    what a regex would read otherwise."""
    assert all(re.fullmatch(r"[a-z0-9_.+-]+", name) for name in _PROGRAM_NAMES)
    assert all(
        re.escape(text) == text.replace("-", r"\-")
        for text in redaction._NOT_PLAIN_TEXTS
        if text != "\\"
    )


_JSONISH = st.one_of(
    st.sampled_from(
        [
            '{"path": ',
            '"a.txt"',
            "}",
            "{",
            "[",
            "]",
            ",",
            ":",
            " ",
            "\t",
            "\n",
            "\r",
            "\x0c",
            "\xa0",
            "\ufeff",
            "NaN",
            "-Infinity",
            "Infinity",
            "1e400",
            "-0",
            "01",
            "0.5",
            "1.",
            ".5",
            "true",
            "null",
            "None",
            '"\\ud800"',
            '"\\u0000"',
            '"\x01"',
            '"a\\qb"',
            "\\",
            '"\udc80"',
            '"url: http://x"',
            '"token"',
            "//",
            "/*",
            "'a'",
        ]
    ),
    st.text(alphabet='ab0-1.e+E"{}[],: ', max_size=4),
)


@settings(max_examples=500, deadline=None)
@given(st.lists(_JSONISH, max_size=10).map("".join))
def test_args_pydantic_parsed_are_previewed_as_if_parsed_again(text: str) -> None:
    """A text pydantic's parser (jiter) takes, json.loads takes too, so a preview of
    args pydantic parsed skips parsing them again (`parsed`) and says the same."""
    try:
        pydantic_core.from_json(text)
    except (ValueError, TypeError):  # TypeError: a lone surrogate, which it cannot read
        return
    json.loads(text)  # raises if json.loads refuses what jiter took
    assert args_preview(text, parsed=True) == args_preview(text)
