"""The local channel `agentworker ui` attaches over: a Unix socket only this user can open.

The socket lives in the data folder (writable by its user alone) with mode 0600, and each peer's
uid is checked as well (SO_PEERCRED), so only the user running the worker can
attach — the socket is the power to approve calls. The protocol is one JSON object
per line: the client opens with `{"op": "attach"}`, the worker answers with the
console's snapshot (in pages: see `pages`) and then streams events; commands carry
a `req` number and get a reply with the same number. A client that cannot keep up is dropped rather
than let its backlog grow without bound.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import socket
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

from worker.core.console import Console, Event, Subscriber, encode
from worker.errors import StartupError
from worker.wire.own_hub import private_folder

log = logging.getLogger(__name__)

MAX_LINE: Final = 1024 * 1024
# A client this far behind (bytes not yet sent) is dropped.
MAX_BACKLOG: Final = 8 * 1024 * 1024
# How long a stopping worker lets a UI read what was still queued for it.
CLOSE_GRACE_S: Final = 2.0
# Calls and plans that changed are sent to a UI together, at most this often, as a
# "changes" event holding each row once, as it last was (paged: see changes_lines);
# every other event goes at once (the changes before it first, so a UI reads them in
# the order they happened).
# One line per call's start and end and per plan touched made a busy worker encode
# and write four lines a call, and the TUI's process wake, parse and queue each.
CHANGES_EVERY_S: Final = 0.05
# The snapshot's lists, and the rows that changed, are sent in lines of about this
# many bytes at most, well under MAX_LINE: on one line, about 64 waiting prompts that
# show whole calls passed it, and no UI could attach (their calls were denied at their
# timeout); so would a few dozen calls with long non-ASCII args finished together.
SNAPSHOT_PAGE: Final = 256 * 1024
_SNAPSHOT_LISTS: Final = ("prompts", "calls", "plans", "grants")
# Events told while a UI reads its snapshot wait for it, up to this many.
MAX_HELD: Final = 100_000


def pages(snapshot: Event) -> list[bytes]:
    """The snapshot as lines of about SNAPSHOT_PAGE bytes at most: the first is the
    snapshot with what fits of its lists, each next one a "snapshot_more" with more
    items; every line but the last says "more". One item is never split (the largest,
    a prompt showing a whole call, is bounded by prompt_text.SHOW_LIMIT well under
    MAX_LINE)."""
    lines: list[Event] = []
    page: Event = {**snapshot, **{key: [] for key in _SNAPSHOT_LISTS}}
    size = len(encode(page))
    for key in _SNAPSHOT_LISTS:
        for item in snapshot.get(key, ()):
            more = len(encode(item))  # its newline stands for the comma before it
            if size + more > SNAPSHOT_PAGE and any(page[k] for k in _SNAPSHOT_LISTS):
                lines.append(page)
                page = {"type": "snapshot_more", **{k: [] for k in _SNAPSHOT_LISTS}}
                size = len(encode(page))
            page[key].append(item)
            size += more
    lines.append(page)
    for earlier in lines[:-1]:
        earlier["more"] = True
    return [encode(line) for line in lines]


def changes_lines(calls: Iterable[Event], plans: Iterable[Event]) -> list[bytes]:
    """Calls' and plans' rows that changed, as "changes" lines of at most SNAPSHOT_PAGE
    bytes, as the snapshot is paged: however many calls changed together, no line
    passes MAX_LINE. Each line stands alone (a UI takes the rows it holds). A row is
    never split; the largest, a call's, shows its texts cut at console.RESULT_PREVIEW
    characters (some tens of KiB encoded at most), so none passes SNAPSHOT_PAGE alone.
    Each row is encoded once, as `encode` would, and the lines joined from them."""
    lines: list[bytes] = []
    page: dict[str, list[str]] = {"calls": [], "plans": []}
    empty = size = len(_changes_line(page))
    for key, rows in (("calls", calls), ("plans", plans)):
        for row in rows:
            text = _dumps(row)
            if size + len(text) + 1 > SNAPSHOT_PAGE and (page["calls"] or page["plans"]):
                lines.append(_changes_line(page))
                page, size = {"calls": [], "plans": []}, empty
            page[key].append(text)
            size += len(text) + 1  # and its comma
    if page["calls"] or page["plans"]:
        lines.append(_changes_line(page))
    return lines


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"))


def _changes_line(page: dict[str, list[str]]) -> bytes:
    calls, plans = ",".join(page["calls"]), ",".join(page["plans"])
    return f'{{"type":"changes","calls":[{calls}],"plans":[{plans}]}}\n'.encode()


class NoWorkerError(StartupError):
    """`agentworker ui` found no worker to attach to (or may not open its socket)."""

    exit_code = 3


def _peer(sock: socket.socket) -> tuple[int, int] | None:
    """The other end's (pid, uid) as the kernel says, or None where it cannot."""
    if not hasattr(socket, "SO_PEERCRED"):
        return None  # the folder's mode guards it on platforms without SO_PEERCRED
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return int(pid), int(uid)


def _refusal(sock: socket.socket | None) -> str | None:
    """Why a UI connection is refused, or None. Another user may not attach; nor may a
    process in another pid namespace than the worker's: a program in the exec sandbox
    runs as this user, and the UI socket is the power to approve its own calls."""
    peer = _peer(sock) if sock is not None else None
    if peer is None:
        return None
    pid, uid = peer
    if uid != os.getuid():
        return f"refused a UI connection from uid {uid}"
    try:
        same = os.readlink(f"/proc/{pid}/ns/pid") == os.readlink("/proc/self/ns/pid")
    except OSError:  # gone already, or no /proc to ask: it may not approve anything
        same = False
    if not same:
        return f"refused a UI connection from pid {pid}, in another pid namespace (a sandbox)"
    return None


class ConsoleServer:
    """Serves a Console on the local socket for as long as the worker runs."""

    def __init__(self, console: Console, path: Path) -> None:
        self.console = console
        self.path = path
        self._server: asyncio.Server | None = None
        self._sessions: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        # The pids of the UIs attached to answer prompts (sessions per pid), and the same
        # as a set replaced whole on each change: the desktop's input thread reads it
        # (worker.actions.computer._own_ui: their windows are the person's alone).
        self._ui_sessions: collections.Counter[int] = collections.Counter()
        self.ui_pids: frozenset[int] = frozenset()

    async def start(self) -> None:
        private_folder(self.path.parent, "the UI socket")
        # Only one worker per data folder runs (the worker lock), so a socket left
        # here is a dead worker's.
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        old = os.umask(0o177)
        try:
            self._server = await asyncio.start_unix_server(
                self._serve, path=str(self.path), limit=MAX_LINE
            )
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)

    async def stop(self) -> None:
        """Each UI is sent what is already queued for it (the worker's last "stopped"
        among it), then its connection is closed and its session ends by itself. A
        session cancelled instead makes asyncio 3.11 log a CancelledError traceback.
        A UI that reads nothing more (stopped with Ctrl+Z, say) is cut off after
        CLOSE_GRACE_S."""
        if self._server is not None:
            self._server.close()
            for writer in list(self._sessions.values()):
                writer.close()
            if self._sessions:
                _, stuck = await asyncio.wait(list(self._sessions), timeout=CLOSE_GRACE_S)
                for task in stuck:
                    self._sessions[task].transport.abort()
                await asyncio.gather(*stuck, return_exceptions=True)
            await self._server.wait_closed()
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._sessions[task] = writer
        try:
            why = _refusal(writer.get_extra_info("socket"))
            if why is not None:
                log.warning("%s", why)
                return
            await self._session(reader, writer)
        # RecursionError: JSON nested past the parser's depth ends that session, nothing else.
        except (ConnectionError, asyncio.IncompleteReadError, ValueError, RecursionError) as exc:
            log.info("a UI connection ended: %s", exc or type(exc).__name__)
        finally:
            self._sessions.pop(task, None)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        opening = json.loads(await reader.readline() or b"{}")
        if not isinstance(opening, dict) or opening.get("op") != "attach":
            return
        asks = opening.get("asks", True) is not False
        gone = asyncio.Event()
        loop = asyncio.get_running_loop()
        calls: dict[str, dict[str, Any]] = {}  # changed since the last "changes"
        plans: dict[str, dict[str, Any] | None] = {}  # raw plan id -> its row, or None
        due: asyncio.TimerHandle | None = None
        # What is told while the snapshot is sent, in order, for after it (None: sent).
        held: list[Event] | None = []

        def write(line: bytes) -> None:
            if writer.is_closing():
                gone.set()
                return
            transport = writer.transport
            if transport.get_write_buffer_size() > MAX_BACKLOG:
                log.warning("a UI fell too far behind; dropping it")
                gone.set()
                writer.close()
                return
            writer.write(line)

        def flush() -> None:
            nonlocal due
            if due is not None:
                due.cancel()
                due = None
            if calls or plans:
                lines = changes_lines(
                    calls.values(), ({"raw": raw, "plan": row} for raw, row in plans.items())
                )
                calls.clear()
                plans.clear()
                for line in lines:
                    write(line)

        def send(event: Event) -> None:
            nonlocal due
            if held is not None:
                held.append(event)
                if len(held) > MAX_HELD:
                    log.warning("a UI did not read its snapshot; dropping it")
                    gone.set()
                    writer.close()
                return
            kind = event.get("type")
            if kind == "call":
                calls[event["call"]["id"]] = event["call"]
            elif kind == "plan":
                plans[event["raw"]] = event["plan"]
            else:
                flush()
                write(encode(event))
                return
            if due is None:
                due = loop.call_later(CHANGES_EVERY_S, flush)

        peer = _peer(writer.get_extra_info("socket")) if asks else None
        snapshot = pages(self.console.subscribe(send, asks=asks))
        if peer is not None:
            self._ui_sessions[peer[0]] += 1
            self.ui_pids = frozenset(+self._ui_sessions)
        log.info("a UI attached")
        try:
            for page in snapshot:  # read at the UI's pace, not all queued here at once
                writer.write(page)
                await writer.drain()
            told: list[Event] = held or []
            held = None
            for event in told:
                send(event)
            while not gone.is_set():
                line = await reader.readline()
                if not line:
                    break
                command = json.loads(line)
                if not isinstance(command, dict):
                    continue
                reply = self.console.handle(command)
                send({"type": "reply", "req": command.get("req"), **reply})
                await writer.drain()
        finally:
            self.console.unsubscribe(send, asks=asks)
            if peer is not None:
                self._ui_sessions[peer[0]] -= 1
                self.ui_pids = frozenset(+self._ui_sessions)
            if due is not None:
                due.cancel()
            log.info("a UI detached")


class SocketLink:
    """A UI's side of the local socket (`agentworker ui`)."""

    def __init__(self, path: Path, *, asks: bool = True) -> None:
        self.path = path
        self.asks = asks
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._next = 0
        self.closed = asyncio.Event()

    async def open(self, on_event: Subscriber) -> Event:
        try:
            reader, writer = await asyncio.open_unix_connection(str(self.path), limit=MAX_LINE)
        except (FileNotFoundError, ConnectionRefusedError):
            raise NoWorkerError(
                f"no worker is running with this data folder (no socket at {self.path}); "
                "start one with `agentworker up` or `agentworker run`",
            ) from None
        except PermissionError:
            raise NoWorkerError(
                f"{self.path} belongs to another user: attach as the user running the worker",
            ) from None
        peer = _peer(writer.get_extra_info("socket"))
        if peer is not None and peer[1] != os.getuid():
            writer.close()
            raise NoWorkerError(
                f"the socket at {self.path} is served by another user (uid {peer[1]}), not "
                "by your worker: refusing to attach",
            )
        self._writer = writer
        writer.write(encode({"op": "attach", "asks": self.asks}))
        line = await reader.readline()
        if not line:
            raise NoWorkerError("the worker closed the connection at once")
        snapshot: Event = json.loads(line)
        page = snapshot
        while page.get("more"):  # the rest of the snapshot (see `pages`)
            line = await reader.readline()
            if not line:
                raise NoWorkerError("the worker closed the connection while it attached")
            page = json.loads(line)
            for key in _SNAPSHOT_LISTS:
                snapshot.setdefault(key, []).extend(page.get(key, ()))
        snapshot.pop("more", None)
        self._reader_task = asyncio.create_task(self._read(reader, on_event))
        return snapshot

    async def _read(self, reader: asyncio.StreamReader, on_event: Subscriber) -> None:
        try:
            while line := await reader.readline():
                event = json.loads(line)
                if event.get("type") == "reply":
                    waiter = self._replies.pop(event.get("req"), None)
                    if waiter is not None and not waiter.done():
                        waiter.set_result(event)
                    continue
                on_event(event)
        except (ConnectionError, ValueError) as exc:
            log.info("the worker's socket closed: %s", exc)
        finally:
            self.closed.set()
            for waiter in self._replies.values():
                if not waiter.done():
                    waiter.set_result({"ok": False, "code": "not_found", "message": "worker gone"})
            on_event({"type": "detached"})

    async def command(self, command: dict[str, Any]) -> dict[str, Any]:
        if self._writer is None or self.closed.is_set():
            return {"ok": False, "code": "not_found", "message": "not attached to a worker"}
        self._next += 1
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._replies[self._next] = waiter
        self._writer.write(encode({**command, "req": self._next}))
        return await waiter

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader_task
