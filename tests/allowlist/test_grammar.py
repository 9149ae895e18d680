"""The grammar reads an argument list the way the program will, or refuses it."""

from __future__ import annotations

import pytest

from allowlist import Grammar, NoMatchError, PathRefusedError, Slot, example_path_check
from allowlist._grammar import token_hits

LS = Grammar(
    flags=frozenset({"-l", "-a", "--all"}),
    options={"-w": "int", "--sort": ("size", "time"), "-I": "glob"},
    positionals=(Slot("read_path", "many"),),
)


def read(grammar: Grammar, line: str) -> tuple[object, ...]:
    reading = grammar.match(line.split(), example_path_check)
    return reading.flags, reading.values, reading.positionals, reading.after_double_dash


def test_short_flags_bundle_and_a_value_takes_the_rest_of_its_token() -> None:
    assert read(LS, "-la -w80 src") == (("-l", "-a"), (("-w", "80"),), ("src",), ())
    assert read(LS, "-law 80") == (("-l", "-a"), (("-w", "80"),), (), ())


def test_long_options_take_equals_or_the_next_argument() -> None:
    assert read(LS, "--sort=time --sort size")[1] == (("--sort", "time"), ("--sort", "size"))


def test_options_may_follow_positionals_until_double_dash() -> None:
    assert read(LS, "src -l -- -a --all") == (("-l",), (), ("src",), ("-a", "--all"))


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("-lx", "option -x (in -lx) is not allowed"),
        ("--sort=name", "the value of --sort must be one of: size, time"),
        ("--all=yes", "option --all takes no value"),
        (  # no abbreviations, ever
            "--al",
            "option --al is not allowed: the program would read it as an abbreviation of "
            "--all, and abbreviations are never admitted; write the option in full",
        ),
        ("-w", "option -w needs a value"),
        ("-w ten", "the value of -w must be a whole number"),
    ],
)
def test_anything_outside_the_grammar_is_refused_with_the_reason(line: str, why: str) -> None:
    with pytest.raises(NoMatchError) as caught:
        LS.match(line.split(), example_path_check)
    assert caught.value.reason == why


def test_a_file_named_like_an_option_is_a_file_only_after_double_dash() -> None:
    assert read(LS, "-- -rf --output=/x")[3] == ("-rf", "--output=/x")
    with pytest.raises(NoMatchError):
        LS.match(["-rf"], example_path_check)


def test_paths_outside_the_shared_folder_are_refused_as_paths() -> None:
    for path in ("/etc/passwd", "../x", "a/../../x"):
        with pytest.raises(PathRefusedError) as caught:
            LS.match([path], example_path_check)
        assert caught.value.path == path
    assert read(LS, "a/../b /shared/c -")[2] == ("a/../b", "/shared/c", "-")


def test_option_values_of_a_path_kind_are_checked_too() -> None:
    grep = Grammar(options={"-f": "read_path"}, positionals=(Slot("read_path", "many"),))
    with pytest.raises(PathRefusedError):
        grep.match(["-f/etc/shadow"], example_path_check)


def test_write_paths_are_checked_as_writes() -> None:
    seen: list[tuple[str, bool]] = []

    def check(path: str, write: bool) -> None:
        seen.append((path, write))

    Grammar(positionals=(Slot("read_path"), Slot("write_path"))).match(["a", "b"], check)
    assert seen == [("a", False), ("b", True)]


def test_positional_counts_follow_the_slots() -> None:
    two = Grammar(positionals=(Slot("opaque"), Slot("int", "optional")))
    two.match(["x"], example_path_check)
    two.match(["x", "3"], example_path_check)
    for args in ([], ["x", "3", "4"], ["x", "y"]):
        with pytest.raises(NoMatchError):
            two.match(args, example_path_check)


def test_subcommand_words_come_first_and_may_have_alternatives() -> None:
    git = Grammar(subcommand=("log|show",), flags=frozenset({"-p"}))
    git.match(["show", "-p"], example_path_check)
    for args in (["-p", "log"], ["push"], []):
        with pytest.raises(NoMatchError):
            git.match(args, example_path_check)


def test_required_options_must_be_present() -> None:
    sed = Grammar(flags=frozenset({"--sandbox", "-n"}), require=(frozenset({"--sandbox"}),))
    sed.match(["-n", "--sandbox"], example_path_check)
    with pytest.raises(NoMatchError, match="needs --sandbox"):
        sed.match(["-n"], example_path_check)


def test_single_dash_style_reads_whole_words_and_paths_first() -> None:
    find = Grammar(
        style="single_dash",
        flags=frozenset({"-print", "("}),
        options={"-name": "glob", "-newer": "read_path"},
        positionals=(Slot("read_path", "many"),),
    )
    reading = find.match([".", "src", "(", "-name", "-x", "-print"], example_path_check)
    assert reading.positionals == (".", "src")
    assert reading.values == (("-name", "-x"),)
    for args in ([".", "-name", "x", "other"], ["-exec"], [".", "-newer", "/etc/passwd"], ["--"]):
        with pytest.raises(NoMatchError):
            find.match(args, example_path_check)


def test_any_args_admits_everything_after_the_subcommand() -> None:
    Grammar(subcommand=("config",), any_args=True).match(["config", "-x", "/"], example_path_check)


@pytest.mark.parametrize(
    ("entry", "arg", "hit"),
    [
        ("--pre", "--pre=sh", True),
        ("--pre", "--pr", True),  # an abbreviation getopt_long would expand
        ("--pre", "--pre-glob", False),
        ("--pre", "--no-pre", False),
        ("--pre", "--", False),
        ("-i", "-ni", True),
        ("-i", "-i.bak", True),
        ("-i", "--in-place", False),
        ("-i", "file-i", False),
        ("-exec", "-exec", True),
        ("-exec", "-execdir", False),
    ],
)
def test_denied_arguments_are_found_in_every_spelling(entry: str, arg: str, hit: bool) -> None:
    assert token_hits(entry, arg) is hit


def test_options_first_style_ends_the_options_at_the_first_positional() -> None:
    """For programs that stop reading options at their first operand (xxd): a later
    `-p` is a second operand (xxd's output file), never a flag."""
    xxd = Grammar(
        style="options_first",
        flags=frozenset({"-p", "-u"}),
        options={"-c": "int"},
        positionals=(Slot("read_path", "optional"),),
    )
    reading = xxd.match(["-pu", "-c16", "a.bin"], example_path_check)
    assert (reading.flags, reading.values, reading.positionals) == (
        ("-p", "-u"),
        (("-c", "16"),),
        ("a.bin",),
    )
    for args in (["a.bin", "-p"], ["a.bin", "-c16"], ["a.bin", "--", "-p"]):
        with pytest.raises(NoMatchError, match="at most 1"):
            xxd.match(args, example_path_check)


def test_an_abbreviation_is_refused_naming_the_option_the_program_would_read() -> None:
    with pytest.raises(NoMatchError) as refused:
        read(LS, "--so=time src")
    assert "abbreviation of --sort" in refused.value.reason
    assert "write the option in full" in refused.value.reason
    two = Grammar(flags=frozenset({"--all", "--alpha"}))
    with pytest.raises(NoMatchError, match="abbreviation of --all or --alpha"):
        read(two, "--al")
    with pytest.raises(NoMatchError, match=r"option --bogus is not allowed$"):
        read(two, "--bogus")


GIT_DIFF = Grammar(
    flags=frozenset({"--cached"}),
    options={"-U": "int", "--unified": "int"},
    positionals=(Slot("git_rev", "many"),),
    optional=frozenset({"-U", "--unified"}),
)


def test_an_optional_value_is_only_ever_attached_as_git_reads_it() -> None:
    assert read(GIT_DIFF, "-U5 HEAD") == ((), (("-U", "5"),), ("HEAD",), ())
    assert read(GIT_DIFF, "--unified=2") == ((), (("--unified", "2"),), (), ())
    # Alone it is a flag, and the next token a revision or path, checked as one.
    assert read(GIT_DIFF, "-U 5") == (("-U",), (), ("5",), ())
    assert read(GIT_DIFF, "--unified HEAD") == (("--unified",), (), ("HEAD",), ())
    with pytest.raises(PathRefusedError):
        read(GIT_DIFF, "-U /etc/passwd")
    with pytest.raises(NoMatchError, match="the value of -U"):
        read(GIT_DIFF, "-Uabc")
