"""Fixtures: a root with a secret next to it, both resolvers to test against, the entry
helper and a folder to share with a sandbox."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox import ConfinedDir, openat2_available
from tests.sandbox.support import INSIDE, SECRET, Tree


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    base = Path(os.path.realpath(tmp_path))  # roots arrive resolved, as the worker passes them
    root = base / "root"
    outside = base / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "data.txt").write_text(INSIDE)
    (root / "sub" / "inner.txt").write_text("inner\n")
    (outside / "secret.txt").write_text(SECRET)
    return Tree(root=root, outside=outside)


@pytest.fixture(params=[True, False], ids=["openat2", "walk"])
def use_openat2(request: pytest.FixtureRequest) -> bool:
    """Every confinement test runs against both resolvers."""
    wanted: bool = request.param
    if wanted and not openat2_available():
        pytest.skip("this kernel has no openat2")
    return wanted


@pytest.fixture
def confined(tree: Tree, use_openat2: bool) -> Iterator[ConfinedDir]:
    with ConfinedDir(tree.root, use_openat2=use_openat2) as root:
        yield root


@pytest.fixture(scope="session")
def entry(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The sandbox's entry helper, built once for the session as a worker builds it."""
    from sandbox import _entry

    return _entry.build(tmp_path_factory.mktemp("exec-cache"), "cc")


@pytest.fixture
def btrfs(tmp_path: Path) -> Iterator[Path]:
    """A btrfs file system on a loop image, mounted for the test (root only)."""
    image, mounted = tmp_path / "btrfs.img", tmp_path / "btrfs"
    with open(image, "wb") as handle:
        handle.truncate(256 << 20)
    subprocess.run(["mkfs.btrfs", "-q", str(image)], check=True, capture_output=True)
    mounted.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(mounted)], check=True)
    try:
        yield mounted
    finally:
        subprocess.run(["umount", str(mounted)], check=True)


@pytest.fixture
def share(tmp_path: Path) -> Path:
    """A folder to share with a sandbox, holding `a.txt` ("inside")."""
    folder = Path(os.path.realpath(tmp_path)) / "share"
    folder.mkdir()
    (folder / "a.txt").write_text("inside\n")
    return folder
