"""How both ends open gRPC: message limits, keepalive, TLS rules and the bearer token.

Plaintext is allowed only to loopback. Keepalive carries a timeout, so a silent
partition (no reset, no bytes) is noticed within keepalive + PING_ACK_S instead of
after the kernel's TCP timeout (the worker's silence limit finds it sooner), while a
link that keeps delivering bytes is alive, however long a ping's ack waits behind them.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
from pathlib import Path
from typing import Final, NamedTuple

import grpc

# A 16 MiB fs_write plus its envelope must fit; both sides agree on the limit.
MAX_MESSAGE_BYTES = 32 * 1024 * 1024
# What a result may carry before it is answered `result_too_large` instead:
# the limit less room for the envelope and telemetry.
MAX_RESULT_BYTES = MAX_MESSAGE_BYTES - 256 * 1024


class Keepalive(NamedTuple):  # not a dataclass: see worker.paths
    time_s: float = 10.0
    ping_timeout_s: float = 5.0


# How long a ping's ack may take before gRPC ends the link (`grpc.http2.ping_timeout_ms`):
# the ack comes behind whatever the link carries ahead of it (the sender's socket buffer,
# up to 4 MiB on Linux, and gRPC's write under way). At `ping_timeout_s` (5 s) a worker on
# a link of 0.35 MB/s, the hub's ack behind the calls it was sending, lost the link
# every ~5 s and never got a call through (review21's reproducer at the default
# keepalive). So the ack has this long, or twice `ping_timeout_s`: ~21 MB ahead of it at
# 0.35 MB/s. `ping_timeout_s` stays gRPC's keepalive timeout, which is to end a link
# with nothing at all come that long after a keepalive ping (any byte read calls it
# off) while it is the shorter; gRPC 1.85 never arms that watch (its condition asks for
# a timer already set), so a link that delivers nothing is found by the worker's silence
# limit (three of the hub's heartbeats, connection._Silence) and the hub's progress
# rules (server.WRITE_STUCK_S, OUTBOX_WAIT_S), and by keepalive within keepalive_time_s
# + PING_ACK_S.
PING_ACK_S = 60.0


def _shared_options(keepalive: Keepalive) -> list[tuple[str, int]]:
    """Message limits and keepalive, the same at both ends."""
    ping_ms = int(keepalive.ping_timeout_s * 1000)
    ack_ms = max(int(PING_ACK_S * 1000), 2 * ping_ms)
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", int(keepalive.time_s * 1000)),
        ("grpc.keepalive_timeout_ms", ping_ms),
        ("grpc.http2.ping_timeout_ms", ack_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]


def client_options(keepalive: Keepalive) -> list[tuple[str, int]]:
    return [
        *_shared_options(keepalive),
        # Reconnection pacing is ours (full-jitter backoff); keep gRPC's own short.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
        ("grpc.enable_retries", 0),
    ]


def server_options(keepalive: Keepalive) -> list[tuple[str, int]]:
    return [
        *_shared_options(keepalive),
        # Workers ping often on purpose; do not punish them with GOAWAY.
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 50),
        ("grpc.http2.min_ping_interval_without_data_ms", 50),
        ("grpc.so_reuseport", 0),
        # No window grown from bandwidth probes: a call's request waiting for its turn to
        # be read (worker.hub.reads.CONTROL_READS_AT_ONCE) would take in megabytes
        # meanwhile (sixteen 31 MiB calls waiting: 520 MiB), where it takes the initial
        # 64 KiB now. A request being read still gets a window as large as it is.
        ("grpc.http2.bdp_probe", 0),
        # Calls that arrived and wait for the server's loop to take them: past 1,000 of
        # them gRPC cancels new ones at random, surely past 3,000 (its defaults, "random
        # early detection"), and 1,200 workers saying Hello at once after a restart of
        # the hub had a few of their streams cancelled (CANCELLED, or INTERNAL at the
        # worker's write). A fleet of 4,096 is taken whole; past 8,192, as many as the
        # hub's Hello bounds take at once (worker.hub.hellos.HELLO_BURST), none is.
        ("grpc.server.max_pending_requests", 4096),
        ("grpc.server.max_pending_requests_hard_limit", 8192),
    ]


def split_host(target: str) -> str:
    """The host part of `host:port` or `[v6]:port`."""
    if target.startswith("["):
        return target[1 : target.index("]")]
    host, _, _port = target.rpartition(":")
    return host or target


def is_loopback(target: str) -> bool:
    """True for `localhost` and loopback IP literals; other names are never trusted."""
    host = split_host(target)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def open_channel(
    target: str, keepalive: Keepalive, tls_ca: Path | None = None, *, own_connection: bool = False
) -> grpc.aio.Channel:
    """A channel to `target`: plaintext to loopback or a Unix socket (`unix:PATH`: this
    machine's hub, see worker.wire.own_hub), TLS to anything else. With
    `own_connection`, on a connection of its own, closed with it: gRPC otherwise shares
    one between the channels of a process to one target, and a worker that gave its
    stream up for the hub's silence dialled again over the same dead connection."""
    options = client_options(keepalive)
    if own_connection:
        options.append(("grpc.use_local_subchannel_pool", 1))
    if target.startswith("unix:"):
        return grpc.aio.insecure_channel(target, options=options)
    if tls_ca is not None:
        creds = grpc.ssl_channel_credentials(root_certificates=tls_ca.read_bytes())
        return grpc.aio.secure_channel(target, creds, options=options)
    if not is_loopback(target):
        from worker.errors import InsecureError  # here: it loads the sandbox package

        raise InsecureError(
            f"refusing to send the token in plaintext to {target}: plaintext is allowed only to "
            "loopback (127.0.0.1, ::1, localhost). Give the server's CA with --tls-ca to use TLS.",
        )
    # A proxy from http_proxy/https_proxy would see the plaintext token; a TLS link
    # may keep the proxy (a CONNECT tunnel sees only ciphertext).
    direct = [*options, ("grpc.enable_http_proxy", 0)]
    return grpc.aio.insecure_channel(target, options=direct)


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


# Metadata of a worker's stream: its key for the server it dials (key_for_server), which
# the hub's operator accepts for the worker's id and the hub asks of every later Hello,
# so another holder of the token cannot take that worker's place (docs/architecture.md,
# "Workers are enrolled").
WORKER_KEY_HEADER = "agentworker-worker-key"

# What a worker sends is never `worker.key` itself: any server it was ever pointed at (a
# typo'd address, a hostile host) would have had the key the person's hub knows it by,
# and been served as it there, given its plans, calls and args (review27 I2). It sends
# an HMAC of the server's name under worker.key instead, so each server gets a key of
# its own and none is worth anything at another. An HMAC, not a signed challenge: the
# standard library has it, the Hello keeps its one round trip, and the hub still keeps
# only a digest; what a nonce would add (a key seen on the wire is not replayable at
# the same server) TLS gives, which every non-loopback link uses. PER_SERVER_PREFIX
# marks such a key, so a hub tells it from a worker.key sent by an older worker.
PER_SERVER_PREFIX: Final = "s1."
# The name of this data folder's own hub (`up`'s, or the one `run` reaches with this
# machine's workers' token), whatever its port this time: only this user's hub is ever
# sent the key for it (worker.wire.own_hub; worker.app.worker_target).
OWN_HUB_NAME: Final = "own-hub"


def server_name(address: str) -> str:
    """A server as the worker names it: the address it dials, with its scheme and
    spelling made one (`dns:///Host:443` is `host:443`; a socket's path keeps its case)."""
    spelled = address.strip()
    if not spelled.startswith("unix:"):
        spelled = spelled.removeprefix("dns:///").removeprefix("dns:").lower()
    return spelled


def key_for_server(worker_key: str, server: str) -> str:
    """The key a worker proves to `server` (server_name, or OWN_HUB_NAME): HMAC-SHA256 of
    the name under worker.key. Knowing it tells nothing of worker.key or of the key for
    any other name."""
    if not worker_key:
        return ""
    import hmac  # here: `agentworker call` loads this module and never makes a key

    mac = hmac.new(worker_key.encode(), b"agentworker worker key\0" + server.encode(), "sha256")
    return PER_SERVER_PREFIX + mac.hexdigest()


def is_per_server(key: str) -> bool:
    """Whether a worker stream's key is one made for its server (else an older worker's
    worker.key itself)."""
    return key.startswith(PER_SERVER_PREFIX)


# How a worker's key is shown to people: the first 64 bits of its sha256 (the digest
# the hub keeps), in groups of four hex digits. The worker prints it at its start and
# `agentworker workers` lists it, so the hub's operator accepts the key they compare.
FINGERPRINT_HEX: Final = 16


def worker_key_digest_of(key: str) -> str:
    """sha256 of a worker's key as the hub sees it (worker.hub.hellos.worker_key_digest)."""
    return hashlib.sha256(key.encode()).hexdigest() if key else ""


def fingerprint_of_digest(digest: str) -> str:
    head = digest[:FINGERPRINT_HEX]
    return "-".join(head[i : i + 4] for i in range(0, len(head), 4))


def worker_metadata(token: str, worker_key: str) -> tuple[tuple[str, str], ...]:
    if not worker_key:
        return bearer(token)
    return (*bearer(token), (WORKER_KEY_HEADER, worker_key))


def read_or_create_token(path: Path) -> str:
    """The hub's token, made on first start and readable by this user only.

    It is written whole to a file of its own and then linked into place, so a
    reader that finds `path` (a worker or a client started beside the hub) never
    reads it half written; the link fails if another start made one first."""
    if path.exists():
        return read_token(path)
    # Hex, not urlsafe base64: a token that starts with '-' reads as an option when
    # passed as `--token VALUE` (it did, and a benchmark's worker failed to start).
    import secrets  # here: the hub makes a token, a caller only reads one

    token = secrets.token_hex(32)
    draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(token + "\n")
        os.link(draft, path)
    except FileExistsError:
        return read_token(path)
    finally:
        draft.unlink(missing_ok=True)
    return token


def read_token(path: Path) -> str:
    try:
        token = path.read_text(encoding="ascii").strip()
    except FileNotFoundError as exc:
        raise _no_token(
            f"no hub token at {path}: start the hub first (`agentworker up` or "
            "`agentworker hub`), or pass --server and --token.",
        ) from exc
    if not token:
        raise _no_token(f"the token file {path} is empty")
    return token


def _no_token(message: str) -> Exception:
    # Imported only here: the errors load the sandbox package, which a caller that
    # has its token (`agentworker call`: this module, the token, a channel) never needs.
    from worker.errors import CredentialsError

    return CredentialsError(message)
