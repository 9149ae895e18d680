"""An argv's passwords, as previews, audit details and recordings keep them (review14
finding 01): the flag words (`pass`, `passphrase`, `passin`, `passout`, `bearer`),
curl's `-E`/`--cert file:password`, my_getopt's cut `--pass=`, the programs it named
(openssl, gpg, zip, redis-cli, htpasswd, ldapsearch, docker login), a known program
behind the wrappers that run it, and a shell's `-c` script (best effort). What holds
no password is shown as it was (a recording replays it)."""

from __future__ import annotations

import json
import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.core.redaction import (
    MASK,
    args_for_replay,
    args_preview,
    argv_secrets,
    masked_detail,
    masked_message,
)

SECRET = "PW0secretValue"


def _all_three(argv: list[str]) -> list[list[str]]:
    """An argv as a preview, an audit detail and a recording keep it."""
    replay, _ = args_for_replay(json.dumps({"argv": argv}))
    assert replay is not None
    return [
        json.loads(args_preview(json.dumps({"argv": argv})))["argv"],
        masked_detail(argv),
        json.loads(replay)["argv"],
    ]


MASKED = [
    (
        ["curl", "--pass", SECRET, "--cert", "c.pem", "x"],
        ["curl", "--pass", MASK, "--cert", "c.pem", "x"],
    ),
    (["curl", "-E", f"c.pem:{SECRET}", "x"], ["curl", "-E", f"c.pem:{MASK}", "x"]),
    (["curl", f"-vEc.pem:{SECRET}", "x"], ["curl", f"-vEc.pem:{MASK}", "x"]),
    (["curl", "--cert", f"c.pem:{SECRET}", "x"], ["curl", "--cert", f"c.pem:{MASK}", "x"]),
    (["curl", "--proxy-pass", SECRET, "x"], ["curl", "--proxy-pass", MASK, "x"]),
    (["curl", "--oauth2-bearer", SECRET, "x"], ["curl", "--oauth2-bearer", MASK, "x"]),
    (["openssl", "enc", "-pass", f"pass:{SECRET}"], ["openssl", "enc", "-pass", MASK]),
    (["openssl", "req", "-passout", f"pass:{SECRET}"], ["openssl", "req", "-passout", MASK]),
    (["openssl", "enc", "-k", SECRET], ["openssl", "enc", "-k", MASK]),
    (["gpg", "--passphrase", SECRET, "-d", "f"], ["gpg", "--passphrase", MASK, "-d", "f"]),
    (["zip", "-P", SECRET, "a.zip", "f"], ["zip", "-P", MASK, "a.zip", "f"]),
    (["zip", f"-rP{SECRET}", "a.zip", "d"], ["zip", f"-rP{MASK}", "a.zip", "d"]),
    (["unzip", "-P", SECRET, "a.zip"], ["unzip", "-P", MASK, "a.zip"]),
    (["7z", "x", f"-p{SECRET}", "-spf", "a.7z"], ["7z", "x", f"-p{MASK}", "-spf", "a.7z"]),
    (["mysql", f"--pass={SECRET}", "db"], ["mysql", f"--pass={MASK}", "db"]),
    (["mysqldump", f"--pa={SECRET}", "db"], ["mysqldump", f"--pa={MASK}", "db"]),
    (["redis-cli", "-a", SECRET, "ping"], ["redis-cli", "-a", MASK, "ping"]),
    (["htpasswd", "-b", "f", "user", SECRET], ["htpasswd", "-b", "f", "user", MASK]),
    (["htpasswd", "-nbB", "user", SECRET], ["htpasswd", "-nbB", "user", MASK]),
    (
        ["ldapsearch", "-x", "-w", SECRET, "-D", "cn=a"],
        ["ldapsearch", "-x", "-w", MASK, "-D", "cn=a"],
    ),
    (["ldappasswd", "-a", SECRET, f"-s{SECRET}"], ["ldappasswd", "-a", MASK, f"-s{MASK}"]),
    (["docker", "login", "-p", SECRET, "-u", "me"], ["docker", "login", "-p", MASK, "-u", "me"]),
    (["docker", "-H", "h", "login", f"-p{SECRET}"], ["docker", "-H", "h", "login", f"-p{MASK}"]),
    (
        ["timeout", "5", "curl", "-u", f"me:{SECRET}", "x"],
        ["timeout", "5", "curl", "-u", MASK, "x"],
    ),
    (["env", "A=1", "curl", "-u", f"me:{SECRET}"], ["env", "A=1", "curl", "-u", MASK]),
    (["nice", "mysql", f"-p{SECRET}", "db"], ["nice", "mysql", f"-p{MASK}", "db"]),
    (
        ["sudo", "-u", "db", "--", "mysql", f"-p{SECRET}"],
        ["sudo", "-u", "db", "--", "mysql", f"-p{MASK}"],
    ),
    (["xargs", "-n", "1", "zip", "-P", SECRET], ["xargs", "-n", "1", "zip", "-P", MASK]),
    (["sh", "-c", f"curl -u me:{SECRET} x"], ["sh", "-c", f"curl -u '{MASK}' x"]),
    (
        ["bash", "-ec", f"cd d && mysql -p{SECRET} db | tee o"],
        ["bash", "-ec", f"cd d && mysql '-p{MASK}' db | tee o"],
    ),
    (
        ["sh", "-c", f"sh -c 'zip -P {SECRET} a f'"],
        ["sh", "-c", "sh -c 'zip -P '\"'\"'***'\"'\"' a f'"],
    ),
    (["env", "-S", f"curl -u me:{SECRET} x"], ["env", "-S", f"curl -u '{MASK}' x"]),
]


@pytest.mark.parametrize(
    ("argv", "kept"), MASKED, ids=lambda v: " ".join(v[:2]) if isinstance(v, list) else ""
)
def test_a_password_in_these_argv_shapes_is_masked(argv: list[str], kept: list[str]) -> None:
    assert _all_three(argv) == [kept] * 3


SHOWN = [
    ["curl", "--passive-ftp", "-XPUT", "x"],
    ["curl", "-E", "c.pem", "x"],  # a certificate with no password
    ["rsync", "--bypass", "a", "b"],
    ["docker", "run", "-p", "8080:80", "img"],  # -p is a port outside `login`
    ["openssl", "x509", "-in", "c.pem", "-noout", "-keyform", "PEM"],
    ["7z", "x", "-spf", "a.7z"],
    ["zip", "-r", "a.zip", "d"],
    ["htpasswd", "-c", "f", "user"],  # asks on the terminal
    ["mysql", "--pager=less", "--port=3306", "db"],
    ["timeout", "--signal", "KILL", "5", "ls", "-p", "x"],
    ["sh", "-c", "ls -la /tmp && echo done"],
    ["bash", "-c", "echo 'unclosed"],
    ["env", "LANG=C", "sort", "f"],
]


@pytest.mark.parametrize("argv", SHOWN, ids=lambda argv: " ".join(argv[:2]))
def test_an_argv_without_a_password_is_kept_as_it_was(argv: list[str]) -> None:
    assert _all_three(argv)[1:] == [argv, argv]
    assert MASK not in json.dumps(_all_three(argv)[0])


def test_a_long_script_is_masked_as_text_only() -> None:
    """A script past 4 KiB is not split into words (shlex is slow Python); what a text
    shows of a password (a flag word, NAME=value) is masked still."""
    script = "true; " * 700 + f"curl --pass {SECRET} -u me:{SECRET}x x"
    kept = masked_detail(["sh", "-c", script])
    assert f"--pass {SECRET}" not in kept[2]
    assert f"me:{SECRET}x" in kept[2]  # the documented limit


WRAPPERS = [
    ["timeout", "5"],
    ["timeout", "-s", "KILL", "5"],
    ["env", "A=1"],
    ["env", "-u", "HOME"],
    ["nice", "-n", "3"],
    ["nohup"],
    ["setsid"],
    ["stdbuf", "-o", "L"],
    ["ionice", "-c", "2"],
    ["taskset", "0x1"],
    ["chrt", "5"],
    ["time", "-f", "%e"],
    ["sudo", "-u", "root"],
    ["doas", "-u", "root"],
    ["xargs", "-n", "1"],
    ["/usr/bin/nice"],
]
COMMANDS = [
    (["curl", "-u", f"me:{SECRET}", "x"], 2),
    (["mysql", f"-Bp{SECRET}", "db"], 1),
    (["zip", "-P", SECRET, "a.zip"], 2),
    (["sshpass", "-p", SECRET, "ssh", "h"], 2),
]


@settings(max_examples=300, deadline=None)
@given(
    wrappers=st.lists(st.sampled_from(WRAPPERS), max_size=4),
    command=st.sampled_from(COMMANDS),
)
def test_a_known_program_behind_any_chain_of_wrappers_keeps_its_password_masked(
    wrappers: list[list[str]], command: tuple[list[str], int]
) -> None:
    argv = [word for wrapper in wrappers for word in wrapper] + command[0]
    for kept in _all_three(argv):
        assert SECRET not in json.dumps(kept), (argv, kept)
        assert len(kept) == len(argv)


def test_a_message_that_quotes_the_argv_in_its_own_words_is_masked_too() -> None:
    """The allowlist's refusal says "`curl -E c.pem:X https://x` fits rule …": the
    passwords the argv holds are masked wherever a message quotes them."""
    argv = ["curl", "-E", f"c.pem:{SECRET}", "-u", f"me:{SECRET}2", "x"]
    known = argv_secrets(json.dumps({"argv": argv}))
    assert set(known) == {SECRET, f"me:{SECRET}2"}
    message = f"`{shlex.join(argv)}` fits rule curl-get, but: unexpected 'c.pem:{SECRET}'"
    kept = masked_message(message, known)
    assert SECRET not in kept and "fits rule curl-get" in kept, kept
    detail = masked_detail({"tried": {"r": f"{SECRET} is no option"}}, known)
    assert SECRET not in json.dumps(detail)
    script = ["sh", "-c", f"zip -P {SECRET} a f; mysql -p{SECRET}3 db"]
    assert set(argv_secrets(json.dumps({"argv": script}))) == {SECRET, f"{SECRET}3"}
    assert argv_secrets(json.dumps({"argv": ["mysql", "-pab", "db"]})) == ()  # too short
    assert argv_secrets(json.dumps({"path": "x"})) == ()
    assert argv_secrets("[" * 5000) == ()


def test_scripts_are_read_up_to_a_share_per_call() -> None:
    """Args of a megabyte could hold hundreds of `sh -c` lists of 4 KiB, each split by
    slow Python: one preview, detail or recording reads 8 KiB of scripts in all, and
    shows the rest as any text is shown (the documented limit)."""
    scripts = [["sh", "-c", f"zip -P {SECRET}{n} a f; " + "true; " * 500] for n in range(3)]
    replay, redacted = args_for_replay(json.dumps({"lists": scripts}))
    assert replay is not None and redacted
    assert [f"{SECRET}{n} " in replay for n in range(3)] == [False, False, True]
    again, _ = args_for_replay(json.dumps({"lists": scripts[2:]}))  # a call of its own
    assert again is not None and SECRET not in again
