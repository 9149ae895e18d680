"""Unix sockets are doors out of the sandbox (review8 findings 14 and 15): real listeners
outside, a real sandbox (bubblewrap, the entry helper's Landlock, the seccomp filter).

A named socket in a shared folder, read-only included, and, where a rule keeps the
network, an abstract socket of the machine's network namespace (the X server's
@/tmp/.X11-unix/X0): what listens runs outside, as the person. The filter refuses
socket(AF_UNIX); Landlock ABI 6 scopes abstract sockets on its own; socketpair(2), a
program's own pipe, still works.
"""

from __future__ import annotations

import asyncio
import os
import socket
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox import _seccomp, confinement, environment
from sandbox.process import Limits, Mount, PidCap, View, run

FILTER = pytest.mark.skipif(
    _seccomp.filter_for_machine() is None, reason="no table for this machine"
)

# Connects to the address given (a path, or an abstract name after "@"), says how it went.
CONNECT = textwrap.dedent(
    """
    import errno, socket, sys
    where = sys.argv[1]
    address = "\\0" + where[1:] if where.startswith("@") else where
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as exc:
        print("socket", errno.errorcode[exc.errno]); sys.exit()
    try:
        s.connect(address)
    except OSError as exc:
        print("connect", errno.errorcode[exc.errno]); sys.exit()
    print("connected")
    """
)


def in_sandbox(
    share: Path,
    entry: str | None,
    seccomp: bool,
    network: bool,
    code: str,
    *args: str,
    unix_sockets: bool = False,
) -> str:
    view = View(
        cwd=str(share),
        mounts=(Mount(str(share), False),),
        env=environment.build({}, []),
        entry=entry,
        seccomp=seccomp,
        network=network,
        unix_sockets=unix_sockets,
    )
    argv = ["/usr/bin/python3", "-I", "-c", code, *args]
    done = asyncio.run(run(argv, view, Limits(timeout_s=60), pid_cap=PidCap()))
    assert done.exit_code == 0, done.stderr
    return done.stdout.decode().strip()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, socket.socket]]:
    """A socket listening in a folder to be shared read-only, as a docker.sock would."""
    share = Path(os.path.realpath(tmp_path)) / "share"
    share.mkdir()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(share / "service.sock"))
        listener.listen(4)
        yield share, listener


def attempt(
    share: Path,
    listener: socket.socket,
    entry: str | None,
    seccomp: bool,
    network: bool,
    where: str,
    unix_sockets: bool = False,
) -> tuple[str, bool]:
    """What the sandboxed program said, and whether the listener has a connection from
    it waiting (a connect completes into the listener's backlog, answered or not)."""
    said = in_sandbox(share, entry, seccomp, network, CONNECT, where, unix_sockets=unix_sockets)
    listener.setblocking(False)
    try:
        peer, _ = listener.accept()
    except BlockingIOError:
        return said, False
    peer.close()
    return said, True


@FILTER
def test_a_named_socket_in_a_read_only_share_cannot_be_reached(
    served: tuple[Path, socket.socket], entry: str
) -> None:
    """Review8 finding 15: the sandbox cannot even make a unix socket to connect with."""
    share, listener = served
    where = str(share / "service.sock")
    assert attempt(share, listener, entry, True, False, where) == ("socket EPERM", False)
    # Without the filter it is let in, read-only share, Landlock and all: what the
    # filter closes (Landlock has no right for it before LANDLOCK_ACCESS_FS_RESOLVE_UNIX).
    assert attempt(share, listener, entry, False, False, where) == ("connected", True)


def abstract_listener() -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0agentworker-test-" + os.urandom(8).hex())
    listener.listen(4)
    return listener


def abstract_name(listener: socket.socket) -> str:
    name = listener.getsockname()
    text = name.decode() if isinstance(name, bytes) else name
    return "@" + text.lstrip("\0")


@FILTER
def test_an_abstract_socket_of_the_machine_is_out_of_reach_with_the_network(
    tmp_path: Path, entry: str
) -> None:
    """Review8 finding 14: `network = true` shares the machine's network namespace, and
    with it its abstract sockets (an X server's): the filter refuses the socket."""
    share = Path(os.path.realpath(tmp_path))
    with abstract_listener() as listener:
        where = abstract_name(listener)
        assert attempt(share, listener, entry, True, True, where) == ("socket EPERM", False)
        # With no filter and no Landlock it connects: what the two close.
        assert attempt(share, listener, None, False, True, where) == ("connected", True)
        # Without the network, the sandbox has a namespace of its own: nothing listens.
        assert attempt(share, listener, None, False, False, where) == (
            "connect ECONNREFUSED",
            False,
        )


def test_landlock_scope_alone_keeps_abstract_sockets_out_of_reach(
    tmp_path: Path, entry: str
) -> None:
    """Where the filter is not had, Landlock ABI 6's scope closes finding 14 by itself."""
    if not confinement.landlock_for(tmp_path / "cache").scopes:
        pytest.skip("this kernel's Landlock has no scopes (ABI 6, Linux 6.12)")
    share = Path(os.path.realpath(tmp_path))
    with abstract_listener() as listener:
        where = abstract_name(listener)
        assert attempt(share, listener, entry, False, True, where) == ("connect EPERM", False)


@FILTER
def test_a_socketpair_still_works_in_the_sandbox(tmp_path: Path, entry: str) -> None:
    """A program's own pipe (multiprocessing, asyncio's self-pipe) is socketpair(2)."""
    code = "import socket; a, b = socket.socketpair(); a.sendall(b'x'); print(b.recv(1).decode())"
    share = Path(os.path.realpath(tmp_path))
    assert in_sandbox(share, entry, True, False, code) == "x"


@FILTER
def test_a_rule_that_opts_in_reaches_named_sockets_but_not_abstract_ones(
    served: tuple[Path, socket.socket], entry: str, tmp_path: Path
) -> None:
    """`unix_sockets = true`: the filter lets socket(AF_UNIX) through, so the named
    socket in the share is reached (what the rule asks for); with the network kept too,
    Landlock's scope (ABI 6) still keeps the machine's abstract sockets out of reach."""
    share, listener = served
    named = str(share / "service.sock")
    assert attempt(share, listener, entry, True, False, named, True) == ("connected", True)
    if not confinement.landlock_for(tmp_path / "cache").scopes:
        return  # exec refuses such a rule here (below)
    with abstract_listener() as machine:
        where = abstract_name(machine)
        assert attempt(share, machine, entry, True, True, where, True) == ("connect EPERM", False)


@FILTER
@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_opt_in_filter_differs_only_in_letting_unix_sockets_be_made(machine: str) -> None:
    """socket(AF_UNIX) and socketpair(AF_UNIX) of every type, the datagram one included;
    the other families stay refused (review9 finding 01)."""
    from tests.sandbox.test_seccomp import ARCHES, ARGUMENTS, SOCKET_ARGUMENTS, answer

    closed, open_ = _seccomp.build(machine), _seccomp.build(machine, unix_sockets=True)
    assert closed is not None and open_ is not None
    column = 0 if machine == "x86_64" else 1
    socket_nr, pair_nr = _seccomp._SOCKET[column], _seccomp._SOCKETPAIR[column]
    differ = set()
    for arch in ARCHES.values():
        for number in [*range(500), 0x40000000 + 41, 0xFFFFFFFF]:
            for args in [*ARGUMENTS, *SOCKET_ARGUMENTS]:
                if answer(closed, arch, number, *args) != answer(open_, arch, number, *args):
                    differ.add((arch, number, args[0] & 0xFFFFFFFF))
                    assert answer(open_, arch, number, *args) == _seccomp.RET_ALLOW
    native = _seccomp.AUDIT_ARCH[machine]
    assert differ == {(native, socket_nr, _seccomp.AF_UNIX), (native, pair_nr, _seccomp.AF_UNIX)}


def test_a_rule_with_the_network_is_refused_where_nothing_closes_abstract_sockets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fail closed: no filter for this machine and no Landlock scope: the reason to refuse."""
    landlock = confinement.Landlock(tmp_path / "cache", "cc")
    if _seccomp.filter_for_machine() is not None:
        assert confinement.abstract_sockets_open(None, landlock) is None
    monkeypatch.setattr(_seccomp, "filter_for_machine", lambda: None)
    landlock.abi = 5
    why = confinement.abstract_sockets_open("/entry", landlock)
    assert why is not None and "abstract unix sockets" in why and "(ABI 5)" in why
    assert confinement.abstract_sockets_open(None, landlock) is not None
    layers = {layer.name: layer for layer in confinement.report(landlock)}
    assert not layers["unix sockets"].active
    landlock.abi = 6
    assert confinement.abstract_sockets_open("/entry", landlock) is None
    assert confinement.abstract_sockets_open(None, landlock) is not None
    monkeypatch.undo()
    if _seccomp.filter_for_machine() is not None:  # a rule's opt-in lifts the filter's part
        landlock.abi = 5
        assert confinement.abstract_sockets_open(None, landlock, unix_sockets=False) is None
        why = confinement.abstract_sockets_open("/entry", landlock, unix_sockets=True)
        assert why is not None and "unix_sockets = true" in why
        landlock.abi = 6
        assert confinement.abstract_sockets_open("/entry", landlock, unix_sockets=True) is None


@FILTER
def test_a_named_datagram_socket_in_a_read_only_share_cannot_be_reached(
    tmp_path: Path, entry: str
) -> None:
    """A datagram socketpair's end can be given any address per send (and connected
    anew): socket(AF_UNIX) refused, it still sent a service outside a datagram with a
    descriptor of the workspace (review9 finding 02). socketpair(AF_UNIX, SOCK_DGRAM)
    answers EPERM; without the filter the datagram arrives (the test's own control)."""
    share = Path(os.path.realpath(tmp_path)) / "share"
    share.mkdir()
    code = textwrap.dedent(
        """
        import errno, socket, sys
        try:
            a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
            a.sendto(b"from inside", sys.argv[1])
            print("sent")
        except OSError as exc:
            print(errno.errorcode[exc.errno])
        """
    )
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as service:
        service.bind(str(share / "service.sock"))
        service.setblocking(False)
        where = str(share / "service.sock")
        assert in_sandbox(share, entry, True, False, code, where) == "EPERM"
        with pytest.raises(BlockingIOError):
            service.recv(64)  # nothing arrived (the run has ended)
        assert in_sandbox(share, entry, False, False, code, where) == "sent"
        assert service.recv(64) == b"from inside"
