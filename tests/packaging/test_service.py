"""`agentworker service`: the units it writes, checked by each platform's own rules
where this machine has them (systemd-analyze), by their file format elsewhere."""

from __future__ import annotations

import os
import plistlib
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from worker.cli.service import Kind, build_unit, check_unit, program, systemd_quote
from worker.config import Paths
from worker.errors import UsageError

TASK_NS = "{http://schemas.microsoft.com/windows/2004/02/mit/task}"

# The systemd manager is the far side of a boundary: this stand-in records what it
# was asked, so install and uninstall can be checked without a user session bus.
FAKE_SYSTEMCTL = """#!/bin/sh
echo "$@" >> "$SYSTEMCTL_LOG"
"""


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTWORKER_", "XDG_"))}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "systemctl"
    fake.write_text(FAKE_SYSTEMCTL)
    fake.chmod(0o755)
    env.update(
        AGENTWORKER_HOME=str(tmp_path / "home with space"),
        XDG_CONFIG_HOME=str(tmp_path / "xdg"),
        SYSTEMCTL_LOG=str(tmp_path / "systemctl.log"),
        PATH=f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}",
    )
    return env


def _cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _verify(unit: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    return subprocess.run(
        ["systemd-analyze", "--user", "verify", str(unit)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_service_install_writes_a_unit_systemd_accepts(tmp_path: Path) -> None:
    env = _env(tmp_path)
    out = _cli(env, "service", "install")
    assert out.returncode == 0, out.stderr
    unit = tmp_path / "xdg" / "systemd" / "user" / "agentworker.service"
    assert f"wrote {unit}" in out.stdout
    assert "journalctl --user -u agentworker.service" in out.stdout
    text = unit.read_text()
    home = env["AGENTWORKER_HOME"]
    assert f'ExecStart={sys.executable} -P -m worker --home "{home}" up' in text
    assert "Restart=on-failure" in text and "StandardError=journal" in text
    verified = _verify(unit, tmp_path)
    assert verified.returncode == 0, verified.stderr
    assert verified.stderr == "", verified.stderr  # not even a warning
    asked = (tmp_path / "systemctl.log").read_text().splitlines()
    assert asked == ["--user daemon-reload", "--user enable --now agentworker.service"]


def test_systemd_analyze_rejects_a_broken_unit(tmp_path: Path) -> None:
    """The check above can fail: verify does refuse a unit that cannot run."""
    unit = tmp_path / "broken.service"
    unit.write_text("[Service]\nExecStart=relative/agentworker up\n")
    assert _verify(unit, tmp_path).returncode != 0


def test_service_uninstall_stops_and_removes_the_unit(tmp_path: Path) -> None:
    env = _env(tmp_path)
    assert _cli(env, "service", "install", "--no-start").returncode == 0
    status = _cli(env, "service", "status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert "installed:" in status.stdout and "differs" not in status.stdout
    out = _cli(env, "service", "uninstall")
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "xdg" / "systemd" / "user" / "agentworker.service").exists()
    asked = (tmp_path / "systemctl.log").read_text().splitlines()
    assert asked == [
        "--user daemon-reload",
        "--user enable agentworker.service",
        "--user is-active agentworker.service",
        "--user disable --now agentworker.service",
        "--user daemon-reload",
    ]
    gone = _cli(env, "service", "status")
    assert gone.returncode == 1 and "not installed" in gone.stdout


def test_service_install_says_how_to_finish_when_systemd_is_unreachable(tmp_path: Path) -> None:
    env = _env(tmp_path)
    (tmp_path / "bin" / "systemctl").write_text(
        "#!/bin/sh\necho 'Failed to connect to bus' >&2\nexit 1\n"
    )
    out = _cli(env, "service", "install")
    assert out.returncode == 1
    assert "Failed to connect to bus" in out.stderr
    assert "systemctl --user enable --now agentworker.service" in out.stderr
    assert "Traceback" not in out.stderr
    assert (tmp_path / "xdg" / "systemd" / "user" / "agentworker.service").exists()


def test_systemd_quote_keeps_paths_literal() -> None:
    assert systemd_quote("/usr/bin/python3") == "/usr/bin/python3"
    assert systemd_quote("/home/a b/x") == '"/home/a b/x"'
    assert systemd_quote("50%$HOME") == '"50%%$$HOME"'
    assert systemd_quote('say "hi"\\') == '"say \\"hi\\"\\\\"'


@pytest.mark.parametrize("kind", ["systemd", "launchd", "windows"])
def test_a_path_with_a_line_break_is_refused_not_written_into_a_unit(
    tmp_path: Path, kind: Kind
) -> None:
    """A newline in the home's name would end ExecStart's line and start one of its
    own: `ExecStart=/bin/sh -c ...`, run at every login."""
    home = tmp_path / "x\nExecStart=/bin/sh -c 'touch /tmp/owned'\nX-Rest="
    with pytest.raises(UsageError) as refused:
        build_unit(Paths.at(home), kind)
    assert "control character" in refused.value.message


def test_launchd_agent_is_a_plist_that_restarts_on_failure(tmp_path: Path) -> None:
    paths = Paths(tmp_path, tmp_path)
    unit = build_unit(paths, "launchd", worker_only=True)
    check_unit(unit)
    plist = plistlib.loads(unit.encoded())
    assert plist["Label"] == "dev.agentworker.worker"
    assert plist["ProgramArguments"][-1] == "run"
    assert plist["ProgramArguments"][0] == str(Path(sys.executable).absolute())
    assert plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["StandardErrorPath"].endswith("Library/Logs/agentworker/agentworker.log")
    assert unit.path.parts[-2:] == ("LaunchAgents", "dev.agentworker.worker.plist")


def test_windows_task_starts_at_logon_restarts_and_logs_to_a_file(tmp_path: Path) -> None:
    paths = Paths(tmp_path / "a & b", tmp_path / "a & b")
    unit = build_unit(paths, "windows", sandbox=True)
    check_unit(unit)
    task = ET.fromstring(unit.encoded())  # noqa: S314 - our own template
    assert task.find(f"{TASK_NS}Triggers/{TASK_NS}LogonTrigger") is not None
    assert task.findtext(f"{TASK_NS}Settings/{TASK_NS}RestartOnFailure/{TASK_NS}Count") == "999"
    exe = task.find(f"{TASK_NS}Actions/{TASK_NS}Exec")
    assert exe is not None
    assert exe.findtext(f"{TASK_NS}Command") == str(Path(sys.executable).absolute())
    arguments = exe.findtext(f"{TASK_NS}Arguments") or ""
    assert arguments.startswith("-P -m worker --log-file ")
    assert str(tmp_path / "a & b" / "Logs" / "agentworker.log") in arguments
    assert arguments.endswith("up --sandbox")


def test_the_service_never_runs_a_worker_package_from_the_folder_it_starts_in(
    tmp_path: Path,
) -> None:
    """systemd starts a user service in the home folder, which an agent may write: a
    worker/__main__.py planted there must not be what the unit runs (review25 G9)."""
    planted = tmp_path / "worker"
    planted.mkdir()
    (planted / "__init__.py").write_text("")
    (planted / "__main__.py").write_text("print('the planted worker ran')\n")
    out = subprocess.run(
        [*program(), "--version"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "planted" not in out.stdout and out.stdout.strip()
