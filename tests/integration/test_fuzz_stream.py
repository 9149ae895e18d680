"""Fuzzing what a server can send: generated and mutated ServerEnvelope bytes and
args_json values go to a real worker (connection, pipeline, ledger, handlers)
through a scripted hub. Whatever comes, the worker stays up, answers every
well-formed call exactly once, and its ledger ends with no RUNNING rows.

Bounded for CI (about 30 s in all): FUZZ_EXAMPLES examples of up to 40 envelopes each,
each example against a fresh worker and ledger, in PARTS tests of their own (so xdist
spreads them and none nears the per-test timeout on a loaded machine);
AW_FUZZ_EXAMPLES=2000 runs longer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.cluster import write_config
from tests.support.scripted_hub import TOKEN, ScriptedHub
from worker import app
from worker.config import Paths, load
from worker.core.connection import Backoff, Target, WorkerConnection, split_messages
from worker.wire.proto import agentworker_pb2 as pb

FUZZ_EXAMPLES = int(os.environ.get("AW_FUZZ_EXAMPLES", "200"))
PARTS = 4
ANSWER_WITHIN_S = 20.0

ACTIONS = [
    ("workerDiag", "probe"),  # async: a task of its own
    ("workerHost", "fs_stat"),  # a plain function: answered within the reader's turn
    ("workerHost", "fs_write"),
    ("workerHost", "no_such_action"),
    ("", ""),
]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)

args_json = st.one_of(
    json_values.map(json.dumps),
    st.builds(
        lambda path: json.dumps({"path": path}),
        st.sampled_from([".", "a.txt", "../escape", "/etc/passwd", "x\x00y", "é" * 300]),
    ),
    st.builds(lambda ms: json.dumps({"sleep_ms": ms}), st.integers(0, 40)),
    st.integers(1, 5000).map(lambda depth: "[" * depth + "]" * depth),
    st.integers(1, 3000).map(lambda depth: '{"a":' * depth + "1" + "}" * depth),
    st.text(max_size=40),  # seldom JSON at all
)


@st.composite
def requests(draw: st.DrawFn) -> pb.ActionRequest:
    surface, action = draw(st.sampled_from(ACTIONS))
    return pb.ActionRequest(
        agent_id=draw(st.sampled_from(["tester", "stranger", ""])),
        plan_id=draw(st.sampled_from(["p1", "p2", ""])),
        surface=surface,
        action=action,
        args_json=draw(args_json),
        blob=draw(st.binary(max_size=8)),
        timeout_ms=draw(st.sampled_from([0, 1, 300, 5000, 2**31, 2**32 - 1])),
        attempt=draw(st.integers(0, 2**32 - 1)),
    )


@st.composite
def mutations(draw: st.DrawFn, data: bytes) -> bytes:
    """`data` with a few bytes flipped, then perhaps cut short."""
    mutated = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        if mutated:
            at = draw(st.integers(0, len(mutated) - 1))
            mutated[at] ^= draw(st.integers(1, 255))
    if draw(st.booleans()) and mutated:
        mutated = mutated[: draw(st.integers(0, len(mutated)))]
    return bytes(mutated)


# One step of the script: ("calls", requests in one envelope), ("cancel", index of an
# earlier well-formed call), ("kill", plan), ("raw", bytes), ("mutated", a request).
steps = st.one_of(
    st.tuples(st.just("calls"), st.lists(requests(), min_size=1, max_size=4)),
    st.tuples(st.just("cancel"), st.integers(0, 60)),
    st.tuples(st.just("kill"), st.sampled_from(["p1", "p2"])),
    st.tuples(st.just("raw"), st.binary(max_size=64)),
    st.tuples(st.just("mutated"), requests()),
)


@dataclass
class Script:
    """What was sent: the well-formed calls by id, in order."""

    sent: list[str] = field(default_factory=list)
    raw_envelopes: int = 0


def envelope(*messages: pb.ServerMessage) -> bytes:
    return pb.ServerEnvelope(messages=list(messages)).SerializeToString()


def asks_to_drain(raw: bytes) -> bool:
    """Whether the worker would read a Drain in `raw`: it would end the session, and
    the scripted hub (no real hub) would lose what it queued for the old stream."""
    parts, _intact = split_messages(raw)
    for part in parts:
        with contextlib.suppress(DecodeError):
            if pb.ServerMessage.FromString(part).WhichOneof("kind") == "drain":
                return True
    return False


def send_noise(hub: ScriptedHub, raw: bytes) -> None:
    if not asks_to_drain(raw):
        hub.send_raw(raw)


def play_script(hub: ScriptedHub, script_steps: list[Any], draw_mutation: Any) -> Script:
    script = Script()
    for kind, value in script_steps:
        if kind == "calls":
            messages = []
            for request in value:
                request.correlation_id = f"well-formed-{len(script.sent)}"
                script.sent.append(request.correlation_id)
                messages.append(pb.ServerMessage(request=request))
            hub.send_raw(envelope(*messages))
        elif kind == "cancel" and script.sent:
            target = script.sent[value % len(script.sent)]
            hub.send_raw(envelope(pb.ServerMessage(cancel=pb.Cancel(correlation_id=target))))
        elif kind == "kill":
            hub.send_raw(envelope(pb.ServerMessage(kill_plan=pb.KillPlan(plan_id=value))))
        elif kind == "raw":
            send_noise(hub, value)
            script.raw_envelopes += 1
        elif kind == "mutated":
            value.correlation_id = f"mutant-{script.raw_envelopes}"
            send_noise(hub, draw_mutation(envelope(pb.ServerMessage(request=value))))
            script.raw_envelopes += 1
    return script


HOMES: list[Path] = []  # the test's tmp_path, where each example makes its home


@contextlib.contextmanager
def fresh_home() -> Iterator[Path]:
    # Left for pytest to remove with the rest of tmp_path: the database's checkpointer
    # thread may still touch the ledger's log files a moment after it is closed.
    home = Path(tempfile.mkdtemp(prefix="example-", dir=HOMES[-1]))
    write_config(home, "127.0.0.1:1", max_concurrency=4, max_accepted=64)
    (home / "workspace" / "a.txt").write_text("a")
    yield home


async def run_example(home: Path, script_steps: list[Any], draw_mutation: Any) -> None:
    paths = Paths(home, home)
    dispatcher = app.build_dispatcher(paths, load(paths))
    hub = ScriptedHub()
    address = await hub.start()
    link = WorkerConnection(
        dispatcher, Target(address, TOKEN), heartbeat_s=0.5, backoff=Backoff(0.01, 0.05)
    )
    runner = asyncio.create_task(link.run())
    try:
        await asyncio.wait_for(link.connected.wait(), 10)
        script = play_script(hub, script_steps, draw_mutation)
        answers: dict[str, set[bytes]] = {}
        expected = set(script.sent)
        async with asyncio.timeout(ANSWER_WITHIN_S):
            while not expected <= answers.keys():
                result = await hub.next("result", timeout=ANSWER_WITHIN_S)
                if result.correlation_id.startswith("well-formed-"):
                    result.replayed = False  # a re-send after a reconnect is the same answer
                    answers.setdefault(result.correlation_id, set()).add(
                        result.SerializeToString(deterministic=True)
                    )
        assert not runner.done(), "the worker's connection ended"
        once = {cid: len(found) for cid, found in answers.items() if cid in expected}
        assert once == dict.fromkeys(expected, 1), "a call answered more than once"
        await dispatcher.drain(5)  # mutants that became calls end too
        assert dispatcher.state.running_ids() == []
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
        await hub.stop()
        dispatcher.close()


TOTALS: Counter[str] = Counter()  # for the closing line: what a run fed the worker


@settings(
    max_examples=-(-FUZZ_EXAMPLES // PARTS),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(script_steps=st.lists(steps, min_size=1, max_size=40), data=st.data())
def _fuzz(script_steps: list[Any], data: st.DataObject) -> None:
    def draw_mutation(raw: bytes) -> bytes:
        return data.draw(mutations(raw))

    TOTALS["examples"] += 1
    TOTALS["envelopes"] += len(script_steps)
    TOTALS["calls"] += sum(len(value) for kind, value in script_steps if kind == "calls")
    with fresh_home() as home:
        asyncio.run(run_example(home, script_steps, draw_mutation))


@pytest.mark.parametrize("part", range(PARTS))
def test_no_server_input_stops_the_worker_or_leaves_a_call_unanswered(
    tmp_path: Path, part: int
) -> None:
    TOTALS.clear()
    HOMES.append(tmp_path)
    _fuzz()
    print(
        f"fuzz: {TOTALS['examples']} examples, {TOTALS['envelopes']} envelopes, "
        f"{TOTALS['calls']} well-formed calls"
    )
