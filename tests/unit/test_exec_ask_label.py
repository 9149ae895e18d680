"""An allowlist ask's name is kept at rest (a grant for the plan or agent in
state.db, the approval's audit row, a denial's message): it names the command with
its passwords masked, while its digest binds the command itself and the prompt's
note shows it whole to the person."""

from __future__ import annotations

from worker.actions.host.exec_cmd import ask_about
from worker.core.redaction import MASK

SECRET = "s3cr3t-value"


def test_an_asks_name_masks_the_passwords_its_command_holds() -> None:
    for argv in (
        ["curl", "-vu", f"me:{SECRET}", "https://x.test/"],
        ["mysql", f"-Bp{SECRET}", "db"],
        ["sshpass", "-p", SECRET, "ssh", "h"],
        ["grep", f"--password={SECRET}", "."],
    ):
        what, note = ask_about("workerHost", argv, "/w", "the allowlist asks")
        assert SECRET not in what and MASK in what, what
        assert SECRET in note  # the person sees what they approve, whole


def test_commands_that_differ_in_a_masked_password_are_asked_apart() -> None:
    one, _ = ask_about("workerHost", ["curl", "-u", "me:one", "x"], "/w", "asks")
    two, _ = ask_about("workerHost", ["curl", "-u", "me:two", "x"], "/w", "asks")
    assert one != two  # the same label, another digest: an approval of one is not the other's
    assert one.split(" (sha256")[0] == two.split(" (sha256")[0]
