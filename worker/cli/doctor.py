"""`agentworker doctor [--json]`: what works on this machine, what does not, and the fix.

Each check is a `Finding`: ok, info, warn (a part will not work: exec without
bubblewrap, the desktop without a display) or blocker (the worker cannot run as
configured: a broken config.toml, a token file others can read). The command exits
non-zero when there is a blocker, so scripts and installers can stop on it.

Probes are real but harmless: the sandbox is built and `true` run in it, the hub
is asked for its status, the kernel is asked which Landlock ABI it has. Nothing
is changed, created or started.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import worker

# asyncio, ssl, ctypes, platform, shutil and importlib.metadata are imported inside the
# checks that use them: `agentworker --help` imports this module (worker.cli.main).

if TYPE_CHECKING:
    from worker.config import Config, Paths

Status = Literal["ok", "info", "warn", "blocker"]
EXIT_BLOCKER = 1
HUB_TIMEOUT_S = 3.0

# The libraries the worker cannot start without, and the ones a part of it needs.
CORE_LIBRARIES = ("grpcio", "protobuf", "pydantic", "platformdirs", "httpx")
# The desktop's input library differs by platform (see pyproject.toml's markers); the
# one-file build bundles the metadata of exactly these, so keep it the one list.
INPUT_LIBRARY = "python-xlib" if sys.platform.startswith("linux") else "pynput"
PART_LIBRARIES: Final = {
    "textual": "the TUI (`agentworker ui`)",
    "mss": "screenshots",
    "Pillow": "screenshot encoding",
    "zlib-ng": "fast PNG encoding",
    INPUT_LIBRARY: "mouse and keyboard actions",
    "psutil": "process accounting",
}


@dataclass(frozen=True)
class Finding:
    check: str
    status: Status
    summary: str
    fix: str = ""
    details: dict[str, Any] = field(default_factory=dict)


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    doctor = sub.add_parser(
        "doctor",
        help="check this machine: what works, what does not, and how to fix it",
        description="Checks Python and libraries, the display, bubblewrap, Landlock and "
        "seccomp, config.toml and its roots, the hub, TLS and the token file. Each "
        "finding says its fix; exits 1 when something blocks the worker.",
    )
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.add_argument("--offline", action="store_true", help="do not try to reach the hub")
    doctor.set_defaults(handler=run)


def run(paths: Paths, args: argparse.Namespace) -> int:
    findings = diagnose(paths, reach_hub=not args.offline)
    blockers = sum(f.status == "blocker" for f in findings)
    warnings = sum(f.status == "warn" for f in findings)
    if args.json:
        report = {
            "agentworker": worker.__version__,
            "ok": blockers == 0,
            "blockers": blockers,
            "warnings": warnings,
            "findings": [asdict(f) for f in findings],
        }
        print(json.dumps(report, indent=2))
    else:
        _print(findings, blockers, warnings)
    return EXIT_BLOCKER if blockers else 0


def _print(findings: list[Finding], blockers: int, warnings: int) -> None:
    print(f"agentworker {worker.__version__} doctor")
    width = max(len(f.check) for f in findings)
    for f in findings:
        print(f"  {f.status:<8} {f.check:<{width}}  {f.summary}")
        if f.fix:
            print(f"  {'':<8} {'':<{width}}  fix: {f.fix}")
    verdict = "nothing blocks the worker" if not blockers else f"{blockers} blocker(s)"
    print(f"{verdict}; {warnings} warning(s)")


def diagnose(paths: Paths, *, reach_hub: bool = True) -> list[Finding]:
    from worker.config import Config

    findings = [_python(), *_libraries()]
    config_finding, config = _config(paths)
    findings.append(config_finding)
    settings = config or Config()
    findings += _folders(paths, plans_pass=settings.sandbox.uid_range is not None)
    if config is not None and paths.config_file.exists():
        findings += _roots(config, paths)
    findings += [_token(paths), *_tls(settings)]
    if reach_hub:
        findings.append(_hub(paths, settings))
    findings += [_bubblewrap(settings), _landlock(settings, paths), _user_limits(settings, paths)]
    findings.append(_epoll_watches())
    findings.append(_in_flight(settings))
    findings.append(_seccomp())
    findings += [_plan_limits(settings, paths), *_display()]
    return findings


def _guard(check: str, probe: Callable[[], Finding]) -> Finding:
    """A probe that breaks is itself a finding, never a traceback."""
    try:
        return probe()
    except Exception as exc:  # noqa: BLE001 - doctor reports whatever goes wrong
        return Finding(check, "warn", f"could not be checked: {type(exc).__name__}: {exc}")


# ----------------------------------------------------------------- python


def _python() -> Finding:
    import platform

    version = platform.python_version()
    details = {
        "version": version,
        "executable": sys.executable,
        "frozen": bool(getattr(sys, "frozen", False)),
        "platform": platform.platform(),
    }
    return Finding("python", "ok", f"Python {version} on {platform.system()}", details=details)


def _library_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        module = {
            "grpcio": "grpc",
            "protobuf": "google.protobuf",
            "Pillow": "PIL",
            "zlib-ng": "zlib_ng",
            "python-xlib": "Xlib",
        }.get(name, name)
        try:
            imported = __import__(module, fromlist=["__version__"])
        except ImportError:
            return None
        return str(getattr(imported, "__version__", "present"))


def _libraries() -> list[Finding]:
    versions = {name: _library_version(name) for name in (*CORE_LIBRARIES, *PART_LIBRARIES)}
    missing_core = [n for n in CORE_LIBRARIES if versions[n] is None]
    missing_part = [n for n in PART_LIBRARIES if versions[n] is None]
    shown = ", ".join(f"{n} {v}" for n, v in versions.items() if v)
    reinstall = "reinstall agentworker (pipx reinstall agentworker, or `make .venv/.installed`)"
    if missing_core:
        return [
            Finding(
                "libraries",
                "blocker",
                f"missing: {', '.join(missing_core)}",
                reinstall,
                {"versions": versions},
            )
        ]
    if missing_part:
        needs = "; ".join(f"{n} ({PART_LIBRARIES[n]})" for n in missing_part)
        return [
            Finding("libraries", "warn", f"missing: {needs}", reinstall, {"versions": versions})
        ]
    return [Finding("libraries", "ok", shown, details={"versions": versions})]


# ----------------------------------------------------------------- config


def _config(paths: Paths) -> tuple[Finding, Config | None]:
    from worker.config import load
    from worker.errors import ConfigError

    where = str(paths.config_file)
    try:
        config = load(paths)
    except ConfigError as exc:
        return (
            Finding(
                "config",
                "blocker",
                exc.message,
                f"edit {where} (or move it aside: the next `agentworker up` writes a fresh one)",
                {"path": where},
            ),
            None,
        )
    if not paths.config_file.exists():
        return (
            Finding(
                "config",
                "info",
                f"{where} does not exist yet",
                "`agentworker up` writes it on first start",
                {"path": where},
            ),
            config,
        )
    from worker.actions.scope_names import grant_tables_problem

    # What the worker's start refuses (exit 4) is a blocker here too, not "valid".
    problem = grant_tables_problem((g.scopes for g in config.grant), where)
    if problem is not None:
        fix = f"edit the [[grant]] table in {where}"
        return Finding("config", "blocker", problem, fix, {"path": where}), config
    return Finding("config", "ok", f"{where} is valid", details={"path": where}), config


def _folders(paths: Paths, *, plans_pass: bool) -> list[Finding]:
    """The config and data folders: this user's, owner-only. Others' search bit alone
    on the data folder only while [sandbox] uids lets plans' uids pass through it
    (`plans_pass`; sandbox.plan_uids)."""
    out = []
    folders = {paths.config_dir: "config folder", paths.data_dir: "data folder"}
    if paths.config_dir == paths.data_dir:
        folders = {paths.config_dir: "home folder"}
    for folder, name in folders.items():
        if not folder.exists():
            out.append(
                Finding(name, "info", f"{folder} not created yet", "`agentworker up` makes it")
            )
            continue
        mode = stat.S_IMODE(folder.stat().st_mode)
        details = {"path": str(folder), "mode": oct(mode)}
        passed = folder == paths.data_dir and plans_pass
        if not os.access(folder, os.W_OK | os.X_OK):
            out.append(
                Finding(
                    name, "blocker", f"{folder} is not writable", "chown it to yourself", details
                )
            )
        elif mode & 0o076 or (mode & stat.S_IXOTH and not passed):
            said = f"{folder} is open to other users (mode {oct(mode)})"
            if not mode & 0o076:  # others' search alone: left by [sandbox] uids
                said += "; [sandbox] uids, which needs that, is off (a worker's start closes it)"
            out.append(Finding(name, "warn", said, f"chmod 700 {folder}", details))
        else:
            shut = "owner only" if not mode & 0o077 else "owner only; plans' uids pass through"
            out.append(Finding(name, "ok", f"{folder} ({shut})", details=details))
    return out


def _roots(config: Config, paths: Paths) -> list[Finding]:
    if not config.root:
        return [
            Finding(
                "roots",
                "warn",
                "no [[root]] in config.toml: every file action answers path_not_allowed",
                f"add a [[root]] table with path and mode to {paths.config_file}",
            )
        ]
    out = []
    for entry in config.root:
        folder = Path(os.path.expanduser(entry.path))
        mode = "read-write" if entry.mode == "rw" else "read-only"
        details = {"path": str(folder), "mode": entry.mode}
        if folder == paths.workspace and not folder.exists():
            out.append(Finding("root", "ok", f"{folder} ({mode}; made on start)", details=details))
        elif not folder.is_dir():
            out.append(
                Finding(
                    "root",
                    "warn",
                    f"{folder} does not exist or is not a folder: skipped",
                    f"create it, or remove its [[root]] from {paths.config_file}",
                    details,
                )
            )
        else:
            out.append(Finding("root", "ok", f"{folder} ({mode})", details=details))
    return out


def _token(paths: Paths) -> Finding:
    token = paths.token_file
    if not token.exists():
        return Finding(
            "token file",
            "info",
            f"{token} does not exist yet",
            "the hub writes it (owner-only) when it first starts",
        )
    mode = stat.S_IMODE(token.stat().st_mode)
    details = {"path": str(token), "mode": oct(mode)}
    if mode & 0o077:
        return Finding(
            "token file",
            "blocker",
            f"{token} can be read by other users (mode {oct(mode)}): they could drive the hub",
            f"chmod 600 {token}",
            details,
        )
    return Finding("token file", "ok", f"{token} (mode 0600)", details=details)


def _tls(config: Config) -> list[Finding]:
    import ssl

    from worker.wire.transport import is_loopback

    hub = config.hub
    out = []
    if hub.tls_cert is None and hub.tls_key is None:
        if not is_loopback(hub.listen):
            out.append(
                Finding(
                    "tls",
                    "blocker",
                    f"[hub] listen = {hub.listen} is not loopback and there is no TLS: "
                    "the hub refuses to start",
                    "set [hub] tls_cert and tls_key, or listen on 127.0.0.1",
                )
            )
        else:
            out.append(Finding("tls", "ok", f"plaintext on loopback ({hub.listen})"))
    elif hub.tls_cert is None or hub.tls_key is None:
        out.append(
            Finding("tls", "blocker", "[hub] has only one of tls_cert and tls_key", "set both")
        )
    else:
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
                hub.tls_cert, hub.tls_key
            )
        except (OSError, ssl.SSLError) as exc:
            out.append(
                Finding(
                    "tls",
                    "blocker",
                    f"the hub's certificate or key does not load: {exc}",
                    "point [hub] tls_cert/tls_key at a PEM certificate and its key",
                )
            )
        else:
            out.append(Finding("tls", "ok", f"hub certificate {hub.tls_cert} loads with its key"))
    server = config.worker.server
    ca = config.worker.tls_ca
    if server and not is_loopback(server) and ca is not None and not ca.is_file():
        out.append(
            Finding(
                "tls",
                "blocker",
                f"[worker] tls_ca {ca} does not exist",
                "point it at the server's CA certificate, or remove it to use the system's",
            )
        )
    return out


# ----------------------------------------------------------------- hub


def _hub(paths: Paths, config: Config) -> Finding:
    import asyncio

    return _guard("hub", lambda: asyncio.run(_ask_hub(paths, config)))


async def _ask_hub(paths: Paths, config: Config) -> Finding:
    import grpc

    from worker.hub.client import ControlClient
    from worker.wire.proto import agentworker_pb2 as pb

    address = config.worker.server or config.hub.listen
    token = config.worker.token
    if token is None and address != config.hub.listen:
        # This machine's hub.token goes to this machine's hub alone (review27 I2).
        return Finding(
            "hub",
            "warn",
            f"the worker's server {address} is not this machine's hub, and no token for it "
            "is in the config, so it was not asked (this machine's hub.token goes to no "
            "other)",
            "give `agentworker doctor` that server's token: AGENTWORKER_TOKEN or [worker] token",
            {"address": address},
        )
    if token is None and paths.token_file.exists():
        token = paths.token_file.read_text(encoding="ascii").strip()
    if not token:
        return Finding(
            "hub",
            "info",
            f"no hub token yet, so no hub has run from here ({address})",
            "start one: `agentworker up` (or `agentworker service install`)",
            {"address": address},
        )
    from worker.errors import HubUnreachableError, NotYourHubError

    try:
        client = ControlClient.local(paths, config, config.worker.server, token)
    except NotYourHubError as exc:  # another user's listener: no token was sent
        fix = "start your own hub once its port is free: `agentworker up`"
        return Finding("hub", "blocker", exc.message, fix, {"address": address})
    except HubUnreachableError:
        return Finding(
            "hub",
            "warn",
            f"no hub answered at {address} (unavailable)",
            "start one: `agentworker up` (or `agentworker service install`)",
            {"address": address},
        )
    try:
        reply = await client.stub.Status(
            pb.StatusRequest(), metadata=client.metadata, timeout=HUB_TIMEOUT_S
        )
    except grpc.aio.AioRpcError as exc:
        code = exc.code()
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return Finding(
                "hub",
                "blocker",
                f"the hub at {address} refused the token",
                f"use the token in {paths.token_file} of the hub's machine ([worker] token)",
                {"address": address},
            )
        if code == grpc.StatusCode.PERMISSION_DENIED:  # a workers' token: serves, not calls
            return Finding(
                "hub",
                "ok",
                f"the hub at {address} takes this token as a worker's (it may serve, not "
                "call); its status is for callers",
                details={"address": address},
            )
        return Finding(
            "hub",
            "warn",
            f"no hub answered at {address} ({code.name.lower()})",
            "start one: `agentworker up` (or `agentworker service install`)",
            {"address": address},
        )
    finally:
        await client.close()
    state = pb.StatusResponse.State.Name(reply.state).lower()
    return Finding(
        "hub",
        "ok",
        f"{address}: {state}, {reply.connected_workers} of {reply.known_workers} worker(s) "
        f"connected (hub {reply.version})",
        details={"address": address, "state": state, "version": reply.version},
    )


# ----------------------------------------------------------------- containment


BWRAP_INSTALL = (
    "install bubblewrap: `sudo apt install bubblewrap` (Debian, Ubuntu), "
    "`sudo dnf install bubblewrap` (Fedora), `sudo pacman -S bubblewrap` (Arch)"
)


def _bubblewrap(config: Config) -> Finding:
    import asyncio
    import shutil

    if not sys.platform.startswith("linux"):
        return Finding(
            "bubblewrap",
            "warn",
            f"exec runs in a bubblewrap sandbox, which needs Linux (this is {sys.platform}): "
            "exec answers sandbox_unavailable",
            "run the worker on Linux to use workerHost.exec",
        )
    found = shutil.which(config.exec.bwrap)
    if found is None:
        return Finding(
            "bubblewrap",
            "warn",
            f"{config.exec.bwrap} is not on PATH: exec and sandbox mode answer sandbox_unavailable",
            BWRAP_INSTALL,
        )

    def probe() -> Finding:
        from worker.actions import workbench
        from worker.errors import WorkerError

        try:
            asyncio.run(workbench.probe(config))
        except WorkerError as exc:
            return Finding(
                "bubblewrap",
                "warn",
                f"{found} is installed but cannot build the sandbox",
                exc.message.split(" To fix it: ", 1)[-1],
                {"path": found, "said": exc.message},
            )
        return Finding(
            "bubblewrap",
            "ok",
            f"{found} builds the sandbox and runs a program in it",
            details={"path": found},
        )

    return _guard("bubblewrap", probe)


def _landlock(config: Config, paths: Paths) -> Finding:
    if not sys.platform.startswith("linux"):
        return Finding("landlock", "info", "Linux only")
    from sandbox import confinement  # imported as the check runs, like the verbs

    landlock = confinement.Landlock(paths.exec_cache, config.exec.cc)
    layer = landlock.layer()
    details = {"abi": landlock.abi, "applied": layer.active, "require": config.exec.landlock}
    if layer.active:
        return Finding("landlock", "ok", f"exec applies Landlock {layer.detail}", details=details)
    fix = (
        "install a C compiler (Debian/Ubuntu: apt install gcc libc6-dev) or set [exec] cc"
        if landlock.abi
        else "a kernel with Landlock (5.13+, landlock in the lsm= boot parameter) adds its layer"
    )
    if config.exec.landlock == "require":
        return Finding("landlock", "warn", f"off, and required: {layer.detail}", fix, details)
    return Finding("landlock", "info", f"off: {layer.detail}", fix, details)


def _user_limits(config: Config, paths: Paths) -> Finding:
    """Whether each sandbox gets only a share of its user's inotify instances and
    watches (sandbox._startline): where it does not, one sandboxed program can take
    them all from the person's other programs while it runs."""
    if not sys.platform.startswith("linux"):
        return Finding("user limits", "info", "Linux only")
    from sandbox import _startline, confinement  # imported as the check runs, like the verbs

    landlock = confinement.Landlock(paths.exec_cache, config.exec.cc)
    layer = confinement.user_limits_layer(landlock)
    details = {"limits": dict(_startline.user_limits()), "applied": layer.active}
    if layer.active:
        return Finding("user limits", "ok", layer.detail, details=details)
    fix = (
        "Linux 5.11 or later counts them per user namespace, where each sandbox gets its share"
        if not _startline.user_limits()
        else "what turns Landlock on (above) gives each sandbox its share"
    )
    return Finding("user limits", "info", f"off: {layer.detail}", fix, details)


# Kernel memory one epoll watch takes (an epitem and its wait-queue entry): 5,491,511
# watches took 1.11 GB of unreclaimable slab here.
EPOLL_WATCH_BYTES: Final = 200


def _epoll_watches() -> Finding:
    """epoll watches are counted per uid (fs.epoll.max_user_watches), not per user
    namespace: no sandbox gets a share, and one sandboxed program can take them all
    from the person's programs (every event loop then fails to watch anything new)."""
    if not sys.platform.startswith("linux"):
        return Finding("epoll watches", "info", "Linux only")
    try:
        most = int(Path("/proc/sys/fs/epoll/max_user_watches").read_text(encoding="ascii"))
    except (OSError, ValueError):
        return Finding("epoll watches", "info", "this kernel does not say its epoll limit")
    gigabytes = most * EPOLL_WATCH_BYTES / 1e9
    return Finding(
        "epoll watches",
        "info",
        f"not shared out: a sandboxed program can take all {most:,} epoll watches of the "
        f"worker's user (about {gigabytes:.1f} GB of kernel memory), and the user's other "
        "programs then get ENOSPC from epoll_ctl while it runs: the kernel counts them per "
        "uid, not per user namespace. In sandbox mode a plan's memory cgroup counts their "
        f"kernel memory: a plan_memory_mb under {gigabytes * 1000:,.0f} leaves the person "
        "some; exec on the host has no such bound",
        "a worker run as an account of its own keeps the person's epoll watches apart",
        {"max_user_watches": most},
    )


# Descriptors one message may pass (the kernel's SCM_MAX_FD; sandbox._bwrap's too: the
# CLI does not import the sandbox), and the soft RLIMIT_NOFILE most programs run with.
SCM_MAX_FD: Final = 253
USUAL_OPEN_FILES: Final = 1024


def _in_flight(config: Config) -> Finding:
    """Descriptors in flight (SCM_RIGHTS) are counted per uid, and a sender is refused
    once the count passes its RLIMIT_NOFILE: a sandbox holds at most its open_files +
    253, which must leave the user's other programs room under the usual 1,024."""
    most = config.exec.open_files + SCM_MAX_FD
    details = {"open_files": config.exec.open_files, "most_in_flight": most}
    if most < USUAL_OPEN_FILES:
        return Finding(
            "descriptors in flight",
            "ok",
            f"a sandbox can hold at most {most:,} descriptors in flight ([exec] open_files "
            f"+ {SCM_MAX_FD}): programs of the worker's user keep "
            f"{USUAL_OPEN_FILES - most:,} under the usual limit of {USUAL_OPEN_FILES:,}",
            details=details,
        )
    exempt = os.geteuid() == 0
    return Finding(
        "descriptors in flight",
        "info" if exempt else "warn",
        f"a sandbox can hold {most:,} descriptors in flight ([exec] open_files + "
        f"{SCM_MAX_FD}), and the kernel counts them per user: while it does, every program "
        f"of the worker's user at the usual limit of {USUAL_OPEN_FILES:,} gets ETOOMANYREFS "
        "from sendmsg when it passes one"
        + (" (root's programs with CAP_SYS_RESOURCE are exempt)" if exempt else ""),
        "set [exec] open_files = 512 or less",
        details,
    )


def _plan_limits(config: Config, paths: Paths) -> Finding:
    if not sys.platform.startswith("linux"):
        return Finding("plan limits", "info", "sandbox mode needs Linux")

    def probe() -> Finding:
        from sandbox import cgroups
        from worker.actions import workbench

        choice = workbench.plan_cgroups(paths.workbench, config.sandbox)
        support = choice.v2
        note = workbench.limits_note(config.sandbox, config.exec, choice)
        details = {
            "applies": choice.backend.kind if choice.backend is not None else "rlimits",
            "where": choice.backend.where if choice.backend is not None else "",
            "cgroup_v2": support.usable,
            "cgroup": str(support.folder or ""),
            "controllers": list(support.controllers),
            "reason": support.reason if choice.backend is None else choice.note,
        }
        fix = "" if choice.backend is not None else cgroups.HOW
        return Finding("plan limits", "info", f"sandbox mode: {note}", fix, details)

    return _guard("plan limits", probe)


def _seccomp() -> Finding:
    if not sys.platform.startswith("linux"):
        return Finding("seccomp", "info", "Linux only")
    actions = Path("/proc/sys/kernel/seccomp/actions_avail")
    if not actions.exists():
        return Finding(
            "seccomp",
            "info",
            "seccomp filters are not available in this kernel",
            "a kernel with CONFIG_SECCOMP_FILTER adds a syscall filter to the sandbox",
        )
    mode = ""
    for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
        if line.startswith("Seccomp:"):
            mode = line.split(":", 1)[1].strip()
    filtered = (
        " (this process already runs under a filter, as in a container)" if mode == "2" else ""
    )
    from sandbox import confinement  # imported as the check runs, like the verbs

    layer = next(layer for layer in confinement.report() if layer.name == "seccomp")
    details = {"actions": actions.read_text(encoding="ascii").split(), "mode": mode}
    if not layer.active:
        return Finding("seccomp", "info", layer.detail + filtered, details=details)
    return Finding(
        "seccomp", "ok", f"exec installs a filter that {layer.detail}{filtered}", details=details
    )


# ----------------------------------------------------------------- desktop


def _display() -> list[Finding]:
    from worker.actions.computer import ACTIONS  # the surface's own list of its actions

    env = os.environ
    details: dict[str, Any] = {
        k: env.get(k, "") for k in ("DISPLAY", "WAYLAND_DISPLAY", "XDG_SESSION_TYPE")
    }
    problem: tuple[str, str] | None
    if sys.platform.startswith("linux"):
        # The computer surface's own judgement from the environment (Wayland, no
        # DISPLAY, libraries missing); then whether a server answers at DISPLAY.
        from worker.actions.computer._backend import detect

        found = detect()
        if not found.available:
            fix = found.fix
            if "DISPLAY is not set" in found.reason:
                fix += (
                    " For the systemd service: "
                    "`systemctl --user import-environment DISPLAY XAUTHORITY`."
                )
            problem = (found.reason, fix)
        else:
            problem = _x11_opens(env["DISPLAY"])
        server = found.server or "x11"
    elif sys.platform == "darwin":
        server, problem = "quartz", _macos_permissions()
    elif sys.platform == "win32":
        server, problem = "win32", None
    else:
        server, problem = (
            "",
            (f"no desktop backend for {sys.platform}", "use Linux, macOS or Windows"),
        )
    details["server"] = server
    actions = {a: problem is None for a in sorted(ACTIONS)}
    if server == "quartz" and problem is not None:
        # Each permission gates its own actions: screenshots, or input and windows.
        missing = problem[0]
        for action in sorted(ACTIONS):
            if action in ("display_info", "cursor_position"):
                actions[action] = True  # no permission asked
                continue
            needs = "Screen Recording" if action == "screenshot" else "Accessibility"
            actions[action] = needs not in missing
    details["actions"] = actions
    if problem is None:
        return [
            Finding("display", "ok", f"{server}: every computer action can work", details=details)
        ]
    summary, fix = problem
    return [
        Finding(
            "display",
            "warn",
            f"{summary}: computer actions answer not_supported",
            fix,
            details,
        )
    ]


def _x11_opens(display: str) -> tuple[str, str] | None:
    import ctypes

    try:
        libx11 = ctypes.CDLL("libX11.so.6")
    except OSError:
        return ("libX11 is not installed", "install libx11-6 (Debian) or libX11 (Fedora)")
    libx11.XOpenDisplay.restype = ctypes.c_void_p
    libx11.XOpenDisplay.argtypes = [ctypes.c_char_p]
    handle = libx11.XOpenDisplay(display.encode())
    if not handle:
        return (
            f"DISPLAY={display} is set but no X server answers there",
            "start the desktop session (or Xvfb), or set DISPLAY and XAUTHORITY to it",
        )
    libx11.XCloseDisplay.argtypes = [ctypes.c_void_p]
    libx11.XCloseDisplay(handle)
    return None


def _macos_permissions() -> tuple[str, str] | None:
    """Accessibility (input) and Screen Recording (screenshots), as macOS grants them."""
    import ctypes

    app_services = ctypes.CDLL(
        "/System/Library/Frameworks/ApplicationServices.framework/ApplicationServices"
    )
    core_graphics = ctypes.CDLL("/System/Library/Frameworks/CoreGraphics.framework/CoreGraphics")
    app_services.AXIsProcessTrusted.restype = ctypes.c_bool
    core_graphics.CGPreflightScreenCaptureAccess.restype = ctypes.c_bool
    missing = []
    if not app_services.AXIsProcessTrusted():
        missing.append("Accessibility")
    if not core_graphics.CGPreflightScreenCaptureAccess():
        missing.append("Screen Recording")
    if not missing:
        return None
    names = " and ".join(missing)
    return (
        f"macOS has not granted {names} to this program",
        f"System Settings → Privacy & Security → {names}: allow your terminal (or agentworker)",
    )
