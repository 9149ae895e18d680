"""Protocol 3's writes wait for their parts in threads of their own, and the stream's
own copies have a thread of their own: with more blobs still coming than the worker's
pool has threads, the stream is still read and every other call still runs (review12
finding 01: six such writes took the pool, the reader's copy of a 512 KiB request
waited behind them for parts only it could read, and nothing more was read, no part,
Cancel, KillPlan or heartbeat, until the silence limit dropped the stream). A real
worker against a scripted hub (real loopback gRPC)."""

from __future__ import annotations

import asyncio
import gc
import json
import os
from pathlib import Path

import pytest

from tests.integration.test_parts_follow import digest, header, parts, probe_runs
from tests.integration.test_stream_rules import MIB, error_code, play
from tests.support.scripted_hub import ScriptedHub
from worker.core.connection import WorkerConnection
from worker.core.threads import CallThreads
from worker.wire.proto import agentworker_pb2 as pb

# Writes whose blobs are still coming, two waiting threads each: more than the pool's
# threads (six on two cores), and call slots for them and two more calls.
POOL = CallThreads()._max_workers
COMING = POOL // 2 + 1
WITHIN_S = 60.0  # a ceiling for a loaded machine, not a pace


def _args(name: str) -> str:
    return json.dumps({"path": name, "mode": "overwrite"})


async def _until_no_jobs(link: WorkerConnection) -> None:
    """Until no job of any call is counted in a thread (each ends on its own)."""
    async with asyncio.timeout(WITHIN_S):
        while link.dispatcher.threads.unfinished():
            await asyncio.sleep(0.01)


def test_blobs_still_coming_hold_no_thread_the_stream_or_other_calls_need(
    tmp_path: Path,
) -> None:
    blobs = [os.urandom(2 * MIB) for _ in range(COMING)]
    inline = os.urandom(MIB // 2)  # in its request: copied off the loop as it is read

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        assert link.dispatcher.threads._max_workers == POOL < 2 * COMING
        for i, blob in enumerate(blobs):
            header(hub, f"w{i}", len(blob), _args(f"w{i}.bin"))
            parts(hub, f"w{i}", blob, end=MIB)  # half of it: the rest is held back
        hub.request(
            "inline", _args("inline.bin"), surface="workerHost", action="fs_write", blob=inline
        )
        hub.request("probe", json.dumps({"mark": "meanwhile"}))
        answered = {}
        while len(answered) < 2:
            result = await hub.next("result", WITHIN_S)
            answered[result.correlation_id] = error_code(result)
        assert answered == {"inline": "ok", "probe": "ok"}
        # The held-back halves and the digests: every write is placed, once.
        for i, blob in enumerate(blobs):
            parts(hub, f"w{i}", blob, start=MIB)
            digest(hub, f"w{i}", len(blob))
        for _ in blobs:
            result = await hub.next("result", WITHIN_S)
            assert error_code(result) == "ok", result
        workspace = tmp_path / "workspace"
        assert [(workspace / f"w{i}.bin").read_bytes() for i in range(COMING)] == blobs
        assert (workspace / "inline.bin").read_bytes() == inline
        await _until_no_jobs(link)
        assert not [p for p in workspace.iterdir() if p.name.endswith("-tmp")]

    play(tmp_path, scenario, {"max_concurrency": COMING + 2}, protocol=3)


def test_a_blob_still_coming_that_stops_ends_its_threads(tmp_path: Path) -> None:
    """A Cancel reaches the stopped blob's waiting threads: they end, counted no more."""
    blob = os.urandom(2 * MIB)

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        header(hub, "c1", len(blob), _args("c1.bin"))
        parts(hub, "c1", blob, end=MIB)
        hub.request("probe", json.dumps({"mark": "meanwhile"}))
        assert error_code(await hub.next("result", WITHIN_S)) == "ok"
        hub.send(cancel=pb.Cancel(correlation_id="c1", reason="the caller left"))
        assert error_code(await hub.next("result", WITHIN_S)) == "cancelled"
        await _until_no_jobs(link)
        assert not [p for p in (tmp_path / "workspace").iterdir() if p.name.endswith("-tmp")]

    play(tmp_path, scenario, protocol=3)


def test_writes_stopped_by_a_hang_up_leave_no_traceback_in_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A write whose blob stops coming fails twice (its thread: the blob stopped; its
    claim: no digest came): the one its handler does not raise is read too. Left unread,
    asyncio logged it with its traceback when it was collected, a few per hundred
    (review12 finding 07); the race is run often enough here to show one."""
    rounds, per_round = 20, 2

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        for round_ in range(rounds):
            for i in range(per_round):
                cid = f"r{round_}-{i}"
                header(hub, cid, 16 * MIB, _args(f"{cid}.bin"))
                parts(hub, cid, os.urandom(MIB), end=MIB)
            await probe_runs(hub, f"p{round_}")  # every part is in
            hub.hang_up()
            await hub.dials(round_ + 2)
            await _until_no_jobs(link)  # each write's threads saw its blob stop
        # Once, every round's futures unreachable by now: a full collection took some
        # 0.5 s of this process's heap each, half the test's time, and at each of 20
        # rounds it went past the 120 s ceiling under load.
        gc.collect()

    play(tmp_path, scenario, protocol=3)
    never = [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()]
    assert never == []
