"""fs_stat writes its answer as JSON with orjson, without building its result model
(pydantic's construct and dump were a third of the call): that JSON is exactly what
the model makes, for every kind of path, odd times and names included."""

from __future__ import annotations

import os
from pathlib import Path

from worker import app
from worker.actions.host import fs_stat
from worker.config import Config, Paths, RootSection
from worker.core.registry import Context, Json


def test_the_stat_json_is_the_result_models_own(tmp_path: Path) -> None:
    folder = tmp_path / "files"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("a" * 10)
    odd = folder / 'é ü \\ " \u2028.bin'
    odd.write_bytes(b"\0" * 3)
    # Times with fractions a float cannot hold exactly, one far back, one far ahead.
    os.utime(folder / "a.txt", ns=(1_764_225_000_123_456_789, 1_764_225_000_987_654_321))
    os.utime(odd, ns=(-1_000_000_001, 4_102_444_800_000_000_001))
    os.symlink("a.txt", folder / "inside")
    os.symlink("/etc/passwd", folder / "outside")
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
    seen = {}
    try:
        for name, follow in [
            ("a.txt", False),
            ("sub", False),
            ("inside", False),
            ("inside", True),
            ("outside", False),
            (odd.name, False),
            (".", False),
        ]:
            outcome = fs_stat.fs_stat(ctx, fs_stat.FsStatArgs(path=name, follow_symlinks=follow))
            assert isinstance(outcome.result, Json)
            text = outcome.result.text
            model = fs_stat.FsStatResult.model_validate_json(text)
            assert model.model_dump_json() == text, name
            assert model.path == name
            seen[name, follow] = model
    finally:
        dispatcher.close()
    assert seen["inside", False].type == "symlink"
    assert seen["inside", False].symlink_target == "a.txt"
    assert seen["inside", True].type == "file" and seen["inside", True].size == 10
    assert seen["outside", False].symlink_target is None
    assert seen[odd.name, False].atime < 0 < seen[odd.name, False].mtime
