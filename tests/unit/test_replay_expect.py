"""An answer against its expectation: what holds, and the diff when it does not."""

from __future__ import annotations

import hashlib
from typing import Any

from worker.replay.expect import MISSING, Answer, Mismatch, check, render
from worker.replay.script import Expect


def ok(result: Any, blob: bytes = b"") -> Answer:
    return Answer("ok", None, None, result, blob, replayed=False)


def failed(code: str, message: str = "it went wrong") -> Answer:
    return Answer("error", code, message, None, b"", replayed=False)


def test_no_expectation_given_means_the_step_must_succeed() -> None:
    default = Expect(status="ok")
    assert check(default, ok({})) == []
    assert check(default, failed("not_found")) == [Mismatch("status", "ok", "error")]


def test_an_empty_expectation_checks_nothing() -> None:
    assert check(Expect(), failed("internal_error")) == []


def test_an_error_code_implies_an_error_status() -> None:
    expect = Expect(error_code="not_found")
    assert check(expect, failed("not_found")) == []
    assert check(expect, ok({})) == [
        Mismatch("status", "error", "ok"),
        Mismatch("error_code", "not_found", None),
    ]
    assert check(expect, failed("busy")) == [Mismatch("error_code", "not_found", "busy")]


def test_the_result_is_matched_as_a_subset_key_by_key() -> None:
    expect = Expect(result={"size": 3, "entries": [{"name": "a"}, {"name": "b"}]})
    actual = {"size": 3, "mtime": 1.5, "entries": [{"name": "a", "size": 1}, {"name": "b"}]}
    assert check(expect, ok(actual)) == []


def test_each_difference_in_the_result_is_named_by_its_place() -> None:
    expect = Expect(result={"size": 3, "entries": [{"name": "a"}], "eof": True})
    actual = {"size": 4, "entries": [{"name": "z"}]}
    assert check(expect, ok(actual)) == [
        Mismatch("result.size", 3, 4),
        Mismatch("result.entries.0.name", "a", "z"),
        Mismatch("result.eof", True, MISSING),
    ]


def test_arrays_must_have_the_same_length() -> None:
    expect = Expect(result={"entries": [{"name": "a"}]})
    actual = {"entries": [{"name": "a"}, {"name": "b"}]}
    assert check(expect, ok(actual)) == [
        Mismatch("result.entries", [{"name": "a"}], actual["entries"])
    ]


def test_numbers_compare_by_value_but_booleans_are_not_numbers() -> None:
    assert check(Expect(result={"n": 1}), ok({"n": 1.0})) == []
    assert check(Expect(result={"n": 1}), ok({"n": True})) == [Mismatch("result.n", 1, True)]
    assert check(Expect(result={"b": False}), ok({"b": 0})) == [Mismatch("result.b", False, 0)]


def test_exit_code_and_blob_digest() -> None:
    blob = b"out"
    digest = hashlib.sha256(blob).hexdigest()
    assert check(Expect(exit_code=0, blob_sha256=digest), ok({"exit_code": 0}, blob)) == []
    assert check(Expect(exit_code=0), ok({"exit_code": 2})) == [Mismatch("exit_code", 0, 2)]
    assert check(Expect(exit_code=0), ok({"path": "x"})) == [Mismatch("exit_code", 0, MISSING)]
    assert check(Expect(blob_sha256=digest), ok({})) == [
        Mismatch("blob_sha256", digest, hashlib.sha256(b"").hexdigest())
    ]


def test_a_wrong_status_is_reported_alone_with_what_the_worker_said() -> None:
    expect = Expect(status="ok", result={"size": 3}, blob_sha256="0" * 64)
    answer = failed("not_found", "'a.txt' does not exist.\nCheck the path.")
    mismatches = check(expect, answer)
    assert mismatches == [Mismatch("status", "ok", "error")]
    assert render(mismatches, answer, indent="") == (
        'status\n  - expected: "ok"\n  + actual:   "error"\n'
        "the worker said: not_found: 'a.txt' does not exist.\n  Check the path."
    )


def test_the_diff_shows_missing_keys_and_cuts_long_values() -> None:
    text = render([Mismatch("result.text", "x" * 500, MISSING)], indent="")
    expected_line, actual_line = text.splitlines()[1:]
    assert len(expected_line) < 230 and expected_line.endswith("…")
    assert actual_line == "  + actual:   (missing)"
