"""sandbox.listing: bounded, sorted, never entering a symlink."""

from __future__ import annotations

import os
import stat

from sandbox import ConfinedDir, ConfinementError, Problem, list_tree
from tests.sandbox.support import Tree
from tests.sandbox.test_paths import unprivileged


def paths(root: ConfinedDir, relative: str = ".", **options: object) -> list[str]:
    return [entry.path for entry in list_tree(root, relative, **options).entries]  # type: ignore[arg-type]


def test_lists_one_level_sorted(confined: ConfinedDir) -> None:
    assert paths(confined) == ["data.txt", "sub"]


def test_depth_descends_into_real_folders(tree: Tree, confined: ConfinedDir) -> None:
    (tree.root / "sub" / "deeper").mkdir()
    (tree.root / "sub" / "deeper" / "x").write_text("x")
    assert paths(confined, depth=2) == ["data.txt", "sub", "sub/deeper", "sub/inner.txt"]
    assert paths(confined, depth=3)[-2:] == ["sub/deeper/x", "sub/inner.txt"]
    assert paths(confined, "sub") == ["deeper", "inner.txt"]


def test_hidden_names_only_on_request(tree: Tree, confined: ConfinedDir) -> None:
    (tree.root / ".env").write_text("KEY=1")
    assert ".env" not in paths(confined)
    assert ".env" in paths(confined, hidden=True)


def test_symlinks_are_reported_and_never_entered(tree: Tree, confined: ConfinedDir) -> None:
    (tree.root / "out").symlink_to(tree.outside)
    (tree.root / "in").symlink_to("sub")
    listing = list_tree(confined, ".", depth=5)
    names = [entry.path for entry in listing.entries]
    assert "out" in names and "in" in names
    assert not any(name.startswith(("out/", "in/")) for name in names)
    assert not any("secret" in name for name in names)


def test_limit_truncates(tree: Tree, confined: ConfinedDir) -> None:
    for i in range(20):
        (tree.root / f"f{i:02}").write_text("")
    listing = list_tree(confined, ".", limit=5)
    assert [e.path for e in listing.entries] == ["data.txt", "f00", "f01", "f02", "f03"]
    assert listing.truncated
    assert not list_tree(confined, ".", limit=22).truncated


def test_scan_limit_bounds_a_huge_folder(tree: Tree, confined: ConfinedDir) -> None:
    for i in range(50):
        (tree.root / f"n{i:02}").write_text("")
    listing = list_tree(confined, ".", limit=1000, scan_limit=10)
    assert len(listing.entries) == 10 and listing.truncated


def test_listing_outside_or_a_file_is_refused(tree: Tree, confined: ConfinedDir) -> None:
    (tree.root / "out").symlink_to(tree.outside)
    for path, code in (("out", Problem.OUTSIDE), ("data.txt", Problem.NOT_A_FOLDER)):
        try:
            list_tree(confined, path)
        except ConfinementError as exc:
            assert exc.problem == code
        else:
            raise AssertionError(f"{path} was listed")


def test_an_unreadable_folder_is_reported_not_fatal(tree: Tree, confined: ConfinedDir) -> None:
    os.mkfifo(tree.root / "pipe")  # listed, never opened
    tree.root.chmod(0o755)
    (tree.root / "sub").chmod(0)

    def check() -> None:
        entries = {e.path: e for e in list_tree(confined, ".", depth=2).entries}
        assert entries["sub"].error == Problem.DENIED, entries["sub"]
        assert entries["pipe"].error is None and "data.txt" in entries

    try:
        unprivileged(check)
    finally:
        (tree.root / "sub").chmod(0o755)


def test_a_row_function_makes_what_is_kept_and_a_full_listing_stops_the_walk(
    tree: Tree, confined: ConfinedDir
) -> None:
    for folder in ("a", "b"):
        (tree.root / folder).mkdir()
        for i in range(3):
            (tree.root / folder / f"f{i}").write_text("x" * i)
    seen: list[str] = []

    def row(path: str, name: str, st: os.stat_result, error: object) -> tuple[object, ...]:
        seen.append(path)
        return (path, name, st.st_size if stat.S_ISREG(st.st_mode) else "dir", error)

    listing = list_tree(confined, ".", depth=2, limit=3, row=row)
    assert listing.entries == [
        ("a", "a", "dir", None),
        ("a/f0", "f0", 0, None),
        ("a/f1", "f1", 1, None),
    ]
    assert listing.truncated and seen == ["a", "a/f0", "a/f1"], "nothing made past the limit"
    full = list_tree(confined, ".", depth=2, limit=11, row=row)
    assert len(full.entries) == 11 and not full.truncated  # a, 3, b, 3, data.txt, sub, 1


def test_withheld_folders_are_never_listed(tree: Tree) -> None:
    (tree.root / "own" / "deeper").mkdir(parents=True)
    (tree.root / "sub" / "own.db").write_text("x")
    withheld = [tree.root / "own", tree.root / "sub" / "own.db"]
    with ConfinedDir(tree.root, withheld=withheld) as confined:
        assert paths(confined, depth=3, hidden=True) == ["data.txt", "sub", "sub/inner.txt"]
