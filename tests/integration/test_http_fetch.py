"""http_fetch through the real hub and worker, against a local server opened on purpose.

The test server's host:port is in the worker's `[http] allow_hosts`; everything
else on this machine is not. Refusal tests aim at a honeypot listener, and the
worker runs with HTTP_PROXY and friends pointing at the same honeypot: after every
test the honeypot must have seen no connection at all, which shows each refusal
came before connecting and that no proxy was used. No test sends a packet beyond
loopback: the non-loopback addresses below are refused before any connection.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, free_port, wait_for
from tests.support.host_calls import call, error_code, shared_cluster
from tests.support.http_server import Honeypot, TestServer, pattern
from worker.actions.host.fetching.body import MAX_PIECES
from worker.actions.host.fetching.pinned import HEAD_BYTES

MIB = 1024 * 1024
CAP = 5 * MIB
CLOSED_PORT = free_port()  # nothing listens here


@pytest.fixture(scope="module")
def server() -> Iterator[TestServer]:
    with TestServer() as running:
        yield running


@pytest.fixture(scope="module")
def honeypot() -> Iterator[Honeypot]:
    with Honeypot() as pot:
        yield pot


@pytest.fixture(scope="module")
def live(
    tmp_path_factory: pytest.TempPathFactory, server: TestServer, honeypot: Honeypot
) -> Iterator[Cluster]:
    config = (
        "[http]\n"
        f'allow_hosts = ["127.0.0.1:{server.port}", "localhost:{server.port}", '
        f'"127.0.0.1:{CLOSED_PORT}"]\n'
        "connect_timeout_s = 5\nread_timeout_s = 5\ntotal_timeout_s = 10\n"
    )
    proxy = f"http://127.0.0.1:{honeypot.port}"
    proxies = {
        name: proxy
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy")
    }
    # The worker's own plaintext link to the hub must ignore these too (else the
    # honeypot would see its connection).
    home = tmp_path_factory.mktemp("http") / "home"
    with shared_cluster(home, extra_config=config, worker_env=proxies) as cluster:
        yield cluster


@pytest.fixture(autouse=True)
def nothing_reaches_the_honeypot(honeypot: Honeypot) -> Iterator[None]:
    yield
    honeypot.settle()  # every connection made so far is counted
    assert honeypot.connections == 0, "a connection was made that should have been refused"


def fetch(live: Cluster, url: str, blob: bytes = b"", **args: object) -> tuple[dict, bytes]:  # type: ignore[type-arg]
    return call(live, "http_fetch", {"url": url, **args}, blob)


def ok(live: Cluster, url: str, blob: bytes = b"", **args: object) -> tuple[dict, bytes]:  # type: ignore[type-arg]
    out, body = fetch(live, url, blob, **args)
    assert out["status"] == "ok", out
    return out["result"], body


# --- what is allowed works ---------------------------------------------------------------


def test_get_returns_status_headers_and_body(live: Cluster, server: TestServer) -> None:
    result, body = ok(live, server.url("/hello"))
    assert result["status"] == 200 and result["reason"] == "OK"
    assert body == b"hello\n" and result["body_bytes"] == 6
    assert ["Set-Cookie", "a=1"] in result["headers"]
    assert result["content_type"] == "text/plain"
    assert result["url"] == server.url("/hello") and result["address"] == "127.0.0.1"
    assert result["truncated"] is False and result["redirects"] == []


def test_method_headers_and_body_are_sent(live: Cluster, server: TestServer) -> None:
    _, body = ok(
        live, server.url("/echo"), b"payload \x00\xff", method="PUT", headers={"X-Token": "t1"}
    )
    seen = json.loads(body)
    assert seen["method"] == "PUT"
    assert seen["body"] == "payload \x00\xff"
    assert seen["headers"]["x-token"] == "t1"
    assert seen["headers"]["host"] == f"127.0.0.1:{server.port}", "Host names the URL's host"
    assert seen["headers"]["user-agent"].startswith("agentworker/")


def test_head_has_no_body(live: Cluster, server: TestServer) -> None:
    result, body = ok(live, server.url("/hello"), method="HEAD")
    assert result["status"] == 200 and body == b""


def test_gzip_and_deflate_are_decoded(live: Cluster, server: TestServer) -> None:
    result, body = ok(live, server.url("/gzip"))
    assert body == b"hello gzip\n" and result["decoded"] is True
    result, body = ok(live, server.url("/deflate-raw"))
    assert body == b"raw deflate\n"


def test_redirects_are_followed_up_to_five(live: Cluster, server: TestServer) -> None:
    result, body = ok(live, server.url("/chain?n=5"))
    assert body == b"end of chain\n" and len(result["redirects"]) == 5
    assert result["url"] == server.url("/chain?n=0")
    result, _ = ok(live, server.url("/chain?n=6"))
    assert result["status"] == 302 and result["redirect_limit_reached"] is True
    assert len(result["redirects"]) == 5
    result, _ = ok(live, server.url("/chain?n=1"), follow_redirects=False)
    assert result["status"] == 302 and ["Location", "/chain?n=0"] in result["headers"]


@pytest.mark.parametrize(("status", "method", "sent"), [(303, "GET", ""), (307, "POST", "data")])
def test_redirect_methods_follow_the_rules(
    live: Cluster, server: TestServer, status: int, method: str, sent: str
) -> None:
    to = f"/redirect?status={status}&to=/echo"
    _, body = ok(live, server.url(to), b"data", method="POST")
    seen = json.loads(body)
    assert seen["method"] == method and seen["body"] == sent


# An agent's headers: credentials under any name, and the few that say how to answer.
AGENT_HEADERS = {
    "Authorization": "Bearer secret",
    "Cookie": "s=1",
    "X-Api-Key": "key-secret",
    "Private-Token": "gitlab-secret",
    "X-Auth-Token": "auth-secret",
    "X-Anything": "unknown-secret",
    "Accept": "application/json",
    "Accept-Language": "de",
    "User-Agent": "agent/1",
}


def test_only_answer_headers_follow_a_redirect_to_another_origin(
    live: Cluster, server: TestServer
) -> None:
    """A redirect elsewhere takes none of the agent's headers but Accept, Accept-Language,
    User-Agent (and Content-Type, Accept-Encoding): any other may be a credential."""
    other = f"http://localhost:{server.port}/echo"  # another origin, opened on purpose too
    _, body = ok(live, server.url(f"/redirect?to={other}"), headers=AGENT_HEADERS)
    seen = json.loads(body)["headers"]
    assert not [value for value in seen.values() if "secret" in value], seen
    assert seen["accept"] == "application/json" and seen["accept-language"] == "de"
    assert seen["user-agent"] == "agent/1"


@pytest.mark.parametrize("status", [307, 308])
def test_a_redirect_that_would_resend_the_body_elsewhere_is_answered_not_followed(
    live: Cluster, server: TestServer, status: int
) -> None:
    """A 307 or 308 keeps the method and the body: to another origin, the body (which may
    hold what was meant for this one alone) would go too. The redirect is the answer."""
    other = f"http://localhost:{server.port}/echo"
    result, _ = ok(
        live, server.url(f"/redirect?status={status}&to={other}"), b"secret", method="POST"
    )
    assert result["status"] == status and result["redirects"] == []
    assert ["Location", other] in result["headers"]
    assert f"localhost:{server.port}" in result["redirect_not_followed"]
    assert "re-send the request body" in result["redirect_not_followed"]
    # Without a body, or with a redirect that drops it (303), it is followed.
    result, body = ok(live, server.url(f"/redirect?status={status}&to={other}"))
    assert result["redirect_not_followed"] is None and json.loads(body)["method"] == "GET"
    result, body = ok(live, server.url(f"/redirect?status=303&to={other}"), b"x", method="POST")
    assert json.loads(body)["body"] == "" and result["redirects"] == [other]


def test_the_agents_headers_follow_a_redirect_within_the_origin(
    live: Cluster, server: TestServer
) -> None:
    _, body = ok(live, server.url("/redirect?to=/echo"), headers=AGENT_HEADERS)
    seen = json.loads(body)["headers"]
    assert {name.lower(): value for name, value in AGENT_HEADERS.items()}.items() <= seen.items()


def test_proxy_variables_in_the_environment_are_ignored(live: Cluster, server: TestServer) -> None:
    worker = next(p for p in live.procs if p.name == "worker")
    environ = Path(f"/proc/{worker.pid}/environ").read_bytes().split(b"\0")
    assert any(var.startswith(b"HTTP_PROXY=") for var in environ), "the trap is set"
    ok(live, server.url("/hello"))  # direct; the honeypot (the proxy) sees nothing


# --- the SSRF guard ----------------------------------------------------------------------

INTERNAL = [
    "http://127.1:{hp}/",
    "http://0x7f000001:{hp}/",
    "http://017700000001:{hp}/",
    "http://2130706433:{hp}/",
    "http://[::ffff:127.0.0.1]:{hp}/",
    "http://[::1]:{hp}/",
    "http://0.0.0.0:{hp}/",
    "http://127.0.0.1:{hp}/",  # loopback, but not the port opened on purpose
    "http://localhost:{hp}/",  # a name that resolves to a loopback address
    "http://169.254.169.254/latest/meta-data/",
    "http://100.64.0.1/",
    "http://10.0.0.1/",
    "http://[fd00::1]/",
    "http://[fe80::1]/",
    "http://224.0.0.1/",
]


@pytest.mark.parametrize("template", INTERNAL)
def test_internal_addresses_are_refused_before_connecting(
    live: Cluster, honeypot: Honeypot, template: str
) -> None:
    url = template.format(hp=honeypot.port)
    out, body = fetch(live, url, connect_timeout_s=1)
    assert error_code(out) == "url_not_allowed", out
    assert "allow_hosts" in out["error"]["message"], "the message says how to open a host"
    assert body == b""


@pytest.mark.parametrize(
    "template",
    [
        "http://user:secret@127.0.0.1:{ok}/hello",  # refused even for an opened host
        "http://127.0.0.1:{ok}@127.0.0.1:{hp}/",
        "http://127.0.0.1:{ok}\\@127.0.0.1:{hp}/",
        "http://@127.0.0.1:{hp}/",
    ],
)
def test_userinfo_tricks_are_refused(
    live: Cluster, server: TestServer, honeypot: Honeypot, template: str
) -> None:
    out, _ = fetch(live, template.format(ok=server.port, hp=honeypot.port))
    assert error_code(out) == "url_not_allowed", out


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "ftp://127.0.0.1/", "gopher://127.0.0.1:70/_x", "data:,x"]
)
def test_other_schemes_are_refused(live: Cluster, url: str) -> None:
    out, _ = fetch(live, url)
    assert error_code(out) == "url_not_allowed"
    assert "only http:// and https://" in out["error"]["message"]


@pytest.mark.parametrize(
    "target",
    [
        "http://127.1:{hp}/",
        "http://localhost:{hp}/",
        "http://169.254.169.254/latest/meta-data/",
        "file:///etc/passwd",
    ],
)
def test_a_redirect_to_an_internal_or_non_http_url_is_refused(
    live: Cluster, server: TestServer, honeypot: Honeypot, target: str
) -> None:
    location = target.format(hp=honeypot.port)
    out, body = fetch(live, server.url(f"/redirect?to={location}"))
    assert error_code(out) == "url_not_allowed", out
    assert "redirected to a refused URL" in out["error"]["message"]
    assert body == b""


# --- hostile responses ---------------------------------------------------------------------


def test_a_gzip_bomb_stops_at_the_cap(live: Cluster, server: TestServer) -> None:
    out, body = fetch(live, server.url("/gzip-bomb"))
    result = out["result"]
    assert result["truncated"] is True and result["decoded"] is True
    assert body == bytes(CAP), "exactly the cap, counted after decoding"
    assert out["invocation"]["truncated"] is True


def test_stacked_encodings_are_passed_through_undecoded(live: Cluster, server: TestServer) -> None:
    result, body = ok(live, server.url("/double-gzip"))
    assert result["decoded"] is False
    assert len(body) < MIB and body[:2] == b"\x1f\x8b", "the raw gzip bytes, not inflated"


def test_a_big_plain_body_is_truncated_at_five_mib(live: Cluster, server: TestServer) -> None:
    result, body = ok(live, server.url(f"/bytes?n={6 * MIB}"))
    assert result["truncated"] is True and len(body) == CAP
    assert body == pattern(CAP)


def test_a_content_length_that_promises_more_than_is_sent(
    live: Cluster, server: TestServer
) -> None:
    result, body = ok(live, server.url("/short-body"))
    assert body == b"ten bytes!" and result["truncated"] is False
    assert result["body_error"] and "ended the body early" in result["body_error"]


def test_a_content_length_that_promises_less_than_is_sent(
    live: Cluster, server: TestServer
) -> None:
    result, body = ok(live, server.url("/long-body"))
    assert body == b"xxxxx" and result["body_error"] is None


def test_a_terabyte_content_length_is_read_to_the_cap_only(
    live: Cluster, server: TestServer
) -> None:
    result, body = ok(live, server.url("/huge-length"))
    assert result["truncated"] is True and len(body) == CAP


def test_a_chunked_body_that_never_ends_is_cut_at_the_cap(
    live: Cluster, server: TestServer
) -> None:
    # Answered ok: cut at the cap, not by the total timeout (that answers `timeout`).
    result, body = ok(live, server.url("/chunked-forever"))
    assert result["truncated"] is True and len(body) == CAP


def test_a_body_in_one_byte_chunks_is_cut_after_its_most_pieces(
    live: Cluster, server: TestServer
) -> None:
    """Each chunk is a trip through the worker's loop: past MAX_PIECES the read stops
    and says why (review25 G2: 5 MiB of one-byte chunks took 30 s of the worker's CPU)."""
    result, body = ok(live, server.url("/tiny-chunks"))
    assert body == b"A" * MAX_PIECES and result["truncated"] is True
    assert f"more than {MAX_PIECES:,} pieces" in result["body_error"]


def test_endless_interim_responses_end_after_the_most_a_fetch_reads_before_a_body(
    live: Cluster, server: TestServer
) -> None:
    """httpcore reads 1xx responses in a loop of its own, before any body (review25 G2b:
    one such fetch took 35 s of the worker's CPU)."""
    out, _ = fetch(live, server.url("/endless-interim"))
    assert error_code(out) == "not_supported", out
    assert f"more than {HEAD_BYTES:,} bytes before the body" in out["error"]["message"]


def test_a_trickling_server_meets_the_total_timeout(live: Cluster, server: TestServer) -> None:
    """A byte every 50 ms never trips the read timeout; the total timeout ends it."""
    out, _ = fetch(live, server.url("/trickle"), total_timeout_s=1)
    assert error_code(out) == "timeout", out
    assert "total timeout of 1 s" in out["error"]["message"]  # its own, not another bound


# --- arguments -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        {"headers": {"Host": "evil.example"}},
        {"headers": {"Content-Length": "1"}},
        {"headers": {"X-A": "a\r\nInjected: 1"}},
        {"headers": {"X-A": "\u00e9"}},  # httpx cannot encode it (review25 r4: internal_error)
        {"headers": {"X-A": "a\x1bb"}},
        {"headers": {"Bad Name": "x"}},
        {"method": "CONNECT"},
        {"total_timeout_s": 11},  # above this worker's [http] total_timeout_s
        {"unknown": 1},
    ],
)
def test_unsafe_arguments_are_validation_errors(
    live: Cluster, server: TestServer, args: dict[str, object]
) -> None:
    out, _ = fetch(live, server.url("/echo"), **args)
    assert error_code(out) == "validation_error", out


def test_a_request_body_over_sixteen_mib_is_too_large(live: Cluster, server: TestServer) -> None:
    out, _ = fetch(live, server.url("/echo"), bytes(16 * MIB + 1), method="POST")
    assert error_code(out) == "too_large"


def test_nothing_listening_is_a_clear_error(live: Cluster) -> None:
    out, _ = fetch(live, f"http://127.0.0.1:{CLOSED_PORT}/")  # opened on purpose, but closed
    assert error_code(out) == "not_found", out
    assert "could not connect" in out["error"]["message"]


# --- secrets at rest (issue 10, F) ---------------------------------------------------


def test_query_values_and_header_values_stay_out_of_telemetry_and_logs(
    live: Cluster, server: TestServer
) -> None:
    url = server.url("/hello") + "?access_token=QUERYSECRET&page=2"
    out, _ = fetch(live, url, headers={"X-Trace": "HEADERSECRET"})
    assert out["status"] == "ok", out
    preview = out["invocation"]["args_preview"]
    assert "QUERYSECRET" not in preview and "HEADERSECRET" not in preview, preview
    assert "access_token=***" in preview and "X-Trace" in preview, preview
    log = (live.home / "worker.log").read_text()
    assert "QUERYSECRET" not in log and "HEADERSECRET" not in log


def test_a_redirect_to_a_backslashed_url_is_url_not_allowed(
    live: Cluster, server: TestServer
) -> None:
    """`http:\\\\127.0.0.1/` is no URL a browser-like parser and the guard agree on."""
    out, _ = fetch(live, server.url("/redirect") + "?to=http:%5C%5C127.0.0.1/")
    assert error_code(out) == "url_not_allowed", out


def _stored_results(path: Path, correlation_id: str) -> list[bytes]:
    """The results a database's `calls` table keeps of a call (the hub's, the ledger's,
    and the ledger's form kept at rest while it waits for the ack)."""
    with sqlite3.connect(path) as db:
        columns = {row[1] for row in db.execute("PRAGMA table_info(calls)")}
        kept = ", at_rest" if "at_rest" in columns else ""
        rows = db.execute(
            f"SELECT result{kept} FROM calls WHERE correlation_id = ?", (correlation_id,)
        ).fetchall()
    return [bytes(value) for row in rows for value in row if value is not None]


def _acked(state_db: Path, correlation_id: str) -> bool:
    with sqlite3.connect(state_db) as db:
        row = db.execute(
            "SELECT acked FROM calls WHERE correlation_id = ?", (correlation_id,)
        ).fetchone()
    return row is not None and row[0] == 1


def test_a_responses_secrets_reach_the_caller_whole_and_rest_masked(
    live: Cluster, server: TestServer
) -> None:
    """review25 G10: the response's Set-Cookie, X-Auth-Token and a token in its Location
    stayed whole for 24 h in hub.db and state.db once the caller had them."""
    secret = f"RESPSECRET{uuid.uuid4().hex[:12]}"
    cid = f"g10-{uuid.uuid4().hex}"
    url = server.url("/login") + f"?secret={secret}"
    out, _ = call(live, "http_fetch", {"url": url}, correlation_id=cid)
    assert out["status"] == "ok", out
    result = out["result"]
    headers = dict(map(tuple, result["headers"]))
    assert headers["Set-Cookie"] == f"session={secret}; HttpOnly", "the caller gets it whole"
    assert headers["X-Auth-Token"] == secret
    assert headers["Location"] == f"/home?access_token={secret}"
    state_db, hub_db = live.home / "state.db", live.home / "hub.db"
    wait_for(lambda: _acked(state_db, cid) and _stored_results(hub_db, cid), 60)
    for path in (state_db, hub_db):
        kept = _stored_results(path, cid)
        assert len(kept) == 1, (path.name, "one form kept: the one at rest")
        assert secret.encode() not in kept[0], path.name
    # A repeat of the id is answered from the hub's store: its outcome as kept, masked
    # (the body went once delivered: blob_gone).
    out, _ = call(live, "http_fetch", {"url": url}, correlation_id=cid)
    assert error_code(out) == "blob_gone" and out["replayed"], out
    again = out["error"]["details"]["result"]
    kept_headers = dict(map(tuple, again["headers"]))
    assert kept_headers["Set-Cookie"] == kept_headers["X-Auth-Token"] == "***", again
    assert kept_headers["Location"] == "/home?access_token=***"
    assert kept_headers["Content-Type"] == "text/plain", "the rest is kept as it came"
    assert again["url"] == url.replace(secret, "***") and again["status"] == 200
