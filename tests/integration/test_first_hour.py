"""A newcomer's first hour (issue 18), item by item, against a real `agentworker up`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.cluster import free_port, wait_for
from tests.support.procs import as_a_terminal_starts, marker, processes_with, wait_until_gone


@dataclass
class Up:
    env: dict[str, str]
    home: Path
    log_path: Path
    proc: subprocess.Popen[bytes]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def cli(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return cli(self.env, *argv)


def cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", *argv], env=env, capture_output=True, text=True, timeout=60
    )


def fresh_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTWORKER_")}
    env["AGENTWORKER_HOME"] = str(home)
    env["AGENTWORKER_LISTEN"] = f"127.0.0.1:{free_port()}"
    return env


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    home = tmp_path / "home"
    env = fresh_env(home)
    log_path = tmp_path / "up.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker", "up"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    running = Up(env, home, log_path, proc)
    try:
        wait_for(lambda: "ready:" in running.log() or proc.poll() is not None, 60)
        assert proc.poll() is None, running.log()
        yield running
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, running.log()


def test_up_ends_its_start_with_a_ready_line_and_three_next_commands(up: Up) -> None:
    after = up.log().split("ready:", 1)[1]
    steps = [line.strip() for line in after.splitlines()[1:4]]
    assert len(steps) == 3
    assert steps[0].endswith("grant workerHost.fs_stat --agent me --for 8h")
    # Each suggested command works as printed (the shell would strip the quotes).
    assert up.cli("grant", "workerHost.fs_stat", "--agent", "me", "--for", "8h").returncode == 0
    called = up.cli("call", "fs_stat", '{"path": "."}', "--agent", "me")
    assert called.returncode == 0, called.stdout + called.stderr
    assert steps[2].endswith("doctor")


def test_a_sandbox_first_start_speaks_of_plan_workspaces_not_roots(tmp_path: Path) -> None:
    """An operator of sandbox mode read "until you add roots", a host-mode step that
    sandbox mode ignores: its first start names where plans' workspaces go."""
    env = fresh_env(tmp_path / "home")
    log_path = tmp_path / "up.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker", "up", "--sandbox", "--headless"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: "ready:" in log_path.read_text() or proc.poll() is not None, 60)
        start = log_path.read_text().split("ready:", 1)[0]
        assert "sandbox mode: each plan gets a workspace of its own under " in start, start
        assert f"{tmp_path / 'home' / 'workbench'} at its first call" in start, start
        assert "roots" not in start and "[[root]]" not in start, start
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log_path.read_text()


def test_call_output_keeps_numbers_as_numbers(up: Up) -> None:
    (up.home / "workspace" / "n.txt").write_text("13 bytes long")
    up.cli("grant", "workerHost.fs_stat", "--agent", "me")
    out = json.loads(up.cli("call", "fs_stat", '{"path": "n.txt"}', "--agent", "me").stdout)
    invocation = out["invocation"]
    assert invocation["bytes_in"] == len('{"path": "n.txt"}')
    assert isinstance(invocation["bytes_out"], int) and invocation["bytes_out"] > 0
    assert isinstance(invocation["started_unix_ms"], int)
    assert isinstance(invocation["duration_ms"], int)
    assert out["result"]["size"] == 13


def test_an_unknown_args_field_lists_the_fields_the_action_accepts(up: Up) -> None:
    up.cli("grant", "workerHost.fs_stat", "--agent", "me")
    out = json.loads(up.cli("call", "fs_stat", '{"pth": "."}', "--agent", "me").stdout)
    error = out["error"]
    assert error["code"] == "validation_error"
    assert "workerHost.fs_stat accepts: " in error["message"]
    assert "path" in error["details"]["accepted_fields"]


def test_a_missing_args_field_is_named_as_missing(up: Up) -> None:
    """`path: Field required` read as a problem with the path given: the answer says
    the field is missing, and lists every missing one in details."""
    up.cli("grant", "workerHost.fs_read", "--agent", "me")
    called = up.cli("call", "fs_read", '{"offset": "x"}', "--agent", "me")
    error = json.loads(called.stdout)["error"]
    assert error["code"] == "validation_error"
    assert error["message"].startswith(
        "invalid arguments for workerHost.fs_read: missing required field path; offset: "
    ), error["message"]
    assert error["details"]["missing_fields"] == ["path"]


def test_not_found_names_the_folder_a_relative_path_was_looked_for_in(up: Up) -> None:
    up.cli("grant", "workerHost.fs_*", "--agent", "me")
    out = json.loads(up.cli("call", "fs_read", '{"path": "notes.md"}', "--agent", "me").stdout)
    workspace = os.path.realpath(up.home / "workspace")
    assert out["error"]["code"] == "not_found"
    assert f"Looked for {workspace}/notes.md" in out["error"]["message"]
    assert (
        f"relative paths start in the first shared folder, {workspace}" in (out["error"]["message"])
    )
    assert out["error"]["details"]["looked_for"] == f"{workspace}/notes.md"


def test_reload_makes_a_new_root_reachable_without_a_restart(up: Up, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "a.txt").write_text("a")
    up.cli("grant", "workerHost.fs_stat", "--agent", "me")
    args = json.dumps({"path": str(shared / "a.txt")})
    before = json.loads(up.cli("call", "fs_stat", args, "--agent", "me").stdout)
    assert before["error"]["code"] == "path_not_allowed"
    with (up.home / "config.toml").open("a") as config:
        config.write(f'\n[[root]]\npath = "{shared}"\nmode = "ro"\n')
    said = up.cli("reload")
    assert said.returncode == 0, said.stderr
    assert f"pid {up.proc.pid}" in said.stdout
    wait_for(lambda: "reloaded" in up.log(), 30)
    after = json.loads(up.cli("call", "fs_stat", args, "--agent", "me").stdout)
    assert after["status"] == "ok", after


def test_reload_keeps_the_old_settings_when_the_file_breaks(up: Up) -> None:
    config = up.home / "config.toml"
    good = config.read_text()
    config.write_text("[[root]\n")
    assert up.cli("reload").returncode == 0
    wait_for(lambda: "not reloaded" in up.log(), 30)
    assert "is not valid TOML" in up.log()
    config.write_text(good)  # the CLI reads it too; the worker kept its roots meanwhile
    up.cli("grant", "workerHost.fs_stat", "--agent", "me")
    still = json.loads(up.cli("call", "fs_stat", '{"path": "."}', "--agent", "me").stdout)
    assert still["status"] == "ok"


def test_reload_says_when_no_worker_runs(tmp_path: Path) -> None:
    out = cli(fresh_env(tmp_path / "none"), "reload")
    assert out.returncode == 1
    assert "no worker runs" in out.stderr and "Traceback" not in out.stderr


def test_killed_lists_the_plans_held_until_lifted(up: Up) -> None:
    assert up.cli("killed").stdout.strip() == "no plan is killed"
    assert up.cli("kill", "plan-7", "--reason", "went astray").returncode == 0
    rows = json.loads(up.cli("killed", "--json").stdout)
    assert [(r["plan"], r["reason"], r["killed_by"]) for r in rows] == [
        ("plan-7", "went astray", "cli")
    ]
    assert "plan-7" in up.cli("killed").stdout
    assert up.cli("lift", "plan-7").returncode == 0
    assert json.loads(up.cli("killed", "--json").stdout) == []


def test_a_second_hub_says_so_in_one_clean_line(tmp_path: Path) -> None:
    env = fresh_env(tmp_path / "second")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env["AGENTWORKER_LISTEN"] = f"127.0.0.1:{taken.getsockname()[1]}"
        out = cli(env, "hub")
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr  # no gRPC C-core log line before it
    assert "the address is in use" in lines[0]


def test_version_is_the_package_version() -> None:
    import worker

    out = cli(dict(os.environ), "--version")
    assert out.returncode == 0
    assert out.stdout.strip() == f"agentworker {worker.__version__}"


def test_allowlist_check_puts_forbidden_forms_under_their_own_heading(tmp_path: Path) -> None:
    out = cli(fresh_env(tmp_path / "a"), "allowlist", "check", "--", "git", "push")
    assert out.returncode != 0
    allowed, _, forbidden = out.stdout.partition("Forbidden forms:")
    assert "git log" in allowed and "difftool" not in allowed
    assert "difftool" in forbidden and "git log" not in forbidden


def test_a_missing_blob_in_file_is_said_before_anything_is_sent(up: Up, tmp_path: Path) -> None:
    up.cli("grant", "fs_write", "--agent", "me")
    out = up.cli(
        "call", "fs_write", '{"path": "x.txt", "mode": "create"}', "--agent", "me",
        "--blob-in", str(tmp_path / "nope.txt"),
    )  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    assert "no such file (nothing was sent)" in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
    assert not (up.home / "workspace" / "x.txt").exists()


def test_a_blob_out_into_a_missing_folder_is_said_before_the_call_runs(
    up: Up, tmp_path: Path
) -> None:
    data = tmp_path / "in.txt"
    data.write_text("hi")
    up.cli("grant", "workerHost.fs_*", "--agent", "me")
    out = up.cli(
        "call", "fs_write", '{"path": "y.txt", "mode": "create"}', "--agent", "me",
        "--blob-in", str(data), "--blob-out", str(tmp_path / "missing" / "out.bin"),
    )  # fmt: skip
    assert out.returncode == 2
    assert f"the folder {tmp_path / 'missing'} does not exist" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (up.home / "workspace" / "y.txt").exists()


def test_blob_out_never_keeps_an_older_answer(up: Up, tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    target.write_text("an old answer")
    up.cli("grant", "workerHost.fs_*", "--agent", "me")
    ok = up.cli("call", "fs_stat", '{"path": "."}', "--agent", "me", "--blob-out", str(target))
    assert ok.returncode == 0 and target.read_bytes() == b""  # ok with no blob: empty
    failed = up.cli(
        "call", "fs_read", '{"path": "absent.txt"}', "--agent", "me", "--blob-out", str(target)
    )
    assert failed.returncode == 1
    assert not target.exists()
    assert f"removed {target}: the call failed" in failed.stderr


def test_the_blob_out_file_is_in_place_before_the_answer_is_printed(up: Up, tmp_path: Path) -> None:
    """A script that reads the answer may open the file at once. The command is
    stopped as its first byte of answer arrives; the file must already hold the blob."""
    target = tmp_path / "out.bin"
    target.write_text("an old answer")
    (up.home / "workspace" / "page.txt").write_text("the new answer")
    up.cli("grant", "workerHost.fs_*", "--agent", "me")
    argv = ["call", "fs_read", '{"path": "page.txt"}', "--agent", "me", "--blob-out", str(target)]
    command = subprocess.Popen(
        [sys.executable, "-m", "worker", *argv], env=up.env, stdout=subprocess.PIPE
    )
    assert command.stdout is not None
    try:
        assert command.stdout.read(1) == b"{"
        command.send_signal(signal.SIGSTOP)
        assert target.read_bytes() == b"the new answer"
    finally:
        command.send_signal(signal.SIGCONT)
        command.stdout.read()
        command.stdout.close()
        assert command.wait(60) == 0


def test_fs_write_without_a_blob_is_refused_with_the_way_to_write_an_empty_file(up: Up) -> None:
    up.cli("grant", "workerHost.fs_*", "--agent", "me")
    refused = up.cli("call", "fs_write", '{"path": "e.txt", "mode": "create"}', "--agent", "me")
    assert refused.returncode == 2
    assert "--blob-in /dev/null" in refused.stderr
    assert not (up.home / "workspace" / "e.txt").exists()
    empty = up.cli(
        "call", "fs_write", '{"path": "e.txt", "mode": "create"}', "--agent", "me",
        "--blob-in", "/dev/null", "--json",
    )  # fmt: skip
    assert empty.returncode == 0, empty.stdout + empty.stderr
    assert (up.home / "workspace" / "e.txt").read_bytes() == b""


def test_grant_takes_a_bare_action_name_as_call_does(up: Up) -> None:
    granted = up.cli("grant", "fs_stat", "--agent", "me")
    assert granted.returncode == 0, granted.stderr
    assert "workerHost.fs_stat" in granted.stdout
    assert up.cli("call", "fs_stat", '{"path": "."}', "--agent", "me").returncode == 0


@pytest.mark.parametrize("scope", ["click", "typing", "mouse", "exe_"])
def test_grant_offers_no_exec_or_typing_for_another_name(tmp_path: Path, scope: str) -> None:
    """review27 I5: the closest qualified name shared workerHost.'s prefix, so the mouse
    and typing were answered "Did you mean workerHost.exec?"."""
    env = fresh_env(tmp_path / "home")
    refused = cli(env, "grant", scope, "--agent", "me")
    assert refused.returncode == 2, refused.stdout
    said = refused.stderr.split("The scopes")[0]
    assert "workerHost.exec" not in said and "key_type" not in said, said


@pytest.mark.parametrize(("scope", "marked"), [("key_type", True), ("workerComputer.*", True),
                                              ("mouse_click", False)])  # fmt: skip
def test_a_typing_grant_says_it_types_into_any_window(
    tmp_path: Path, scope: str, marked: bool
) -> None:
    """As the TUI's prompt marks key_type and key_combo (review27 I5)."""
    env = fresh_env(tmp_path / "home")
    granted = cli(env, "grant", scope, "--agent", "me")
    assert granted.returncode == 0, granted.stderr
    assert ("types into any window, a terminal too" in granted.stdout) is marked, granted.stdout


def test_grant_takes_a_bare_computer_action_name_as_call_does(tmp_path: Path) -> None:
    """`grant screenshot` granted workerHost.screenshot, which no call asks for."""
    env = fresh_env(tmp_path / "home")
    granted = cli(env, "grant", "screenshot", "--agent", "me")
    assert granted.returncode == 0, granted.stderr
    assert "grant 1: workerComputer.screenshot for agent me" in granted.stdout


@pytest.mark.parametrize(
    ("scope", "said"),
    [
        ("fs_stats", "workerHost.fs_stats names no action, so a grant of it would admit no "
         "call. Did you mean workerHost.fs_stat?"),
        ("bogus.*", "bogus.* names no action, so a grant of it would admit no call. The "
         "scopes, by surface: workerComputer. cursor_position, display_info,"),
        ("workbenchHost.*", "workbenchHost.* needs no grant: sandbox mode's"),
        # By the action, whatever surface the name was given (review27 I5: exec was
        # offered for the mouse and for typing).
        ("mouse_*", "Did you mean workerComputer.mouse_*?"),
        ("mouse_clik", "Did you mean workerComputer.mouse_click?"),
        ("keytype", "Did you mean workerComputer.key_type?"),
    ],
)  # fmt: skip
def test_grant_refuses_a_scope_no_action_asks_for(tmp_path: Path, scope: str, said: str) -> None:
    """A typo made a grant that admitted nothing, silently."""
    env = fresh_env(tmp_path / "home")
    refused = cli(env, "grant", scope, "--agent", "me")
    assert refused.returncode == 2, refused.stdout
    assert said in refused.stderr
    # Every scope only when no one is close: a typo's answer is its one line.
    if "Did you mean" in said:
        assert "The scopes" not in refused.stderr, refused.stderr
    assert json.loads(cli(env, "grants", "--json").stdout) == []


def test_a_config_grant_of_a_scope_no_action_asks_for_stops_the_start(tmp_path: Path) -> None:
    """A typo in a [[grant]] table granted nothing, in silence: the calls it was meant
    for were refused scope_required. The start is refused, naming it and the closest."""
    env = fresh_env(tmp_path / "home")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "config.toml").write_text(
        '[[grant]]\nagent = "me"\nscopes = ["workerHost.fs_stat", "workerHost.fs_stats"]\n'
    )
    started = cli(env, "up", "--headless")
    assert started.returncode == 4, started.stdout + started.stderr
    assert "'workerHost.fs_stats' names no action" in started.stderr, started.stderr
    assert "Did you mean workerHost.fs_stat?" in started.stderr, started.stderr
    assert "[[grant]] in " in started.stderr and "Traceback" not in started.stderr


def test_revoke_and_lift_of_nothing_say_which_command_lists_what_there_is(
    tmp_path: Path,
) -> None:
    env = fresh_env(tmp_path / "home")
    revoked = cli(env, "revoke", "99")
    assert revoked.returncode == 1
    assert revoked.stdout == "no grant 99 (`agentworker grants` lists them, each by its number)\n"
    lifted = cli(env, "lift", "nothere")
    assert lifted.returncode == 1
    assert lifted.stdout == (
        "plan nothere was not killed (`agentworker killed` lists the plans that are)\n"
    )


def test_status_with_no_hub_says_so_and_how_to_start_one(tmp_path: Path) -> None:
    env = fresh_env(tmp_path / "nohub")
    text = cli(env, "status")
    assert text.returncode == 3
    assert f"no hub answered at {env['AGENTWORKER_LISTEN']}" in text.stderr
    assert "agentworker up" in text.stderr and "Traceback" not in text.stderr
    as_json = cli(env, "status", "--json")
    assert as_json.returncode == 3
    assert json.loads(as_json.stdout)["state"] == "no_hub"
    # A token file but nothing listening: the same answer.
    (tmp_path / "nohub").mkdir(exist_ok=True)
    (tmp_path / "nohub" / "hub.token").write_text("ab" * 32)
    again = cli(env, "status", "--json")
    assert again.returncode == 3 and json.loads(again.stdout)["state"] == "no_hub"


def hashing(name: str) -> list[int]:
    """The sha256sum processes reading `name` (the call's own argv names it too)."""
    found = []
    for pid in processes_with(name):
        with contextlib.suppress(OSError):  # ended meanwhile
            if Path(f"/proc/{pid}/comm").read_text() == "sha256sum\n":
                found.append(pid)
    return found


def test_ctrl_c_on_a_call_says_it_runs_on_and_how_to_stop_it(up: Up) -> None:
    """The call goes on at the worker when `call` is interrupted; the message said
    nothing (exit 130, silence). The kill it names stops the program."""
    big = up.home / "workspace" / f"{marker()}.bin"  # the marker finds the program
    with big.open("wb") as sparse:
        sparse.truncate(1 << 40)  # hashing a TiB of holes outlasts any test
    assert up.cli("grant", "exec", "--agent", "me").returncode == 0
    args = json.dumps({"argv": ["sha256sum", big.name], "timeout_s": 600})
    argv = [sys.executable, "-m", "worker", "call", "exec", args, "--agent", "me", "--plan", "long"]
    call = subprocess.Popen(
        as_a_terminal_starts(argv),
        env=up.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: hashing(big.name), 60)
    call.send_signal(signal.SIGINT)
    out, err = call.communicate(timeout=60)
    assert call.returncode == 130, out + err
    assert "exec was sent and may still run on the worker" in err
    assert "agentworker kill long (then agentworker lift long)" in err
    assert hashing(big.name)  # it does run on
    assert up.cli("kill", "long").returncode == 0
    assert wait_until_gone(big.name, within_s=30) == []
    assert up.cli("lift", "long").returncode == 0


def test_ctrl_c_on_a_call_with_an_id_names_the_id_that_gets_its_answer(up: Up) -> None:
    big = up.home / "workspace" / f"{marker()}.bin"
    with big.open("wb") as sparse:
        sparse.truncate(1 << 40)
    assert up.cli("grant", "exec", "--agent", "me").returncode == 0
    args = json.dumps({"argv": ["sha256sum", big.name], "timeout_s": 600})
    argv = ["call", "exec", args, "--agent", "me", "--id", "mine-1"]
    call = subprocess.Popen(
        as_a_terminal_starts([sys.executable, "-m", "worker", *argv]),
        env=up.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: hashing(big.name), 60)
    call.send_signal(signal.SIGINT)
    _, err = call.communicate(timeout=60)
    assert call.returncode == 130, err
    assert "stopped only by agentworker pause" in err
    assert "The same call with --id mine-1 answers from the hub's record" in err
    assert up.cli("pause").returncode == 0
    assert wait_until_gone(big.name, within_s=30) == []
    assert up.cli("resume").returncode == 0


def test_a_second_ctrl_c_stops_the_running_calls_a_drain_waits_for(tmp_path: Path) -> None:
    """The first Ctrl-C lets running calls finish within drain_grace_s (here ten
    minutes); the log says a second one stops them now, and it does. It did nothing."""
    home = tmp_path / "home"
    workspace = home / "workspace"
    workspace.mkdir(parents=True)
    (home / "config.toml").write_text(
        f'[worker]\ndrain_grace_s = 600\n\n[[root]]\npath = "{workspace}"\nmode = "rw"\n'
    )
    env = fresh_env(home)
    log_path = tmp_path / "up.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker", "up"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    running = Up(env, home, log_path, proc)
    try:
        wait_for(lambda: "ready:" in running.log() or proc.poll() is not None, 60)
        big = workspace / f"{marker()}.bin"
        with big.open("wb") as sparse:
            sparse.truncate(1 << 40)
        assert running.cli("grant", "exec", "--agent", "me").returncode == 0
        args = json.dumps({"argv": ["sha256sum", big.name], "timeout_s": 600})
        argv = ["call", "exec", args, "--agent", "me", "--plan", "long"]
        call = subprocess.Popen(
            [sys.executable, "-m", "worker", *argv], env=env, stdout=subprocess.PIPE, text=True
        )
        wait_for(lambda: hashing(big.name), 60)
        proc.send_signal(signal.SIGINT)
        wait_for(lambda: "Ctrl-C again stops them now" in running.log(), 60)
        assert "draining: finishing 1 running call(s) (up to 600 s;" in running.log()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, running.log()
        assert "stopping 1 running call(s) now" in running.log()
        out, _ = call.communicate(timeout=60)
        assert json.loads(out)["error"]["code"] == "cancelled"
        assert wait_until_gone(big.name, within_s=30) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
