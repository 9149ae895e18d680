"""`agentworker service install | uninstall | status`: the worker as a background service.

Each platform keeps its own kind: a systemd user unit (logs in the journal), a
launchd user agent (logs in ~/Library/Logs), a Windows scheduled task started at
logon (logs beside the data). The templates live in `packaging/` (shipped in the
package as `worker/_units`); this module fills in the real paths — the Python or
one-file executable running now, and the home it runs with — so the service runs
exactly the program that installed it. Every kind restarts the worker when it
fails and leaves it stopped when it stops cleanly.

A worker running as a service has no terminal: approvals wait for `agentworker ui`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

# subprocess, shutil, plistlib, xml, getpass and importlib.resources are imported
# where they are used: `agentworker --help` imports this module (worker.cli.main).

if TYPE_CHECKING:
    from worker.config import Paths

Kind = Literal["systemd", "launchd", "windows"]
KINDS: tuple[Kind, ...] = ("systemd", "launchd", "windows")

UNIT_NAME = "agentworker.service"
LAUNCHD_LABEL = "dev.agentworker.worker"
TASK_NAME = "agentworker"
_MANAGER_TIMEOUT_S = 30.0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    service = sub.add_parser(
        "service",
        help="run the worker as a background service (systemd, launchd, Windows task)",
        description="Install agentworker as this platform's user service: it starts at "
        "login, restarts when it fails, and logs where the platform keeps logs. "
        "Approvals then reach you through `agentworker ui`.",
    )
    verbs = service.add_subparsers(dest="service_command", required=True, metavar="VERB")
    install = verbs.add_parser("install", help="write the service and start it")
    install.add_argument(
        "--worker-only",
        action="store_true",
        help="run `agentworker run` (a worker joining the server in config.toml) "
        "instead of `agentworker up` (hub + worker on loopback)",
    )
    install.add_argument("--sandbox", action="store_true", help="run in sandbox mode")
    install.add_argument(
        "--no-start", action="store_true", help="write and register it, but do not start it now"
    )
    install.add_argument(
        "--print",
        dest="print_only",
        action="store_true",
        help="print what would be written, and change nothing",
    )
    install.add_argument(
        "--kind", choices=KINDS, help="the service kind (default: this platform's)"
    )
    uninstall = verbs.add_parser("uninstall", help="stop the service and remove it")
    uninstall.add_argument("--kind", choices=KINDS, help=argparse.SUPPRESS)
    status = verbs.add_parser("status", help="installed? running? where are its logs?")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument("--kind", choices=KINDS, help=argparse.SUPPRESS)
    service.set_defaults(handler=run)


# ----------------------------------------------------------------- what runs


def program() -> list[str]:
    """The program the service runs: this one-file build, or this Python with this package."""
    if getattr(sys, "frozen", False):
        return [str(Path(sys.executable).resolve())]
    # The venv's python (not resolved: a venv's python is a symlink to the base
    # interpreter, which would not see the venv's packages). -P: the folder the service
    # starts in (systemd's default for a user service is the home folder, which an agent
    # may write) is not put first on sys.path, so a worker/ there is never the one run
    # (review25 G9), as ui.child starts the TUI.
    return [str(Path(sys.executable).absolute()), "-P", "-m", "worker"]


def service_argv(
    paths: Paths, *, worker_only: bool, sandbox: bool, log_file: Path | None
) -> list[str]:
    argv = program()
    if paths.home is not None:  # the unit runs with the folder this command was given
        argv += ["--home", str(paths.home)]
    if log_file is not None:
        argv += ["--log-file", str(log_file)]
    argv.append("run" if worker_only else "up")
    if sandbox:
        argv.append("--sandbox")
    return argv


def default_kind() -> Kind:
    if sys.platform == "darwin":
        return "launchd"
    if sys.platform == "win32":
        return "windows"
    return "systemd"


@dataclass(frozen=True)
class Unit:
    """One service definition: where it goes and what it says."""

    kind: Kind
    path: Path
    text: str
    logs: str  # where to read its logs, said to a person

    def encoded(self) -> bytes:
        # Task Scheduler reads its XML as UTF-16 (the file says so).
        return self.text.encode("utf-16" if self.kind == "windows" else "utf-8")


def _template(kind: Kind) -> str:
    from importlib import resources

    name = {
        "systemd": "systemd/agentworker.service",
        "launchd": f"launchd/{LAUNCHD_LABEL}.plist",
        "windows": "windows/agentworker.xml",
    }[kind]
    return (resources.files("worker") / "_units" / name).read_text(encoding="utf-8")


def _fill(template: str, fields: dict[str, str]) -> str:
    text = template
    for key, value in fields.items():
        text = text.replace("{{" + key + "}}", value)
    left = re.findall(r"\{\{(\w+)\}\}", text)
    if left:  # a template and this module disagree: a bug, said plainly
        raise RuntimeError(f"service template fields left unfilled: {', '.join(left)}")
    return text


def systemd_quote(arg: str) -> str:
    """One ExecStart word: specifiers (%) and variables ($) taken literally, quoted if needed."""
    arg = arg.replace("%", "%%").replace("$", "$$")
    if re.fullmatch(r"[A-Za-z0-9_@+=:,./-]+", arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _systemd_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "systemd" / "user"


def _windows_log(paths: Paths) -> Path:
    return paths.data_dir / "Logs" / "agentworker.log"


def _launchd_log() -> Path:
    return Path.home() / "Library" / "Logs" / "agentworker" / "agentworker.log"


def _printable(argv: list[str]) -> list[str]:
    """`argv` as it may go into a unit: a control character (a newline in a folder's
    name) would end the line it is on and start one of its own, a new ExecStart say."""
    for word in argv:
        if not word.isprintable():
            from worker.errors import UsageError

            raise UsageError(
                f"cannot write a service that runs {word!r}: it holds a control character "
                "(a line break, say), which would add lines of its own to the unit. Move "
                "agentworker, or its --home, to a folder whose path has none."
            )
    return argv


def build_unit(
    paths: Paths, kind: Kind, *, worker_only: bool = False, sandbox: bool = False
) -> Unit:
    import subprocess
    from xml.sax.saxutils import escape

    if kind == "systemd":
        argv = _printable(
            service_argv(paths, worker_only=worker_only, sandbox=sandbox, log_file=None)
        )
        text = _fill(_template(kind), {"exec_start": " ".join(systemd_quote(a) for a in argv)})
        return Unit(kind, _systemd_dir() / UNIT_NAME, text, f"journalctl --user -u {UNIT_NAME}")
    if kind == "launchd":
        argv = _printable(
            service_argv(paths, worker_only=worker_only, sandbox=sandbox, log_file=None)
        )
        log = _launchd_log()
        indent = " " * 4
        fields = {
            "label": LAUNCHD_LABEL,
            "program_arguments": "\n".join(f"{indent}<string>{escape(a)}</string>" for a in argv),
            # launchd starts agents with a bare PATH; keep the one agentworker was installed from.
            "environment": f"{indent}<key>PATH</key>\n"
            f"{indent}<string>{escape(os.environ.get('PATH', '/usr/bin:/bin'))}</string>",
            "log_file": escape(str(log)),
        }
        text = _fill(_template(kind), fields)
        plist = Path.home() / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist"
        return Unit(kind, plist, text, f"{log} (or Console.app)")
    log = _windows_log(paths)
    argv = _printable(service_argv(paths, worker_only=worker_only, sandbox=sandbox, log_file=log))
    fields = {
        "task_name": TASK_NAME,
        "user": escape(_windows_user()),
        "command": escape(argv[0]),
        "arguments": escape(subprocess.list2cmdline(argv[1:])),
    }
    text = _fill(_template(kind), fields)
    return Unit(kind, paths.data_dir / "agentworker-task.xml", text, str(log))


def _windows_user() -> str:
    import getpass

    domain = os.environ.get("USERDOMAIN")
    user = getpass.getuser()
    return f"{domain}\\{user}" if domain else user


def check_unit(unit: Unit) -> None:
    """The rendered text parses as its kind's format (plist, XML); ValueError if not."""
    import plistlib

    if unit.kind == "launchd":
        plistlib.loads(unit.encoded())
    elif unit.kind == "windows":
        import xml.etree.ElementTree as ET

        ET.fromstring(unit.encoded())  # noqa: S314 - our own template, not input


# ----------------------------------------------------------------- managers


@dataclass(frozen=True)
class Step:
    argv: list[str]
    ok: bool
    said: str


def _manager(argv: list[str]) -> Step:
    import shutil
    import subprocess

    if shutil.which(argv[0]) is None:
        return Step(argv, False, f"{argv[0]} is not on this machine's PATH")
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=_MANAGER_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Step(argv, False, str(exc))
    said = (done.stdout + done.stderr).strip()
    return Step(argv, done.returncode == 0, said)


def _start_steps(unit: Unit) -> list[list[str]]:
    if unit.kind == "systemd":
        return [
            ["systemctl", "--user", "daemon-reload"],
            ["systemctl", "--user", "enable", "--now", UNIT_NAME],
        ]
    if unit.kind == "launchd":
        domain = f"gui/{os.getuid()}"
        return [["launchctl", "bootstrap", domain, str(unit.path)]]
    return [
        ["schtasks", "/Create", "/TN", TASK_NAME, "/XML", str(unit.path), "/F"],
        ["schtasks", "/Run", "/TN", TASK_NAME],
    ]


def _register_only(unit: Unit) -> list[list[str]]:
    if unit.kind == "systemd":
        return [
            ["systemctl", "--user", "daemon-reload"],
            ["systemctl", "--user", "enable", UNIT_NAME],
        ]
    if unit.kind == "launchd":
        return []  # RunAtLoad: loading starts it, so loading waits for the next login
    return [["schtasks", "/Create", "/TN", TASK_NAME, "/XML", str(unit.path), "/F"]]


def _stop_steps(unit: Unit) -> list[list[str]]:
    if unit.kind == "systemd":
        return [["systemctl", "--user", "disable", "--now", UNIT_NAME]]
    if unit.kind == "launchd":
        return [["launchctl", "bootout", f"gui/{os.getuid()}/{LAUNCHD_LABEL}"]]
    return [["schtasks", "/End", "/TN", TASK_NAME], ["schtasks", "/Delete", "/TN", TASK_NAME, "/F"]]


def _state_steps(unit: Unit) -> list[list[str]]:
    if unit.kind == "systemd":
        return [["systemctl", "--user", "is-active", UNIT_NAME]]
    if unit.kind == "launchd":
        return [["launchctl", "print", f"gui/{os.getuid()}/{LAUNCHD_LABEL}"]]
    return [["schtasks", "/Query", "/TN", TASK_NAME, "/FO", "LIST"]]


def _show(argv: list[str]) -> str:
    return " ".join(argv)


# ----------------------------------------------------------------- verbs


def run(paths: Paths, args: argparse.Namespace) -> int:
    kind: Kind = args.kind or default_kind()
    if args.service_command == "install":
        return _install(paths, args, kind)
    if args.service_command == "uninstall":
        return _uninstall(paths, kind)
    return _status(paths, kind, as_json=args.json)


def _install(paths: Paths, args: argparse.Namespace, kind: Kind) -> int:
    unit = build_unit(paths, kind, worker_only=args.worker_only, sandbox=args.sandbox)
    check_unit(unit)
    if args.print_only:
        print(f"# {unit.path}")
        print(unit.text, end="")
        return 0
    unit.path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "windows":
        _windows_log(paths).parent.mkdir(parents=True, exist_ok=True)
    elif kind == "launchd":
        _launchd_log().parent.mkdir(parents=True, exist_ok=True)
    unit.path.write_bytes(unit.encoded())
    print(f"wrote {unit.path}")
    steps = _register_only(unit) if args.no_start else _start_steps(unit)
    for argv in steps:
        step = _manager(argv)
        if not step.ok:
            print(
                f"agentworker: `{_show(argv)}` failed: {step.said or 'no message'}\n"
                f"The service file is written; register it from your desktop session:\n  "
                + "\n  ".join(_show(a) for a in steps),
                file=sys.stderr,
            )
            return 1
    if args.no_start:
        print(
            "registered; it starts at your next login (or start it now: "
            f"{_show(_start_steps(unit)[-1])})"
        )
    else:
        print("started; it restarts when it fails and starts again at each login")
    print(f"logs: {unit.logs}")
    print("approvals: run `agentworker ui` to answer them while the service runs")
    return 0


def _uninstall(paths: Paths, kind: Kind) -> int:
    unit = build_unit(paths, kind)
    if not unit.path.exists():
        print(f"no service installed ({unit.path} does not exist)")
        return 0
    for argv in _stop_steps(unit):
        step = _manager(argv)
        if not step.ok:
            print(f"note: `{_show(argv)}`: {step.said or 'failed'}", file=sys.stderr)
    unit.path.unlink()
    if kind == "systemd":
        _manager(["systemctl", "--user", "daemon-reload"])
    print(f"removed {unit.path}")
    return 0


def _status(paths: Paths, kind: Kind, *, as_json: bool) -> int:
    unit = build_unit(paths, kind)
    installed = unit.path.exists()
    current = installed and unit.path.read_bytes() == unit.encoded()
    state = ""
    if installed:
        step = _manager(_state_steps(unit)[0])
        state = step.said.splitlines()[0] if step.said else ("running" if step.ok else "unknown")
    report = {
        "kind": kind,
        "installed": installed,
        "path": str(unit.path),
        "current": current,
        "state": state,
        "logs": unit.logs,
    }
    if as_json:
        print(json.dumps(report, indent=2))
        return 0 if installed else 1
    if not installed:
        print(f"not installed ({kind}): run `agentworker service install`")
        return 1
    print(f"installed: {unit.path} ({kind}); state: {state or 'unknown'}")
    if not current:
        print(
            "it differs from what this agentworker would write (moved, upgraded, or another "
            "home): run `agentworker service install` again to update it"
        )
    print(f"logs: {unit.logs}")
    return 0
