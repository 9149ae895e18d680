"""The shipped policy: read-only tools, no shells, and every injection refused."""

from __future__ import annotations

import pytest

from allowlist import Decision, Policy, Refusal, example_path_check, load_policy

SHELLS_AND_INTERPRETERS = (
    "sh", "bash", "dash", "zsh", "python", "python3", "perl", "ruby", "node", "env", "xargs",
    "awk", "gawk", "tar", "make", "ssh", "nice", "timeout", "nohup", "less", "vi",
)  # fmt: skip


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy()


def decide(policy: Policy, *argv: str) -> Decision:
    return policy.decide(argv, example_path_check)


def test_every_shipped_rule_has_examples_and_they_hold_at_load(policy: Policy) -> None:
    # load_policy() checked them all; here: none is missing its examples.
    for rule in policy.rules():
        assert rule.match and rule.not_match, f"rule {rule.id} needs match and not_match"
    for deny in policy.denies():
        assert deny.match and deny.not_match, f"deny {deny.id} needs match and not_match"
    examples = sum(len(r.match) + len(r.not_match) for r in policy.rules())
    assert examples > 150


def test_the_default_is_read_only_tools_without_shells_or_interpreters(policy: Policy) -> None:
    assert {"ls", "cat", "head", "tail", "wc", "grep", "rg", "find", "git"} <= set(policy.programs)
    assert not set(SHELLS_AND_INTERPRETERS) & set(policy.programs)
    for program in policy.programs.values():
        assert program.paths and all(path.startswith("/") for path in program.paths)
        assert not program.network, f"{program.name} should not get the network by default"


@pytest.mark.parametrize(
    ("argv", "refusal", "rule"),
    [
        (("git", "-c", "core.pager=sh", "log"), Refusal.FORBIDDEN, "git-global-options"),
        (("git", "-C", "/", "log"), Refusal.FORBIDDEN, "git-global-options"),
        (("git", "-ccore.pager=sh", "log"), Refusal.FORBIDDEN, "git-global-options"),
        (("git", "diff", "--output=/tmp/x"), Refusal.FORBIDDEN, "git-running-options"),
        (("git", "config", "core.fsmonitor", "sh"), Refusal.FORBIDDEN, "git-config-changes"),
        (("find", ".", "-exec", "sh", "-c", "id", ";"), Refusal.FORBIDDEN, "find-actions"),
        (("find", ".", "-delete"), Refusal.FORBIDDEN, "find-actions"),
        (("rg", "--pre=sh", "x"), Refusal.FORBIDDEN, "rg-preprocessor"),
        (("rg", "--pre", "sh", "x"), Refusal.FORBIDDEN, "rg-preprocessor"),
        (("sed", "-i", "s/a/b/", "f"), Refusal.FORBIDDEN, "sed-in-place"),
        (("sed", "-ni", "p", "f"), Refusal.FORBIDDEN, "sed-in-place"),
        (("sort", "--compress-program=sh", "f"), Refusal.FORBIDDEN, "sort-compress-program"),
    ],
)
def test_injections_through_options_are_forbidden_with_the_rules_reason(
    policy: Policy, argv: tuple[str, ...], refusal: Refusal, rule: str
) -> None:
    decision = decide(policy, *argv)
    assert (decision.refusal, decision.rule_id) == (refusal, rule)
    program = policy.programs[argv[0]]
    justification = {item.id: item.reason for item in (*program.rules, *program.denies)}[rule]
    assert justification in decision.reason


@pytest.mark.parametrize(
    "argv",
    [
        ("ls", "-rf"),  # -f is not an ls flag this policy admits
        ("cat", "--output=/x"),
        ("ls", "-la", "--hide=x", "--color=always"),
        ("grep", "-r", "--include=*.py", "-e"),  # -e needs a value
        ("sed", "e id", "f"),  # GNU sed's e command: --sandbox is required
        ("sed", "1e id", "f"),
        ("tail", "-f", "log"),
        ("git", "branch", "new-branch"),
        ("git", "stash"),
        ("git", "push", "origin", "main"),
        ("uniq", "in.txt", "out.txt"),
        # xxd stops reading options at its input file: the next argument is a file it writes
        ("xxd", "a.bin", "-p"),
        ("xxd", "a.bin", "-s../victim"),
        ("sha256sum", "-c", "sums"),
    ],
)
def test_forms_outside_every_rule_are_not_allowed(policy: Policy, argv: tuple[str, ...]) -> None:
    decision = decide(policy, *argv)
    assert decision.refusal == Refusal.NOT_ALLOWED, decision
    assert decision.reason.startswith("no rule allows")


def test_sed_runs_only_in_its_own_sandbox_mode(policy: Policy) -> None:
    decision = decide(policy, "sed", "--sandbox", "1e id", "f")
    assert decision.verdict == "allow"  # GNU sed itself refuses e, r and w under --sandbox


@pytest.mark.parametrize("argv0", ["/tmp/git", "./git", "../bin/git", "/usr/bin/git", "git/"])
def test_argv0_must_be_a_bare_name(policy: Policy, argv0: str) -> None:
    decision = decide(policy, argv0, "log")
    assert decision.refusal == Refusal.NOT_ALLOWED
    assert "bare program name" in decision.reason


def test_a_bare_name_runs_the_pinned_path(policy: Policy) -> None:
    decision = decide(policy, "git", "log", "--oneline", "-n", "3")
    assert decision.verdict == "allow"
    assert decision.path in policy.programs["git"].paths
    assert decision.rule_id == "git-log"


@pytest.mark.parametrize(
    "argv",
    [
        ("cat", "/etc/passwd"),
        ("grep", "-r", "secret", "/"),
        ("git", "log", "--", "../../etc"),
        ("find", ".", "-newer", "/etc/shadow"),
        ("head", "-n", "1", "/shared/../etc/passwd"),
    ],
)
def test_paths_outside_the_shared_folders_are_path_not_allowed(
    policy: Policy, argv: tuple[str, ...]
) -> None:
    assert decide(policy, *argv).refusal == Refusal.PATH_REFUSED


def test_file_names_that_look_like_options_are_files_after_double_dash(policy: Policy) -> None:
    for argv in (("ls", "--", "-rf"), ("cat", "--", "--output=/x"), ("grep", "x", "--", "-rf")):
        assert decide(policy, *argv).verdict == "allow", argv


def test_denied_arguments_are_refused_even_after_double_dash(policy: Policy) -> None:
    """find reads its expression past `--`; deny entries err the same way for every program."""
    assert decide(policy, "find", "--", ".", "-exec", "id", ";").refusal == Refusal.FORBIDDEN
    assert decide(policy, "rg", "--", "--pre=sh").refusal == Refusal.FORBIDDEN


def test_shell_metacharacters_are_just_text(policy: Policy) -> None:
    text = "a; rm -rf / && b | c $(id) `id`\nnext"
    assert decide(policy, "echo", text).verdict == "allow"
    assert decide(policy, "grep", "-rn", text, ".").verdict == "allow"


def test_unknown_programs_name_the_allowed_ones(policy: Policy) -> None:
    decision = decide(policy, "python3", "-c", "print(1)")
    assert decision.refusal == Refusal.NOT_ALLOWED
    assert "Allowed programs: " in decision.reason and "git" in decision.reason


def test_no_abbreviation_of_a_shipped_long_option_is_admitted() -> None:
    """The differential test's abbreviated lists (tests/integration/test_exec_tracer.py),
    put to the shipped policy: getopt and git would expand each, so each is refused,
    and the refusal names the option it abbreviates."""
    from tests.integration.test_exec_tracer import abbreviated

    policy = load_policy(None)
    tried = 0
    for rule in policy.rules():
        for argv in abbreviated(rule):
            decision = policy.decide(argv, example_path_check)
            assert not decision.runs, argv
            if rule.decision != "forbidden":
                assert f"abbreviation of {argv[-1]}" in decision.reason, (argv, decision.reason)
            tried += 1
    assert tried > 100, tried
