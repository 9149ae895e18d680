"""`agentworker allowlist check` and `show`, as a person runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from worker.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def agentworker(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTWORKER_")}
    return subprocess.run(
        [sys.executable, "-m", "worker", "--home", str(home), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )


def home_with_root(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / "ws").mkdir(parents=True)
    (home / "config.toml").write_text(f'[[root]]\npath = "{home / "ws"}"\nmode = "rw"\n')
    return home


def test_check_explains_an_allowed_command_with_its_rule_and_path(tmp_path: Path) -> None:
    done = agentworker(
        home_with_root(tmp_path), "allowlist", "check", "--", "git", "log", "-n", "3"
    )
    assert done.returncode == 0, done.stderr
    assert "decision: allow" in done.stdout
    assert "rule: git-log" in done.stdout and "runs: /usr/bin/git" in done.stdout


def test_check_explains_refusals_and_exits_nonzero(tmp_path: Path) -> None:
    home = home_with_root(tmp_path)
    forbidden = agentworker(home, "allowlist", "check", "--json", "--", "git", "-C", "/", "log")
    assert forbidden.returncode == 1
    answer = json.loads(forbidden.stdout)
    assert answer["decision"] == "command_forbidden" and answer["rule"] == "git-global-options"
    outside = agentworker(home, "allowlist", "check", "--", "cat", "/etc/passwd")
    assert outside.returncode == 1 and "decision: path_not_allowed" in outside.stdout
    near = agentworker(home, "allowlist", "check", "--", "ls", "-la", "--hide=x", "-Z")
    assert "rules that came close:" in near.stdout and "option -Z" in near.stdout


def test_show_prints_the_effective_policy_with_the_persons_file_on_top(tmp_path: Path) -> None:
    home = home_with_root(tmp_path)
    (home / "allowlist.toml").write_text(
        '[program.date]\npaths = ["/usr/bin/date"]\n[[program.date.rule]]\nid = "my-date"\n'
        'reason = "what time it is"\nmatch = ["date"]\nnot_match = ["date -s now"]\n'
    )
    text = agentworker(home, "allowlist", "show")
    assert text.returncode == 0, text.stderr
    assert "date  →  /usr/bin/date" in text.stdout and "my-date" in text.stdout
    assert "find-actions: -exec -execdir" in text.stdout
    data = json.loads(agentworker(home, "allowlist", "show", "--json").stdout)
    assert data["user_file"] == str(home / "allowlist.toml")
    assert data["programs"]["date"]["rules"][0]["source"] == str(home / "allowlist.toml")


def test_a_broken_allowlist_file_is_reported_with_the_rule_it_breaks(tmp_path: Path) -> None:
    home = home_with_root(tmp_path)
    (home / "allowlist.toml").write_text(
        '[program.cat]\n[[program.cat.rule]]\nid = "mine"\nreason = "r"\nmatch = ["cat -Q"]\n'
    )
    done = agentworker(home, "allowlist", "show")
    assert done.returncode == ConfigError.exit_code
    assert "rule mine: example 'cat -Q' should match but does not" in done.stderr


def test_output_into_a_closed_pipe_stops_quietly(tmp_path: Path) -> None:
    """`agentworker allowlist show | head -1`: the reader leaves early; the command
    exits 141 (as for SIGPIPE) with no traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone before the first write
    try:
        done = subprocess.run(
            [sys.executable, "-m", "worker", "--home", str(tmp_path), "allowlist", "show"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 141, done.stderr
    assert done.stderr == "", done.stderr
