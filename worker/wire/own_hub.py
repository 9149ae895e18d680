"""This machine's hub, told apart from whoever else listens where it listens.

`agentworker run` with no `--server`, and the CLI's verbs (`status`, `call`, `workers`,
`kill`, ...), talk to this data folder's hub and send it a token: the workers' token or
hub.token. Whoever listened on `[hub] listen` was taken for that hub (review11 finding
06): another user of the machine who bound the loopback port while the hub was away was
sent both tokens, re-sent the person's unacked results and drove the person's worker.

So the hub also serves on a Unix socket in the data folder (`Paths.hub_socket`), and
these clients dial that socket, once they know it is the person's own:
- the folder that holds it is a folder (not a link), belongs to this user and no one else
  may write in it, so no one else can put a socket there or swap this one;
- the socket belongs to this user;
- the process that answers on it runs as this user (SO_PEERCRED, where the kernel says).
A socket that fails one of these is refused (`NotYourHubError`), never passed over for
TCP. Only where there is no socket (a hub of an older version; a platform without Unix
sockets) is the TCP address dialled, and only once the kernel says that what listens on
its port is this user's (Linux: /proc/net/tcp and tcp6 give each listening socket's
uid); a listener of another user is refused, naming the uid, and nothing is sent.

Remote servers and an explicit `--server` are dialled as named (over TLS off loopback).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import stat
import struct
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Final, NamedTuple

if TYPE_CHECKING:
    from worker.errors import StartupError

# A gRPC target that is a Unix socket's path (grpc's `unix:` scheme).
UNIX_SCHEME: Final = "unix:"
_LISTEN: Final = "0A"  # a TCP socket's state in /proc/net/tcp: LISTEN
_PROC_TCP: Final = ("/proc/net/tcp", "/proc/net/tcp6")


def serves_socket() -> bool:
    """Whether a hub here serves its Unix socket: where Python and gRPC have them."""
    return hasattr(socket, "AF_UNIX") and os.name == "posix"


class Dial(NamedTuple):
    """Where to dial this machine's hub: `target` for gRPC; `local_socket` when it is the
    hub's Unix socket (no TLS on it)."""

    target: str
    local_socket: bool


class OwnHub(NamedTuple):
    """This data folder's hub: its Unix socket, and the TCP address (`[hub] listen`) for a
    hub that serves none. `socket` None: the port alone, as `--server` named it with a
    token of its own (the port is still this user's before anything is sent there).
    Not a dataclass: see worker.paths."""

    socket: Path | None
    listen: str

    def dial(self) -> Dial:
        """Where to dial it now, having made sure the other end is this user's. Raises
        NotYourHubError when another user holds the socket or the port (nothing may be
        sent there), HubUnreachableError when no hub is there to answer."""
        if self.socket is not None and serves_socket():
            checked = _checked_socket(self.socket)
            if checked is not None:
                return Dial(checked, local_socket=True)
        return Dial(self._checked_listen(), local_socket=False)

    def _checked_listen(self) -> str:
        uid = os.getuid() if hasattr(os, "getuid") else None
        owners = listeners(self.listen)
        if owners is None:
            if self.socket is not None and serves_socket():
                # A hub of this version here serves its socket; without a way to ask the
                # kernel who holds the port, the token does not go to it.
                raise _unreachable(
                    f"no hub of yours serves its socket at {self.socket}, and this system "
                    f"cannot tell which user listens on {self.listen}, so no token was sent "
                    "there. Start the hub (`agentworker up` or `agentworker hub`)."
                )
            return self.listen  # no Unix sockets, no /proc: as before (docs/architecture.md)
        if not owners:
            raise _unreachable(
                f"no hub answered at {self.socket} or {self.listen}: start one with "
                "`agentworker up` (or `agentworker service install`)"
            )
        others = sorted(owner for owner in owners if owner != uid)
        if others:
            socket_said = (
                f", and no hub of yours serves its socket at {self.socket}"
                if self.socket is not None
                else " (it is your [hub] listen's port)"
            )
            raise _not_yours(
                f"refusing to send a token to {self.listen}: that port is held by another "
                f"user (uid {', '.join(map(str, others))}), not by your hub (you are uid "
                f"{uid}){socket_said}. Nothing was sent. Another user of this machine may be "
                "posing as your hub: see who with "
                f"`ss -ltnpe 'sport = :{_port(self.listen)}'`; start your hub (`agentworker "
                "up` or `agentworker hub`) once the port is free, or give it another port "
                "with [hub] listen."
            )
        return self.listen


def _checked_socket(path: Path) -> str | None:
    """`unix:PATH` when the socket there is this user's hub's; None when there is none
    (no folder, no socket: a hub that serves none, or none running)."""
    uid = os.getuid()
    try:
        folder = path.parent.lstat()
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(folder.st_mode) or folder.st_uid != uid or folder.st_mode & 0o022:
        raise _not_yours(
            f"refusing to dial the hub's socket at {path}: its folder {path.parent} must be "
            "a folder (not a link) that belongs to you and that only you may write in, or "
            "another user could put a socket of theirs there. Nothing was sent. Fix the "
            f"folder (chmod go-w {path.parent}), or remove it if it is not yours."
        )
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != uid:
        raise _not_yours(
            f"refusing to dial {path}: it is not a socket of yours (owner uid {info.st_uid}, "
            f"you are uid {uid}). Nothing was sent. Remove it, then start your hub "
            "(`agentworker up` or `agentworker hub`)."
        )
    peer = _peer_uid(path)
    if peer is not None and peer != uid:
        raise _not_yours(
            f"refusing to send a token to {path}: the process serving it runs as another "
            f"user (uid {peer}), not as you (uid {uid}). Nothing was sent."
        )
    return f"{UNIX_SCHEME}{path}"


def _peer_uid(path: Path) -> int | None:
    """The uid of the process that serves `path`, as the kernel says (SO_PEERCRED); None
    where it cannot say, or the socket's backlog is full (its owner and its folder's
    mode guard it then). Raises HubUnreachableError when no one serves it (a stopped hub's
    socket): the hub is down, and nothing else is dialled in its place."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.setblocking(False)  # a Unix socket's connect never waits on the network
        try:
            probe.connect(str(path))
        except BlockingIOError:
            return None
        except (ConnectionRefusedError, FileNotFoundError) as exc:
            raise _unreachable(
                f"no hub answered at {path} (the socket of a hub that stopped): start one "
                "with `agentworker up` (or `agentworker service install`)"
            ) from exc
        if not hasattr(socket, "SO_PEERCRED"):
            return None
        creds = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return int(struct.unpack("3i", creds)[1])


def socket_answers(path: Path) -> bool:
    """Whether a process listens on the Unix socket at `path` (a hub's start asks)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.setblocking(False)
        try:
            probe.connect(str(path))
        except BlockingIOError:
            return True  # its backlog is full: someone listens
        except OSError:
            return False
        return True


def private_folder(folder: Path, holds: str = "the hub's socket") -> None:
    """Make the folder of a socket (`holds` names it) owner-only and check it is this
    user's alone: a folder another user may write in, or a link to one, could be given
    a socket of theirs."""
    from worker.errors import StartupError  # here: the errors load the sandbox package

    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise StartupError(
            f"{folder} must be a folder (not a link) that belongs to you and is writable "
            f"by you alone (chmod go-w) to hold {holds}; if another user made it, "
            "remove it or set AGENTWORKER_HOME to a shorter path"
        )


def listeners(address: str) -> set[int] | None:
    """The uids of the TCP sockets listening on `address`'s port where a connection to
    a loopback address may land (on loopback, or on every address), as /proc/net/tcp and
    tcp6 give them; None where the system has no such files (not Linux)."""
    port = _port(address)
    if port is None:
        return set()
    owners: set[int] = set()
    found = False
    for table in _PROC_TCP:
        try:
            with open(table, encoding="ascii") as rows:
                found = True
                next(rows, None)  # the header
                for row in rows:
                    owner = _listener(row.split(), port)
                    if owner is not None:
                        owners.add(owner)
        except FileNotFoundError:
            continue  # no IPv6 here, say
    return owners if found else None


def _listener(fields: list[str], port: int) -> int | None:
    """The uid of a /proc/net/tcp row's socket when it listens on `port` where a loopback
    connection may reach it; None otherwise."""
    if len(fields) < 8 or fields[3] != _LISTEN:
        return None
    host, _, port_hex = fields[1].partition(":")
    with contextlib.suppress(ValueError):
        if int(port_hex, 16) == port and _reachable_from_loopback(host):
            return int(fields[7])
    return None


def _reachable_from_loopback(host_hex: str) -> bool:
    """Whether a socket bound to this /proc/net/tcp address (each 32-bit word in the
    host's byte order) may take a connection to a loopback address."""
    raw = bytes.fromhex(host_hex)
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(raw)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_unspecified


def _port(address: str) -> int | None:
    text = address.rsplit(":", 1)[-1]
    return int(text) if text.isdigit() else None


def _not_yours(message: str) -> StartupError:
    from worker.errors import NotYourHubError

    return NotYourHubError(message)


def _unreachable(message: str) -> StartupError:
    from worker.errors import HubUnreachableError

    return HubUnreachableError(message)
