"""The policy in force from a file: loaded once per version of the file, so an edit
takes effect at the next use without a restart, and the file is not parsed again
while it has not changed. Owned by whoever needs the policy (the worker keeps one
for its lifetime), never a module-level cache."""

from __future__ import annotations

import threading
from pathlib import Path

from allowlist._load import PolicyError
from allowlist._policy import Policy
from allowlist._self_test import load_policy


class PolicyFile:
    """The latest load of a policy file (or of the shipped default, for None)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version: tuple[str, int, int] | None = None
        self._found: Policy | PolicyError | None = None

    def current(self, path: Path | None) -> Policy:
        """The policy `path` holds now; PolicyError while it does not load (a broken
        file never falls back to a looser policy)."""
        version = ("", 0, 0)
        if path is not None:
            try:
                st = path.stat()
            except OSError as exc:
                raise PolicyError(f"cannot read {path}: {exc.strerror}") from None
            version = (str(path), st.st_mtime_ns, st.st_size)
        with self._lock:
            if version != self._version:
                try:
                    self._found = load_policy(path)
                except PolicyError as exc:
                    self._found = exc
                self._version = version  # only the current version is worth keeping
            found = self._found
        if isinstance(found, PolicyError):
            raise PolicyError(str(found))
        assert found is not None
        return found
