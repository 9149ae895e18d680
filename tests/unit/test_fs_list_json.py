"""fs_list writes its answer as JSON from plain dicts (a validated model per entry
cost three times the listing), with orjson: that JSON is exactly what its result
model makes, odd names and times included."""

from __future__ import annotations

import json
import os
from pathlib import Path

from worker import app
from worker.actions.host import fs_list
from worker.config import Config, Paths, RootSection
from worker.core.registry import Context, Json


def listed(tmp_path: Path, folder: Path, args: fs_list.FsListArgs) -> fs_list.FsListResult:
    """fs_list's answer for `folder` (the one root), checked to be the model's own JSON."""
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
    try:
        outcome = fs_list._list(ctx, args)
    finally:
        dispatcher.close()
    assert isinstance(outcome.result, Json)
    text = outcome.result.text
    model = fs_list.FsListResult.model_validate_json(text)
    assert model.model_dump_json() == text
    assert json.loads(text)["truncated"] is model.truncated is outcome.truncated
    return model


def test_the_listing_json_is_the_result_models_own(tmp_path: Path) -> None:
    folder = tmp_path / "files"
    (folder / "sub" / "deeper").mkdir(parents=True)
    (folder / "a.txt").write_text("a" * 10)
    (folder / "sub" / "é ü.bin").write_bytes(b"\0" * 3)
    (folder / ".hidden").write_text("h")
    os.symlink("a.txt", folder / "inside")
    os.symlink("/etc/passwd", folder / "outside")
    (folder / "sub" / "locked").mkdir(mode=0o000)
    model = listed(tmp_path, folder, fs_list.FsListArgs(path=".", depth=3, hidden=True))
    by_name = {entry.name: entry for entry in model.entries}
    assert by_name["inside"].type == "symlink" and by_name["inside"].symlink_target == "a.txt"
    assert by_name["outside"].symlink_target is None
    assert by_name["é ü.bin"].path == "sub/é ü.bin" and by_name["a.txt"].size == 10
    assert not model.truncated


def test_odd_names_times_and_modes_are_written_as_the_model_writes_them(tmp_path: Path) -> None:
    """Escapes, non-ASCII, U+2028, and floats whose shortest form is an exponent."""
    folder = tmp_path / "odd"
    folder.mkdir()
    names = ['quote"back\\slash', "new\nline\ttab\x01\x1f\x7f", "line\u2028sep", "ünï 🎉"]
    times_ns = [10_000, -1_500_000_000, 1_234_567_890_123_456_789, 0]
    for name, ns in zip(names, times_ns, strict=True):
        (folder / name).write_bytes(b"x" * len(name))
        os.utime(folder / name, ns=(ns, ns))
    (folder / "setuid").write_text("")
    (folder / "setuid").chmod(0o4755)
    model = listed(tmp_path, folder, fs_list.FsListArgs(path=".", limit=3))
    assert model.truncated and len(model.entries) == 3
    model = listed(tmp_path, folder, fs_list.FsListArgs(path="."))
    by_name = {entry.name: entry for entry in model.entries}
    assert sorted(by_name) == sorted([*names, "setuid"])
    assert by_name[names[0]].mtime == 1e-05 and by_name[names[1]].mtime == -1.5
    assert by_name["setuid"].mode == "0o4755"


def test_entries_that_share_a_mode_are_each_their_own(tmp_path: Path) -> None:
    """Entries of one st_mode are copies of one finished entry: each has its own name,
    size and time, and the one whose name is not UTF-8 alone is escaped and marked."""
    folder = tmp_path / "same"
    folder.mkdir()
    for i in range(20):
        (folder / f"f{i:02d}").write_bytes(b"x" * i)
        os.utime(folder / f"f{i:02d}", ns=(i * 1_000_000_000, i * 1_000_000_000))
    with open(os.path.join(os.fsencode(folder), b"caf\xe9"), "wb") as odd:
        odd.write(b"y" * 99)
    model = listed(tmp_path, folder, fs_list.FsListArgs(path="."))
    plain = [entry for entry in model.entries if entry.name.startswith("f")]
    assert [(e.name, e.size, e.mtime, e.error) for e in plain] == [
        (f"f{i:02d}", i, float(i), None) for i in range(20)
    ]
    (odd_entry,) = [entry for entry in model.entries if not entry.name.startswith("f")]
    assert odd_entry.name == "caf\\xe9" and odd_entry.size == 99
    assert odd_entry.error == fs_list.NOT_UTF8 and odd_entry.mode == plain[0].mode
