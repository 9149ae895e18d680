"""workerDiag.probe's hold: a window a test opens and closes on an event. The name
is a plain name, so a held call only ever looks in the diagnostics folder."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.support.cluster import release
from worker.actions.host.diag import ProbeArgs, probe
from worker.config import Paths
from worker.core.registry import Context


def _context(data_dir: Path, blob: bytes = b"") -> Context:
    return Context(
        correlation_id="c",
        plan_id="p",
        agent_id="a",
        blob=blob,
        roots=(),
        paths=Paths(config_dir=data_dir, data_dir=data_dir),
    )


def test_a_held_probe_finishes_when_released(tmp_path: Path) -> None:
    ctx = _context(tmp_path, b"echo")

    async def go() -> bytes:
        held = asyncio.create_task(probe(ctx, ProbeArgs(hold="h-1", blob_repeat=2)))
        done, _ = await asyncio.wait({held}, timeout=0.1)
        assert not done, "held until released"
        release(tmp_path, "h-1")
        return (await asyncio.wait_for(held, 10)).blob

    assert asyncio.run(go()) == b"echoecho"


@pytest.mark.parametrize("name", ["../state", "a/b", "", ".release", "x" * 65])
def test_a_hold_names_no_path(name: str) -> None:
    with pytest.raises(ValidationError):
        ProbeArgs(hold=name)


def test_a_hold_never_released_ends_with_timeout_at_its_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bounded as the longest sleep, not by the call's own deadline (up to a day)."""
    from worker.actions.host import diag
    from worker.errors import WorkerError

    monkeypatch.setattr(diag, "HOLD_MAX_S", 0.05)
    ctx = _context(tmp_path)
    with pytest.raises(WorkerError) as raised:
        asyncio.run(probe(ctx, ProbeArgs(hold="never")))
    assert raised.value.code == "timeout" and "never released" in str(raised.value)
