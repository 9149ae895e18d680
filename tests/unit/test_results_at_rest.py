"""A result's secrets are kept masked once it is delivered, whole until then (review25
G10): an http_fetch's Set-Cookie and token headers stayed whole for 24 h in the
worker's ledger (state.db) and the hub's store (hub.db) after the caller had them,
while the request's own Authorization was kept only masked (its args' preview).

The worker's ledger keeps the whole result until the server acks it (a re-send, or a
duplicate's answer, must carry all of it; a crash keeps it), then the form kept at
rest; the hub keeps the whole one until a caller has it. Each store zeroes the whole
form where it lay (secure_delete), so the database files no longer hold it."""

from __future__ import annotations

from pathlib import Path

from worker.actions.host.http_fetch import HttpFetchResult
from worker.clock import now_ms
from worker.core.ledger import Seen, State
from worker.core.redaction import MASK, masked_headers
from worker.hub.store import HubStore
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.protocol import at_rest, for_caller

SECRET = "SECRETq7Zp4Lm2Wx9"
DIGEST = "blake3:" + "ab" * 32


def _fetched(**changed: object) -> HttpFetchResult:
    fields: dict[str, object] = {
        "url": "https://example.com/login",
        "status": 200,
        "reason": "OK",
        "http_version": "HTTP/1.1",
        "headers": [("Content-Type", "text/plain"), ("Content-Length", "2")],
        "content_type": "text/plain",
        "body_bytes": 2,
        "truncated": False,
        "decoded": False,
        "body_error": None,
        "redirects": [],
        "redirect_limit_reached": False,
        "redirect_not_followed": None,
        "address": "93.184.215.14",
        "elapsed_ms": 3,
    }
    return HttpFetchResult.model_validate({**fields, **changed})


def _result(cid: str) -> pb.ActionResult:
    """An http_fetch's result as the pipeline sends it: whole, and its form at rest."""
    fetched = _fetched(headers=[("Set-Cookie", f"session={SECRET}"), ("Date", "today")])
    kept = fetched.at_rest()
    assert kept is not None
    return pb.ActionResult(
        correlation_id=cid,
        status=pb.ActionResult.OK,
        result_json=fetched.model_dump_json(),
        result_json_at_rest=kept.model_dump_json(),
    )


def _kept_bytes(result: pb.ActionResult) -> bytes:
    masked = at_rest(result)
    assert masked is not None
    return masked.SerializeToString()


def _files_hold(folder: Path, secret: str) -> list[str]:
    return [
        path.name
        for path in sorted(folder.iterdir())
        if path.is_file() and secret.encode() in path.read_bytes()
    ]


def test_secret_looking_response_headers_are_masked_and_the_rest_kept() -> None:
    headers = [
        ("Set-Cookie", "session=abc; HttpOnly"),
        ("Set-Cookie2", "id=abc"),
        ("X-Auth-Token", "abc"),
        ("X-Subject-Token", "abc"),
        ("X-Api-Key", "abc"),
        ("Authorization", "abc"),
        ("WWW-Authenticate", 'Digest nonce="abc"'),
        ("Authentication-Info", 'nextnonce="abc"'),
        ("X-Session-Id", "abc"),
        ("X-CSRF-Token", "abc"),
        ("X-XSRF-Header", "abc"),
    ]
    assert masked_headers(headers) == [(name, MASK) for name, _ in headers]
    plain = [
        ("Content-Type", "text/html; charset=utf-8"),
        ("Date", "Sun, 29 Nov 2026 14:00:00 GMT"),
        ("Location", "/next"),
    ]
    assert masked_headers(plain) == plain
    # In any other value, what a preview masks in text: a URL's query values and
    # fragment, an auth scheme's credentials.
    assert masked_headers(
        [
            ("Location", "https://app.example/cb?code=abc#access_token=def"),
            ("X-Note", "Bearer abcdefgh123"),
        ]
    ) == [("Location", "https://app.example/cb?code=***#***"), ("X-Note", "Bearer ***")]


def test_relative_references_in_url_headers_are_masked_too() -> None:
    """review26 H2: URLs were found by their scheme, so a relative Location, a Refresh's
    url= or a Link's reference kept an OAuth code or a ticket whole."""
    assert masked_headers(
        [
            ("Location", "/cb?code=abc&state=xyz#frag"),
            ("Content-Location", "//cdn.example/f?sig=abc"),
            ("Refresh", "0;url=/x?ticket=abc"),
            ("Link", '</p?cursor=abc>; rel="next", </q?a>; rel="prev"'),
            ("X-Note", "what?yes"),
        ]
    ) == [
        ("Location", "/cb?code=***&state=***#***"),
        ("Content-Location", "//cdn.example/f?sig=***"),
        ("Refresh", "0;url=/x?ticket=***"),
        ("Link", '</p?cursor=***>; rel="next", </q?***>; rel="prev"'),
        ("X-Note", "what?yes"),
    ]


def test_a_query_holding_separators_is_masked_to_the_end_of_its_reference() -> None:
    """A query stopped at `,` or `;` (review26's residual): in a Link reference the rest
    of `cursor=abc,secret` stayed whole; in a Location a `;` ended it too."""
    assert masked_headers(
        [
            ("Link", '</p?cursor=abc,def;ghi#x,y>; rel="next", </q?b=1>; rel="prev"'),
            ("Location", "/cb?code=abc;def,ghi&state=x,y"),
            ("Content-Location", "/f?sig=a;b#frag;more"),
            ("Refresh", "5; URL=/x?ticket=abc,def;ghi"),
        ]
    ) == [
        ("Link", '</p?cursor=***#***>; rel="next", </q?b=***>; rel="prev"'),
        ("Location", "/cb?code=***&state=***"),
        ("Content-Location", "/f?sig=***#***"),
        ("Refresh", "5; URL=/x?ticket=***"),
    ]


def test_a_fetch_result_with_nothing_to_mask_has_no_form_at_rest() -> None:
    assert _fetched().at_rest() is None
    kept = _fetched(
        url=f"https://example.com/cb?code={SECRET}",
        redirects=[f"https://example.com/cb?code={SECRET}"],
    ).at_rest()
    assert kept is not None and SECRET not in kept.model_dump_json()
    assert kept.url == "https://example.com/cb?code=***" and kept.status == 200


def test_a_caller_gets_the_whole_result_without_the_form_at_rest() -> None:
    result = _result("c1")
    whole = for_caller(result)
    assert SECRET in whole.result_json and not whole.result_json_at_rest
    kept = at_rest(result)
    assert kept is not None and SECRET not in kept.SerializeToString().decode("latin-1")


def test_the_ledger_keeps_a_result_whole_until_its_ack_then_masked(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    state = State(path)
    result = _result("fetch-1")
    data = result.SerializeToString()
    assert state.begin("fetch-1", DIGEST, "p").seen is Seen.NEW
    state.finish("fetch-1", data, b"ok", _kept_bytes(result))
    # Not acked: a duplicate is answered whole, and the re-send carries all of it,
    # after a stop too (the worker that comes back has only the database).
    assert state.begin("fetch-1", DIGEST, "p").result == data
    state.close()
    state = State(path)
    assert [u.result for u in state.unacked_results()] == [data]
    state.ack(["fetch-1"])
    late = state.begin("fetch-1", DIGEST, "p")
    assert late.seen is Seen.DONE and late.result is not None
    answer = pb.ActionResult.FromString(late.result)
    assert SECRET not in answer.result_json and f"{MASK}" in answer.result_json
    assert not answer.result_json_at_rest
    state.close()
    assert _files_hold(tmp_path, SECRET) == [], "the whole form is zeroed where it lay"


def test_the_ledger_empties_its_log_of_a_whole_result_once_masked(tmp_path: Path) -> None:
    """review26 H3: the row was masked and zeroed where it lay, but the log's older
    frames held the whole result (cookie, token) while the worker ran, an idle one for
    good. A masking ack has the checkpointer empty the log at its next round."""
    state = State(tmp_path / "state.db")
    for n in range(3):
        cid = f"fetch-{n}"
        result = _result(cid)
        assert state.begin(cid, DIGEST, "p").seen is Seen.NEW
        state.finish(cid, result.SerializeToString(), b"ok", _kept_bytes(result))
    assert "state.db-wal" in _files_hold(tmp_path, SECRET)
    state.ack([f"fetch-{n}" for n in range(3)])
    checkpointer = getattr(state.connection, "checkpointer", None)
    assert checkpointer is not None
    assert checkpointer.wait_for(lambda: _files_hold(tmp_path, SECRET) == [], 30), _files_hold(
        tmp_path, SECRET
    )
    state.close()


def test_the_ledger_keeps_a_held_result_masked_once_acked(tmp_path: Path) -> None:
    """An effect-free call's result, held in memory until its ack, is written then in
    its form at rest."""
    state = State(tmp_path / "state.db")
    result = _result("held-1")
    data = result.SerializeToString()
    state.hold("held-1", DIGEST, "p", data, b"", _kept_bytes(result))
    assert state.begin("held-1", DIGEST, "p", claim=False).result == data
    state.ack(["held-1"])
    late = state.begin("held-1", DIGEST, "p", claim=False).result
    assert late is not None and SECRET.encode() not in late
    state.close()
    assert _files_hold(tmp_path, SECRET) == []


def test_the_hub_keeps_a_result_whole_only_until_a_caller_has_it(tmp_path: Path) -> None:
    store = HubStore(tmp_path / "hub.db")
    request = pb.ActionRequest(
        correlation_id="", surface="workerHost", action="http_fetch", args_json="{}"
    )
    for cid in ("taken", "waiting"):
        request.correlation_id = cid
        store.add("w", DIGEST, request, 0, now_ms() + 60_000)
    # A caller was waiting for "taken": kept masked from its first write. Nobody was
    # waiting for "waiting" (a hub restarted): kept whole for the caller to come.
    store.complete_many(
        [(_result("taken"), None, False, None), (_result("waiting"), None, True, None)]
    )
    taken, waiting = store.get("taken"), store.get("waiting")
    assert taken is not None and taken.result is not None
    assert SECRET not in taken.result.result_json and not taken.result.result_json_at_rest
    assert waiting is not None and waiting.result is not None
    assert SECRET in waiting.result.result_json
    store.delivered(waiting)  # that caller came
    gone = store.get("waiting")
    assert gone is not None and gone.result is not None
    assert SECRET not in gone.result.result_json
    store.close()
    assert _files_hold(tmp_path, SECRET) == []
