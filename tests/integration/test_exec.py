"""workerHost.exec end to end: hub → worker → allowlist → bubblewrap → back, for real.

One worker serves the module. Its environment holds a token and secrets (which no
child may see) and a PATH that puts the workspace first (which must not matter).
Its allowlist file adds a few programs the default never allows, to misbehave with.
"""

from __future__ import annotations

import os
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox import _pidcap
from tests.support.cluster import Cluster, cluster, wait_for
from tests.support.host_calls import call
from tests.support.policies import ENV, PRINTENV, PYTHON3, TOUCH_ASKS, YES, exec_config
from tests.support.procs import STUBBORN, marker, processes_with, wait_until_gone
from worker.wire.proto import agentworker_pb2 as pb

SECRETS = {"GITHUB_TOKEN": "ghp_not_for_children", "MY_API_KEY": "sk-not-for-children"}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("exec")
    rules = (PYTHON3, PRINTENV, ENV, YES, TOUCH_ASKS)
    extra = 'pass_env = ["LANG", "HARMLESS_VAR"]\ntmp_mb = 32\n'
    settings = exec_config(base, *rules, extra=extra)
    with cluster(base / "home", worker=False, extra_config=settings) as c:
        env = {
            "AGENTWORKER_TOKEN": c.token,
            "HARMLESS_VAR": "visible",
            "PATH": f"{c.workspace}:{os.environ['PATH']}",
            **SECRETS,
        }
        worker = c.spawn("worker", "run", env=env)
        wait_for(lambda: c.status().connected_workers >= 1, 60, worker)
        yield c


def run_exec(
    live: Cluster, argv: list[str], *, blob: bytes = b"", **fields: Any
) -> tuple[dict[str, Any], bytes]:
    args: dict[str, Any] = {"argv": argv}
    for key in ("cwd", "timeout_s"):
        if key in fields:
            args[key] = fields.pop(key)
    return call(live, "exec", args, blob, **fields)


def in_background(live: Cluster, argv: list[str], **fields: Any) -> dict[str, Any]:
    box: dict[str, Any] = {}

    def go() -> None:
        box["out"], box["blob"] = run_exec(live, argv, **fields)

    box["thread"] = threading.Thread(target=go, daemon=True)
    box["thread"].start()
    return box


def test_cat_prints_a_file_and_reads_stdin_from_the_blob(live: Cluster) -> None:
    (live.workspace / "a.txt").write_text("from a file\n")
    out, blob = run_exec(live, ["cat", "a.txt", "-"], blob=b"from stdin\n")
    assert out["status"] == "ok", out
    assert out["result"]["program"] == "/usr/bin/cat" and out["result"]["rule"] == "cat"
    assert out["result"]["exit_code"] == 0 and out["result"]["signal"] is None
    assert blob == b"from a file\nfrom stdin\n"
    assert out["result"]["stdout_bytes"] == len(blob) and out["result"]["stderr_bytes"] == 0
    assert out["invocation"]["sandboxed"] is True


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["/tmp/git", "log"], "command_not_allowed"),
        (["./git", "log"], "command_not_allowed"),
        (["../bin/git", "log"], "command_not_allowed"),
        (["sh", "-c", "id"], "command_not_allowed"),
        (["ls", "-rf"], "command_not_allowed"),
        (["cat", "--output=/x"], "command_not_allowed"),
        (["sed", "1e id", "a.txt"], "command_not_allowed"),
        (["git", "-c", "core.pager=sh", "log"], "command_forbidden"),
        (["git", "-C", "/", "log"], "command_forbidden"),
        (["find", ".", "-exec", "sh", "-c", "id", ";"], "command_forbidden"),
        (["rg", "--pre=sh", "x"], "command_forbidden"),
        (["sed", "-i", "s/a/b/", "a.txt"], "command_forbidden"),
        (["cat", "/etc/passwd"], "path_not_allowed"),
        (["grep", "-r", "root", "/etc"], "path_not_allowed"),
        (["sort", "--rev", "a.txt"], "command_not_allowed"),  # --reverse, abbreviated
        (["git", "diff", "-U", "/etc/passwd"], "path_not_allowed"),  # -U takes no "next"
    ],
)
def test_refusals_answer_with_their_code_and_leave_an_audit_row(
    live: Cluster, argv: list[str], code: str
) -> None:
    out, _ = run_exec(live, argv)
    assert out["status"] == "error" and out["error"]["code"] == code, out
    assert out["error"]["details"]["argv"] == argv
    assert out["invocation"]["error_code"] == code


def test_an_abbreviated_option_is_refused_with_the_option_to_write_in_full(
    live: Cluster,
) -> None:
    out, _ = run_exec(live, ["git", "log", "--onel"])
    assert out["error"]["code"] == "command_not_allowed"
    assert "abbreviation of --oneline" in out["error"]["message"]
    assert "write the option in full" in out["error"]["message"]


def test_gnu_sed_e_command_is_refused_by_sed_itself_in_sandbox_mode(live: Cluster) -> None:
    (live.workspace / "lines.txt").write_text("one\n")
    out, blob = run_exec(live, ["sed", "--sandbox", "1e id", "lines.txt"])
    assert out["result"]["exit_code"] == 1
    assert b"e/r/w commands disabled in sandbox mode" in blob


def test_symbolic_links_cannot_lead_arguments_or_cwd_out(live: Cluster) -> None:
    """/etc/passwd is in the sandbox (ls -l needs it), so links to it must be caught first."""
    links = live.workspace / "links"
    (links / "a").mkdir(parents=True)
    (links / "pw").symlink_to("/etc/passwd")
    (links / "a" / "top").symlink_to(live.workspace)  # a folder link, then '..'
    for argv, cwd in (
        (["cat", "pw"], "links"),
        (["cat", "a/top/../etc/passwd"], "links"),
        (["cat", "../etc/passwd"], "links/a/top"),  # a symlinked cwd: '..' means its target's
    ):
        out, blob = run_exec(live, argv, cwd=cwd)
        assert out["status"] == "error", (argv, blob)
        assert out["error"]["code"] == "path_not_allowed", out
    (links / "inside.txt").write_text("fine\n")
    (links / "ok").symlink_to(links / "inside.txt")
    out, blob = run_exec(live, ["cat", "ok"], cwd="links")
    assert blob == b"fine\n"


def test_file_names_that_look_like_options_stay_file_names(live: Cluster) -> None:
    (live.workspace / "-rf").write_text("dash rf\n")
    (live.workspace / "--output=x").write_text("dash output\n")
    out, blob = run_exec(live, ["cat", "--", "-rf", "--output=x"])
    assert out["status"] == "ok" and blob == b"dash rf\ndash output\n"


def test_shell_metacharacters_arrive_as_inert_text(live: Cluster) -> None:
    text = "a; touch pwned && b | c $(touch pwned) `touch pwned`\nsecond line"
    out, blob = run_exec(live, ["echo", text])
    assert out["status"] == "ok" and blob == text.encode() + b"\n"
    assert not (live.workspace / "pwned").exists()


def test_a_workspace_binary_never_shadows_the_pinned_program(live: Cluster) -> None:
    impostor = live.workspace / "cat"
    impostor.write_text("#!/bin/sh\necho pwned\n")
    impostor.chmod(impostor.stat().st_mode | stat.S_IXUSR)
    (live.workspace / "b.txt").write_text("real cat\n")
    out, blob = run_exec(live, ["cat", "b.txt"])  # the worker's PATH starts with the workspace
    assert out["result"]["program"] == "/usr/bin/cat" and blob == b"real cat\n"
    refused, _ = run_exec(live, ["./cat", "b.txt"])
    assert refused["error"]["code"] == "command_not_allowed"


def test_env_and_printenv_show_no_token_or_secret(live: Cluster) -> None:
    for argv in (["env"], ["printenv"]):
        out, blob = run_exec(live, argv)
        assert out["status"] == "ok", out
        text = blob.decode()
        assert live.token not in text
        for value in SECRETS.values():
            assert value not in text
        assert "AGENTWORKER" not in text and "HARMLESS_VAR=visible" in text
        assert "PATH=/usr/local/bin:/usr/bin:/bin" in text


def test_yes_flood_is_capped_and_the_worker_stays_responsive(live: Cluster) -> None:
    """Calls are answered while yes floods: an order of events, not a time (a worker
    stuck on the flood's pipe would answer nothing until the flood ends). The limit
    this replaced, each call under 1 s by the clock, failed at load 16."""
    flood = in_background(live, ["yes"], timeout_s=3)
    answered_meanwhile = 0
    while flood["thread"].is_alive():
        out, _ = call(live, "fs_stat", {"path": "."})
        assert out["status"] == "ok", out
        answered_meanwhile += flood["thread"].is_alive()
    out, blob = flood["out"], flood["blob"]
    assert out["status"] == "ok", out
    assert out["result"]["truncated"] and out["result"]["timed_out"]
    assert out["result"]["signal"] == "SIGKILL"
    assert len(blob) == 1024 * 1024 and set(blob) == set(b"y\n")
    assert out["invocation"]["truncated"] is True
    # The first may come before yes starts; the rest cannot all.
    assert answered_meanwhile >= 3, "calls waited for the flood to end"


def test_the_exec_timeout_returns_the_output_so_far_and_kills_every_child(live: Cluster) -> None:
    tag = marker()
    out, blob = run_exec(live, ["python3", "-c", STUBBORN, tag], timeout_s=1)
    assert out["status"] == "ok", out
    assert out["result"]["timed_out"] and out["result"]["signal"] == "SIGKILL"
    assert blob == b"started\n"
    assert wait_until_gone(tag) == []


def test_the_call_deadline_kills_the_command_and_its_children(live: Cluster) -> None:
    tag = marker()
    out, _ = run_exec(live, ["python3", "-c", STUBBORN, tag], timeout_ms=1500)
    assert out["error"]["code"] == "timeout", out
    assert wait_until_gone(tag) == []


def test_the_kill_switch_stops_a_running_exec_and_its_children(live: Cluster) -> None:
    tag = marker()
    running = in_background(live, ["python3", "-c", STUBBORN, tag], plan_id="doomed-plan")
    wait_for(lambda: len(processes_with(tag)) >= 2, 10)
    live.run(
        lambda c: c.stub.KillPlan(
            pb.KillPlanRequest(plan_id="doomed-plan", reason="test"), metadata=c.metadata
        )
    )
    running["thread"].join(10)
    assert running["out"]["error"]["code"] == "plan_killed"
    assert wait_until_gone(tag) == []


def test_a_fork_bomb_and_a_memory_hog_are_contained(live: Cluster) -> None:
    bomb = (
        "import os, time\nfailed = False\nfor _ in range(11):\n    try:\n        os.fork()\n"
        "    except OSError:\n        failed = True\n        break\n"
        "os.write(1, b'E' if failed else b'.')\ntime.sleep(600)\n"
    )
    tag = marker()
    out, blob = run_exec(live, ["python3", "-c", bomb, tag], timeout_s=2.5)
    assert out["result"]["timed_out"] and b"E" in blob
    assert len(blob) <= _pidcap.most_at_once(64)  # the cap: RLIMIT_NPROC, or pid_max for root
    assert wait_until_gone(tag) == []
    hog, hog_blob = run_exec(live, ["python3", "-c", "b = bytearray(16 * 1024**3)"])
    assert hog["result"]["exit_code"] == 1 and b"MemoryError" in hog_blob
    assert live.call("workerHost.fs_stat", '{"path": "."}')["status"] == "ok"


FILL_TMP = """
import errno
written = 0
try:
    for n in range(64):  # 4 MiB files, each far under the per-file cap
        with open(f"/tmp/f{n}", "wb") as f:
            for _ in range(4):
                f.write(bytes(1024 * 1024))
                written += 1
except OSError as exc:
    print("full" if exc.errno == errno.ENOSPC else exc, written)
else:
    print("all", written)
"""


def test_the_sandboxs_tmp_holds_no_more_than_its_size(live: Cluster) -> None:
    """/tmp is a tmpfs: its pages are memory that no rlimit counts (GNU sort spilled
    976 MiB there with memory_mb = 256). It is as large as [exec] tmp_mb (32 here)."""
    out, blob = run_exec(live, ["python3", "-c", FILL_TMP])
    assert out["status"] == "ok", out
    verdict, written = blob.decode().split()
    assert verdict == "full" and 28 <= int(written) <= 32, blob


def test_an_ask_rule_is_refused_when_no_one_can_be_asked(live: Cluster) -> None:
    out, _ = run_exec(live, ["touch", "asked.txt"])
    assert out["error"]["code"] == "scope_required"
    # Named by program, count, folder and digest: no argument of it is kept (review14 01).
    assert "workerHost.exec touch (1 arg) in " in out["error"]["message"]
    assert "asked.txt" not in out["error"]["message"]
    assert not (live.workspace / "asked.txt").exists()


def test_git_reads_history_and_repository_config_cannot_run_programs(live: Cluster) -> None:
    repo = live.workspace / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    (repo / "f.txt").write_text("x\n")
    subprocess.run([*git, "add", "f.txt"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "first commit"], cwd=repo, check=True)
    hook = repo / "fsmonitor.sh"
    hook.write_text(f"#!/bin/sh\ntouch {repo}/pwned\n")
    hook.chmod(0o755)
    subprocess.run(["git", "config", "core.fsmonitor", str(hook)], cwd=repo, check=True)
    subprocess.run(["git", "status", "--short"], cwd=repo, check=True, capture_output=True)
    assert (repo / "pwned").exists(), "the trap is armed: plain git runs the hook"
    (repo / "pwned").unlink()
    out, blob = run_exec(live, ["git", "log", "--oneline"], cwd="repo")
    assert out["result"]["exit_code"] == 0 and b"first commit" in blob
    status, _ = run_exec(live, ["git", "status", "--short"], cwd="repo")
    assert status["result"]["exit_code"] == 0
    assert not (repo / "pwned").exists(), "the repository's core.fsmonitor ran"


def test_cwd_must_be_a_folder_inside_the_shared_folders(live: Cluster) -> None:
    (live.workspace / "sub").mkdir(exist_ok=True)
    inside, blob = run_exec(live, ["pwd"], cwd="sub")
    assert inside["status"] == "ok"
    assert blob.decode().strip() == os.path.realpath(live.workspace / "sub")
    outside, _ = run_exec(live, ["pwd"], cwd="/etc")
    assert outside["error"]["code"] == "path_not_allowed"
    (live.workspace / "file.txt").write_text("")
    not_dir, _ = run_exec(live, ["pwd"], cwd="file.txt")
    assert not_dir["error"]["code"] == "not_directory"


def test_a_timeout_over_the_ceiling_is_a_validation_error(live: Cluster) -> None:
    out, _ = run_exec(live, ["true"], timeout_s=100_000)
    assert out["error"]["code"] == "validation_error" and "ceiling" in out["error"]["message"]


def test_a_broken_allowlist_refuses_every_exec_until_fixed(live: Cluster) -> None:
    policy = live.home.parent / "allowlist.toml"
    good = policy.read_text()
    broken = '\n[[program.yes.rule]]\nid = "broken-example"\nreason = "r"\nmatch = ["yes -x"]\n'
    policy.write_text(good + broken)
    try:
        out, _ = run_exec(live, ["true"])
        assert out["error"]["code"] == "command_not_allowed"
        assert "rule broken-example" in out["error"]["message"]
    finally:
        policy.write_text(good)
    assert run_exec(live, ["true"])[0]["status"] == "ok"


def test_no_bubblewrap_means_sandbox_unavailable(tmp_path: Path) -> None:
    settings = '[exec]\nbwrap = "/nonexistent/bwrap"\n'
    with cluster(tmp_path / "home", extra_config=settings) as c:
        out, _ = run_exec(c, ["true"])
    assert out["error"]["code"] == "sandbox_unavailable"
    assert "apt install bubblewrap" in out["error"]["message"]
    assert out["error"]["retryable"] is True


def test_xxd_never_takes_an_option_after_its_input_as_a_flag(live: Cluster) -> None:
    """xxd stops reading options at its input file, so `xxd in -p` would write a hex
    dump to a file named `-p`: a write through a read-only rule. It is refused."""
    box = live.workspace / "xxd"
    box.mkdir()
    (box / "a.bin").write_bytes(b"hello")
    for argv in (["xxd", "a.bin", "-p"], ["xxd", "a.bin", "-c16"]):
        out, _ = run_exec(live, argv, cwd="xxd")
        assert out["status"] == "error" and out["error"]["code"] == "command_not_allowed", out
    out, blob = run_exec(live, ["xxd", "-p", "a.bin"], cwd="xxd")
    assert out["status"] == "ok" and blob == b"68656c6c6f\n", out
    assert sorted(os.listdir(box)) == ["a.bin"]


HOSTILE_GIT_CONFIG = """
[filter "evil"]
\tclean = "touch {mark}-filter; cat"
[diff "evil"]
\ttextconv = "sh -c 'touch {mark}-textconv; cat \\"$0\\"'"
[diff]
\texternal = "sh -c 'touch {mark}-external'"
[include]
\tpath = included
[remote "origin"]
\turl = https://example.com/repo.git
"""


def hostile_repo(folder: Path) -> None:
    """A repository whose own config names programs to run, as a downloaded archive
    of someone's working copy may: filter and textconv drivers for every file."""
    folder.mkdir()
    git = ["git", "-c", "user.email=a@b", "-c", "user.name=n", "-C", str(folder)]
    subprocess.run([*git, "init", "-q"], check=True)
    (folder / "a.txt").write_text("one\n")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "first"], check=True)
    (folder / "a.txt").write_text("one\ntwo\n")
    (folder / ".gitattributes").write_text("* filter=evil diff=evil\n")
    mark = folder / "PWNED"
    with (folder / ".git" / "config").open("a") as config:
        config.write(HOSTILE_GIT_CONFIG.format(mark=mark))
    (folder / ".git" / "included").write_text(f'[core]\n\tpager = "touch {mark}-included"\n')


def test_a_repositorys_own_config_cannot_make_git_run_programs(live: Cluster) -> None:
    """Read-only git commands on a hostile repository run no driver, pager or
    external diff named in its config; they still see its history and remotes."""
    hostile_repo(live.workspace / "hostile")
    for argv in (
        ["git", "status", "--short"],
        ["git", "diff"],
        ["git", "log", "-p", "-n", "1"],
        ["git", "show", "HEAD"],
        ["git", "blame", "a.txt"],
    ):
        out, blob = run_exec(live, argv, cwd="hostile")
        assert out["status"] == "ok" and out["result"]["exit_code"] == 0, (argv, out, blob)
    out, blob = run_exec(live, ["git", "diff"], cwd="hostile")
    assert b"+two" in blob
    out, blob = run_exec(live, ["git", "remote", "-v"], cwd="hostile")
    assert b"origin\thttps://example.com/repo.git (fetch)" in blob
    (live.workspace / "hostile" / "deeper").mkdir()
    out, blob = run_exec(live, ["git", "rev-parse", "--show-prefix"], cwd="hostile/deeper")
    assert blob == b"deeper/\n", out
    assert [p.name for p in (live.workspace / "hostile").iterdir() if "PWNED" in p.name] == []
    assert "[filter" in (live.workspace / "hostile" / ".git" / "config").read_text()


def test_git_outside_any_repository_finds_none(live: Cluster) -> None:
    (live.workspace / "not-a-repo").mkdir()
    out, blob = run_exec(live, ["git", "status"], cwd="not-a-repo")
    assert out["result"]["exit_code"] == 128 and b"not a git repository" in blob, out
