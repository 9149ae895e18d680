"""The console keeps each call as it came and makes a UI's row of it only when a UI
is told (an event, or a snapshot on attach): the row a UI gets is the same either
way, every text inert and cut at RESULT_PREVIEW with a note of what was left out."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from worker import app
from worker.config import Config, Paths
from worker.core.console import RESULT_PREVIEW
from worker.wire.proto import agentworker_pb2 as pb


def test_a_calls_row_is_the_same_told_at_once_or_in_a_later_snapshot(tmp_path: Path) -> None:
    asyncio.run(_rows(tmp_path))


async def _rows(tmp_path: Path) -> None:
    paths = Paths(config_dir=tmp_path, data_dir=tmp_path / "data")
    config = Config()
    dispatcher = app.build_dispatcher(paths, config)
    try:
        console = app.build_console(dispatcher, config, server="127.0.0.1:1", mode="run")
        args = '{"text": "' + "\x1b[2J" + "a" * (RESULT_PREVIEW + 500) + '"}'
        calls = []
        for cid in ("quiet", "told"):
            req = pb.ActionRequest(
                correlation_id=cid,
                agent_id="agent\u202e",
                plan_id="plan\n1",
                surface="workerHost",
                action="fs_stat",
                args_json=args,
            )
            result = pb.ActionResult(
                correlation_id=cid, status=pb.ActionResult.ERROR, error=pb.Error(code="not_found")
            )
            result.error.message = "gone\x07"
            result.invocation.duration_ms = 7
            result.invocation.decision = "granted"
            result.invocation.scope = "workerHost.fs_stat"
            calls.append((req, result))
        # No UI: nothing told, the call kept.
        console.call_started(calls[0][0])
        console.call_finished(calls[0][0], calls[0][1], 0)
        events: list[dict[str, Any]] = []
        snapshot = console.subscribe(events.append, asks=False)
        console.call_started(calls[1][0])
        running = [e["call"] for e in events if e["type"] == "call"]
        console.call_finished(calls[1][0], calls[1][1], 12)
        told = [e["call"] for e in events if e["type"] == "call"][-1]
        later = console.snapshot()["calls"]
    finally:
        dispatcher.close()
    (quiet,) = snapshot["calls"]
    assert running[0]["status"] == "running" and running[0]["duration_ms"] is None
    assert [row["id"] for row in later] == ["quiet", "told"]
    assert later[0] == quiet and later[1] == told
    for row in (quiet, told):
        assert row["agent_id"] == "agent\\u202e" and row["plan_id"] == "plan\\n1"
        assert row["plan_raw"] == "plan\n1"  # whole, a key for a UI's kill and lift
        assert row["args"].startswith('{"text": "\\e[2J') and "\x1b" not in row["args"]
        assert row["args"].endswith(" … (+516 chars)")
        assert row["status"] == "not_found" and row["error"] == "gone\\x07"
        assert row["duration_ms"] == 7 and row["decision"] == "granted"
        assert row["telemetry"]["scope"] == "workerHost.fs_stat"
        assert list(row["telemetry"]) == [
            "scope",
            "bytes_in",
            "bytes_out",
            "truncated",
            "sandboxed",
            "args_digest",
        ]
    assert quiet["blob_bytes"] == 0 and told["blob_bytes"] == 12
