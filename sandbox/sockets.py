"""What a sandbox's sockets hold in kernel buffers: memory no rlimit counts.

Data a program writes into a socket and never reads sits in the kernel's buffers
(skbs), which RLIMIT_AS does not count and no process owns: one process filling the
511 socketpairs RLIMIT_NOFILE allows it queued 119 MB at the system's default buffer
sizes, and a sandbox may run `max_processes` of them (review7 finding 02). A memory
cgroup charges it; where a plan has none (rlimits mode) the workbench's watch sums it
here and stops the plan past its memory (worker/actions/workbench.py).

Every sandbox has a network namespace of its own (bubblewrap's --unshare-all; sandbox
mode never shares the network), so every socket its programs made, those held in any
process's descriptors and those in flight in another socket's queue alike, is one of
that namespace's: the kernel's sock_diag dump of the namespace lists each with its
memory (`SK_MEMINFO`), as `ss -m` shows it. A netlink socket dumps the namespace it
was made in, and a worker that is not root cannot enter another user namespace's
network namespace, so the entry helper makes one inside and sends it out over a
socketpair before the program starts (entry.c, `-n`). The worker alone holds it then.

The sum is, for each AF_UNIX, TCP and UDP socket (IPv4 and IPv6), what is queued to
receive, what its sends hold (an AF_UNIX send is charged to the sender until it is
read) and its backlog: a little over what is queued, never under. Those are the only
sockets a sandbox can make: the seccomp filter (sandbox._seccomp) refuses every other
family and protocol (MPTCP's, UDP-Lite's and netlink's buffers read 0 here: review9
finding 03), and the entry helper refuses netlink once its own socket is out.
"""

from __future__ import annotations

import array
import contextlib
import os
import socket
import struct
import threading
from typing import Final

__all__ = ["SocketMemory", "SocketsUnseenError", "channel", "probe"]

_NETLINK_SOCK_DIAG: Final = 4
_SOCK_DIAG_BY_FAMILY: Final = 20
_NLM_F_REQUEST: Final = 0x1
_NLM_F_DUMP: Final = 0x300
_NLMSG_ERROR: Final = 2
_NLMSG_DONE: Final = 3
_HEADER: Final = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, pid
_ATTRIBUTE: Final = struct.Struct("=HH")  # rtattr: length, type
_MEMINFO: Final = struct.Struct("=9I")  # SK_MEMINFO_VARS, in order
_UDIAG_SHOW_MEMINFO: Final = 0x20
_UNIX_DIAG_MEMINFO: Final = 5
_UNIX_MESSAGE: Final = 16  # struct unix_diag_msg
_INET_DIAG_SKMEMINFO: Final = 7
_INET_MESSAGE: Final = 72  # struct inet_diag_msg
_ALL_STATES: Final = 0xFFFFFFFF
# What a dump asks: AF_UNIX, then TCP and UDP over IPv4 and IPv6.
_DUMPS: Final = (
    (socket.AF_UNIX, 0),
    (socket.AF_INET, socket.IPPROTO_TCP),
    (socket.AF_INET6, socket.IPPROTO_TCP),
    (socket.AF_INET, socket.IPPROTO_UDP),
    (socket.AF_INET6, socket.IPPROTO_UDP),
)
_READ: Final = 1 << 20


class SocketsUnseenError(Exception):
    """The sandbox's sockets could not be summed; the message says why."""


def channel() -> tuple[socket.socket, int]:
    """A socketpair (close-on-exec): the worker's end, and the descriptor to give the
    entry helper (`-n`), to close once bubblewrap started."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setblocking(False)
    return ours, theirs.detach()


class SocketMemory:
    """The kernel memory held by one sandbox's sockets, through the sock_diag socket
    its entry helper sends over `ours` (see the module doc). A sum runs on a thread
    (its cost is the program's to choose); `close`, from any thread, never waits for
    one: a sum under way closes the sockets when it ends."""

    def __init__(self, ours: socket.socket) -> None:
        self._ours: socket.socket | None = ours
        self._diag: socket.socket | None = None
        self._sequence = 0
        self._summing = threading.Lock()
        self._closed = False

    def close(self) -> None:
        self._closed = True
        if self._summing.acquire(blocking=False):
            try:
                self._close()
            finally:
                self._summing.release()

    def _close(self) -> None:
        for each in (self._ours, self._diag):
            if each is not None:
                each.close()
        self._ours = self._diag = None

    def queued(self) -> int:
        """Bytes the sandbox's sockets hold now. 0 before the entry helper sent its
        socket (the program has not started) and once closed (the run ended, and its
        sandbox with it): nothing of it holds any then. SocketsUnseenError when they
        cannot be summed."""
        with self._summing:
            try:
                if self._closed:  # the run ended, its sandbox killed: nothing held
                    return 0
                diag = self._diag or self._receive()
                if diag is None:
                    return 0
                total = 0
                for family, protocol in _DUMPS:
                    self._sequence += 1
                    total += _dump(diag, self._sequence, family, protocol)
                return total
            finally:
                if self._closed:
                    self._close()

    def _receive(self) -> socket.socket | None:
        if self._ours is None:
            raise SocketsUnseenError("the sandbox's sockets are no longer watched")
        fds = array.array("i")
        try:
            data, control, _, _ = self._ours.recvmsg(1, socket.CMSG_SPACE(fds.itemsize))
        except BlockingIOError:
            return None  # not sent yet: nothing of the program runs
        except OSError as exc:
            raise SocketsUnseenError(f"the sandbox's sock_diag socket was not had: {exc}") from None
        for level, kind, value in control:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(value[: len(value) - len(value) % fds.itemsize])
        if not data or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            if not data:  # the entry ended before it sent one: the program never ran
                return None
            raise SocketsUnseenError("the sandbox's entry sent no sock_diag socket")
        try:
            diag = socket.socket(fileno=fds[0])
        except OSError:  # not a socket at all
            os.close(fds[0])
            diag = None
        if diag is None or (diag.family, diag.proto) != (socket.AF_NETLINK, _NETLINK_SOCK_DIAG):
            if diag is not None:
                diag.close()
            raise SocketsUnseenError(
                "the sandbox's entry sent something else than a sock_diag socket"
            )
        diag.settimeout(5.0)
        self._diag = diag
        self._ours.close()
        self._ours = None
        return diag


def probe() -> str:
    """Why the sockets of this machine's sandboxes cannot be summed ('' when they can):
    each family dumped once, in the worker's own network namespace. A kernel built
    without a family's sock_diag (unix_diag, inet_diag, tcp_diag, udp_diag) still
    makes its sockets."""
    try:
        diag = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG)
    except OSError as exc:
        return f"no sock_diag socket can be made ({exc})"
    with diag:
        diag.settimeout(5.0)
        try:
            for sequence, (family, protocol) in enumerate(_DUMPS, 1):
                _dump(diag, sequence, family, protocol)
        except SocketsUnseenError as exc:
            return str(exc)
    return ""


def _dump(diag: socket.socket, sequence: int, family: int, protocol: int) -> int:
    """What the sockets of `family` (and `protocol`) in the namespace of `diag` hold."""
    if family == socket.AF_UNIX:
        request = struct.pack(
            "=BBHIIIII",
            family,
            0,
            0,
            _ALL_STATES,
            0,
            _UDIAG_SHOW_MEMINFO,
            0xFFFFFFFF,
            0xFFFFFFFF,
        )
        skip, memory_attribute = _UNIX_MESSAGE, _UNIX_DIAG_MEMINFO
    else:
        extensions = 1 << (_INET_DIAG_SKMEMINFO - 1)
        request = struct.pack("=BBBBI", family, protocol, extensions, 0, _ALL_STATES) + bytes(48)
        skip, memory_attribute = _INET_MESSAGE, _INET_DIAG_SKMEMINFO
    flags = _NLM_F_REQUEST | _NLM_F_DUMP
    message = _HEADER.pack(_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY, flags, sequence, 0)
    try:
        diag.send(message + request)
        total = 0
        while True:
            data = diag.recv(_READ)
            if not data:
                raise SocketsUnseenError("the sock_diag socket closed")
            summed, done = _summed(data, sequence, skip, memory_attribute)
            total += summed
            if done:
                return total
    except OSError as exc:
        name = (
            "AF_UNIX"
            if family == socket.AF_UNIX
            else "IPv4"
            if family == socket.AF_INET
            else "IPv6"
        )
        if family != socket.AF_UNIX:
            name += " TCP" if protocol == socket.IPPROTO_TCP else " UDP"
        raise SocketsUnseenError(f"{name} sockets could not be listed: {exc}") from None


def _summed(data: bytes, sequence: int, skip: int, memory_attribute: int) -> tuple[int, bool]:
    """The memory of each socket in one read of a dump, and whether the dump ended."""
    total, at = 0, 0
    while at + _HEADER.size <= len(data):
        length, kind, _, seq, _ = _HEADER.unpack_from(data, at)
        if length < _HEADER.size:
            raise SocketsUnseenError("a sock_diag answer was malformed")
        end = min(at + length, len(data))
        if seq != sequence:
            at += (length + 3) & ~3
            continue  # an answer to an earlier request (one that timed out)
        if kind == _NLMSG_DONE:
            return total, True
        if kind == _NLMSG_ERROR:
            code = -struct.unpack_from("=i", data, at + _HEADER.size)[0]
            raise OSError(code, f"sock_diag answered: {os.strerror(code)}")
        attribute = at + _HEADER.size + skip
        while attribute + _ATTRIBUTE.size <= end:
            size, kind = _ATTRIBUTE.unpack_from(data, attribute)
            if size < _ATTRIBUTE.size:
                break
            if kind == memory_attribute and size >= _ATTRIBUTE.size + _MEMINFO.size:
                rmem, _, wmem, _, _, queued, _, backlog, _ = _MEMINFO.unpack_from(
                    data, attribute + _ATTRIBUTE.size
                )
                total += rmem + wmem + queued + backlog
            attribute += (size + 3) & ~3
        at += (length + 3) & ~3
    return total, False


def close_quietly(memory: SocketMemory | None) -> None:
    if memory is not None:
        with contextlib.suppress(OSError):
            memory.close()
