"""What the console's local socket sends its clients is inert, whoever chose the text:
the config file's grants and the server's refusal (the link's detail) went out as
they were, to every client of the socket (only the TUI made them inert, on its own
screen). A real worker's console and socket, a real connection to a hub that
refuses with hostile text, and a raw client reading the socket's lines."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc

from tests.support.scripted_hub import TOKEN, ScriptedHub
from tests.ui.rig import Rig
from worker.config import GrantSection
from worker.core.connection import Backoff, FatalConnectionError, Target, WorkerConnection
from worker.core.console_socket import MAX_LINE, ConsoleServer
from worker.wire.proto import agentworker_pb2 as pb

# ESC sequences (clear the screen, home the cursor, set the title), a bell, a line
# break, then a bidi override reversing the rest.
EVIL = "build-7\x1b[2J\x1b[H\x1b]0;owned\x07\nok\u202eTPECCA"
SHOWN = "build-7\\e[2J\\e[H\\e]0;owned\\x07\\nok\\u202eTPECCA"
RAW = ("\x1b", "\x07", "\n", "\x9b", "\u202e")
# Values that go as they are: a plan's id whole, the key a UI acts by (never drawn).
AS_IS = ("raw", "plan_raw")


class RefusingHub(ScriptedHub):
    """A hub that refuses every stream with a message of its choosing."""

    async def Stream(  # noqa: N802
        self, request_iterator: AsyncIterator[pb.WorkerEnvelope], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ServerEnvelope | bytes]:
        await context.abort(grpc.StatusCode.UNAVAILABLE, EVIL)
        yield b""  # never reached: abort raises


def _texts(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            if key not in AS_IS:
                yield from _texts(item, f"{path}.{key}")
    elif isinstance(value, list):
        for n, item in enumerate(value):
            yield from _texts(item, f"{path}[{n}]")


def test_a_socket_client_gets_config_grants_and_the_links_error_inert(tmp_path: Path) -> None:
    async def scenario() -> None:
        grant = GrantSection(agent=EVIL, scopes=["workerHost.fs_read"], plan=EVIL)
        rig = Rig(tmp_path, grants=[grant])
        server = ConsoleServer(rig.console, rig.paths.ui_socket)
        await server.start()
        hub = RefusingHub()
        address = await hub.start()
        link = WorkerConnection(rig.dispatcher, Target(address, TOKEN), backoff=Backoff(0.05, 0.2))
        # A kill kept from an older worker, which took any plan id (item: ids are printable),
        # by the server the worker serves.
        rig.dispatcher.state.kill_plan(EVIL, EVIL, "server")
        link.on_state = rig.console.set_link
        reader, writer = await asyncio.open_unix_connection(
            str(rig.paths.ui_socket), limit=MAX_LINE
        )
        told: list[dict[str, Any]] = []

        async def until(found: Any) -> dict[str, Any]:
            async with asyncio.timeout(30):
                while True:
                    line = await reader.readline()
                    assert line, "the socket closed"
                    event = json.loads(line)
                    told.append(event)
                    if found(event):
                        return event

        runner = asyncio.create_task(link.run())
        try:
            writer.write(b'{"op": "attach", "asks": false}\n')
            snapshot = await until(lambda e: e.get("type") == "snapshot")
            [kept] = [g for g in snapshot["grants"] if g["id"] is None]
            assert (kept["agent"], kept["plan"]) == (SHOWN, SHOWN)
            refused = await until(
                lambda e: e.get("type") == "link" and e["link"]["state"] == "backoff"
            )
            assert refused["link"]["detail"] == f"UNAVAILABLE: {SHOWN}"
            writer.write(json.dumps({"op": "grants", "req": 1}).encode() + b"\n")
            grants = await until(lambda e: e.get("type") == "reply" and e["req"] == 1)
            assert [g["agent"] for g in grants["grants"] if g["id"] is None] == [SHOWN]
            writer.write(json.dumps({"op": "lift", "plan": EVIL, "req": 2}).encode() + b"\n")
            asked = await until(lambda e: e.get("type") == "reply" and e["req"] == 2)
            assert asked["plan"] == SHOWN and isinstance(asked["confirm"], str)
        finally:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError, FatalConnectionError):
                await runner
            writer.close()
            await server.stop()
            await hub.stop()
            rig.close()
        raw = [
            (path, text) for event in told for path, text in _texts(event) if set(text) & set(RAW)
        ]
        assert raw == []
        plans = [p for e in told if e.get("type") == "snapshot" for p in e["plans"]]
        assert [(p["raw"], p["plan_id"], p["reason"]) for p in plans] == [(EVIL, SHOWN, SHOWN)]

    asyncio.run(scenario())
