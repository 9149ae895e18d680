"""Where agentworker keeps its files, and the settings it runs with.

Precedence is config file < environment (`AGENTWORKER_*`) < flags
(docs/architecture.md, "Configuration reference").
`AGENTWORKER_HOME`, when set, holds both the config file and the data, so tests and
side-by-side instances never touch the person's real files.
"""

from __future__ import annotations

import logging
import os
import tomllib
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from sandbox import Root, environment, plan_uids
from worker import hosts
from worker.errors import ConfigError
from worker.paths import DEFAULT_LISTEN as DEFAULT_LISTEN
from worker.paths import Paths as Paths  # where it lived first; worker.paths needs no pydantic

log = logging.getLogger(__name__)

STATE_DB = "state.db"  # the worker's ledger and telemetry, in the data folder
HUB_DB = "hub.db"  # the reference hub's store, in the data folder
DATABASES = (STATE_DB, HUB_DB)
DB_FILE_SUFFIXES = ("", "-wal", "-shm", "-journal")  # SQLite's files for one database
LEDGER_BLOBS_SUFFIX = "-blobs"  # the ledger's folder of large unacked result blobs
USER_POLICY = "allowlist.toml"  # the person's exec allowlist, beside config.toml


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HubSection(_Strict):
    listen: str = DEFAULT_LISTEN
    tls_cert: Path | None = None
    tls_key: Path | None = None
    default_timeout_s: float = Field(default=60.0, gt=0, le=86_400)
    # Request blobs held at once for calls not yet answered; past it, `busy`.
    held_blobs_mib: int = Field(default=256, ge=16, le=65_536)
    # Serve any new worker id at its first Hello, as hubs did before enrolment: anyone
    # holding hub-workers.token is then a worker of this hub and is given plans, calls,
    # args and blobs. Off: a new worker waits for `agentworker workers accept ID`.
    accept_new_workers: bool = False


class RootSection(_Strict):
    path: Path
    mode: Literal["rw", "ro"] = "ro"


class GrantSection(_Strict):
    agent: str = "*"
    scopes: list[str]
    plan: str = "*"
    expires: datetime | None = None


class WorkerSection(_Strict):
    server: str | None = None  # None: this machine's hub at [hub].listen
    token: str | None = None
    tls_ca: Path | None = None
    max_concurrency: int = Field(default=8, ge=1, le=256)
    max_accepted: int = Field(default=4096, ge=1, le=1_000_000)
    # Results the server has not acknowledged, kept on disk until it does: past this
    # the worker takes no new call (`busy`), so a server that never acks cannot fill it.
    max_unacked_mib: int = Field(default=256, ge=1, le=1_000_000)
    default_timeout_s: float = Field(default=60.0, gt=0, le=86_400)
    drain_grace_s: float = Field(default=20.0, ge=0, le=3_600)
    # The diagnostic surface (workerDiag.*) exists for tests and benchmarks only.
    diagnostics: bool = False


class ConnectionSection(_Strict):
    keepalive_time_s: float = Field(default=10.0, ge=0.1)
    # How long a keepalive ping may go unanswered before the link counts as dead.
    ping_timeout_s: float = Field(default=5.0, ge=0.1)
    heartbeat_s: float = Field(default=5.0, ge=0.05)
    backoff_base_s: float = Field(default=0.5, ge=0.01)
    backoff_cap_s: float = Field(default=30.0, ge=0.1, le=30.0)


class TelemetrySection(_Strict):
    retention_days: int = Field(default=90, ge=1)
    # The most invocation rows (and audit events) kept, the oldest going first: rows
    # are bounded by size as well as by age.
    max_rows: int = Field(default=1_000_000, ge=1000)


class ExecSection(_Strict):
    """workerHost.exec: its policy file, deadlines and per-process limits."""

    # An allowlist layered on the shipped policy; unset: allowlist.toml beside config.toml.
    policy: Path | None = None
    default_timeout_s: float = Field(default=30.0, gt=0, le=86_400)
    max_timeout_s: float = Field(default=600.0, gt=0, le=86_400)  # the ceiling a call may ask
    cpu_s: int = Field(default=300, ge=1, le=86_400)
    memory_mb: int = Field(default=4096, ge=16)  # address space per process
    file_size_mb: int = Field(default=64, ge=1)
    tmp_mb: int = Field(default=256, ge=1, le=1_048_576)  # the sandbox's /tmp, all its files
    # Above 512, a sandbox's descriptors in flight can make the worker's user's other
    # programs (at the usual 1,024) fail to pass one (sandbox._bwrap.SCM_MAX_FD).
    open_files: int = Field(default=512, ge=16, le=1_048_576)
    max_processes: int = Field(default=64, ge=1, le=4096)
    # Variables passed from the worker's environment; secret-looking names are refused.
    pass_env: list[str] = ["LANG", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "LC_COLLATE", "TZ"]
    bwrap: str = "bwrap"
    # The C compiler that builds the sandbox's Landlock helper once (sandbox/entry.c).
    cc: str = "cc"
    # "auto": Landlock where this machine has it, and exec in bubblewrap + seccomp where
    # not (said at start and by doctor); "require": exec refuses where it is missing.
    landlock: Literal["auto", "require"] = "auto"
    # Sandboxes built ahead of a plan's next exec (sandbox.warm): for this many plans at
    # most (the ones used last; 0: none), each let go when no call took it within
    # ahead_idle_s.
    ahead_plans: int = Field(default=4, ge=0, le=64)
    ahead_idle_s: float = Field(default=30.0, gt=0, le=3600)

    @model_validator(mode="after")
    def _coherent(self) -> ExecSection:
        if self.default_timeout_s > self.max_timeout_s:
            raise ValueError("default_timeout_s must not exceed max_timeout_s")
        for name in self.pass_env:
            why = environment.refusal(name)
            if why is not None:
                raise ValueError(f"pass_env: {name!r} {why}; it is never passed to programs")
        return self


class FsSection(_Strict):
    """The workerHost.fs_* actions."""

    # A file with several names (hard links) may have one outside every root; such
    # files are refused for reading and appending unless this is set.
    allow_hard_links: bool = False


class HttpSection(_Strict):
    """workerHost.http_fetch: hosts opened on purpose, and the longest waits allowed."""

    # Hosts reachable even though they resolve to a private, loopback or other
    # non-public address: "host" (any port) or "host:port", e.g. "localhost:8000".
    allow_hosts: list[str] = []
    # Each is the default for a call and the most a call may ask.
    connect_timeout_s: float = Field(default=10.0, gt=0, le=300)
    read_timeout_s: float = Field(default=30.0, gt=0, le=3_600)
    total_timeout_s: float = Field(default=60.0, gt=0, le=3_600)

    @field_validator("allow_hosts")
    @classmethod
    def _hosts(cls, entries: list[str]) -> list[str]:
        for entry in entries:
            hosts.parse_pattern(entry)  # raises ValueError with the reason
        return entries


class SandboxSection(_Strict):
    """Sandbox mode (`--sandbox`): a workspace per plan, under the data folder."""

    quota_mb: int = Field(default=1024, ge=1)  # disk a plan's workspace may take
    # Files, folders and links a plan's workspace may hold (empty files take no disk).
    max_entries: int = Field(default=100_000, ge=100, le=10_000_000)
    # Plans holding a workspace at once (so the disk they may take is max_plans x quota_mb);
    # a new plan past it is answered `busy` until one is torn down or swept.
    max_plans: int = Field(default=64, ge=1, le=100_000)
    # Of them, made for one agent (the server's agent_id): one agent, or one gone wrong,
    # must not take every workspace and leave the others' plans answered `busy`.
    # Unset: half of max_plans.
    max_plans_per_agent: int | None = Field(default=None, ge=1, le=100_000)

    @property
    def plans_per_agent(self) -> int:
        return self.max_plans_per_agent or max(1, self.max_plans // 2)

    idle_hours: float = Field(default=168.0, gt=0)  # workspaces unused this long are swept
    sweep_every_s: float = Field(default=600.0, ge=0.05, le=86_400)
    # Programs of one plan running at once: with per-sandbox rlimits, this bounds the plan.
    plan_execs: int = Field(default=2, ge=1, le=64)
    # Limits on all of one plan's programs together, in a cgroup per plan: "auto" where
    # this machine offers cgroups (a delegated cgroup v2 subtree, or cgroup v1 as root;
    # `agentworker doctor` says which), "off" for the per-sandbox rlimits alone.
    cgroups: Literal["auto", "off"] = "auto"
    plan_processes: int = Field(default=256, ge=8, le=4_194_304)  # processes at once
    plan_memory_mb: int = Field(default=4096, ge=32)  # memory in use, swap not allowed
    plan_cpus: float = Field(default=2.0, ge=0.01, le=4096)  # CPUs' worth of time
    # A uid of each plan's own, from this range ("A-B", no account's; a root worker
    # only): the kernel's per-user counts (epoll watches, pipe pages) a plan's programs
    # take are then that uid's, never the worker's user's (sandbox.plan_uids). Unset:
    # plans' programs run as the worker's user.
    uids: str | None = None

    @field_validator("uids")
    @classmethod
    def _uid_range(cls, text: str | None) -> str | None:
        if text is not None:
            plan_uids.parse(text)  # raises ValueError with the reason
        return text

    @property
    def uid_range(self) -> range | None:
        return None if self.uids is None else plan_uids.parse(self.uids)


# The longest a prompt may wait for its person (`[ui] prompt_timeout_s`): an hour.
PROMPT_TIMEOUT_MAX_S: Final = 3_600


class UiSection(_Strict):
    """Approval prompts (the TUI, or `agentworker ui` attached to a running worker)."""

    # A prompt nobody answers within this is a denial.
    prompt_timeout_s: float = Field(default=60.0, ge=1, le=PROMPT_TIMEOUT_MAX_S)


class ComputerSection(_Strict):
    """workerComputer: whether the agent may drive this desktop, and how the person stops it."""

    enabled: bool = True
    # Pauses every plan from any window; "" for none (`agentworker pause` always works).
    stop_hotkey: str = "ctrl+alt+shift+escape"
    # Input the worker did not inject, while the agent drives, pauses the computer surface.
    takeover: bool = True
    # "While the agent drives": this long after its last computer action.
    takeover_window_s: float = Field(default=30.0, gt=0, le=86_400)


class Config(_Strict):
    hub: HubSection = HubSection()
    root: list[RootSection] = []
    grant: list[GrantSection] = []
    worker: WorkerSection = WorkerSection()
    connection: ConnectionSection = ConnectionSection()
    telemetry: TelemetrySection = TelemetrySection()
    exec: ExecSection = ExecSection()
    fs: FsSection = FsSection()
    http: HttpSection = HttpSection()
    sandbox: SandboxSection = SandboxSection()
    ui: UiSection = UiSection()
    computer: ComputerSection = ComputerSection()


# Environment variables and the setting each one overrides.
_ENV: Final[dict[str, tuple[str, str]]] = {
    "AGENTWORKER_LISTEN": ("hub", "listen"),
    "AGENTWORKER_TLS_CERT": ("hub", "tls_cert"),
    "AGENTWORKER_TLS_KEY": ("hub", "tls_key"),
    "AGENTWORKER_SERVER": ("worker", "server"),
    "AGENTWORKER_TOKEN": ("worker", "token"),
    "AGENTWORKER_TLS_CA": ("worker", "tls_ca"),
    "AGENTWORKER_MAX_CONCURRENCY": ("worker", "max_concurrency"),
    "AGENTWORKER_DIAGNOSTICS": ("worker", "diagnostics"),
    "AGENTWORKER_KEEPALIVE_S": ("connection", "keepalive_time_s"),
    "AGENTWORKER_PING_TIMEOUT_S": ("connection", "ping_timeout_s"),
    "WORKER_INVOCATION_RETENTION_DAYS": ("telemetry", "retention_days"),
}

_TEMPLATE = """\
# agentworker configuration. Precedence: this file < AGENTWORKER_* variables < flags.

[hub]
listen = "{listen}"        # the address the hub serves and the worker dials

# Filesystem roots the agent may reach. Only these, nothing else.
# Add a table per folder; mode = "ro" (read-only) or "rw".
[[root]]
path = "{workspace}"
mode = "rw"

# Pre-granted scopes. Without a grant, calls answer scope_required.
# [[grant]]
# agent = "*"                      # an agent id, or *
# scopes = ["workerHost.fs_stat"]  # patterns over surface.action
# plan = "*"
# expires = "2026-12-31T00:00:00Z"

# workerHost.exec runs allowlisted programs in a bubblewrap sandbox. Your own
# rules go in allowlist.toml beside this file (`agentworker allowlist show`).
# [exec]
# default_timeout_s = 30
# max_timeout_s = 600
# memory_mb = 4096                  # address space per process
# max_processes = 64
# pass_env = ["LANG", "LC_ALL", "TZ"]

# workerHost.http_fetch reaches public internet addresses only. To open a host on
# this machine or network on purpose (a local dev server, say), list it here.
# [http]
# allow_hosts = ["localhost:8000"]  # "host" (any port) or "host:port"
# total_timeout_s = 60

# Sandbox mode (`--sandbox`): a workspace per plan. Where this machine offers cgroups,
# all of a plan's programs together are held to these (`agentworker doctor` says
# whether they apply here).
# [sandbox]
# quota_mb = 1024                   # disk a plan's workspace may take
# max_entries = 100000              # files, folders and links a plan's workspace may hold
# max_plans = 64                    # plans with a workspace at once (disk: max_plans x quota_mb)
# max_plans_per_agent = 32          # of them, plans one agent may hold (unset: half)
# plan_processes = 256
# plan_memory_mb = 4096             # memory in use, no swap
# plan_cpus = 2.0                   # CPUs' worth of time
"""


# Read with one rule, here only: a value that is not a positive whole number is
# ignored (and logged), as the retention variable has always been documented.
RETENTION_VAR = "WORKER_INVOCATION_RETENTION_DAYS"


def load(
    paths: Paths,
    overrides: dict[str, dict[str, object]] | None = None,
    environ: Mapping[str, str] = os.environ,
) -> Config:
    """Read the config file, then `environ`'s AGENTWORKER_* (and retention) variables,
    then `overrides` (from flags)."""
    raw: dict[str, object] = {}
    if paths.config_file.exists():
        try:
            raw = tomllib.loads(paths.config_file.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{paths.config_file} is not valid TOML: {exc}") from exc
    for var, (section, key) in _ENV.items():
        value = environ.get(var)
        if value is None or value == "":
            continue
        if var == RETENTION_VAR and not (value.isdigit() and int(value) > 0):
            log.warning("%s=%r is not a positive number of days; ignored", var, value)
            continue
        _section(raw, section)[key] = value
    for section, values in (overrides or {}).items():
        _section(raw, section).update({k: v for k, v in values.items() if v is not None})
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"settings in {paths.config_file} are invalid: {problems}") from exc


def _section(raw: dict[str, object], name: str) -> dict[str, object]:
    value = raw.setdefault(name, {})
    if not isinstance(value, dict):
        raise ConfigError(f"[{name}] in the config file must be a table")
    return value


def roots_of(config: Config, paths: Paths) -> list[Root]:
    """The [[root]] folders that exist, resolved, each with the worker's own places
    inside it withheld; the workspace is made on first use.

    A person may share a folder that holds the worker's own settings and data (their
    home, say). Those stay unreachable through it, by fs_* and exec alike; the start
    log names them.
    """
    folders, files = own_places(config, paths)
    roots = []
    for entry in config.root:
        folder = Path(os.path.expanduser(entry.path))
        if folder == paths.workspace:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not folder.is_dir():
            log.warning("root %s does not exist or is not a folder; skipped", folder)
            continue
        real = Path(os.path.realpath(folder))
        if _within_own(real, folders, files, paths):
            log.warning(
                "root %s holds places of the worker's own files (its settings, token and "
                "data); skipped: share a folder of your own, or the workspace %s",
                real,
                paths.workspace,
            )
            continue
        withheld = _withheld_in(real, folders, files)
        if withheld:
            log.warning(
                "the shared folder %s holds the worker's own %s; they stay hidden from the "
                "agent (fs_* and exec)",
                real,
                ", ".join(str(place) for place in withheld),
            )
        roots.append(Root.sharing(real, writable=entry.mode == "rw", withheld=withheld))
    return roots


def own_places(config: Config, paths: Paths) -> tuple[list[Path], list[Path]]:
    """The worker's own folders, and its own files (which may lie elsewhere), resolved."""
    folders = [paths.config_dir, paths.data_dir]
    for sock in (paths.ui_socket, paths.hub_socket):
        if sock.parent != paths.data_dir and sock.parent not in folders:  # a long data path
            folders.append(sock.parent)  # the sockets' folder under the temp folder
    files = [
        paths.config_file,
        paths.token_file,
        paths.workers_token_file,
        paths.placement_key_file,  # the hub's proof of where it placed each plan
        paths.config_dir / USER_POLICY,
        paths.workbench,
        paths.exec_cache,
        paths.data_dir / "worker_id",
        paths.ui_socket,  # the person's console: approvals are answered there
        paths.hub_socket,  # this data folder's hub, for this user's verbs and worker
        paths.worker_key_file,  # proves to a hub that this is the worker of that id
        *(paths.data_dir / f"{db}{suffix}" for db in DATABASES for suffix in DB_FILE_SUFFIXES),
        paths.data_dir / f"{STATE_DB}{LEDGER_BLOBS_SUFFIX}",  # unacked result blobs
    ]
    if config.exec.policy is not None:
        files.append(Path(config.exec.policy))
    tls = (config.hub.tls_cert, config.hub.tls_key, config.worker.tls_ca)
    files += [p for p in tls if p is not None]
    real = [Path(os.path.realpath(os.path.expanduser(place))) for place in folders]
    return real, [Path(os.path.realpath(os.path.expanduser(place))) for place in files]


def _within_own(root: Path, folders: list[Path], files: list[Path], paths: Paths) -> bool:
    """Whether `root` is one of the worker's own folders, or inside one and holding
    places of its own files, the workspace (made to be shared) aside. Such a file is
    withheld by its path, but the sandbox can only blank what exists: one not there
    yet could be made by a program (an allowlist.toml the policy then reads, a
    ui.sock posing as the person's console)."""
    if root.is_relative_to(Path(os.path.realpath(paths.workspace))):
        return False
    if not any(root.is_relative_to(folder) for folder in folders):
        return False
    return any(place.is_relative_to(root) for place in files)


def _withheld_in(root: Path, folders: list[Path], files: list[Path]) -> tuple[Path, ...]:
    """Own folders strictly inside `root`, and own files inside it not already covered."""
    withheld = [folder for folder in folders if folder != root and folder.is_relative_to(root)]
    for place in files:
        covered = any(place.is_relative_to(folder) for folder in withheld)
        if place != root and place.is_relative_to(root) and not covered:
            withheld.append(place)
    return tuple(sorted(set(withheld)))


def first_start(paths: Paths) -> bool:
    """Create the config file and the workspace on first start; True when it did."""
    paths.ensure()
    if paths.config_file.exists():
        return False
    paths.workspace.mkdir(parents=True, exist_ok=True, mode=0o700)
    text = _TEMPLATE.format(listen=DEFAULT_LISTEN, workspace=paths.workspace)
    fd = os.open(paths.config_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    return True
