"""The shape of the test tree, shared by the fixtures and the tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

INSIDE = "inside data\n"
SECRET = "outside secret\n"


@dataclass(frozen=True)
class Tree:
    root: Path  # the shared folder: data.txt, sub/inner.txt
    outside: Path  # a sibling folder holding secret.txt, which must never be reached

    @property
    def secret(self) -> Path:
        return self.outside / "secret.txt"
