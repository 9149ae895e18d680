"""The README's commands, run as written: every ```sh block, line by line, in a
fresh AGENTWORKER_HOME against a live `agentworker up`, from a scratch folder.

This keeps the README honest. The rules a README line lives by:
- ```sh blocks are run; ```text blocks (installing, services) are shown only;
- `make …` lines are the developer's (they would run this suite): not run;
- an `agentworker up …` line starts that `up` (this test runs it in the
  background, with the line's flags) for the lines after it, up to the next one;
- a line whose comment says "needs the internet" is not run (tests have none);
- the desktop lines run on a real X server (Xvfb with openbox), as DISPLAY of `up`;
- every other line must exit 0 with no Python traceback; a `call` must answer
  "status": "ok"; a comment "→ TEXT" means the output must contain TEXT.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.cluster import free_port, wait_for
from tests.support.desktop import XServer, start_xvfb

README = Path(__file__).resolve().parents[2] / "README.md"
NOT_RUN_MARK = "needs the internet"


@dataclass(frozen=True)
class Line:
    number: int  # in README.md, for the failure message
    text: str

    @property
    def words(self) -> list[str]:
        return shlex.split(self.text, comments=True)

    @property
    def starts_up(self) -> bool:
        return self.words[:2] == ["agentworker", "up"]

    @property
    def expected(self) -> str | None:
        found = re.search(r"#\s*→\s*(.+?)\s*$", self.text)
        return found.group(1) if found else None

    @property
    def runs(self) -> bool:
        return bool(self.words) and self.words[0] != "make" and NOT_RUN_MARK not in self.text


@dataclass
class Scenario:
    """One `agentworker up …` and the README lines run against it."""

    up: Line
    lines: list[Line] = field(default_factory=list)


def readme_lines() -> list[Line]:
    lines: list[Line] = []
    fence: str | None = None
    for number, raw in enumerate(README.read_text(encoding="utf-8").splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("```"):
            fence = stripped[3:].strip() if fence is None else None
            continue
        if fence == "sh" and stripped and not stripped.startswith("#"):
            lines.append(Line(number, stripped))
    return lines


def scenarios() -> list[Scenario]:
    found: list[Scenario] = []
    for line in readme_lines():
        if not line.runs:
            continue
        if line.starts_up:
            found.append(Scenario(line))
        else:
            assert found, f"README.md:{line.number}: a command before any `agentworker up`"
            found[-1].lines.append(line)
    return found


def test_the_readme_starts_the_hub_before_its_commands() -> None:
    plans = scenarios()
    assert plans[0].up.words == ["agentworker", "up"]
    assert sum(len(plan.lines) for plan in plans) >= 20


@contextmanager
def running_up(line: Line, home: Path, cwd: Path, x: XServer) -> Iterator[dict[str, str]]:
    env = {k: v for k, v in x.env().items() if not k.startswith("AGENTWORKER_")}
    env["AGENTWORKER_HOME"] = str(home)
    env["AGENTWORKER_LISTEN"] = f"127.0.0.1:{free_port()}"
    # `agentworker` is this checkout's, as after `make up` with .venv/bin on PATH.
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    log = home.parent / f"up-{line.number}.log"
    with log.open("wb") as out:
        up = subprocess.Popen(
            [sys.executable, "-m", "worker", *line.words[1:]],
            env=env,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: "ready:" in log.read_text() or up.poll() is not None, 60)
        assert up.poll() is None, f"README.md:{line.number}: {line.text}\n{log.read_text()}"
        yield env
    finally:
        up.send_signal(signal.SIGTERM)
        assert up.wait(30) == 0, log.read_text()
    assert "Traceback" not in log.read_text(), log.read_text()


@pytest.fixture
def x_server() -> Iterator[XServer]:
    server = start_xvfb()
    try:
        yield server
    finally:
        server.stop()


def test_every_readme_command_does_what_the_readme_says(tmp_path: Path, x_server: XServer) -> None:
    cwd = tmp_path / "cwd"  # where the person types: --blob-in/--blob-out land here
    cwd.mkdir()
    for number, plan in enumerate(scenarios()):
        with running_up(plan.up, tmp_path / f"home-{number}", cwd, x_server) as env:
            for line in plan.lines:
                done = subprocess.run(
                    ["bash", "-c", line.text],
                    env=env,
                    cwd=cwd,
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                said = done.stdout + done.stderr
                where = f"README.md:{line.number}: {line.text}\n{said}"
                assert done.returncode == 0, where
                assert "Traceback" not in said, where
                if line.words[:2] == ["agentworker", "call"]:
                    assert json.loads(done.stdout)["status"] == "ok", where
                if line.expected is not None:
                    assert line.expected in said, where
