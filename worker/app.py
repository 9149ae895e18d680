"""Assembly: turn a config into a running hub, worker, or both (`up`).

Everything long-lived is built here and nowhere else, so the CLI stays a thin
layer of flags and the tests can start the same pieces the person runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import shutil
import signal
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import grpc

from sandbox import confinement, plan_uids
from worker import actions, db, memory
from worker.actions import computer
from worker.actions.scope_names import grant_tables_problem
from worker.config import Config, Paths, first_start, roots_of
from worker.core.approvals import ApprovalBroker
from worker.core.connection import (
    Backoff,
    LinkState,
    Target,
    WorkerConnection,
    local_hub_key,
)
from worker.core.console import Console, Link
from worker.core.console_socket import ConsoleServer
from worker.core.ledger import UNRECORDED_SERVER, State
from worker.core.pause import PauseState, PauseSwitch
from worker.core.pipeline import Dispatcher, Limits
from worker.core.registry import MIB, Services
from worker.core.scopes import Approver, Grant, Scopes
from worker.core.telemetry import Telemetry
from worker.core.tui_process import TuiProcess, describe_exit
from worker.errors import (
    ConfigError,
    CredentialsError,
    InsecureError,
    InUseError,
    NoSandboxError,
    StartupError,
    TokenNotSentError,
    WorkerError,
)
from worker.hub.health import Health
from worker.hub.server import Hub
from worker.hub.services import control_service, local_streams, worker_service
from worker.hub.store import HubStore
from worker.wire import own_hub
from worker.wire.auth import BearerAuth
from worker.wire.inproc import LocalCall, LocalStreams
from worker.wire.local import LocalLink
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.transport import (
    OWN_HUB_NAME,
    Keepalive,
    fingerprint_of_digest,
    is_loopback,
    key_for_server,
    read_or_create_token,
    read_token,
    server_name,
    server_options,
    split_host,
    worker_key_digest_of,
)

if TYPE_CHECKING:  # sandbox mode's own: imported when `--sandbox` asks for it
    from worker.actions import workbench

log = logging.getLogger("agentworker")

PRUNE_EVERY_S = 3600.0
# Telemetry past retention is pruned on start and then daily.
TELEMETRY_PRUNE_EVERY_S = 86_400.0
# A kill or pause recorded by another process (`agentworker kill`, `pause`) stops
# running calls when that process signals this one (SIGUSR1, see worker.cli.reload);
# this check catches a writer that could not signal (the ledger is the truth).
KILL_CHECK_S = 5.0


def keepalive_of(config: Config) -> Keepalive:
    return Keepalive(
        time_s=config.connection.keepalive_time_s,
        ping_timeout_s=config.connection.ping_timeout_s,
    )


# ----------------------------------------------------------------- worker


@contextlib.contextmanager
def worker_lock(paths: Paths) -> Iterator[None]:
    """One worker per data dir: two would both claim the same ledger."""
    paths.ensure()
    lock_path = paths.data_dir / "worker.lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InUseError(
                f"another worker already runs with {paths.data_dir}; stop it first, or set "
                "AGENTWORKER_HOME to run a second one side by side",
            ) from None
        # Who holds it, for `agentworker reload` (it signals this process).
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def worker_id(paths: Paths) -> str:
    """Stable across restarts: the server recognises the same machine coming back."""
    id_file = paths.data_dir / "worker_id"
    if id_file.exists():
        if id_file.stat().st_mode & 0o077:  # written 0644 before (review29b #5)
            id_file.chmod(0o600)
        return id_file.read_text(encoding="ascii").strip()
    ident = f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
    # This user's alone, as everything in the data folder: a root worker with
    # [sandbox] uids lets others pass through that folder (sandbox.plan_uids).
    fd = os.open(id_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as written:
        written.write(ident + "\n")
    return ident


def grants_of(config: Config, paths: Paths) -> list[Grant]:
    """The [[grant]] tables' grants; ConfigError for a scope no action asks for (a
    typo granted nothing, and the calls it was meant for were refused in silence)."""
    problem = grant_tables_problem((g.scopes for g in config.grant), paths.config_file)
    if problem is not None:
        raise ConfigError(problem)
    return [
        Grant(agent=g.agent, scope=scope, plan=g.plan, expires=g.expires, granted_by="config")
        for g in config.grant
        for scope in g.scopes
    ]


def _sandbox_grant() -> Grant:
    """Sandbox mode's one grant of its own: every workbench action, to any agent (the
    plan's workspace is all such a call can reach)."""
    from worker.actions import workbench

    return Grant(agent="*", scope=f"{workbench.SURFACE}.*", granted_by="sandbox mode")


def build_dispatcher(
    paths: Paths,
    config: Config,
    approver: Approver | None = None,
    bench: workbench.Workbench | None = None,
    desktop: computer.Desktop | None = None,
) -> Dispatcher:
    """The worker side; with `bench`, in sandbox mode: workbenchHost.* per plan, no
    shared folders, no prompts (the plan's workspace is all a call can reach)."""
    desktop = desktop or computer.build(config, paths.data_dir)
    state = State(paths.data_dir / "state.db", convert=True)  # the worker owns state.db
    # In the ledger's database, on its connection: one file, and an ack is recorded
    # only after the row of its result (see Dispatcher.ack).
    telemetry = Telemetry(
        state.connection,
        config.telemetry.retention_days,
        config.telemetry.max_rows,
        convert=True,  # as its ledger: tables from before are made per server here
    )
    static = grants_of(config, paths)
    registry = actions.build(diagnostics=config.worker.diagnostics)
    if not desktop.available:
        registry = computer.absent(registry, desktop.availability)
    roots = roots_of(config, paths)
    if bench is not None:
        from worker.actions import workbench

        static.append(_sandbox_grant())
        registry = {
            **workbench.build(bench),
            **{name: spec for name, spec in registry.items() if spec.diagnostic},
        }
        roots = []
    scopes = Scopes(
        static,
        live=lambda: [
            Grant(g.agent, g.scope, g.plan, g.expires, g.granted_by) for g in state.grants()
        ],
        approver=approver,
    )
    dispatcher = Dispatcher(
        worker_id=worker_id(paths),
        registry=registry,
        state=state,
        telemetry=telemetry,
        scopes=scopes,
        roots=roots,
        paths=paths,
        limits=Limits(
            max_concurrency=config.worker.max_concurrency,
            max_accepted=config.worker.max_accepted,
            max_unacked_bytes=config.worker.max_unacked_mib * MIB,
            default_timeout_s=config.worker.default_timeout_s,
        ),
        config=config,
        pause=desktop.pause,
        services=Services(desktop),
    )
    for grant in state.sort_old_grants():
        log.info(
            "grant %d (%s for agent %r, plan %r), made before grants were kept per server, is %s",
            grant.id,
            grant.scope,
            grant.agent,
            grant.plan,
            "for no server: grant it again for the one it is for (`agentworker grant`)"
            if grant.server == UNRECORDED_SERVER
            else f"server {grant.server}'s (its plan's calls, in the ledger)",
        )
    if bench is not None:
        # A call reaches its plan's workspace of the server that sent it (the one the
        # ledger serves: its connection names it), never another server's.
        bench.server = lambda: state.server
        bench.sort_old(state.servers_of_plans)
        dispatcher.on_teardown = bench.teardown
        dispatcher.held_plans = bench.held
    return dispatcher


def build_console(
    dispatcher: Dispatcher,
    config: Config,
    *,
    server: str,
    mode: str,
    ui_in_process: bool = False,
    first_steps: Sequence[str] = (),
) -> Console:
    """The person's console on a worker, with the approval broker behind it: the
    dispatcher asks it when a call needs the person. With `ui_in_process` (a TUI on
    this process's own loop, as the UI tests drive it) a UI is always attached;
    otherwise one attaches over the socket (`agentworker ui`, or the TUI's own
    process that `up` and `run` start)."""
    broker = ApprovalBroker(
        dispatcher.state,
        dispatcher.telemetry,
        timeout_s=config.ui.prompt_timeout_s,
        always_attached=ui_in_process,
    )
    broker.kill = dispatcher.kill_plan
    broker.emit_audit = lambda event: dispatcher.outbox(pb.WorkerMessage(audit=event))
    broker.on_waiting = lambda cid: dispatcher.results.ack_request(
        cid, pb.ActionAck.AWAITING_APPROVAL
    )
    dispatcher.scopes.approver = broker
    console = Console(
        dispatcher,
        broker,
        server=server,
        mode=mode,
        static_grants=tuple(grants_of(config, dispatcher.paths)),
        first_steps=tuple(first_steps),
    )
    if dispatcher.pause is not None:
        _watch_pause(dispatcher, dispatcher.pause, console)
    return console


def _watch_pause(dispatcher: Dispatcher, switch: PauseSwitch, console: Console) -> None:
    """The global stop reaches running calls at once, and every UI shows it; the UI's
    key sets and lifts it. Set from any thread (a hotkey's), or another process."""
    loop = asyncio.get_running_loop()

    def on_pause(_state: PauseState) -> None:
        loop.call_soon_threadsafe(dispatcher.enforce_pause)
        loop.call_soon_threadsafe(console.pause_changed)

    switch.subscribe(on_pause)
    console.pause, console.paused = pause_hooks(switch, "tui")


def local_workers_token(paths: Paths) -> Path:
    """The token file a worker beside its hub uses: the workers' token, which cannot
    send calls (a hub before it made only hub.token, which it then uses)."""
    workers = paths.workers_token_file
    return workers if workers.exists() or not paths.token_file.exists() else paths.token_file


def worker_target(paths: Paths, config: Config) -> Target:
    """Where the worker dials: the configured server, else this machine's hub, on its
    Unix socket (or its port, once the kernel says this user holds it: never another
    user's listener, worker.wire.own_hub), known to the ledger as `up` knows it, by its
    token (see connection.local_hub_key)."""
    address = config.worker.server or config.hub.listen
    token = config.worker.token
    own = config.worker.server is None
    if server_name(address) == OWN_HUB_NAME:
        # The name of the key this machine's hub accepts unasked (review29 k2): a host
        # so named (a LAN name, a search domain) would be sent it.
        raise ConfigError(
            f"--server {address}: '{OWN_HUB_NAME}' is the name of the key this machine's "
            f"hub knows its own workers by, so it names no server; give the host with its "
            f"port ({OWN_HUB_NAME}:PORT), or leave --server out to dial this machine's hub"
        )
    if token is None:
        if address != config.hub.listen:
            # This machine's workers' token goes to this machine's hub alone: a server
            # named by a typo, or a colleague's, would have it (review27 I2).
            raise TokenNotSentError(
                f"{address} is not this machine's hub ({config.hub.listen}), and this "
                "machine's workers' token goes to no other: give that server's token "
                "with --token-file FILE or AGENTWORKER_TOKEN"
            )
        token = read_token(local_workers_token(paths))
    # This machine's token, sent to its hub however it is named: `--server` spelling
    # `[hub] listen` is dialled as this hub is, never to another user's listener on its
    # port (review28 r3: it was sent the workers' token and worker.key). The key for
    # this hub (OWN_HUB_NAME) goes only there too.
    checked = own or config.worker.token is None
    target = own_hub.OwnHub(paths.hub_socket, config.hub.listen) if checked else None
    if not checked and _this_hubs_port(address, config.hub.listen):
        # With a token of its own, `--server` naming this machine's hub's port is dialled
        # as named, but only once the kernel says its listener is this user's: the key
        # for that address is one the hub accepts unasked, and another user holding the
        # port while the hub was away was sent it with the token (review29 k3).
        target = own_hub.OwnHub(None, address)
    return Target(
        address=address,
        token=token,
        tls_ca=config.worker.tls_ca,
        worker_key=key_for_server(
            read_or_create_token(paths.worker_key_file),
            OWN_HUB_NAME if checked else server_name(address),
        ),
        key=local_hub_key(token) if own and config.worker.token is None else "",
        own_hub=target,
    )


def _this_hubs_port(address: str, listen: str) -> bool:
    """Whether `address` reaches `[hub] listen` on this machine: spelled alike, or a
    loopback host on its port however written (where the hub listens on loopback or on
    every address). Hosts outside `is_loopback` (127.1, ::ffff:127.0.0.1) are dialled
    over TLS alone (transport.open_channel), by a certificate the person's CA signed."""
    named, listening = server_name(address), server_name(listen)
    if named == listening:
        return True
    if named.startswith("unix:") or not is_loopback(named):
        return False
    # A hub listening on every address (0.0.0.0, ::) is reached on loopback too.
    here = is_loopback(listening) or split_host(listening) in ("0.0.0.0", "::", "")  # noqa: S104
    return here and _port(named) == _port(listening) is not None


def _port(address: str) -> int | None:
    """The port of `host:port` as a number: gRPC dials `127.0.0.1:07421` at port 7421."""
    digits = address.rpartition(":")[2]
    return int(digits) if digits.isascii() and digits.isdigit() else None


def reload_config(
    dispatcher: Dispatcher, paths: Paths, config: Config, *, sandbox: bool = False
) -> Config:
    """Read config.toml again (SIGHUP): roots, grants and per-call settings ([exec]'s
    deadlines and limits, [fs], [http]) take effect for the calls after this; what the
    running links were built from needs a restart. In sandbox mode there are no roots
    (each plan has its workspace) and the workbench's own grant stays."""
    from worker.config import load  # the one reader of the file

    try:
        fresh = load(paths)
        grants = grants_of(fresh, paths)
    except ConfigError as exc:
        log.error("config.toml not reloaded, the old settings stay: %s", exc.message)
        return config
    if sandbox:
        grants.append(_sandbox_grant())
    else:
        dispatcher.roots = roots_of(fresh, paths)
    dispatcher.scopes.replace_static(grants)
    dispatcher.config = fresh
    dispatcher.containment.warm.discard()  # built for the roots and limits read before
    log.info(
        "reloaded %s: %s, %d grant(s) from the file",
        paths.config_file,
        "sandbox mode (a workspace per plan)" if sandbox else f"{len(dispatcher.roots)} root(s)",
        len(fresh.grant),
    )
    for root in dispatcher.roots:
        log.info("root %s (%s)", root.path, "read-write" if root.writable else "read-only")
    fixed = [
        name
        for name in ("hub", "worker", "connection", "telemetry", "sandbox")
        if getattr(fresh, name) != getattr(config, name)
    ]
    if fixed:
        log.warning(
            "changes to [%s] take effect only after a restart of agentworker",
            "], [".join(fixed),
        )
    return fresh


def _as_in_the_file(paths: Paths, config: Config) -> Config:
    """The settings as `reload` reads them, from config.toml and the environment but
    no flags: what a reload's changes are told from (else a `--server` given at start
    read as a change to [worker] at the first reload)."""
    from worker.config import load

    try:
        return load(paths)
    except ConfigError:  # changed since the start: the first reload says so
        return config


def build_connection(
    dispatcher: Dispatcher,
    target: Target,
    config: Config,
    gui_available: bool = False,
    link: LocalLink | None = None,
    dial: Callable[[Sequence[tuple[str, str]]], LocalCall] | None = None,
) -> WorkerConnection:
    return WorkerConnection(
        dispatcher,
        target,
        keepalive=keepalive_of(config),
        heartbeat_s=config.connection.heartbeat_s,
        backoff=Backoff(config.connection.backoff_base_s, config.connection.backoff_cap_s),
        gui_available=gui_available,
        link=link,
        dial=dial,
    )


async def _enforce_kills(dispatcher: Dispatcher, nudged: asyncio.Event) -> None:
    """A kill recorded in the ledger by another process reaches running calls too: at
    once when that process nudges this one (`nudged`), else at the next check."""
    while True:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(KILL_CHECK_S):
                await nudged.wait()
        if nudged.is_set():
            nudged.clear()
            log.info("told of a kill or pause made on this machine: checking running calls now")
        if dispatcher.enforce_kills():
            log.info("stopped running calls of a plan killed from this machine")
        if dispatcher.enforce_pause():
            log.info("stopped running calls: paused from this machine")


def prune_telemetry(telemetry: Telemetry) -> int:
    """Forget telemetry past retention, and say how much went."""
    rows, events, recorded = telemetry.prune_all()
    log.info(
        "telemetry: pruned %d invocation rows, %d audit events and %d recorded calls "
        "older than %d days",
        rows,
        events,
        recorded,
        telemetry.retention_days,
    )
    return rows


async def _housekeeping(dispatcher: Dispatcher) -> None:
    """Telemetry pruned on start and daily; the ledger's acked calls (and the results
    it held for other servers) hourly, and the memory that large calls freed given back
    (worker.memory)."""
    telemetry_due = 0.0
    while True:
        # The wall clock, not the monotonic one: a day spent suspended counts.
        if time.time() >= telemetry_due:
            prune_telemetry(dispatcher.telemetry)
            telemetry_due = time.time() + TELEMETRY_PRUNE_EVERY_S
        dispatcher.state.prune()
        if forgot := await db.in_steps(dispatcher.state.cap_acked()):
            log.warning(
                "ledger: forgot the %d oldest acked calls past %d MiB before their %g h",
                forgot,
                dispatcher.state.max_acked_bytes // (1024 * 1024),
                dispatcher.state.ttl_s / 3600,
            )
        if capped := await dispatcher.telemetry.cap_rows_in_steps():
            log.warning(
                "telemetry: forgot the %d oldest rows past [telemetry] max_rows (%d) or "
                "%d MiB a table",
                capped,
                dispatcher.telemetry.max_rows,
                dispatcher.telemetry.max_table_bytes // (1024 * 1024),
            )
        await _give_back_pages(db.path_of(dispatcher.state.connection))
        memory.give_back()
        await asyncio.sleep(PRUNE_EVERY_S)  # a timer by nature: age is what it prunes by


async def _give_back_pages(database: Path) -> None:
    """What pruning freed beyond what the next writes reuse goes back to the file
    system, off the loop and in short steps (worker.db.give_back_free_pages)."""
    if pages := await db.give_back_off_loop(database):
        log.info("gave %d free pages of %s back to the file system", pages, database)


# ----------------------------------------------------------------- hub


@dataclass
class RunningHub:
    server: grpc.aio.Server
    hub: Hub
    address: str
    housekeeping: asyncio.Task[None]
    # Streams of a worker in this process (`up`), opened without gRPC.
    local: LocalStreams
    health: Health
    # Where it also serves for this user's verbs and worker (worker.wire.own_hub).
    socket: Path | None = None

    async def stop(self, grace_s: float = 2.0) -> None:
        self.housekeeping.cancel()
        self.hub.shutdown()
        await asyncio.gather(self.server.stop(grace_s), self.local.stop(grace_s))
        self.hub.store.close()


async def _hub_housekeeping(hub: Hub) -> None:
    while True:
        pruned = await hub.store.prune_off_loop()
        if pruned:
            log.info("hub: forgot %d calls past their keeping time", pruned)
        forgotten = hub.forget_workers()
        if forgotten:
            log.info("hub: forgot %d workers away past their keeping time", forgotten)
        hub.store.ended_plans.forget()
        await _give_back_pages(hub.store.path)
        memory.give_back()
        await asyncio.sleep(PRUNE_EVERY_S)  # a timer by nature: age is what it prunes by


_ADDRESS_IN_USE = (
    "could not listen on {address}: the address is in use. Is another hub running "
    "(`agentworker status`)? Or pick another address with --listen."
)


def _address_taken(address: str) -> bool:
    """Whether something already listens on `address` (host:port; port 0 is never taken)."""
    host = split_host(address)
    port_text = address.rsplit(":", 1)[-1]
    if not port_text.isdigit() or int(port_text) == 0:
        return False
    # An ASCII name goes as bytes: as text, Python would load its IDNA codec to encode
    # it (a few ms of every start) for the same bytes.
    name: str | bytes = host.encode("ascii") if host.isascii() else host
    try:
        infos = socket.getaddrinfo(name, int(port_text), type=socket.SOCK_STREAM)
    except OSError:
        return False  # gRPC will say what is wrong with the address
    for family, kind, proto, _name, sockaddr in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
    return False


async def start_hub(paths: Paths, config: Config, listen: str | None = None) -> RunningHub:
    address = listen or config.hub.listen
    tls = config.hub.tls_cert is not None and config.hub.tls_key is not None
    if not tls and not is_loopback(address):
        raise InsecureError(
            f"refusing to serve plaintext on {address}: only loopback may go without TLS. "
            "Set [hub] tls_cert and tls_key, or listen on 127.0.0.1.",
        )
    paths.ensure()
    if _address_taken(address):
        # Said before gRPC tries: its own failure to bind logs a C-core line first.
        raise InUseError(_ADDRESS_IN_USE.format(address=address))
    local_socket = _own_socket(paths)
    # The workers' token first: a worker started beside the hub waits for hub.token,
    # and then finds its own beside it (else it would take hub.token, see
    # local_workers_token).
    workers_token = read_or_create_token(paths.workers_token_file)
    token = read_or_create_token(paths.token_file)
    hub = Hub(
        HubStore(paths.data_dir / "hub.db"),
        heartbeat_s=config.connection.heartbeat_s,
        default_timeout_s=config.hub.default_timeout_s,
        held_blob_bytes=config.hub.held_blobs_mib * 1024 * 1024,
        placement_key=read_or_create_token(paths.placement_key_file).encode(),
        own_worker_key=lambda: _own_worker_key(paths),
        accept_new_workers=config.hub.accept_new_workers,
    )
    server = grpc.aio.server(options=server_options(keepalive_of(config)))
    server.add_generic_rpc_handlers(
        (
            BearerAuth(
                token, [worker_service(hub), control_service(hub)], workers_token=workers_token
            ),
        )
    )
    # gRPC health, open without the token, for the hub itself ("") and its services.
    services = [service.full_name for service in pb.DESCRIPTOR.services_by_name.values()]
    health = Health(services, token=token, workers_token=workers_token, read=hub.memory.ended)
    server.add_generic_rpc_handlers((health.handler(),))
    try:
        if tls:
            assert config.hub.tls_cert is not None and config.hub.tls_key is not None
            creds = grpc.ssl_server_credentials(
                [(config.hub.tls_key.read_bytes(), config.hub.tls_cert.read_bytes())]
            )
            port = server.add_secure_port(address, creds)
        else:
            port = server.add_insecure_port(address)
    except RuntimeError:
        port = 0
    if port == 0:
        raise InUseError(_ADDRESS_IN_USE.format(address=address))
    if local_socket is not None:
        _serve_socket(server, local_socket)
    host = address.rsplit(":", 1)[0]
    # A worker of this data folder dialling this hub by its address (`run --server
    # ADDRESS --token ...`) brings the key made for that name: its own user's too.
    hub.admission.own_names = (OWN_HUB_NAME, server_name(address), server_name(f"{host}:{port}"))
    await server.start()
    housekeeping = asyncio.create_task(_hub_housekeeping(hub))
    return RunningHub(
        server=server,
        hub=hub,
        address=f"{host}:{port}",
        housekeeping=housekeeping,
        local=local_streams(hub),
        health=health,
        socket=local_socket,
    )


def _own_worker_key(paths: Paths) -> str:
    """This data folder's worker.key ('' while there is none): a worker bringing the key
    made from it for this hub is this hub's own user's, accepted unasked
    (worker.hub.admission)."""
    try:
        return read_token(paths.worker_key_file)
    except CredentialsError:
        return ""


def _own_socket(paths: Paths) -> Path | None:
    """The Unix socket this hub serves on for its own user's verbs and worker (`run`
    with no --server), who can tell it is theirs (worker.wire.own_hub; review11 finding
    06); None where the platform has none. Its folder is made this user's alone, and a
    hub already serving there is another hub of this data folder."""
    if not own_hub.serves_socket():
        return None
    path = paths.hub_socket
    own_hub.private_folder(path.parent)
    if own_hub.socket_answers(path):
        raise InUseError(
            f"another hub of this data folder serves its socket at {path}: stop it first "
            "(`agentworker status` asks it), or give this one another AGENTWORKER_HOME"
        )
    return path


def _serve_socket(server: grpc.aio.Server, path: Path) -> None:
    """Serve on `path` too, owner only (a stopped hub's socket there is replaced; gRPC
    removes it when the server stops). The token is asked there as on TCP."""
    old = os.umask(0o077)  # the socket is made 0600 (0700 for a folder, should one be)
    try:
        served = server.add_insecure_port(f"{own_hub.UNIX_SCHEME}{path}")
    except RuntimeError:
        served = 0
    finally:
        os.umask(old)
    if served == 0:
        raise StartupError(f"could not serve the hub's socket at {path}: see the log above")


# ----------------------------------------------------------------- entry points


class Frontend(Protocol):
    """The TUI, which lives in `ui/` (the worker never imports it; the `agentworker`
    command hands it in)."""

    async def serve(self, link: Link) -> None:
        """`agentworker ui`: run on this process's loop until the person quits."""
        ...

    def command(self, socket: Path, log_file: Path) -> list[str]:
        """The argv of the TUI's own process for `up` and `run`, attached to the
        console `socket`; `log_file` is where the worker logs (named to the person
        should the worker go away)."""
        ...


class TuiLaunch(NamedTuple):
    """How `up` and `run` start their TUI (worker.core.tui_process)."""

    argv: list[str]
    log_file: Path


def _terminal_gone() -> bool:
    """A hung-up terminal fails every ioctl, so it no longer reads as a tty. The TUI
    reads keys from file descriptor 0 (sys.stdin may be swapped while it runs)."""
    return not os.isatty(0)


def _stop_event() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def _say_listening(running: RunningHub, paths: Paths) -> None:
    if running.socket is None:
        log.info("hub listening on %s (token in %s)", running.address, paths.token_file)
    else:
        log.info(
            "hub listening on %s and, for you alone, on %s (token in %s)",
            running.address,
            running.socket,
            paths.token_file,
        )


async def run_hub(paths: Paths, config: Config, listen: str | None = None) -> None:
    running = await start_hub(paths, config, listen)
    _say_listening(running, paths)
    await _stop_event().wait()
    log.info("hub stopping")
    await running.stop()


def _close_data_folder(paths: Paths, config: Config, sandbox: bool) -> None:
    """The data folder owner-only (0700) again when no plan's uid passes through it
    now (no [sandbox] uids in effect): a start with the setting let others search it,
    and that stayed once the setting was gone (review29b #5)."""
    if sandbox and config.sandbox.uid_range is not None:
        return
    if plan_uids.closed_again(paths.data_dir):
        log.info(
            "the data folder %s is owner-only again (0700): [sandbox] uids is off, no "
            "plan's uid passes through it now",
            paths.data_dir,
        )


async def start_workbench(paths: Paths, config: Config) -> workbench.Workbench:
    """Sandbox mode's workspaces, once the sandbox is known to work here (else refuse to
    start: NoSandboxError, a problem of this machine, not an answer to a call)."""
    from worker.actions import workbench

    try:
        workbench.check_uids(paths, config.sandbox)
        await workbench.probe(config)
        bench = workbench.Workbench.at(paths.workbench, config.sandbox)
    except WorkerError as exc:
        raise NoSandboxError(exc.message) from None
    log.info(
        "sandbox mode: a workspace per plan under %s (quota %d MiB, swept after %g h idle); %s",
        paths.workbench,
        config.sandbox.quota_mb,
        config.sandbox.idle_hours,
        bench.limits_note(config.exec),
    )
    return bench


async def run_worker(
    paths: Paths,
    config: Config,
    target: Target | None = None,
    *,
    sandbox: bool = False,
    tui: TuiLaunch | None = None,
    built: Callable[[], None] | None = None,
) -> None:
    """A worker dialling `target` (the configured server by default), with its TUI
    in a process of its own when `tui` says how to start it; `built` is called once
    the worker is built, before it dials."""
    with worker_lock(paths):
        _close_data_folder(paths, config, sandbox)
        bench = await start_workbench(paths, config) if sandbox else None
        desktop = computer.build(config, paths.data_dir)
        dispatcher = build_dispatcher(paths, config, bench=bench, desktop=desktop)
        target = target or worker_target(paths, config)
        if built is not None:
            built()

        def ready() -> None:
            log.info("ready: worker %s connected to %s", dispatcher.worker_id, target.address)

        await _serve_worker(
            dispatcher, target, config, paths, "run", tui, bench, desktop, on_ready=ready
        )
    _leave_if_stuck(dispatcher)


async def run_up(
    paths: Paths,
    config: Config,
    *,
    sandbox: bool = False,
    tui: TuiLaunch | None = None,
    built: Callable[[], None] | None = None,
) -> None:
    """Hub and worker in one process on loopback: the embedded default (with its
    TUI in a process of its own when `tui` says how). `built` is called once both are
    built, before the worker dials."""
    with worker_lock(paths):
        _close_data_folder(paths, config, sandbox)
        bench = await start_workbench(paths, config) if sandbox else None
        running = await start_hub(paths, config)
        _say_listening(running, paths)
        # Hub and worker share this process: request blobs go from one to the other by
        # reference, not down their stream (worker.wire.local).
        local = running.hub.link = LocalLink()
        desktop = computer.build(config, paths.data_dir)
        dispatcher = build_dispatcher(paths, config, bench=bench, desktop=desktop)
        token = read_token(paths.workers_token_file)  # start_hub made it
        target = Target(
            address=running.address,
            token=token,
            worker_key=key_for_server(read_or_create_token(paths.worker_key_file), OWN_HUB_NAME),
            # The same hub at each start, whatever port it has this time (the ledger
            # sends its results only to it: worker.core.ledger).
            key=local_hub_key(token),
        )
        if built is not None:
            built()

        def ready() -> None:
            # The steps are ours, lines and all: in the message, not its values (which
            # the CLI's log lines show inert, line breaks escaped).
            steps = "\n".join(f"  {step}" for step in next_steps(sandbox)).replace("%", "%%")
            log.info(
                "ready: hub on %s with worker %s connected. Try, in another terminal:\n" + steps,
                running.address,
                dispatcher.worker_id,
            )

        try:
            await _serve_worker(
                dispatcher,
                target,
                config,
                paths,
                "up",
                tui,
                bench,
                desktop,
                on_ready=ready,
                local=local,
                # ... and their stream runs inside the process, without gRPC
                # (worker.wire.inproc).
                dial=running.local.open_stream,
                # The TUI covers the terminal the ready line went to: it says them too.
                first_steps=next_steps(sandbox),
            )
        finally:
            await running.stop()
    _leave_if_stuck(dispatcher)


async def _sweep_workspaces(dispatcher: Dispatcher, bench: workbench.Workbench) -> None:
    """Remove workspaces left idle past their age (never one whose plan runs a call)."""
    while True:
        removed = await bench.sweep(dispatcher.plans_running)
        if removed:
            log.info("swept %d idle plan workspace(s): %s", len(removed), ", ".join(removed))
        await asyncio.sleep(bench.settings.sweep_every_s)  # a timer: workspaces go by idle age


async def _serve_worker(
    dispatcher: Dispatcher,
    target: Target,
    config: Config,
    paths: Paths,
    mode: str,
    tui_launch: TuiLaunch | None,
    bench: workbench.Workbench | None = None,
    desktop: computer.Desktop | None = None,
    on_ready: Callable[[], None] | None = None,
    local: LocalLink | None = None,
    dial: Callable[[Sequence[tuple[str, str]]], LocalCall] | None = None,
    first_steps: Sequence[str] = (),
) -> None:
    lost = dispatcher.recover()
    if lost:
        log.warning(
            "%d call(s) were running when the worker last stopped: outcome_unknown", len(lost)
        )
    for root in dispatcher.roots:
        log.info("root %s (%s)", root.path, "read-write" if root.writable else "read-only")
    if not dispatcher.roots and bench is None:
        log.warning("no filesystem roots: add a [[root]] table to config.toml to allow file access")
    landlock = confinement.landlock_for(paths.exec_cache, config.exec.cc)
    for layer in confinement.report(landlock):
        if layer.active:
            log.info("exec sandbox: %s on (%s)", layer.name, layer.detail)
        else:
            log.warning("exec sandbox: %s off: %s", layer.name, layer.detail)
    gui = desktop is not None and desktop.available and bench is None
    if desktop is not None and not gui:
        log.info("computer surface absent: %s", desktop.availability.reason or "sandbox mode")
    elif desktop is not None:
        log.info("computer surface: %s desktop", desktop.availability.server)
    loop = asyncio.get_running_loop()
    loop.set_default_executor(dispatcher.threads)  # asyncio.to_thread's jobs, counted

    def on_pause(_state: PauseState) -> None:  # any thread: the hotkey's, the watcher's
        loop.call_soon_threadsafe(dispatcher.enforce_pause)

    if dispatcher.pause is not None:
        dispatcher.pause.subscribe(on_pause)
    hotkey = asyncio.create_task(desktop.start_hotkey()) if desktop is not None and gui else None
    connection = build_connection(
        dispatcher, target, config, gui_available=gui, link=local, dial=dial
    )
    if bench is not None:
        _say_whose_workspaces(bench, target.server_key)
    console = build_console(
        dispatcher, config, server=target.address, mode=mode, first_steps=first_steps
    )
    connection.on_state = console.set_link
    if dispatcher.pause is not None:
        console.pause, console.paused = pause_hooks(dispatcher.pause, "tui")
    assert console.broker is not None
    connection.answer_scopes = console.broker.scope_request
    if desktop is not None and gui:
        hold_desktop_while_asking(console, desktop)
    ui_server = await _serve_console(console, paths)
    if desktop is not None and gui and ui_server is not None:
        desktop.ui_pids = lambda: ui_server.ui_pids  # their terminals are the person's
    stop = _stop_event()
    housekeeping = asyncio.create_task(_housekeeping(dispatcher))
    nudged = asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, nudged.set)  # `agentworker kill` / `pause`
    kills = asyncio.create_task(_enforce_kills(dispatcher, nudged))
    sweeps = asyncio.create_task(_sweep_workspaces(dispatcher, bench)) if bench else None
    link = asyncio.create_task(connection.run())
    stopper = asyncio.create_task(stop.wait())
    waiting: set[asyncio.Task[Any]] = {link, stopper}
    ready = asyncio.create_task(_say_ready(connection, on_ready))
    loop = asyncio.get_running_loop()
    settings = [_as_in_the_file(paths, config)]

    def hangup() -> None:
        # SIGHUP is `agentworker reload`, unless the TUI's terminal went away (a closed
        # window, a dropped ssh): then the person is gone and the worker stops, as
        # any terminal program does (the TUI's process leaves on its own hang-up).
        if tui_launch is not None and _terminal_gone():
            log.warning("the terminal hung up: stopping")
            stop.set()
        else:
            settings[0] = reload_config(dispatcher, paths, settings[0], sandbox=bench is not None)

    loop.add_signal_handler(signal.SIGHUP, hangup)
    tui = await _start_tui(tui_launch, console) if ui_server is not None else None
    if tui_launch is not None and ui_server is None:
        _say(f"no TUI: its socket could not be made (see {tui_launch.log_file}); serving headless")
    watch = asyncio.create_task(tui.wait()) if tui is not None else None
    if watch is not None:
        waiting.add(watch)
    if dial is None:
        # The fingerprint the hub's operator compares before accepting this worker
        # (`agentworker workers` on the hub lists the one each worker came with): of
        # its key for this server, which no other server is sent.
        log.info(
            "worker %s (key fingerprint %s for this server) dialling %s",
            dispatcher.worker_id,
            fingerprint_of_digest(worker_key_digest_of(target.worker_key)),
            target.address,
        )
    else:
        log.info("worker %s opening its stream to the hub in this process", dispatcher.worker_id)
    try:
        done: set[asyncio.Task[Any]] = set()
        while not done:
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if watch in done and tui is not None and not _tui_ends_the_worker(tui):
                # A crash or a kill of the TUI alone: the worker serves on headless.
                _lost_tui(tui, console)
                waiting.discard(watch)
                done.discard(watch)
                watch = None
        if link in done and watch is not None and not watch.done():
            # The person sees why in the header; the worker ends when they quit.
            with contextlib.suppress(Exception):
                link.result()
            await watch
            link.result()
        elif link in done:
            link.result()  # re-raise a fatal refusal
        else:
            stop.set()  # the person quit the TUI, or a signal: the TUI closes too
            # Nobody will answer now: calls waiting for the person are refused.
            console.broker.close_all("the worker is stopping")
            # Once the TUI has left (q), the terminal is the person's again: the drain
            # is told there (the log goes to its file), else they wait in silence.
            tui_gone = tui is None or watch is None or watch.done()  # quit, or lost before
            if tui is not None and tui_gone:
                tui.take_back_terminal()
            grace = config.worker.drain_grace_s
            _drain_cut_short_by_a_second_stop(
                dispatcher, grace, tell=tui_launch is not None and tui_gone
            )
            await connection.shutdown(grace)
            link.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await link
    finally:
        loop.remove_signal_handler(signal.SIGHUP)
        loop.remove_signal_handler(signal.SIGUSR1)
        ready.cancel()
        housekeeping.cancel()
        kills.cancel()
        if hotkey is not None:
            hotkey.cancel()
        if sweeps is not None:
            sweeps.cancel()
        stopper.cancel()
        console.broker.close_all("the worker is stopping")
        # The TUI's process sees this, then its socket close, and leaves the terminal.
        console.set_link(LinkState("stopped", "the worker stopped"))
        if ui_server is not None:
            await ui_server.stop()
        if tui is not None:
            await tui.close()
        # The sandboxes built ahead of calls: killed, and reaped before the worker ends.
        await dispatcher.containment.warm.aclose()
        dispatcher.close()
        if desktop is not None:
            desktop.close()
        if bench is not None:  # the plans' cgroups, and what runs in them
            await bench.close()


def _drain_cut_short_by_a_second_stop(dispatcher: Dispatcher, grace: float, *, tell: bool) -> None:
    """Says that the running calls get the drain's grace, and makes a second Ctrl-C
    (or SIGTERM) stop them at once: the person waited up to drain_grace_s, after the
    TUI had closed with nothing on the terminal but where the log was, and a second
    Ctrl-C did nothing. `tell`: the log goes to its file and the TUI has left the
    terminal, so the person is told there too."""
    loop = asyncio.get_running_loop()
    running = len(dispatcher.unanswered())
    log.info(
        "draining: finishing %d running call(s) (up to %.0f s; Ctrl-C again stops them now)",
        running,
        grace,
    )
    if tell and running:
        _say(
            f"stopping: {running} running call(s) get up to {grace:.0f} s to finish; "
            "Ctrl-C again stops them now"
        )

    def cut_short() -> None:
        stopped = dispatcher.stop_all(
            WorkerError("cancelled", "cancelled: the person stopped the worker at once")
        )
        log.warning("stopping %d running call(s) now", stopped)
        if tell and stopped:
            _say(f"stopping {stopped} running call(s) now")

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, cut_short)


def _say_whose_workspaces(bench: workbench.Workbench, server: str) -> None:
    """The start log: whose plans this worker serves, and the workspaces it keeps for
    other servers (untouched, and not told of) and for none (to claim)."""
    from sandbox.workspaces import UNCLAIMED

    plans = bench.workspaces.plans(sizes=False)
    mine = sum(plan.server == server for plan in plans)
    unclaimed = sum(plan.server == UNCLAIMED for plan in plans)
    log.info(
        "sandbox mode: serving the plans of server %s (%d workspace(s) here); %d of other "
        "servers' kept for them, unseen by this one; %d unclaimed (`agentworker sandbox list`)",
        server,
        mine,
        len(plans) - mine - unclaimed,
        unclaimed,
    )


def hold_desktop_while_asking(console: Console, desktop: computer.Desktop) -> None:
    """Holds the desktop's input and screenshots (`Desktop.hold`) while any prompt
    waits, or a lift waits for the person's confirmation: on every prompt event, and
    as lifts come and go."""
    broker = console.broker
    assert broker is not None

    def hold() -> None:
        why = None
        if broker.waiting():  # counted, not listed: this runs on every prompt event
            why = "the person at this worker is being asked to approve something"
        elif console.confirming():
            why = "the person at this worker is asked to confirm lifting a kill"
        # Let go once the UIs' screens no longer show the prompt: until they redraw, a
        # screenshot would read what it asked (review26 H9).
        if why is None and desktop.held() and console.screens_drawn(settled):
            why = "a prompt the person answered is still being taken off their screen"
        desktop.hold(why)

    def settled() -> None:
        if not broker.waiting() and not console.confirming():
            desktop.hold(None)

    broker.listeners.append(lambda _kind, _body: hold())
    console.on_confirming = hold


def pause_hooks(
    switch: PauseSwitch, by: str
) -> tuple[Callable[[bool, str], None], Callable[[], bool]]:
    """A UI's two pause controls on the switch: set (global stop) or lift (resume
    lifts a desktop takeover too), and whether anything is paused."""

    def set_paused(on: bool, reason: str) -> None:
        if on:
            switch.stop(reason, by)
        else:
            switch.resume()

    return set_paused, lambda: switch.current().active


async def _start_tui(launch: TuiLaunch | None, console: Console) -> TuiProcess | None:
    """The TUI's own process, attached over the console socket (worker.core.tui_process).
    It counts as an attached UI from now until it ends: a call that needs the person
    while it starts waits for its prompt, as it did with the TUI in this process."""
    if launch is None:
        return None
    assert console.broker is not None
    try:
        tui = await TuiProcess.start(launch.argv, launch.log_file)
    except OSError as exc:
        _say(f"no TUI: it could not start ({exc}); serving headless")
        return None
    console.broker.attach()
    return tui


def _tui_ends_the_worker(tui: TuiProcess) -> bool:
    """The person quit it (exit 0), or the terminal hung up under it."""
    return tui.ended_by_the_person() or _terminal_gone()


def _lost_tui(tui: TuiProcess, console: Console) -> None:
    assert console.broker is not None and tui.proc.returncode is not None
    console.broker.detach()
    tui.take_back_terminal()
    how = describe_exit(tui.proc.returncode)
    log.warning("the TUI ended (%s); serving on headless", how)
    _say(
        f"the TUI ended unexpectedly ({how}). The worker serves on without it: calls "
        "that need your approval are refused until a UI attaches (`agentworker ui`). "
        f"Ctrl+C stops the worker; its log is {tui.log_file}"
    )


def _say(text: str) -> None:
    """A line for the person at the terminal (the log goes to its file)."""
    print(f"agentworker: {text}", file=sys.stderr, flush=True)


async def _serve_console(console: Console, paths: Paths) -> ConsoleServer | None:
    """The local socket `agentworker ui` attaches to; the worker runs on without it."""
    server = ConsoleServer(console, paths.ui_socket)
    try:
        await server.start()
    except (OSError, StartupError) as exc:
        log.warning("no UI socket (`agentworker ui` cannot attach): %s", exc)
        return None
    log.info("UI socket at %s (`agentworker ui` attaches here)", server.path)
    return server


def _leave_if_stuck(dispatcher: Dispatcher) -> None:
    """After a drain that ran out of time: exit now, without waiting for handlers that
    ignored their cancellation or for work stuck in a thread (a blocking library call
    cannot be interrupted). Their calls are answered (outcome_unknown) and recorded,
    and the ledger is closed; waiting for them (asyncio.run would, and the interpreter
    joins its executor's threads at exit, for ever) would let one handler hold the
    worker up past its drain bound."""
    stuck = dispatcher.stragglers()
    if stuck:
        log.error("%d handler(s) ignored cancellation; leaving without them", len(stuck))
    threads = dispatcher.threads.unfinished()
    if threads:
        calls = ", ".join(sorted(cid for cid in threads if cid)) or "none"
        log.error(
            "%d job(s) still running in a thread (calls: %s); leaving without them",
            sum(threads.values()),
            calls,
        )
    if stuck or threads:
        logging.shutdown()
        os._exit(0)


async def _say_ready(connection: WorkerConnection, on_ready: Callable[[], None] | None) -> None:
    await connection.connected.wait()
    if on_ready is not None:
        on_ready()


def next_steps(sandbox: bool) -> list[str]:
    """The commands `up` suggests once it is ready, as the person can type them."""
    me = _command_name()
    if sandbox:
        return [
            f"{me} status",
            f'{me} call workbenchHost.fs_list \'{{"path": "."}}\' --plan try-1',
            f"{me} sandbox list",
        ]
    return [
        f"{me} grant workerHost.fs_stat --agent me --for 8h",
        f'{me} call fs_stat \'{{"path": "."}}\' --agent me',
        f"{me} doctor",
    ]


def _command_name() -> str:
    """`agentworker` when that is on PATH and is this program; else its full path."""
    if getattr(sys, "frozen", False):
        mine = Path(sys.executable)
    else:
        mine = Path(sys.executable).parent / "agentworker"
    found = shutil.which("agentworker")
    if found is not None and Path(found).resolve() == mine.resolve():
        return "agentworker"
    return str(mine) if mine.exists() else "agentworker"


def prepare(paths: Paths, *, sandbox: bool = False) -> bool:
    """First start: create config and workspace; True when this was the first start.
    Said in the mode's own words: shared folders ([[root]]) are not used in sandbox mode."""
    created = first_start(paths)
    if created and sandbox:
        log.info(
            "first start: wrote %s; sandbox mode: each plan gets a workspace of its own "
            "under %s at its first call (`agentworker sandbox list`), and reaches nothing else",
            paths.config_file,
            paths.workbench,
        )
    elif created:
        log.info(
            "first start: wrote %s; the agent may read and write only in %s until you add roots",
            paths.config_file,
            paths.workspace,
        )
    return created
