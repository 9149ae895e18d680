"""An asked exec holds what an argument file (`@args`) names, from before the look
until its program ends (sandbox.held); the file's words are read before the hold
begins, so a change landing then named other places than those held, and the look,
made once it holds, would bind a file nothing held still. The hold reads them again
once it holds and answers `busy` when they differ (bind23 r1)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sandbox import Root
from sandbox.held import HeldError, HeldPlaces
from worker.actions.host import exec_cmd
from worker.errors import WorkerError


def _asked(tmp_path: Path) -> tuple[Any, Any, HeldPlaces]:
    held = HeldPlaces()
    ctx = SimpleNamespace(
        roots=(Root(path=tmp_path, writable=True),),
        containment=SimpleNamespace(held=held),
        correlation_id="call-1",
    )
    return ctx, SimpleNamespace(verdict="ask"), held


def test_an_argument_files_names_are_held(tmp_path: Path) -> None:
    (tmp_path / "args").write_text("-cp cls pkg.Main\n")
    ctx, decision, held = _asked(tmp_path)

    async def holding() -> None:
        with await exec_cmd.held_while_asked(ctx, decision, str(tmp_path), ["java", "@args"]):
            for named in ("args", "cls", "cls/pkg/Main.class", "pkg/Main.class"):
                with pytest.raises(HeldError):  # an fs_write there answers `busy`
                    held.write(str(tmp_path / named), "call-2")
        with held.write(str(tmp_path / "cls"), "call-2"):
            pass  # let go with its program

    asyncio.run(holding())


def test_an_argument_file_changed_before_the_hold_began_answers_busy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's write lands between the first read of @args and the hold (here as
    the hold learns its files): `busy`, and nothing stays held."""
    (tmp_path / "args").write_text("-cp cls pkg.Main\n")
    ctx, decision, held = _asked(tmp_path)
    real = exec_cmd.held_files

    def written_meanwhile(*args: Any) -> Any:
        (tmp_path / "args").write_text("-cp other pkg.Main\n")
        return real(*args)

    monkeypatch.setattr(exec_cmd, "held_files", written_meanwhile)

    async def asking() -> None:
        await exec_cmd.held_while_asked(ctx, decision, str(tmp_path), ["java", "@args"])

    with pytest.raises(WorkerError, match="changed as it was being held") as refused:
        asyncio.run(asking())
    assert refused.value.code == "busy"
    for named in ("args", "cls", "other"):
        with held.write(str(tmp_path / named), "call-2"):
            pass  # nothing stays held
