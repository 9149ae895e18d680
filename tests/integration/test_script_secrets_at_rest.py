"""Passwords in the argv shapes review15 found leave nothing at rest (finding 03).

A real hub and a real `agentworker run` over loopback; the allowlist lets `sh` run
any script, so the scripts below really run (the programs they name are not installed
here, or sit behind `if false`: nothing reaches a server or changes an account), and
the top-level shapes the allowlist does not know are refused `command_not_allowed`.
After each call its password is in no byte of any file the hub and the worker keep:
state.db (previews, the ledger's stored answer, audit rows), hub.db (its stored answer,
and the request, which an answered call keeps with its args masked), and the logs.
The WAL files are first checkpointed into their databases and emptied: a call
answered after the hub committed it pending (any exec longer than the hub's 50 ms
commit delay) leaves its request's earlier row in hub.db-wal until SQLite writes over
it, a limit docs/architecture.md states; what the database keeps, its free space
included (secure_delete), holds none of it. Each failed before the fix.
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

# Each {s} is the call's password.
RUN = [
    ["sh", "-c", "cd /nonexistent\nmysql -p{s} db"],
    ["sh", "-c", "if mysql -p{s} -e 'select 1'; then echo up; fi"],
    ["sh", "-c", "for n in 1; do mysqldump -p{s} db; done"],
    ["sh", "-c", "while ! mysqladmin -p{s} ping; do break; done"],
    ["sh", "-c", "exec mysql --password {s} db"],
    ["sh", "-c", "if false; then echo {s} | sudo -S true; fi"],
    ["sh", "-c", "if false; then sudo -S true; fi <<EOF\n{s}\nEOF"],
    ["sh", "-c", "redis-cli -a{s} ping || redis-cli -a {s} ping"],
    ["sh", "-c", "env LANG=C mysql -p{s} db"],
    ["sh", "-c", "true; true && false || mysql -p{s} db | cat"],
    ["sh", "-c", "x=$(mysql -p{s} -e 'select 1'); y=`mysql -p{s}`; echo \"$(mysql -p{s})\""],
    ["sh", "-c", "true && mysql --password {s} db; true && mysql --password={s} db"],
    ["sh", "-c", "PGPASSWORD={s} psql -h 127.0.0.1 -p 9 -c 'select 1'"],
    ["sh", "-c", "curl -s -u me:{s} http://127.0.0.1:9/ || true"],
    ["sh", "-c", "git ls-remote https://me:{s}@127.0.0.1:9/x.git 2>/dev/null || true"],
    ["sh", "-c", "if false; then docker login -u me -p {s}; fi"],
    ["sh", "-c", "# one's comment\nsshpass -p {s} ssh h true"],
]
REFUSED = [
    ["redis-cli", "-a{s}", "ping"],
    ["exec", "mysql", "-p{s}"],
    ["env", "PGPASSWORD={s}", "psql", "-h", "db"],
    ["ssh", "h", "mysql -p{s} db"],
    ["docker", "exec", "db", "mysql", "-p{s}"],
    ["mongosh", "-u", "app", "-p", "{s}"],
    ["xfreerdp", "/u:me", "/p:{s}", "/v:h"],
    ["psql", "-c", "ALTER USER app WITH PASSWORD '{s}'"],
]
_AGENTS = itertools.count()


def _runs(name: str) -> str:
    return f"""
[program.{name}]
paths = ["{shutil.which(name)}"]
[[program.{name}.rule]]
id = "runs-{name}"
reason = "tests: any script"
any_args = true
"""


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("script-secrets")
    config = exec_config(folder / "policy", _runs("sh"))
    config += '\n[[grant]]\nagent = "script-*"\nscopes = ["workerHost.exec"]\n'
    with shared_cluster(folder / "home", extra_config=config) as cluster:
        yield cluster


def _rows(path: Path, query: str, *params: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as db:
        return list(db.execute(query, params))


def _call(live: Cluster, argv: list[str]) -> dict[str, Any]:
    """Call exec as an agent of its own and wait for all the call leaves at rest."""
    agent = f"script-{next(_AGENTS)}-{uuid.uuid4().hex[:6]}"
    response = live.run(
        lambda client: client.dispatch(
            agent_id=agent,
            surface="workerHost",
            action="exec",
            args_json=json.dumps({"argv": argv, "timeout_s": 20}),
        )
    )
    out = result_to_dict(response)
    cid = out["correlation_id"]
    state, hub = live.home / "state.db", live.home / "hub.db"
    answered = "SELECT 1 FROM calls WHERE correlation_id = ? AND result IS NOT NULL"
    wait_for(lambda: _rows(hub, answered, cid), 60)
    wait_for(lambda: _rows(state, "SELECT 1 FROM invocations WHERE correlation_id = ?", cid), 60)
    code = (out.get("error") or {}).get("code")
    if code and ErrorCode(code).audited:
        audited = "SELECT 1 FROM audit_events WHERE correlation_id = ?"
        wait_for(lambda: _rows(state, audited, cid), 60)
    return out


def _checkpointed(path: Path) -> bool:
    """Whether `path`'s WAL was copied into it whole and emptied (not busy)."""
    with sqlite3.connect(path) as db:
        busy, _, _ = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    return busy == 0


def _kept_at(live: Cluster, secret: str) -> list[str]:
    """The files of the hub's and the worker's home holding `secret`, byte for byte."""
    for name in ("hub.db", "state.db"):
        wait_for(lambda name=name: _checkpointed(live.home / name), 60)  # type: ignore[misc]
    return [
        path.name
        for path in sorted(live.home.iterdir())
        if path.is_file() and secret.encode() in path.read_bytes()
    ]


@pytest.mark.parametrize("shape", RUN, ids=lambda shape: shape[2][:40].replace("{s}", "X"))
def test_a_script_that_ran_leaves_its_password_nowhere(live: Cluster, shape: list[str]) -> None:
    secret = f"PW3mask17{uuid.uuid4().hex[:12]}"
    argv = [item.replace("{s}", secret) for item in shape]
    out = _call(live, argv)
    assert out["status"] == "ok", out  # it ran
    assert not _kept_at(live, secret), argv
    preview = out["invocation"]["args_preview"]
    assert "***" in preview and "sh" in preview, preview


@pytest.mark.parametrize("shape", REFUSED, ids=lambda shape: " ".join(shape)[:40])
def test_a_refused_argv_leaves_its_password_nowhere(live: Cluster, shape: list[str]) -> None:
    secret = f"PW3mask17{uuid.uuid4().hex[:12]}"
    argv = [item.replace("{s}", secret) for item in shape]
    out = _call(live, argv)
    assert out["error"]["code"] == "command_not_allowed", out
    assert not _kept_at(live, secret), argv
