"""The computer surface in the registry: all eleven actions, and how an absent
desktop turns them into answers that say why."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from worker import actions
from worker.actions import computer
from worker.core.registry import Context
from worker.errors import WorkerError


def test_the_registry_holds_the_eleven_computer_actions() -> None:
    served = {s.name for s in actions.build().values() if s.surface == computer.SURFACE}
    assert served == computer.ACTIONS
    assert len(served) == 11


def test_an_absent_desktop_answers_not_supported_and_is_not_advertised(tmp_path: Path) -> None:
    nowhere = computer.detect({}, "linux")
    registry = computer.absent(actions.build(), nowhere)
    spec = registry["workerComputer.mouse_click"]
    assert not spec.advertised
    assert registry["workerHost.fs_stat"].advertised
    args = spec.args.model_validate_json('{"whatever": [1, 2]}')  # any args at all
    ctx = Context("c", "", "a", b"", [], tmp_path)
    with pytest.raises(WorkerError) as caught:
        outcome = spec.handler(ctx, args)
        if asyncio.iscoroutine(outcome):
            asyncio.run(outcome)
    assert caught.value.code == "not_supported"
    assert "DISPLAY is not set" in caught.value.message
