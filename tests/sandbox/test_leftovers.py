"""Sweeping up temporary files that a crashed write left behind, and nothing else."""

from __future__ import annotations

import os
import time
from pathlib import Path

from sandbox import ConfinedDir, Leftovers
from sandbox._leftovers import STALE_S, is_temp_name, temp_name
from sandbox.held import HeldPlaces
from tests.sandbox.support import Tree, crash_mid_write


def temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".agentworker-tmp"))


def sweep_later(folder: Path) -> list[str]:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return Leftovers().sweep(fd, now=time.time() + STALE_S + 60, force=True)
    finally:
        os.close(fd)


def test_the_leftover_of_a_crashed_write_is_swept_once_stale(tree: Tree) -> None:
    (tree.root / "precious").write_bytes(b"old\n")
    with ConfinedDir(tree.root) as root:
        crash_mid_write(root, "precious")
    [leftover] = temps(tree.root)
    fd = os.open(tree.root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert Leftovers().sweep(fd, force=True) == [], "a fresh one may be a write in progress"
    finally:
        os.close(fd)
    assert sweep_later(tree.root) == [leftover]
    assert temps(tree.root) == []
    assert (tree.root / "precious").read_bytes() == b"old\n"


def test_only_names_of_our_exact_shape_that_are_plain_files_are_swept(tree: Tree) -> None:
    ours = temp_name("notes.txt")
    assert is_temp_name(ours)
    keep = {
        "notes.agentworker-tmp": b"a person's file",
        ".notes.txt.agentworker-tmp": b"no random part",
        ".notes.txt.ABCDEF12.agentworker-tmp": b"upper-case: not ours",
        ".notes.txt.12345678.agentworker-tmp.bak": b"a suffix after ours",
        "x.12345678.agentworker-tmp": b"no leading dot",
    }
    for name, data in keep.items():
        (tree.root / name).write_bytes(data)
    (tree.root / ours).write_bytes(b"ours")
    linked = temp_name("linked")
    (tree.root / linked).write_bytes(b"two names")
    os.link(tree.root / linked, tree.outside / "other-name")
    link = temp_name("link")
    (tree.root / link).symlink_to(tree.secret)
    folder = temp_name("folder")
    (tree.root / folder).mkdir()
    assert sweep_later(tree.root) == [ours]
    for name, data in keep.items():
        assert (tree.root / name).read_bytes() == data
    assert (tree.root / linked).read_bytes() == b"two names"
    assert (tree.root / link).is_symlink() and (tree.root / folder).is_dir()
    assert tree.secret.exists()


def test_a_folder_is_swept_once_a_while_by_each_owner_of_the_memory(tree: Tree) -> None:
    """The memory of recent sweeps belongs to its owner (one per worker): a second sweep
    by the same owner within RESWEEP_S reads nothing; another owner's sweep still works."""
    with ConfinedDir(tree.root) as root:
        crash_mid_write(root, "a")
    [leftover] = temps(tree.root)
    later = time.time() + STALE_S + 60
    fd = os.open(tree.root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        mine = Leftovers()
        assert mine.sweep(fd, now=time.time()) == []  # fresh: may be a write in progress
        assert mine.sweep(fd, now=later) == [], "swept moments ago by this owner"
        assert Leftovers().sweep(fd, now=later) == [leftover]
    finally:
        os.close(fd)


def test_a_leftover_the_guard_refuses_stays(tmp_path: Path) -> None:
    """review23 C10: a held name of that shape is left be (the guard registers each
    removal as a write in sandbox.held, which refuses a held place)."""
    held = HeldPlaces()
    kept, swept = (
        tmp_path / ".s.py.0123abcd.agentworker-tmp",
        tmp_path / ".t.0123abcd.agentworker-tmp",
    )
    for path in (kept, swept):
        path.write_bytes(b"x")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with held.hold([str(kept)], "asker"):
            removed = Leftovers().sweep(
                fd,
                now=time.time() + STALE_S + 60,
                guard=lambda name, inode: held.write(str(tmp_path / name), "writer", inode),
            )
    finally:
        os.close(fd)
    assert removed == [swept.name]
    assert temps(tmp_path) == [kept.name]
