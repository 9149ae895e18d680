"""Policy files load strictly, test themselves, and layer with the strictest rule winning."""

from __future__ import annotations

from pathlib import Path

import pytest

from allowlist import (
    Policy,
    PolicyError,
    PolicyFile,
    Refusal,
    example_path_check,
    load_policy,
    load_text,
)

CAT = """
[program.cat]
paths = ["/usr/bin/cat"]

[[program.cat.rule]]
id = "cat-numbered"
reason = "prints files with line numbers"
flags = ["-n"]
positionals = ["read_path..."]
match = {match}
not_match = ["cat /etc/passwd"]
"""


def test_a_broken_example_refuses_the_policy_and_names_the_rule() -> None:
    with pytest.raises(PolicyError) as caught:
        load_text(CAT.format(match='["cat -n a", "cat -A a"]'), "mine.toml")
    message = str(caught.value)
    assert "mine.toml" in message and "rule cat-numbered" in message
    assert "'cat -A a' should match but does not: option -A is not allowed" in message


def test_a_not_match_example_that_matches_refuses_the_policy() -> None:
    text = CAT.format(match='["cat -n a"]').replace('"cat /etc/passwd"', '"cat -n b"')
    with pytest.raises(PolicyError, match="rule cat-numbered: example 'cat -n b' should not match"):
        load_text(text)


def test_a_deny_example_that_does_not_hit_refuses_the_policy() -> None:
    text = (
        CAT.format(match='["cat -n a"]')
        + """
[[program.cat.deny]]
id = "cat-no-v"
args = ["-v"]
reason = "no"
match = ["cat -n a"]
not_match = ["cat a"]
"""
    )
    with pytest.raises(PolicyError, match="deny cat-no-v: example 'cat -n a' should be forbidden"):
        load_text(text)


@pytest.mark.parametrize(
    ("fragment", "complaint"),
    [
        ('flagz = ["-n"]', "unknown key(s) ['flagz']"),
        ('options = ["-n=integer"]', "unknown kind 'integer'"),
        ('options = ["-n"]', "options are written NAME=KIND"),
        ('decision = "maybe"', "decision must be allow, ask or forbidden"),
        ('options = ["-name=int"]', "neither a short (-x) nor a long (--name) option"),
        ('after_double_dash = ["opaque...", "int"]', "positionals go required first"),
        ('require = ["--sandbox"]', "requires ['--sandbox'] but does not list them"),
    ],
)
def test_mistakes_in_a_rule_stop_the_load_with_a_useful_message(
    fragment: str, complaint: str
) -> None:
    text = CAT.format(match='["cat -n a"]').replace(
        'reason = "prints', f'{fragment}\nreason = "prints'
    )
    with pytest.raises(PolicyError) as caught:
        load_text(text)
    assert complaint in str(caught.value)


def test_programs_are_pinned_to_absolute_paths_and_named_bare() -> None:
    with pytest.raises(PolicyError, match="pinned paths must be absolute"):
        load_text('[program.cat]\npaths = ["bin/cat"]\n')
    with pytest.raises(PolicyError, match="bare name"):
        load_text('[program."/usr/bin/cat"]\npaths = ["/usr/bin/cat"]\n')
    with pytest.raises(PolicyError, match="has no pinned paths"):
        load_text("[program.cat]\n")


def test_user_rules_layer_on_the_default_and_the_strictest_wins(tmp_path: Path) -> None:
    mine = tmp_path / "allowlist.toml"
    mine.write_text(
        """
[program.git]
[[program.git.rule]]
id = "my-git-anything"
reason = "I trust my agent with git"
any_args = true
match = ["git -c core.pager=sh log", "git push"]
not_match = []

[[program.git.rule]]
id = "my-git-log-asks"
decision = "ask"
reason = "I want to see history reads"
subcommand = ["log"]
any_args = true
match = ["git log"]
not_match = ["git show"]
"""
    )
    policy = load_policy(mine)
    assert policy.sources == ("default policy", str(mine))
    push = policy.decide(["git", "push"], example_path_check)
    assert (push.verdict, push.rule_id) == ("allow", "my-git-anything")
    pager = policy.decide(["git", "-c", "core.pager=sh", "log"], example_path_check)
    assert pager.refusal == Refusal.FORBIDDEN, "a user rule must not undo a shipped denial"
    log = policy.decide(["git", "log", "-n", "1"], example_path_check)
    assert log.verdict == "ask"
    assert set(log.matched) == {"git-log", "my-git-anything", "my-git-log-asks"}
    config = policy.decide(["git", "config", "x", "y"], example_path_check)
    assert config.refusal == Refusal.FORBIDDEN


def test_a_user_file_may_set_its_own_paths_and_drop_the_default(tmp_path: Path) -> None:
    mine = tmp_path / "allowlist.toml"
    mine.write_text(
        """
[policy]
include_default = false

[program.cat]
paths = ["/opt/cat", "/usr/bin/cat"]
[[program.cat.rule]]
id = "cat"
reason = "plain cat"
positionals = ["read_path..."]
match = ["cat a"]
not_match = ["cat -n a"]
"""
    )
    policy = load_policy(mine)
    assert set(policy.programs) == {"cat"}
    assert policy.programs["cat"].paths == ("/opt/cat", "/usr/bin/cat")
    assert policy.decide(["cat", "a"], example_path_check).path == "/usr/bin/cat"


def test_rule_ids_are_unique_across_layers(tmp_path: Path) -> None:
    mine = tmp_path / "allowlist.toml"
    mine.write_text(
        '[program.cat]\n[[program.cat.rule]]\nid = "cat"\nreason = "again"\nany_args = true\n'
    )
    with pytest.raises(PolicyError, match="rule id 'cat' is used twice"):
        load_policy(mine)


def test_an_allowed_program_that_is_not_installed_is_not_allowed() -> None:
    policy = load_text(
        '[program.nothere]\npaths = ["/nonexistent/nothere"]\n'
        '[[program.nothere.rule]]\nid = "n"\nreason = "r"\nmatch = ["nothere"]\n'
    )
    decision = policy.decide(["nothere"], example_path_check)
    assert decision.refusal == Refusal.NOT_ALLOWED
    assert "not installed" in decision.reason and "/nonexistent/nothere" in decision.reason


def test_a_policy_file_is_loaded_once_per_version_and_an_edit_takes_effect(
    tmp_path: Path,
) -> None:
    """PolicyFile is the cache its owner keeps (the worker holds one): the same object
    while the file is unchanged, the new rules once it changes, a refusal while it is
    broken, never the looser default."""
    mine = tmp_path / "allowlist.toml"
    mine.write_text(CAT.format(match='["cat -n a"]'))
    policies = PolicyFile()
    first = policies.current(mine)
    assert policies.current(mine) is first, "unchanged: not parsed again"
    assert first.decide(["cat", "-n", "a"], example_path_check).verdict == "allow"
    mine.write_text("this is not toml [")
    with pytest.raises(PolicyError):
        policies.current(mine)
    with pytest.raises(PolicyError):
        policies.current(mine)
    mine.write_text(CAT.format(match='["cat -n a", "cat -n b"]'))
    fixed = policies.current(mine)
    assert fixed is not first
    assert PolicyFile().current(None).decide(["cat", "-n", "a"], example_path_check)


GREP = """
[program.grep]
paths = ["/usr/bin/grep"]
{program_walks}
flags = ["-r", "-n", "--recursive"]
options = ["-d=read|skip|recurse", "-f=read_path"]

[[program.grep.rule]]
id = "grep"
reason = "searches"
positionals = ["opaque", "read_path..."]
{rule_walks}

[[program.grep.rule]]
id = "grep-f"
reason = "searches with patterns from a file"
positionals = ["read_path..."]
require = ["-f"]
"""


def _grep(program_walks: str = "", rule_walks: str = "") -> Policy:
    return load_text(GREP.format(program_walks=program_walks, rule_walks=rule_walks), "mine.toml")


def test_walks_says_which_calls_search_folders_and_which_folders() -> None:
    policy = _grep('walks = ["-r", "--recursive", "-d=recurse"]')
    check = example_path_check
    for argv, searched in (
        ("grep -rn x src docs", ("src", "docs")),
        ("grep -nr x", (".",)),  # no path: where it runs
        ("grep -d recurse x a", ("a",)),
        ("grep -f pats -r", (".",)),  # -f names a file to read, not one to search
        ("grep --recursive -- x -y", ("-y",)),
    ):
        decision = policy.decide(argv.split(), check)
        assert decision.runs and decision.walks and decision.searched == searched, argv
    for argv in ("grep x a", "grep -d skip x a", "grep -f pats a"):
        decision = policy.decide(argv.split(), check)
        assert decision.runs and not decision.walks, argv


def test_walks_defaults_to_true_and_a_rule_may_say_otherwise() -> None:
    check = example_path_check
    assert _grep().decide(["grep", "x", "a"], check).walks
    policy = _grep("walks = true", "walks = false")
    assert not policy.decide(["grep", "x", "a"], check).walks
    assert policy.decide(["grep", "-f", "p"], check).walks


def test_walks_names_only_the_rules_own_flags() -> None:
    with pytest.raises(PolicyError) as caught:
        _grep('walks = ["-R"]')
    assert "walks names '-R', which is not one of its flags" in str(caught.value)
    with pytest.raises(PolicyError) as caught:
        _grep('walks = ["--exclude=x"]')
    assert "not one of its options" in str(caught.value)
    with pytest.raises(PolicyError):
        _grep('walks = "yes"')


def test_unix_sockets_is_a_programs_opt_in_a_later_file_may_change(tmp_path: Path) -> None:
    """socket(AF_UNIX) is refused in the sandbox unless the program's rule says
    unix_sockets = true (review8 findings 14 and 15); no shipped program says it."""
    assert not any(program.unix_sockets for program in load_policy(None).programs.values())
    mine = tmp_path / "allowlist.toml"
    mine.write_text("[program.cat]\nunix_sockets = true\n")
    assert load_policy(mine).programs["cat"].unix_sockets
    assert not load_policy(mine).programs["ls"].unix_sockets
    mine.write_text('[program.cat]\nunix_sockets = "yes"\n')
    with pytest.raises(PolicyError, match="unix_sockets"):
        load_policy(mine)
