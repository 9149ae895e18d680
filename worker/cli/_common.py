"""What several verbs share: exit codes, the config a verb runs with, the hub client.

Only the standard library at the top: every verb module imports this, and
`agentworker --help` imports every verb module (see worker.cli.main).
"""

from __future__ import annotations

import argparse
import functools
import logging
import re
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NamedTuple

if TYPE_CHECKING:
    import grpc

    from worker.config import Config, Paths
    from worker.errors import StartupError
    from worker.hub.client import ControlClient

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1  # the action, check or lookup answered no; StartupErrors have their own
EXIT_INTERRUPTED: Final = 130  # Ctrl-C, as a shell reports it

Verb = Callable[["Paths", argparse.Namespace], int]


def add_server_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", help="hub address (default: this machine's hub)")
    add_token_flags(p)


def add_token_flags(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--token-file FILE (or AGENTWORKER_TOKEN), or --token TOKEN: visible to every
    local user in the process list (/proc/PID/cmdline), so it is warned about."""
    one = p.add_mutually_exclusive_group()
    one.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="read the bearer token from FILE (default: AGENTWORKER_TOKEN, else the local "
        "hub's token file)",
    )
    one.add_argument(
        "--token",
        help="the bearer token itself; every user of this machine can read it in the "
        "process list: prefer --token-file or AGENTWORKER_TOKEN",
    )


def add_served_flags(p: argparse.ArgumentParser) -> None:
    """Flags that name a server as the worker knows it (its key: the address it dials
    and a digest of the token it dials with), for what the person keeps per server."""
    group = p.add_argument_group(
        "the server (default: the one the worker here serves, or served last)"
    )
    group.add_argument("--server", help="its address, as `agentworker run --server` names it")
    add_token_flags(group)
    group.add_argument("--tls-ca", type=Path, help="as `run --tls-ca`: it speaks TLS")
    group.add_argument("--server-key", help="its key, as `sandbox list` or the worker's log say")


def server_named(
    paths: Paths, args: argparse.Namespace, served: str | None, before_any: str | None = None
) -> tuple[str, str]:
    """The key of the server the flags of `add_served_flags` name, and how it was
    chosen (for the person): `served` is the one the worker here serves (or served
    last), the default; with none, `before_any` if given (a mark the worker turns into
    the first server it serves), else the one `run` serves with no flags."""
    if args.server_key:
        return args.server_key, "named by its key"
    if args.server or args.token or args.tls_ca:
        from worker.app import worker_target

        return worker_target(paths, config_of(paths, args)).server_key, "named as `run` names it"
    if served:
        return served, "the server the worker here serves, or served last"
    if before_any is not None:
        return before_any, "no worker has served a server from here yet: the first one it serves"
    from worker.app import worker_target

    return worker_target(paths, config_of(paths, args)).server_key, (
        "the server `agentworker run` serves with no flags"
    )


VISIBLE_FLAG_WARNING: Final = (
    "agentworker: warning: --token shows the token to every user of this machine (ps, "
    "/proc/PID/cmdline); use --token-file FILE or AGENTWORKER_TOKEN instead"
)


def settle_token(args: argparse.Namespace) -> None:
    """Before a verb runs: the token of --token-file read into `args.token`, or a
    warning for a --token given on the command line."""
    import sys

    token_file = getattr(args, "token_file", None)
    if token_file is not None:
        from worker.wire.transport import read_token

        args.token = read_token(token_file)
    elif getattr(args, "token", None):
        print(VISIBLE_FLAG_WARNING, file=sys.stderr)


def flag_or_env_token(args: argparse.Namespace) -> str | None:
    """A client verb's token: --token(-file), else AGENTWORKER_TOKEN (None: neither)."""
    import os

    return getattr(args, "token", None) or os.environ.get("AGENTWORKER_TOKEN") or None


def token_for(paths: Paths, args: argparse.Namespace, own_address: str) -> str:
    """The token a client verb sends: --token(-file) or AGENTWORKER_TOKEN, else this
    data folder's hub.token, but only to this data folder's hub (no --server, or one
    naming `own_address`). `--server X` with neither sent hub.token to X, which could
    then call this machine's hub as the person (review27 I2): a token goes only to the
    server it belongs to."""
    given = flag_or_env_token(args)
    if given is not None:
        return given
    server = getattr(args, "server", None)
    if server and server != own_address:
        from worker.errors import TokenNotSentError

        raise TokenNotSentError(
            f"--server {server} is not this machine's hub ({own_address}), and this "
            "machine's hub.token goes to no other: give the token of that hub with "
            "--token-file FILE or AGENTWORKER_TOKEN"
        )
    from worker.wire.transport import read_token

    return read_token(paths.token_file)


def config_of(paths: Paths, args: argparse.Namespace) -> Config:
    """The config file, then AGENTWORKER_* variables, then this verb's flags."""
    from worker.config import load

    worker_flags = {
        "server": getattr(args, "server", None),
        "token": getattr(args, "token", None),
        "tls_ca": getattr(args, "tls_ca", None),
        "max_concurrency": getattr(args, "max_concurrency", None),
    }
    hub_flags = {
        "listen": getattr(args, "listen", None),
        # Only ever turned on by a flag; off, the file's setting stands.
        "accept_new_workers": True if getattr(args, "accept_new_workers", False) else None,
    }
    return load(paths, {"worker": worker_flags, "hub": hub_flags})


def own_hub_of(paths: Paths, args: argparse.Namespace) -> tuple[str, Path | None]:
    """`hub_of` for this data folder's hub, whatever --server names."""
    import argparse as _argparse

    return hub_of(paths, _argparse.Namespace(**{**vars(args), "server": None}))


def hub_of(paths: Paths, args: argparse.Namespace) -> tuple[str, Path | None]:
    """The hub's address and the CA certificate to trust: --server, else [hub] listen;
    [worker] tls_ca. Each from the config file, then AGENTWORKER_LISTEN and
    AGENTWORKER_TLS_CA, as `config_of` reads them, but without pydantic or the rest
    of the settings, which a client verb has no use for (`agentworker call` answers
    at once). A file that is not TOML, or either setting not a string, is left to
    `config_of`, which says what is wrong."""
    import os
    import tomllib

    from worker.paths import DEFAULT_LISTEN

    raw: dict[str, Any] = {}
    try:
        if paths.config_file.exists():
            raw = tomllib.loads(paths.config_file.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        raw = {"unreadable": True}
    hub, worker = raw.get("hub", {}), raw.get("worker", {})
    if "unreadable" in raw or not isinstance(hub, dict) or not isinstance(worker, dict):
        return _hub_of_config(paths, args)
    listen = os.environ.get("AGENTWORKER_LISTEN") or hub.get("listen", DEFAULT_LISTEN)
    from_env = os.environ.get("AGENTWORKER_TLS_CA")
    tls_ca = getattr(args, "tls_ca", None) or from_env or worker.get("tls_ca")
    if not isinstance(listen, str) or not isinstance(tls_ca, str | Path | None):
        return _hub_of_config(paths, args)
    return getattr(args, "server", None) or listen, Path(tls_ca) if tls_ca else None


def _hub_of_config(paths: Paths, args: argparse.Namespace) -> tuple[str, Path | None]:
    config = config_of(paths, args)
    return getattr(args, "server", None) or config.hub.listen, config.worker.tls_ca


def with_client(
    paths: Paths,
    args: argparse.Namespace,
    body: Callable[[ControlClient], Coroutine[Any, Any, int]],
) -> int:
    """Run `body` against the hub (this machine's, or --server); the one place a gRPC
    failure talking to it becomes a HubUnreachableError. This machine's hub is dialled
    only once it is known to be this user's (NotYourHubError otherwise: nothing sent)."""
    import asyncio

    import grpc

    from worker.wire.transport import Keepalive, bearer, open_channel

    hub = hub_target(paths, args)
    address, target, tls_ca, token = hub.address, hub.target, hub.tls_ca, hub.token

    async def go() -> int:
        channel = open_channel(target, Keepalive(), tls_ca)
        try:
            # Connecting (TCP, TLS, HTTP/2's settings) goes on in gRPC's own threads
            # from here, while the generated protobuf module loads (the largest part
            # of a client verb's start after grpc itself): the call then goes out on
            # a connection that is up, 2-4 ms sooner (issue 12). That module and the
            # client are imported here, after the channel, for that reason.
            channel.get_state(try_to_connect=True)
            from worker.hub.client import ControlClient

            return await body(ControlClient(channel, bearer(token)))
        finally:
            await channel.close()

    try:
        return asyncio.run(go())
    except grpc.aio.AioRpcError as exc:
        raise hub_failure(exc, address) from exc


class HubTarget(NamedTuple):
    address: str  # as the person named it (--server), or [hub] listen
    target: str  # what gRPC dials: this machine's hub's socket, or the address
    tls_ca: Path | None
    token: str


def hub_target(paths: Paths, args: argparse.Namespace) -> HubTarget:
    """Where a client verb dials and the token it sends (`token_for`). This machine's
    hub, also when --server spells its `[hub] listen`, is dialled on its Unix socket, or
    on its port once the kernel says the listener is this user's; never another user's
    (worker.wire.own_hub: NotYourHubError, nothing sent)."""
    own, tls_ca = own_hub_of(paths, args)
    address = getattr(args, "server", None) or own  # the address its messages name
    token = token_for(paths, args, own)
    target = address
    if address == own:
        from worker.wire.own_hub import OwnHub

        dial = OwnHub(paths.hub_socket, address).dial()
        target, tls_ca = dial.target, None if dial.local_socket else tls_ca
    return HubTarget(address, target, tls_ca, token)


def hub_failure(exc: grpc.aio.AioRpcError, address: str) -> StartupError:
    """What a gRPC failure talking to the hub at `address` tells the person: a token it
    refused (exit 5), or a hub that did not answer as asked (exit 3)."""
    import grpc

    from worker.errors import HubUnreachableError, TokenRefusedError
    from worker.wire.auth import WORKERS_ONLY

    if exc.code() is grpc.StatusCode.PERMISSION_DENIED and exc.details() == WORKERS_ONLY:
        return TokenRefusedError(
            f"the hub at {address} takes this token from workers only; calls need "
            "hub.token from its config folder (--token-file or AGENTWORKER_TOKEN)"
        )
    if exc.code() is grpc.StatusCode.UNAUTHENTICATED:
        return TokenRefusedError(
            f"the hub at {address} refused the token sent ({exc.details()}); use the "
            "token of that hub: hub.token in its data folder, given with --token-file "
            "or AGENTWORKER_TOKEN"
        )
    return HubUnreachableError(f"the hub answered {exc.code().name}: {exc.details()}")


# ---------------------------------------------------------------- text from outside


def shown(text: str) -> str:
    """`text` from outside this machine's person (a server's ids, an agent's args, a
    worker's name, a kill's reason) as it may be printed to a terminal: every
    control, escape, bidi and invisible character written as a visible escape
    (`worker.core.approvals.inert`, as the TUI shows them), so none can retitle the
    window, clear the screen or draw a line of its own. Plain ASCII is as it was."""
    if text.isascii() and text.isprintable():
        return text  # the common case, without loading the approvals module
    from worker.core.approvals import inert

    return inert(text, len(text))


def json_shown(value: Any, **dumps: Any) -> str:
    """`value` as JSON that is safe on a terminal and still the same JSON: what `shown`
    would escape is written as a JSON escape (`\\u001b`, `\\u202e`); json.dumps
    with ensure_ascii=False escapes the C0 controls but leaves C1 controls (a
    terminal's CSI, `\\x9b`), bidi overrides and line separators as they are."""
    import json  # here: `call` loads it while its Dispatch is out (worker.cli.remote)

    text = json.dumps(value, ensure_ascii=False, **dumps)
    if text.isascii() and "\x7f" not in text:
        return text
    return _BEYOND_ASCII.sub(lambda found: _json_char(found.group()), text)


_BEYOND_ASCII: Final = re.compile("[^\x00-\x7e]")


@functools.cache
def _json_char(char: str) -> str:
    from worker.core.approvals import inert

    if inert(char, 1) == char:
        return char
    code = ord(char)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # JSON writes it as a UTF-16 surrogate pair
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


LOG_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class ShownFormatter(logging.Formatter):
    """Log lines with every value logged `shown`: a log names a server's ids and
    actions, and goes to the terminal (or a file read on one). The message's own
    text (a line break of ours, `ready:`'s next commands) and a traceback are ours,
    kept as they are."""

    def format(self, record: logging.LogRecord) -> str:
        args = record.args
        if isinstance(args, tuple) and args:
            record = logging.makeLogRecord(record.__dict__)
            record.args = tuple(_shown_arg(arg) for arg in args)
        elif isinstance(args, dict) and args:
            record = logging.makeLogRecord(record.__dict__)
            record.args = {key: _shown_arg(arg) for key, arg in args.items()}
        return super().format(record)


def _shown_arg(arg: object) -> object:
    return arg if isinstance(arg, int | float) else shown(str(arg))


def iso(unix_ms: int) -> str:
    return (
        datetime.fromtimestamp(unix_ms / 1000, UTC).isoformat(timespec="seconds")
        if unix_ms
        else "never"
    )
