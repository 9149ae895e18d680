"""What refused calls leave at rest: no secret of their args (review10 01).

A refusal's message quotes the call (the URL the guard refused, the argv no
allowlist rule allows); it goes into an audit row, kept 90 days, the ledger's and
the hub's stored answers, and the hub logs the event. Whatever of the args is kept
or logged is masked as `args_preview` is: after the refusals, none of the secrets is
anywhere in state.db, in the logs, or in the answers hub.db keeps.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator

import pytest

from tests.support.cluster import Cluster, wait_for
from tests.support.host_calls import call, error_code, shared_cluster

QUERY_SECRET = "QSECRETqsecret0123456789"
ARG_SECRET = "ARGSECRETargsecret98765"
HEADER_SECRET = "HDRSECRET0123456789abcdef"
SECRETS = (QUERY_SECRET, ARG_SECRET, HEADER_SECRET)

REFUSED = (
    ("http_fetch", {"url": f"http://127.0.0.1:9/x?access_token={QUERY_SECRET}"}),
    ("http_fetch", {"url": f"http://user:{ARG_SECRET}@127.0.0.1:9/x"}),
    ("exec", {"argv": ["grep", "-r", f"--password={ARG_SECRET}", "."]}),
    ("exec", {"argv": ["grep", "-r", "--password", ARG_SECRET, "."]}),
    (
        "exec",
        {
            "argv": [
                "git",
                "-c",
                f"http.extraheader=Authorization: Bearer {HEADER_SECRET}",
                "ls-remote",
                f"https://user:{ARG_SECRET}@example.com/r.git",
            ]
        },
    ),
    ("exec", {"argv": ["curl", "-H", f"Authorization: Bearer {HEADER_SECRET}", "x"]}),
    # Passwords that known programs take by short options, in clusters too.
    ("exec", {"argv": ["curl", "-vu", f"me:{ARG_SECRET}", "x"]}),
    ("exec", {"argv": ["mysql", "-h", "db", f"-Bp{ARG_SECRET}"]}),
    ("exec", {"argv": ["sshpass", "-vp", ARG_SECRET, "ssh", "h"]}),
    ("exec", {"argv": ["smbclient", f"-NUme%{ARG_SECRET}", "//h/s"]}),
)


@pytest.fixture(scope="module")
def refused(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, list[str]]]:
    home = tmp_path_factory.mktemp("refusals") / "home"
    with shared_cluster(home) as live:
        codes = []
        for action, args in REFUSED:
            out, _ = call(live, action, args)
            codes.append(error_code(out))
            # The answer's preview was masked before this change too.
            preview = out["invocation"]["args_preview"]
            assert not any(secret in preview for secret in SECRETS), preview
        yield live, codes


def test_the_calls_were_refused_and_audited(refused: tuple[Cluster, list[str]]) -> None:
    live, codes = refused
    assert all(code is not None for code in codes), codes
    with sqlite3.connect(live.home / "state.db") as db:
        rows = db.execute("SELECT kind, detail_json FROM audit_events").fetchall()
    messages = [json.loads(detail).get("message", "") for _, detail in rows]
    # The refused URL and argv are still named, masked.
    assert any("access_token=***" in message for message in messages), messages
    assert any("--password" in message for message in messages), messages
    assert len(rows) >= len(REFUSED) - 1, rows


def test_no_secret_of_a_refused_call_is_in_the_worker_files_or_logs(
    refused: tuple[Cluster, list[str]],
) -> None:
    """state.db (and its WAL) whole: audit rows, previews, the ledger's answers; every
    log; the hub's stored answers. (hub.db keeps each request whole for its 24 h of
    at-most-once, by design: only its answers are looked at there.)"""
    live, _ = refused
    found = []
    files = [path for path in sorted(live.home.glob("state.db*")) if path.is_file()]
    files += sorted(live.home.glob("*.log"))
    assert any(path.name.endswith(".log") for path in files), files
    for path in files:
        data = path.read_bytes()
        found += [(path.name, secret) for secret in SECRETS if secret.encode() in data]

    def stored() -> list[bytes]:
        """The hub's stored answers: it stores them a group commit after answering."""
        with sqlite3.connect(live.home / "hub.db") as db:
            rows = db.execute("SELECT result FROM calls WHERE result IS NOT NULL")
            return [bytes(answer) for (answer,) in rows]

    wait_for(lambda: len(stored()) >= len(REFUSED), 60)
    answers = stored()
    for answer in answers:
        found += [("hub.db answer", secret) for secret in SECRETS if secret.encode() in answer]
    assert not found, found
