"""Which files an exec's arguments name, and what binds each (review16 F7): the
regular files in the shared folders, by contents while small, else by identity;
never a FIFO, a device, a folder or a file outside, and never more read than the cap.
What cannot be bound fails closed (review18 F1): a folder by its listing, and the rest
(past the 64th argument, through /proc or /dev, a link out, a FIFO) by a nonce: the
approval answers that call only."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from sandbox import Root
from worker.actions.host import exec_arg_files
from worker.actions.host.exec_arg_files import arg_files


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / "script.py").write_text("print('hi')\n")
    (folder / "lib").mkdir()
    (folder / "lib" / "p.diff").write_text("--- a\n+++ b\n")
    return folder.resolve()


def _found(shared: Path, argv: list[str]) -> list[tuple[int, str, str]]:
    roots = [Root(path=shared, writable=True)]
    return [
        (f.index, f.path, f.sha256) for f in arg_files(roots, str(shared), argv) if f.kind == "file"
    ]


def _kinds(shared: Path, argv: list[str]) -> list[tuple[int, str]]:
    roots = [Root(path=shared, writable=True)]
    return [(f.index, f.kind) for f in arg_files(roots, str(shared), argv)]


def _bound(shared: Path, argv: list[str]) -> list[dict[str, object]]:
    roots = [Root(path=shared, writable=True)]
    return [f.bound() for f in arg_files(roots, str(shared), argv)]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_relative_absolute_and_option_values_are_bound_by_contents(shared: Path) -> None:
    argv = ["python3", "script.py", "-v", f"--patch={shared}/lib/p.diff", "lib/p.diff", "lib"]
    assert _found(shared, argv) == [
        (1, "script.py", _sha(shared / "script.py")),
        (3, f"{shared}/lib/p.diff", _sha(shared / "lib" / "p.diff")),
        (4, "lib/p.diff", _sha(shared / "lib" / "p.diff")),
    ]  # -v names nothing, lib is a folder


def test_nothing_outside_the_shared_folders_nor_anything_but_a_regular_file(
    shared: Path, tmp_path: Path
) -> None:
    (tmp_path / "outside.py").write_text("x")
    os.symlink(tmp_path / "outside.py", shared / "out.py")
    os.mkfifo(shared / "fifo")  # opened for reading, it would block the thread for ever
    argv = ["sh", str(tmp_path / "outside.py"), "out.py", "fifo", "/proc/self/environ", "/dev/zero"]
    assert _found(shared, argv) == []


def test_a_symlink_inside_is_bound_to_what_it_leads_to(shared: Path) -> None:
    (shared / "b.py").write_text("print('other')\n")
    os.symlink("script.py", shared / "run.py")
    before = _found(shared, ["python3", "run.py"])
    os.replace(shared / "run.py", shared / "old")
    os.symlink("b.py", shared / "run.py")
    assert before != _found(shared, ["python3", "run.py"])
    assert _found(shared, ["python3", "run.py"])[0][2] == _sha(shared / "b.py")


def test_past_the_cap_a_file_is_bound_by_its_identity_not_read(
    shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(exec_arg_files, "HASHED_FILE_BYTES", 8)
    roots = [Root(path=shared, writable=True)]
    (first,) = arg_files(roots, str(shared), ["python3", "script.py"])
    assert first.sha256 == "" and first.identity and "too large" in first.line()
    again = arg_files(roots, str(shared), ["python3", "script.py"])
    assert again == (first,)
    (shared / "script.py").write_text("print('HI')\n")  # the same size, another file
    assert arg_files(roots, str(shared), ["python3", "script.py"]) != (first,)


def test_what_is_read_in_all_is_bounded(shared: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exec_arg_files, "HASHED_BYTES", 20)
    roots = [Root(path=shared, writable=True)]
    found = arg_files(roots, str(shared), ["cat", "script.py", "lib/p.diff"])
    assert [bool(f.sha256) for f in found] == [True, False]  # 12 bytes read, 12 more past 20


def test_what_cannot_be_bound_binds_differently_each_time(shared: Path, tmp_path: Path) -> None:
    """review18 F1: /proc/self/cwd/x.py, the 65th argument on, a link out, a FIFO were
    left out, so an approval "for this plan" answered the rewritten script unasked."""
    (tmp_path / "outside.py").write_text("x")
    os.symlink(tmp_path / "outside.py", shared / "out.py")
    os.mkfifo(shared / "fifo")
    for argv in (
        ["python3", "/proc/self/cwd/script.py"],
        ["python3", "/dev/fd/3"],
        ["python3", "out.py"],
        ["cat", "fifo"],
        ["python3", *["-E"] * 64, "script.py"],
    ):
        first, again = _bound(shared, argv), _bound(shared, argv)
        assert first != again, argv
        assert "unbound" in str(first), (argv, first)
    assert _kinds(shared, ["python3", *["-E"] * 70])[-1] == (65, "unbound")
    roots = [Root(path=shared, writable=True)]
    (named,) = arg_files(roots, str(shared), ["python3", "/proc/self/cwd/script.py"])
    assert "cannot be bound" in named.line() and "asks again" in named.line()


def test_a_file_made_where_an_argument_named_nothing_binds_anew(shared: Path) -> None:
    """`python3 s.py` approved with no s.py: left out then (as most arguments name
    nothing), a script written there later is bound, and so asks again."""
    argv = ["python3", "s.py", "-m", "a message"]
    before = _bound(shared, argv)
    assert before == [] and _bound(shared, argv) == before
    (shared / "s.py").write_text("import os\n")
    assert _bound(shared, argv) != before and _kinds(shared, argv) == [(1, "file")]


def test_a_folder_is_bound_by_what_is_in_it(shared: Path) -> None:
    """`python3 lib` runs lib/__main__.py: a file in it rewritten (its size kept) asks
    again; nothing changed, the same binding."""
    (shared / "lib" / "__main__.py").write_text("print(1)\n")
    argv = ["python3", "lib"]
    assert _kinds(shared, argv) == [(1, "folder")]
    before = _bound(shared, argv)
    assert _bound(shared, argv) == before
    (shared / "lib" / "__main__.py").write_text("print(2)\n")  # the same size
    assert _bound(shared, argv) != before


def test_a_folder_too_large_to_list_binds_differently_each_time(
    shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(exec_arg_files, "LISTED_AT_MOST", 1)
    (shared / "lib" / "more.txt").write_text("x")
    assert _kinds(shared, ["ls", "lib"]) == [(1, "unbound")]
    assert _bound(shared, ["ls", "lib"]) != _bound(shared, ["ls", "lib"])


def test_a_shared_folder_named_through_a_link_outside_is_bound(
    shared: Path, tmp_path: Path
) -> None:
    """/elsewhere/alias -> the shared folder: alias/script.py is the shared script, and
    is bound as it (left out, a rewrite of it ran under the approval)."""
    alias = tmp_path / "alias"
    alias.symlink_to(shared)
    assert _found(shared, ["python3", str(alias / "script.py")]) == [
        (1, str(alias / "script.py"), _sha(shared / "script.py"))
    ]


def test_the_places_held_are_each_argument_as_written_and_as_its_links_lead(
    shared: Path,
) -> None:
    """review18 F5: held from before the look until the program ends (sandbox.held):
    a link's target too, a name that names nothing yet, an option's value; not past
    the 64th argument (those bind nothing: the approval answers one call)."""
    (shared / "run.py").symlink_to("script.py")
    argv = ["python3", "run.py", "--out=late.txt", "lib", *["-v"] * 70, "far.py"]
    places = set(exec_arg_files.held_places(str(shared), argv))
    for name in ("run.py", "script.py", "late.txt", "lib", "-v"):
        assert str(shared / name) in places, name
    assert str(shared / "far.py") not in places


@pytest.mark.parametrize("spelled", ["//proc/self/cwd/script.py", "/dev//fd/0", "//dev/stdin"])
def test_a_path_through_proc_or_dev_however_spelled_binds_nothing(
    shared: Path, spelled: str
) -> None:
    """review19 A1: a leading `//` slipped past the /proc check; left out, a rewritten
    script ran under an approval for the plan."""
    assert _kinds(shared, ["python3", spelled]) == [(1, "unbound")]


def test_a_short_options_attached_value_and_an_implied_suffix_are_bound(shared: Path) -> None:
    """review19 A1c: `awk -fp3.awk`, `make -vfb.mk` and `node app` (app.js) were left out."""
    (shared / "p3.awk").write_text("{ print }\n")
    (shared / "app.js").write_text("console.log(1)\n")
    for argv, name in [
        (["awk", "-fp3.awk"], "p3.awk"),
        (["make", "-vfp3.awk"], "p3.awk"),
        (["node", "app"], "app.js"),
    ]:
        assert _found(shared, argv) == [(1, name, _sha(shared / name))], argv
    assert str(shared / "app.js") in exec_arg_files.held_places(str(shared), ["node", "app"])


def test_a_folders_links_are_bound_by_what_they_point_at(shared: Path) -> None:
    """review19 A2: pkg/__main__.py -> ../script.py was bound by the link alone, and the
    script rewritten ran unasked; a link to a folder fails closed."""
    (shared / "pkg").mkdir()
    (shared / "pkg" / "__main__.py").symlink_to("../script.py")
    before = _bound(shared, ["python3", "pkg"])
    (shared / "script.py").write_text("print('rewritten')\n")
    assert _bound(shared, ["python3", "pkg"]) != before
    (shared / "pkg" / "lib").symlink_to("../lib")
    assert _kinds(shared, ["python3", "pkg"]) == [(1, "unbound")]
