"""The pause switch: a global stop for every surface, a takeover for the computer
surface, shared through one file by the worker and the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.core.pause import PauseState, PauseSwitch
from worker.errors import WorkerError


def test_nothing_is_paused_at_first(tmp_path: Path) -> None:
    switch = PauseSwitch.in_dir(tmp_path)
    switch.check("workerHost")
    switch.check("workerComputer")
    assert not switch.current().active


def test_a_takeover_pauses_only_the_computer_surface(tmp_path: Path) -> None:
    switch = PauseSwitch.in_dir(tmp_path)
    switch.take_over("the person moved the mouse")
    switch.check("workerHost")
    with pytest.raises(WorkerError) as caught:
        switch.check("workerComputer")
    assert caught.value.code == "paused" and caught.value.retryable
    assert "agentworker resume" in caught.value.message
    assert caught.value.details["paused_by"] == "desktop"


def test_the_global_stop_pauses_every_surface(tmp_path: Path) -> None:
    switch = PauseSwitch.in_dir(tmp_path)
    switch.stop("emergency", "hotkey")
    for surface in ("workerHost", "workerComputer", "workerDiag"):
        with pytest.raises(WorkerError, match="every action is paused: emergency"):
            switch.check(surface)


def test_another_process_sees_the_change_and_resume_lifts_both(tmp_path: Path) -> None:
    worker, cli = PauseSwitch.in_dir(tmp_path), PauseSwitch.in_dir(tmp_path)
    seen: list[PauseState] = []
    worker.subscribe(seen.append)
    worker.take_over("typed over the agent")
    cli.stop("from the CLI", "cli")
    assert worker.current().stop is not None and worker.current().takeover is not None
    lifted = cli.resume()
    assert lifted.stop is not None and lifted.takeover is not None
    assert not worker.current().active
    assert [s.active for s in seen] == [True, True, False]


def test_a_pause_survives_a_restart(tmp_path: Path) -> None:
    PauseSwitch.in_dir(tmp_path).stop("before the restart", "cli")
    with pytest.raises(WorkerError, match="before the restart"):
        PauseSwitch.in_dir(tmp_path).check("workerHost")


def test_a_damaged_file_reads_as_stopped(tmp_path: Path) -> None:
    switch = PauseSwitch.in_dir(tmp_path)
    switch.path.write_text("{not json")
    with pytest.raises(WorkerError) as caught:
        switch.check("workerHost")
    assert caught.value.code == "paused"
    switch.resume()
    switch.check("workerHost")
