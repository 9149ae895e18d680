"""fs_list writes its answer as JSON from plain dicts (a validated model per entry
cost three times the listing): that JSON is exactly what its result model makes."""

from __future__ import annotations

import json
import os
from pathlib import Path

from worker import app
from worker.actions.host import fs_list
from worker.config import Config, Paths, RootSection
from worker.core.registry import Context, Json


def test_the_listing_json_is_the_result_models_own(tmp_path: Path) -> None:
    folder = tmp_path / "files"
    (folder / "sub" / "deeper").mkdir(parents=True)
    (folder / "a.txt").write_text("a" * 10)
    (folder / "sub" / "é ü.bin").write_bytes(b"\0" * 3)
    (folder / ".hidden").write_text("h")
    os.symlink("a.txt", folder / "inside")
    os.symlink("/etc/passwd", folder / "outside")
    (folder / "sub" / "locked").mkdir(mode=0o000)
    paths = Paths(config_dir=tmp_path, data_dir=tmp_path / "data")
    config = Config(root=[RootSection(path=folder, mode="ro")])
    dispatcher = app.build_dispatcher(paths, config)
    ctx = Context(
        correlation_id="c",
        plan_id="p",
        agent_id="a",
        blob=b"",
        roots=dispatcher.roots,
        paths=paths,
        config=config,
    )
    args = fs_list.FsListArgs(path=".", depth=3, hidden=True)
    outcome = fs_list._list(ctx, args)
    assert isinstance(outcome.result, Json)
    text = outcome.result.text
    model = fs_list.FsListResult.model_validate_json(text)
    assert model.model_dump_json() == text
    by_name = {entry.name: entry for entry in model.entries}
    assert by_name["inside"].type == "symlink" and by_name["inside"].symlink_target == "a.txt"
    assert by_name["outside"].symlink_target is None
    assert by_name["é ü.bin"].path == "sub/é ü.bin" and by_name["a.txt"].size == 10
    assert json.loads(text)["truncated"] is False
    dispatcher.close()
