"""Landlock through a real hub and worker: what a program inside the sandbox meets, and
what the worker and `doctor` say where Landlock cannot be had (a compiler that is not
there, set in config.toml as a person would)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from tests.support.cluster import cluster
from tests.support.host_calls import call

POLICY = """
[program.python3]
paths = ["/usr/bin/python3"]
[[program.python3.rule]]
id = "test-python"
reason = "tests: a program that tries what Landlock refuses"
any_args = true
"""

PROBE = textwrap.dedent(
    """
    import os, sys
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
    print("seccomp", status["Seccomp"].strip(), flush=True)
    for path in ("written.txt", "/x"):
        try:
            open(path, "w").write("x")
            print("write", path, "ok", flush=True)
        except OSError as exc:
            print("write", path, exc.errno, flush=True)
    try:
        os.execv("/usr/bin/true", ["true"])
    except OSError as exc:
        print("exec", exc.errno, flush=True)
    """
)


def settings(tmp_path: Path, extra: str = "") -> str:
    policy = tmp_path / "allowlist.toml"
    policy.write_text(POLICY)
    return f'[exec]\npolicy = "{policy}"\n{extra}'


def probe(live: Any) -> tuple[dict[str, Any], list[str]]:
    out, blob = call(live, "exec", {"argv": ["python3", "-c", PROBE]})
    return out, blob.decode().splitlines()


def doctor(home: Path) -> dict[str, dict[str, Any]]:
    """doctor's findings by check, for the worker whose home is `home`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTWORKER_")}
    env["AGENTWORKER_HOME"] = str(home)
    done = subprocess.run(
        [sys.executable, "-m", "worker", "doctor", "--json", "--offline"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    found = {f["check"]: f for f in json.loads(done.stdout)["findings"]}
    assert len(found) == len(json.loads(done.stdout)["findings"])
    return found


def test_a_program_may_execute_only_itself_and_write_only_where_shared(tmp_path: Path) -> None:
    with cluster(tmp_path / "home", extra_config=settings(tmp_path)) as live:
        worker = next(proc for proc in live.procs if proc.name == "worker")
        assert "exec sandbox: landlock on (ABI" in worker.log()
        out, lines = probe(live)
        assert out["status"] == "ok", out
        assert lines == [
            "seccomp 2",
            "write written.txt ok",
            f"write /x {errno.EACCES}",  # the sandbox's root: a tmpfs, writable but for Landlock
            f"exec {errno.EACCES}",  # /usr/bin/true is in the sandbox, and not this rule's
        ]
        assert (live.workspace / "written.txt").read_text() == "x"
        # Built once, in the worker's own data folder, which no shared folder shows.
        built = [p.name for p in (tmp_path / "home" / "exec-cache").iterdir()]
        assert len(built) == 1 and built[0].startswith("entry-")
    findings = doctor(tmp_path / "home")
    assert findings["landlock"]["status"] == "ok"
    # Each sandbox's share of its user's inotify instances, written by the entry helper.
    shared = findings["user limits"]
    assert shared["status"] == "ok" and "may take 8 of its user's" in shared["summary"]
    # epoll watches are counted per uid: no share per sandbox, said as such.
    epoll = findings["epoll watches"]
    assert epoll["status"] == "info" and epoll["summary"].startswith("not shared out")


def test_without_a_compiler_the_worker_says_so_and_exec_runs_in_bubblewrap_alone(
    tmp_path: Path,
) -> None:
    extra = settings(tmp_path, 'cc = "/nonexistent/cc"\n')
    with cluster(tmp_path / "home", extra_config=extra) as live:
        worker = next(proc for proc in live.procs if proc.name == "worker")
        said = "exec sandbox: landlock off: no C compiler ('/nonexistent/cc')"
        assert said in worker.log()
        assert "exec runs in bubblewrap with seccomp only" in worker.log()
        out, lines = probe(live)
        assert out["status"] == "ok", out
        # Stated, not silent: bubblewrap and seccomp still hold, Landlock does not.
        assert lines[:3] == ["seccomp 2", "write written.txt ok", "write /x ok"]
        assert lines[3:] == []  # execv of true succeeded
        assert worker.log().count(said) == 1  # once, at start
    findings = doctor(tmp_path / "home")
    found = findings["landlock"]
    assert found["status"] == "info" and "no C compiler" in found["summary"]
    assert "apt install gcc libc6-dev" in found["fix"]
    shared = findings["user limits"]
    assert shared["status"] == "info" and "can take all" in shared["summary"], shared


def test_landlock_required_and_missing_refuses_exec_with_the_reason(tmp_path: Path) -> None:
    extra = settings(tmp_path, 'cc = "/nonexistent/cc"\nlandlock = "require"\n')
    with cluster(tmp_path / "home", extra_config=extra) as live:
        out, _ = probe(live)
        assert out["status"] == "error" and out["error"]["code"] == "sandbox_unavailable"
        message = out["error"]["message"]
        assert 'landlock = "require"' in message and "no C compiler" in message
        assert live.call("workerHost.fs_stat", '{"path": "."}')["status"] == "ok"
    found = doctor(tmp_path / "home")["landlock"]
    assert found["status"] == "warn" and "required" in found["summary"]
