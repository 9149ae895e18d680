"""Shared fixtures: a root with a secret next to it, and both resolvers to test."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandbox import ConfinedDir, openat2_available

INSIDE = "inside data\n"
SECRET = "outside secret\n"


@dataclass(frozen=True)
class Tree:
    root: Path  # the shared folder: data.txt, sub/inner.txt
    outside: Path  # a sibling folder holding secret.txt, which must never be reached

    @property
    def secret(self) -> Path:
        return self.outside / "secret.txt"


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    root = tmp_path / "root"
    outside = tmp_path / "outside"
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
