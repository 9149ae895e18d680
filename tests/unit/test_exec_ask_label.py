"""An allowlist ask's name is kept at rest (a grant for the plan or agent in
state.db, the approval's audit row, a refusal's message, the hub's log): it names the
program, its count of arguments, the folder and the digest that binds the whole
command, and none of the arguments (review14 finding 01: masked argv there kept
every password the masking did not know). The prompt's note, never kept, shows the
command whole."""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime

import pytest

from worker.actions.host.exec_cmd import ask_about
from worker.core.ledger import _renamed_ask
from worker.core.scopes import ASK_PREFIX, Grant, ask_binding

SECRET = "s3cr3t-value"
FOLDER = "/w"

# The `ask` shapes of review14's reproducer, and the ones masked before it.
ASKED = (
    ["curl", "--pass", SECRET, "--cert", "c.pem", "https://x"],
    ["curl", "-E", f"c.pem:{SECRET}", "https://x"],
    ["curl", "--oauth2-bearer", SECRET, "https://x"],
    ["timeout", "5", "curl", "-u", f"me:{SECRET}", "https://x"],
    ["openssl", "enc", "-aes256", "-pass", f"pass:{SECRET}"],
    ["gpg", "--batch", "--passphrase", SECRET, "-d", "f.gpg"],
    ["zip", "-P", SECRET, "a.zip", "f"],
    ["curl", "-vu", f"me:{SECRET}", "https://x.test/"],
    ["mysql", f"-Bp{SECRET}", "db"],
    ["some-tool", f"--whatever={SECRET}", SECRET],
)


@pytest.mark.parametrize("argv", ASKED, ids=lambda argv: " ".join(argv[:2]))
def test_an_asks_name_holds_no_argument_of_its_command(argv: list[str]) -> None:
    what, note = ask_about("workerHost", argv, FOLDER, "the allowlist asks")
    digest = hashlib.sha256(json.dumps([argv, FOLDER]).encode()).hexdigest()
    count = len(argv) - 1
    assert what == f"workerHost.exec {argv[0]} ({count} args) in {FOLDER} (sha256 {digest})"
    assert SECRET not in what
    assert f"command: {' '.join(argv)}\n" in note  # the person sees what they approve, whole


def test_commands_that_differ_in_one_argument_are_asked_apart() -> None:
    one, _ = ask_about("workerHost", ["curl", "-u", "me:one", "x"], FOLDER, "asks")
    two, _ = ask_about("workerHost", ["curl", "-u", "me:two", "x"], FOLDER, "asks")
    assert one != two  # the same words, another digest: an approval of one is not the other's
    assert ask_binding(ASK_PREFIX + one) != ask_binding(ASK_PREFIX + two)
    elsewhere, _ = ask_about("workerHost", ["curl", "-u", "me:one", "x"], "/v", "asks")
    assert ask_binding(ASK_PREFIX + one) != ask_binding(ASK_PREFIX + elsewhere)
    bench, _ = ask_about("workbenchHost", ["curl", "-u", "me:one", "x"], FOLDER, "asks")
    assert ask_binding(ASK_PREFIX + one) != ask_binding(ASK_PREFIX + bench)


def _literal(value: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", value)  # as approvals keeps a grant's pattern


def _earlier_name(argv: list[str], label: str, cwd: str = FOLDER) -> str:
    """The name an ask had before review14: its argv masked, cut at 60 characters."""
    digest = hashlib.sha256(json.dumps([argv, cwd]).encode()).hexdigest()
    return f"workerHost.exec `{label}` in {cwd} (sha256 {digest})"


def test_a_grant_kept_under_an_asks_earlier_name_is_renamed_and_answers_it_still() -> None:
    argv = ["curl", "--pass", SECRET, "--cert", "c.pem", "https://x?a=[1]*"]
    earlier = _literal(ASK_PREFIX + _earlier_name(argv, f"curl --pass {SECRET} --cert c.pem 'x'"))
    renamed = _renamed_ask(earlier)
    assert renamed is not None and SECRET not in renamed, renamed
    what, _ = ask_about("workerHost", argv, FOLDER, "asks")
    assert renamed == _literal(ASK_PREFIX + what)  # the label held every argument
    grant = Grant("agent", renamed, "plan")
    now = datetime.now(UTC)
    assert grant.admits("agent", ASK_PREFIX + what, "plan", now)
    other, _ = ask_about("workerHost", [*argv, "more"], FOLDER, "asks")
    assert not grant.admits("agent", ASK_PREFIX + other, "plan", now)
    # The earlier name, kept as it was, answers the same ask too (the digest binds).
    assert Grant("agent", earlier, "plan").admits("agent", ASK_PREFIX + what, "plan", now)


def test_a_cut_earlier_name_is_renamed_without_a_count() -> None:
    argv = ["curl", "-u", "me:***", "--data", "x" * 80]
    cut = _literal(ASK_PREFIX + _earlier_name(argv, "curl -u 'me:***' --data xxxxxxxxxxxxxxxxxx…"))
    renamed = _renamed_ask(cut)
    assert renamed is not None and "me:" not in renamed and "--data" not in renamed, renamed
    assert renamed.startswith("ask:workerHost.exec curl (args not kept) in /w (sha256 ")
    assert _renamed_ask(renamed) is None  # a name of now is left as it is
    assert _renamed_ask("workerHost.fs_read") is None


# review15 05: exec's blob is the program's stdin, and for `python3 -`, `sh -s`, psql
# or `git apply` the stdin is the command. An ask binds it.
SCRIPT = b"print('the script the person was shown')\n"
OTHER = b"import pathlib; pathlib.Path('PWNED').write_text('x')\n"


def _with_stdin(stdin: bytes, argv: tuple[str, ...] = ("python3", "-")) -> tuple[str, str]:
    digest = hashlib.sha256(stdin).hexdigest() if stdin else None
    return ask_about("workerHost", list(argv), FOLDER, "asks", digest, len(stdin))


def test_an_asks_digest_binds_its_stdin() -> None:
    shown, note = _with_stdin(SCRIPT)
    other, _ = _with_stdin(OTHER)
    empty, _ = _with_stdin(b"")
    bindings = {ask_binding(ASK_PREFIX + name) for name in (shown, other, empty)}
    assert len(bindings) == 3  # another stdin, or none: another ask
    stdin = hashlib.sha256(SCRIPT).hexdigest()
    expected = hashlib.sha256(
        json.dumps([["python3", "-"], FOLDER, {"stdin_sha256": stdin}]).encode()
    ).hexdigest()
    assert shown == (
        f"workerHost.exec python3 (1 arg, {len(SCRIPT)} bytes of stdin) in {FOLDER} "
        f"(sha256 {expected})"
    )
    assert "print(" not in shown  # the name at rest holds none of the stdin
    # The prompt says what the stdin is: its size, its digest, that it is the input.
    assert f"\nstdin: {len(SCRIPT)} bytes, sha256 {stdin}: the program's input" in note
    assert "stdin: none" in _with_stdin(b"")[1]


def test_a_grant_kept_before_stdin_was_bound_answers_no_other_stdin() -> None:
    """A grant kept before review15 05 is bound to [argv, cwd] alone: it answers that
    command with no stdin (its digest is unchanged), never one with a stdin."""
    before = hashlib.sha256(json.dumps([["python3", "-"], FOLDER]).encode()).hexdigest()
    kept = Grant(
        "agent",
        _literal(f"{ASK_PREFIX}workerHost.exec python3 (1 arg) in {FOLDER} (sha256 {before})"),
        "plan",
    )
    now = datetime.now(UTC)
    for stdin in (SCRIPT, OTHER, b"\n"):
        name, _ = _with_stdin(stdin)
        assert not kept.admits("agent", ASK_PREFIX + name, "plan", now), stdin
    none, _ = _with_stdin(b"")
    assert kept.admits("agent", ASK_PREFIX + none, "plan", now)
    # And a grant for one stdin answers that stdin only.
    shown, _ = _with_stdin(SCRIPT)
    grant = Grant("agent", _literal(ASK_PREFIX + shown), "plan")
    assert grant.admits("agent", ASK_PREFIX + shown, "plan", now)
    for stdin in (OTHER, b"", SCRIPT + b" "):
        name, _ = _with_stdin(stdin)
        assert not grant.admits("agent", ASK_PREFIX + name, "plan", now), stdin
