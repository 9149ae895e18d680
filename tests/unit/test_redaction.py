"""Telemetry's args preview: short, and never holding a secret."""

from __future__ import annotations

import json

from worker.core.redaction import PREVIEW_CHARS, args_preview


def test_short_harmless_args_are_kept_as_sent() -> None:
    assert args_preview('{"path": "notes.md"}') == '{"path": "notes.md"}'


def test_secret_looking_keys_are_masked_at_any_depth() -> None:
    args = {"url": "https://x", "headers": {"Authorization": "Bearer abc", "X-Api-Key": "k"}}
    preview = json.loads(args_preview(json.dumps(args)))
    assert preview["headers"] == {"Authorization": "***", "X-Api-Key": "***"}
    assert "abc" not in args_preview(json.dumps({"password": "abc", "token": "abc"}))


def test_long_values_are_cut_and_the_preview_stays_short() -> None:
    preview = args_preview(json.dumps({"text": "y" * 10_000, "more": ["z" * 500] * 20}))
    assert len(preview) <= PREVIEW_CHARS
    assert "y" * 81 not in preview


def test_args_that_are_not_json_say_so() -> None:
    assert args_preview("{not json" + " " * PREVIEW_CHARS) == "<invalid json>"


def test_every_query_value_fragment_and_url_password_is_masked_names_stay() -> None:
    url = "https://u:pw@example.com/p?access_token=T1&page=2&flag#frag"
    preview = json.loads(args_preview(json.dumps({"url": url})))
    assert preview["url"] == "https://u:***@example.com/p?access_token=***&page=***&***#***"
    argv = {"argv": ["curl", "see https://x.test/?sig=S2 now"]}
    assert "S2" not in args_preview(json.dumps(argv))


def test_every_header_value_is_masked_whatever_its_name() -> None:
    args = {"url": "https://x", "headers": {"X-Trace": "H1", "Accept": "text/html"}}
    preview = json.loads(args_preview(json.dumps(args)))
    assert preview["headers"] == {"X-Trace": "***", "Accept": "***"}


def test_content_never_reaches_the_preview() -> None:
    for key in ("content", "data", "body", "text"):
        preview = args_preview(json.dumps({"path": "a.txt", key: "the person's words"}))
        assert "person" not in preview and json.loads(preview)[key] == "***"
