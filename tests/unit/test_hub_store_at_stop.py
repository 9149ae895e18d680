"""A hub that stops stores what is unstored at once, and schedules no store after it:
the group commit scheduled before (STORE_DELAY_S) fired once hub.db had closed, and
every stop wrote "Cannot operate on a closed database" with its traceback to the
hub's log. A real hub and hub.db; the loop is the test's."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from worker.hub import server
from worker.hub.server import Hub
from worker.hub.store import HubStore


def test_no_store_runs_after_the_hub_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(server, "STORE_DELAY_S", 0.0)  # due at the loop's next turn

    async def go() -> None:
        hub = Hub(HubStore(tmp_path / "hub.db"))
        hub._store_soon()  # a commit due, as after any call or result
        hub.shutdown()
        hub._store_soon()  # and one asked for as the streams end
        hub.store.close()
        for _ in range(10):  # past the turns a due timer runs in
            await asyncio.sleep(0)

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(go())
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
