"""Checking a step's answer against its `expect`, and saying what differs.

A mismatch names the place (`status`, `result.entries.0.size`, `blob_sha256`) with
the expected and the actual value, so a failed replay reads as a diff.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Final

from worker.core.approvals import inert
from worker.replay.script import Expect

MISSING: Final = object()  # an expected key that the answer does not have
_SHOWN_CHARS: Final = 200


@dataclass(frozen=True)
class Answer:
    """What a step got back, whichever way it ran."""

    status: str  # "ok" or "error"
    error_code: str | None
    error_message: str | None
    result: Any  # the decoded result JSON, None after an error
    blob: bytes
    replayed: bool  # answered from the record of an earlier delivery, not run again

    @property
    def blob_sha256(self) -> str:
        return hashlib.sha256(self.blob).hexdigest()


@dataclass(frozen=True)
class Mismatch:
    path: str
    expected: Any
    actual: Any

    def to_json(self) -> dict[str, Any]:
        actual = None if self.actual is MISSING else self.actual
        return {
            "path": self.path,
            "expected": self.expected,
            "actual": actual,
            "missing": self.actual is MISSING,
        }


def check(expect: Expect, answer: Answer) -> list[Mismatch]:
    """Every way `answer` falls short of `expect`; empty when it holds."""
    out: list[Mismatch] = []
    status = expect.wanted_status()
    if status is not None and answer.status != status:
        out.append(Mismatch("status", status, answer.status))
    if expect.error_code is not None and answer.error_code != expect.error_code:
        out.append(Mismatch("error_code", expect.error_code, answer.error_code))
    if out:
        return out  # the rest of the answer cannot match when its status or code does not
    if expect.result is not None:
        if not isinstance(answer.result, dict):
            out.append(Mismatch("result", expect.result, answer.result))
        else:
            _subset("result", expect.result, answer.result, out)
    if expect.exit_code is not None:
        actual = (
            answer.result.get("exit_code", MISSING) if isinstance(answer.result, dict) else MISSING
        )
        if not _same(expect.exit_code, actual):
            out.append(Mismatch("exit_code", expect.exit_code, actual))
    if expect.blob_sha256 is not None and answer.blob_sha256 != expect.blob_sha256:
        out.append(Mismatch("blob_sha256", expect.blob_sha256, answer.blob_sha256))
    return out


def _subset(path: str, expected: Any, actual: Any, out: list[Mismatch]) -> None:
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            out.append(Mismatch(path, expected, actual))
            return
        for key, value in expected.items():
            where = f"{path}.{key}"
            if key not in actual:
                out.append(Mismatch(where, value, MISSING))
            else:
                _subset(where, value, actual[key], out)
    elif isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            out.append(Mismatch(path, expected, actual))
            return
        for i, (want, got) in enumerate(zip(expected, actual, strict=True)):
            _subset(f"{path}.{i}", want, got, out)
    elif not _same(expected, actual):
        out.append(Mismatch(path, expected, actual))


def _same(expected: Any, actual: Any) -> bool:
    """Equal JSON scalars: 1 and 1.0 are, true and 1 are not."""
    if actual is MISSING:
        return False
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(expected) is type(actual) and expected == actual
    return bool(expected == actual)


def shown(value: Any) -> str:
    """A value as a person reads it in a diff: JSON, cut short, inert (a worker's
    answer, or a script someone else wrote, may hold escapes for the terminal)."""
    if value is MISSING:
        return "(missing)"
    text = inert(json.dumps(value, ensure_ascii=False, sort_keys=True), _SHOWN_CHARS)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 1] + "…"


def render(mismatches: list[Mismatch], answer: Answer | None = None, indent: str = "    ") -> str:
    """The diff of expected and actual, one place per block."""
    lines = []
    for m in mismatches:
        lines.append(f"{indent}{inert(m.path)}")
        lines.append(f"{indent}  - expected: {shown(m.expected)}")
        lines.append(f"{indent}  + actual:   {shown(m.actual)}")
    if answer is not None and answer.status == "error" and answer.error_message:
        said = [inert(line) for line in f"{answer.error_code}: {answer.error_message}".splitlines()]
        lines.append(f"{indent}the worker said: {said[0]}")
        lines += [f"{indent}  {line}" for line in said[1:]]
    return "\n".join(lines)
