"""The README's path, as a person walks it: `agentworker up`, then the CLI against it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from tests.support.cluster import free_port, wait_for
from worker.errors import ConfigError, CredentialsError, InUseError


def cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", *argv], env=env, capture_output=True, text=True, timeout=60
    )


def test_up_then_grant_then_call_from_a_fresh_home(tmp_path: Path) -> None:
    home = tmp_path / "fresh"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTWORKER_")}
    env["AGENTWORKER_HOME"] = str(home)
    env["AGENTWORKER_LISTEN"] = f"127.0.0.1:{free_port()}"
    log = (tmp_path / "up.log").open("w")
    up = subprocess.Popen(
        [sys.executable, "-m", "worker", "up"], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        wait_for(lambda: cli(env, "status").returncode == 0, 20)
        first_start = (tmp_path / "up.log").read_text()
        assert "first start" in first_start and str(home / "workspace") in first_start
        assert (home / "config.toml").exists()
        assert oct((home / "hub.token").stat().st_mode & 0o777) == "0o600"

        (home / "workspace" / "hello.txt").write_text("hi")
        refused = cli(env, "call", "fs_stat", '{"path": "hello.txt"}', "--agent", "me")
        assert refused.returncode == 1
        assert json.loads(refused.stdout)["error"]["code"] == "scope_required"

        granted = cli(env, "grant", "workerHost.fs_stat", "--agent", "me", "--for", "1h")
        assert granted.returncode == 0, granted.stderr
        ok = cli(env, "call", "fs_stat", '{"path": "hello.txt"}', "--agent", "me")
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert json.loads(ok.stdout)["result"]["size"] == 2

        killed = cli(env, "kill", "plan-x")
        assert killed.returncode == 0, killed.stdout + killed.stderr
        blocked = cli(env, "call", "fs_stat", '{"path": "."}', "--agent", "me", "--plan", "plan-x")
        assert json.loads(blocked.stdout)["error"]["code"] == "plan_killed"
        assert cli(env, "lift", "plan-x").returncode == 0
        lifted = cli(env, "call", "fs_stat", '{"path": "."}', "--agent", "me", "--plan", "plan-x")
        assert json.loads(lifted.stdout)["status"] == "ok"

        workers = json.loads(cli(env, "workers", "--json").stdout)
        assert [w["connected"] for w in workers] == [True]
    finally:
        up.send_signal(signal.SIGTERM)
        assert up.wait(30) == 0
        log.close()


def test_clients_explain_a_missing_hub(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTWORKER_")}
    env["AGENTWORKER_HOME"] = str(tmp_path / "nohub")
    out = cli(env, "workers")  # `status` says it its own way (test_first_hour)
    assert out.returncode == CredentialsError.exit_code
    assert "start the hub first" in out.stderr
    assert "Traceback" not in out.stderr


def test_grant_rejects_a_malformed_scope(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTWORKER_")}
    env["AGENTWORKER_HOME"] = str(tmp_path / "g")
    out = cli(env, "grant", "rm -rf /")
    assert out.returncode == 2
    assert "is not a scope" in out.stderr


def test_a_second_hub_on_a_taken_address_says_so(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTWORKER_")}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env["AGENTWORKER_HOME"] = str(tmp_path / "second")
        env["AGENTWORKER_LISTEN"] = f"127.0.0.1:{taken.getsockname()[1]}"
        out = cli(env, "up")
    assert out.returncode == InUseError.exit_code
    assert "the address is in use" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_broken_config_file_has_its_own_exit_code_and_says_where(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTWORKER_")}
    home = tmp_path / "broken"
    home.mkdir()
    (home / "config.toml").write_text("[worker]\nmax_concurrency = 'many'\n")
    env["AGENTWORKER_HOME"] = str(home)
    out = cli(env, "status")
    assert out.returncode == ConfigError.exit_code
    assert "config.toml" in out.stderr and "max_concurrency" in out.stderr
    assert "Traceback" not in out.stderr
