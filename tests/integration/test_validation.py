"""Malformed args never reach a handler: each answers validation_error with details."""

from __future__ import annotations

import json

import pytest

from tests.support.cluster import Cluster

CASES = {
    "wrong type": ('{"path": 42}', ["path"]),
    "unknown field": ('{"path": ".", "recursive": true}', ["recursive"]),
    "missing field": ("{}", ["path"]),
    "a 1 MB string": (json.dumps({"path": "a" * 1_000_000}), ["path"]),
    "NUL byte": ('{"path": "a\\u0000b"}', ["path"]),
    "invalid JSON": ('{"path": ', []),
    "not an object": ('["path"]', []),
    "bool as string": ('{"path": ".", "follow_symlinks": "yes"}', ["follow_symlinks"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_args_answer_validation_error_with_details(live: Cluster, case: str) -> None:
    args, field = CASES[case]
    out = live.call("workerHost.fs_stat", args)
    assert out["status"] == "error"
    assert out["error"]["code"] == "validation_error", out["error"]
    errors = out["error"]["details"]["errors"]
    assert errors, "details must say what was wrong"
    if field:
        assert any(e["loc"][:1] == field for e in errors), errors
    assert "Traceback" not in out["error"]["message"]
    assert len(out["error"]["message"]) < 2000, "a huge input must not be echoed back"


def test_unexpected_blob_is_refused_not_dropped(live: Cluster) -> None:
    out = live.call("workerHost.fs_stat", '{"path": "."}', blob=b"surprise")
    assert out["error"]["code"] == "validation_error"
    assert out["error"]["details"]["errors"][0]["loc"] == ["blob"]
