"""locate(): mapping a caller's path to a root, by text alone (no file system access)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox import ConfinementError, Located, Problem, Root, locate

HOME = Root(Path("/home/u"), writable=False)
PROJECT = Root(Path("/home/u/project"), writable=True)
NOTES = Root(Path("/srv/notes"), writable=True)
ROOTS = [PROJECT, HOME, NOTES]


def refused(path: str, roots: list[Root] = ROOTS, *, write: bool = False) -> ConfinementError:
    with pytest.raises(ConfinementError) as caught:
        locate(roots, path, write=write)
    assert caught.value.problem == Problem.OUTSIDE
    return caught.value


@pytest.mark.parametrize(
    ("path", "root", "relative"),
    [
        ("/home/u/project/src/main.py", PROJECT, "src/main.py"),
        ("/home/u/project", PROJECT, "."),
        ("/home/u/project/", PROJECT, "."),
        ("/home/u/other/x", HOME, "other/x"),
        ("/home/u", HOME, "."),
        ("/srv/notes/a.md", NOTES, "a.md"),
        ("/home/u/project2/x", HOME, "project2/x"),  # a sibling, not a child, of the project
        ("/home/u/./project//src/", PROJECT, "src"),
        ("/home/u/project/../project/x", PROJECT, "x"),
        ("/home/u/project/../secret", HOME, "secret"),  # lexically under /home/u only
    ],
)
def test_absolute_paths_go_to_the_longest_root(path: str, root: Root, relative: str) -> None:
    assert locate(ROOTS, path) == Located(root=root, relative=relative)


def test_the_order_of_roots_does_not_change_the_longest_match() -> None:
    assert locate([HOME, PROJECT], "/home/u/project/x").root == PROJECT
    assert locate([PROJECT, HOME], "/home/u/project/x").root == PROJECT


@pytest.mark.parametrize(
    ("path", "relative"),
    [
        ("src/main.py", "src/main.py"),
        ("./src//main.py/", "src/main.py"),
        (".", "."),
        ("src/../README", "README"),
        ("a/b/../../c", "c"),
    ],
)
def test_relative_paths_go_to_the_first_root(path: str, relative: str) -> None:
    assert locate(ROOTS, path) == Located(root=PROJECT, relative=relative)
    assert locate([NOTES, PROJECT], path).root == NOTES


@pytest.mark.parametrize("path", ["..", "../x", "../../etc/passwd", "a/../../x", "./../project"])
def test_dot_dot_cannot_climb_out(path: str) -> None:
    error = refused(path)
    assert "'..'" in error.message


@pytest.mark.parametrize("path", ["/etc/passwd", "/home", "/home/user/x", "/", "/srv/notes2/x"])
def test_absolute_paths_outside_every_root(path: str) -> None:
    error = refused(path)
    assert "outside every shared folder" in error.message
    assert "/srv/notes" in error.message  # says where paths may go


@pytest.mark.parametrize("path", ["/home/u/project/../../../etc/passwd", "/../../etc/shadow"])
def test_dot_dot_in_absolute_paths_is_resolved_before_matching(path: str) -> None:
    refused(path)


@pytest.mark.parametrize("path", ["~", "~/x", "~root/.ssh/id_rsa", "~/../../etc"])
def test_tilde_is_refused(path: str) -> None:
    assert "'~'" in refused(path).message


def test_tilde_later_in_a_path_is_a_name() -> None:
    assert locate(ROOTS, "a/~/b").relative == "a/~/b"
    assert locate(ROOTS, "a~").relative == "a~"


@pytest.mark.parametrize("path", ["%2e%2e/x", "%2e%2e%2f%2e%2e%2fetc", "..%2f..%2fetc", "%2E%2E"])
def test_percent_encoding_is_never_decoded(path: str) -> None:
    assert locate(ROOTS, path) == Located(root=PROJECT, relative=path)


@pytest.mark.parametrize(
    "path", ["..\\..\\etc", "..\\..\\etc\\passwd", "\\etc\\passwd", "C:\\Windows", "\\\\server\\x"]
)
def test_backslashes_are_literal(path: str) -> None:
    # One name, with backslashes in it, beneath the first root.
    assert locate(ROOTS, path) == Located(root=PROJECT, relative=path)


def test_backslash_and_slash_mixed() -> None:
    assert locate(ROOTS, "a\\..\\b/../c").relative == "c"
    refused("..\\x/../../y")


def test_nul_bytes_are_refused() -> None:
    error = refused("src/main.py\0.txt")
    assert "NUL" in error.message
    refused("\0")


def test_long_paths_are_refused() -> None:
    longest = "a" * 4095
    assert locate(ROOTS, longest).relative == longest
    error = refused("a" * 4096)
    assert "4096 bytes" in error.message
    assert len(error.message) < 300  # the path is shortened, not echoed in full
    refused("é" * 2048)  # 4,096 bytes in UTF-8, though only 2,048 characters


def test_unencodable_text_is_refused() -> None:
    refused("bad\ud800name")


def test_empty_path_is_refused() -> None:
    refused("")


def test_read_only_roots_refuse_writes() -> None:
    assert locate(ROOTS, "/home/u/notes.txt").root == HOME
    error = refused("/home/u/notes.txt", write=True)
    assert "read-only" in error.message
    assert 'mode = "rw"' in error.message
    assert locate(ROOTS, "/home/u/project/x", write=True).root == PROJECT
    refused("x", [HOME, PROJECT], write=True)


def test_no_roots_says_how_to_add_one() -> None:
    error = refused("x", [])
    assert "[[root]]" in error.message
    assert "config.toml" in error.message
    assert "path" in error.message
    assert "mode" in error.message


def test_messages_name_the_callers_path() -> None:
    assert "'/etc/passwd'" in refused("/etc/passwd").message
    assert "'src/main.py\\x00'" in refused("src/main.py\0").message


def test_root_paths_must_be_absolute() -> None:
    with pytest.raises(ValueError, match="absolute"):
        Root(Path("relative/dir"), writable=True)
    with pytest.raises(ValueError, match="absolute"):
        Root(Path("/a/../b"), writable=True)


def test_the_filesystem_root_as_a_root() -> None:
    everything = Root(Path("/"), writable=False)
    assert locate([everything], "/etc/passwd") == Located(everything, "etc/passwd")
    assert locate([everything], "/") == Located(everything, ".")
    assert locate([everything], "/..") == Located(everything, ".")


def test_unknown_problems_are_a_programming_error() -> None:
    with pytest.raises(ValueError, match="not a valid Problem"):
        ConfinementError("oops", "x")


def test_a_relative_path_into_a_nested_root_obeys_that_root() -> None:
    """A read-only folder shared inside a read-write one stays read-only, however the
    path into it is written; and a read-write one inside a read-only one is writable."""
    shared = Root(Path("/home/u"), writable=True)
    docs = Root(Path("/home/u/docs"), writable=False)
    assert locate([shared, docs], "docs/x") == Located(root=docs, relative="x")
    assert "read-only" in refused("docs/x", [shared, docs], write=True).message
    assert "read-only" in refused("a/../docs/x", [shared, docs], write=True).message
    assert locate([HOME, PROJECT], "project/x", write=True) == Located(PROJECT, "x")
