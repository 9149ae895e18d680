"""Passwords in an exec's argv leave nothing at rest (review14 finding 01).

The reviewer's 18 argv shapes, each through a real hub and a real `agentworker run`
(real subprocesses, loopback gRPC), each with a password of its own: curl options the
masking did not know, mysql's cut `--pass=`, known programs behind wrappers (timeout,
env, nice, sh -c), and programs it did not know (openssl, gpg, zip, redis-cli,
htpasswd, ldapsearch, docker login). The allowlist makes curl, openssl, gpg, zip and
timeout `ask` rules (headless: refused scope_required, naming the ask as a grant for
it would be kept); the rest are refused command_not_allowed. After each call, its
password is in none of state.db and its log (telemetry previews, the ledger's stored
answer, audit rows), the logs (hub.log's audit lines included: each call is another
agent's, so each has its line) and hub.db's stored answers. (hub.db keeps each request
whole for its 24 h of at-most-once, by design: only its answers are looked at there.)
Each one failed before review14's fix.
"""

from __future__ import annotations

import itertools
import json
import shutil
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import Cluster, wait_for
from tests.support.host_calls import shared_cluster
from tests.support.policies import exec_config
from worker.errors import ErrorCode
from worker.hub.client import result_to_dict

ASKED = ("curl", "openssl", "gpg", "zip", "timeout")

SHAPES = [
    ["curl", "--pass", "{s}", "--cert", "c.pem", "https://x"],
    ["curl", "-E", "c.pem:{s}", "https://x"],
    ["curl", "--cert", "c.pem:{s}", "https://x"],
    ["curl", "--proxy-pass", "{s}", "-x", "http://p:1", "https://x"],
    ["curl", "--oauth2-bearer", "{s}", "https://x"],
    ["timeout", "5", "curl", "-u", "me:{s}", "https://x"],
    ["openssl", "enc", "-aes256", "-pass", "pass:{s}"],
    ["openssl", "pkcs12", "-in", "a.p12", "-passin", "pass:{s}"],
    ["gpg", "--batch", "--passphrase", "{s}", "-d", "f.gpg"],
    ["zip", "-P", "{s}", "a.zip", "f"],
    ["mysql", "--pass={s}", "db"],
    ["nice", "mysql", "-p{s}", "db"],
    ["env", "curl", "-u", "me:{s}", "https://x"],
    ["sh", "-c", "curl -u me:{s} https://x"],
    ["redis-cli", "-a", "{s}", "ping"],
    ["htpasswd", "-b", "f", "user", "{s}"],
    ["ldapsearch", "-w", "{s}", "-D", "cn=admin"],
    ["docker", "login", "-p", "{s}", "-u", "me"],
]
_AGENTS = itertools.count()


# A rule the calls below do not fit: the refusal quotes the command in its own words.
UNZIP_LISTS = """
[program.unzip]
paths = ["/usr/bin/unzip"]
[[program.unzip.rule]]
id = "unzip-lists"
reason = "lists an archive"
flags = ["-l"]
positionals = ["read_path"]
"""


def _asks(name: str) -> str:
    return f"""
[program.{name}]
paths = ["{shutil.which(name)}"]
[[program.{name}.rule]]
id = "asks-{name}"
decision = "ask"
reason = "the person approves each"
any_args = true
"""


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("argv-secrets")
    asked = [_asks(name) for name in ASKED if shutil.which(name)]
    config = exec_config(folder / "policy", *asked, UNZIP_LISTS if shutil.which("unzip") else "")
    config += '\n[[grant]]\nagent = "argv-*"\nscopes = ["workerHost.exec"]\n'
    with shared_cluster(folder / "home", extra_config=config) as cluster:
        yield cluster


def _rows(path: Path, query: str, *params: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as db:
        return list(db.execute(query, params))


def _call_leaves_nothing(live: Cluster, argv: list[str], secret: str) -> dict[str, Any]:
    """Call exec with `argv` as an agent of its own (its own hub.log line), wait for
    what the call leaves (the hub's stored answer, the invocation row, the audit row),
    and say where `secret` was found at rest; returns what the caller got."""
    agent = f"argv-{next(_AGENTS)}-{uuid.uuid4().hex[:6]}"
    response = live.run(
        lambda client: client.dispatch(
            agent_id=agent,
            surface="workerHost",
            action="exec",
            args_json=json.dumps({"argv": argv}),
        )
    )
    out = result_to_dict(response)
    code, cid = out["error"]["code"], out["correlation_id"]
    state, hub = live.home / "state.db", live.home / "hub.db"
    answered = "SELECT 1 FROM calls WHERE correlation_id = ? AND result IS NOT NULL"
    wait_for(lambda: _rows(hub, answered, cid), 60)
    wait_for(lambda: _rows(state, "SELECT 1 FROM invocations WHERE correlation_id = ?", cid), 60)
    if ErrorCode(code).audited:
        audited = "SELECT 1 FROM audit_events WHERE correlation_id = ?"
        wait_for(lambda: _rows(state, audited, cid), 60)
    found = []
    files = [path for path in sorted(live.home.glob("state.db*")) if path.is_file()]
    files += sorted(live.home.glob("*.log"))
    for path in files:
        if secret.encode() in path.read_bytes():
            found.append(path.name)
    answers = _rows(hub, "SELECT result FROM calls WHERE result IS NOT NULL")
    if any(secret.encode() in bytes(answer) for (answer,) in answers):  # type: ignore[arg-type]
        found.append("hub.db answers")
    assert not found, (argv, found)
    return out


@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: " ".join(shape[:2]).replace("{s}", "X"))
def test_a_password_in_argv_is_nowhere_at_rest(live: Cluster, shape: list[str]) -> None:
    secret = f"PW0mask15{uuid.uuid4().hex[:12]}"
    argv = [item.replace("{s}", secret) for item in shape]
    out = _call_leaves_nothing(live, argv, secret)
    code = out["error"]["code"]
    assert code == ("scope_required" if argv[0] in ASKED else "command_not_allowed"), out
    # What is kept still says what was asked: the program, and the rest masked.
    preview = out["invocation"]["args_preview"]
    assert argv[0] in preview and "***" in preview, preview


def test_a_refusal_that_quotes_the_command_masks_its_password(live: Cluster) -> None:
    """The allowlist's refusal quotes the command ("`unzip -P X -l a.zip` ..."): the
    password the argv holds is masked in that text too (pipeline: argv_secrets)."""
    if not shutil.which("unzip"):
        pytest.skip("no unzip here")
    secret = f"PW0mask15{uuid.uuid4().hex[:12]}"
    argv = ["unzip", "-P", secret, "-l", "a.zip"]
    out = _call_leaves_nothing(live, argv, secret)
    assert out["error"]["code"] == "command_not_allowed", out
    assert "unzip -P ***" in out["error"]["message"], out
