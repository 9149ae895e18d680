"""Which files an exec's arguments name, and what binds each (review16 F7): the
regular files in the shared folders, by contents while small, else by identity;
never a FIFO, a device, a folder or a file outside, and never more read than the cap."""

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
    return [(f.index, f.path, f.sha256) for f in arg_files(roots, str(shared), argv)]


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
