"""The replay script format: how lines parse, how step ids are derived, and that the
shipped JSON Schema accepts exactly the lines the parser accepts."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import ValidationError

from worker.errors import WorkerError
from worker.replay import script as fmt
from worker.replay.script import Entry, Header, Malformed, Step, parse

ROOT = Path(__file__).resolve().parents[2]


def _parse(text: str, base: Path | None = None, run_label: str = "") -> fmt.Script:
    return parse(text, base=base or Path("/nonexistent"), run_label=run_label)


def test_comments_and_blank_lines_are_skipped_and_line_numbers_kept() -> None:
    script = _parse('# a comment\n\n   # indented\n{"action": "fs_stat", "args": {"path": "."}}\n')
    (entry,) = script.entries
    assert entry.line == 4 and entry.index == 1


def test_a_script_without_a_header_reads_as_the_current_version() -> None:
    script = _parse('{"action": "fs_stat", "args": {"path": "."}}')
    assert script.header.agentworker_replay == fmt.FORMAT_VERSION


def test_the_header_gives_defaults_that_a_step_may_override() -> None:
    script = _parse(
        '{"agentworker_replay": 1, "agent": "me", "plan": "p1"}\n'
        '{"action": "fs_stat", "args": {"path": "."}}\n'
        '{"action": "fs_stat", "args": {"path": "."}, "agent": "other", "plan": ""}\n'
    )
    first, second = script.entries
    assert (first.agent, first.plan) == ("me", "p1")
    assert (second.agent, second.plan) == ("other", "")


def test_a_script_for_a_newer_format_is_refused_as_a_whole() -> None:
    with pytest.raises(WorkerError, match="format 2") as caught:
        _parse('{"agentworker_replay": 2}\n{"action": "fs_stat"}')
    assert caught.value.code == "not_supported"


def test_a_header_after_the_first_step_is_a_malformed_line() -> None:
    script = _parse('{"action": "fs_stat", "args": {"path": "."}}\n{"agentworker_replay": 1}\n')
    (bad,) = script.malformed
    assert bad.line == 2 and "first line" in bad.problems[0]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "line"),
        ('{"args": {}}', "action"),
        ('{"action": "fs_stat", "arg": {}}', "arg"),
        ('{"action": "fs_stat", "wait_ms": "5"}', "wait_ms"),
        ('{"action": "fs_stat", "expect": {"status": "fine"}}', "expect.status"),
        ('{"action": "fs_stat", "expect": {"error_code": "oops"}}', "expect.error_code"),
        ('{"action": "fs_stat", "expect": {"status": "ok", "error_code": "busy"}}', "ok status"),
        ('{"action": "fs_stat", "expect": {"blob_sha256": "abc"}}', "blob_sha256"),
        ('{"action": "fs_stat", "blob": "../secret"}', "relative path inside"),
        ('{"action": "fs_stat", "blob": "/etc/passwd"}', "relative path inside"),
        ('{"action": "fs_stat", "blob": "missing.bin"}', "cannot read"),
    ],
)
def test_a_malformed_line_says_why_with_its_line_number(line: str, problem: str) -> None:
    script = _parse(f'# header comment\n{{"action": "fs_stat", "args": {{"path": "."}}}}\n{line}\n')
    assert [e.line for e in script.entries] == [2]
    (bad,) = script.malformed
    assert bad.line == 3 and bad.index == 2
    assert any(problem in p for p in bad.problems), bad.problems


def test_a_blob_is_read_relative_to_the_script(tmp_path: Path) -> None:
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "in.txt").write_bytes(b"hello")
    script = _parse(
        '{"action": "fs_write", "args": {"path": "a"}, "blob": "files/in.txt"}', tmp_path
    )
    (entry,) = script.entries
    assert entry.read_blob() == b"hello"


SCRIPT = "\n".join(
    json.dumps({"action": "fs_stat", "args": {"path": name}}) for name in ("a", "b", "c", "d")
)


def _ids(script: fmt.Script) -> list[str]:
    return [e.correlation_id for e in script.entries]


def test_the_same_script_gives_the_same_step_ids_every_time() -> None:
    ids = _ids(_parse(SCRIPT))
    assert ids == _ids(_parse(SCRIPT))
    assert len(set(ids)) == 4 and all(cid.startswith("replay-") for cid in ids)


def test_changing_a_step_changes_its_id_and_the_later_ones_only() -> None:
    before = _ids(_parse(SCRIPT))
    after = _ids(_parse(SCRIPT.replace('"c"', '"C"')))
    assert after[:2] == before[:2]
    assert after[2] != before[2] and after[3] != before[3]


def test_an_expectation_or_a_pause_is_not_part_of_a_steps_id() -> None:
    edited = SCRIPT.replace(
        '{"path": "b"}}', '{"path": "b"}, "wait_ms": 5, "expect": {"status": "error"}}'
    )
    assert _ids(_parse(edited)) == _ids(_parse(SCRIPT))


def test_a_run_label_gives_every_step_a_new_id() -> None:
    plain, labelled = _ids(_parse(SCRIPT)), _ids(_parse(SCRIPT, run_label="again"))
    assert not set(plain) & set(labelled)


def test_a_blobs_content_is_part_of_its_steps_id(tmp_path: Path) -> None:
    line = '{"action": "fs_write", "args": {"path": "a"}, "blob": "in.bin"}'
    (tmp_path / "in.bin").write_bytes(b"one")
    first = _ids(_parse(line, tmp_path))
    (tmp_path / "in.bin").write_bytes(b"two")
    assert _ids(_parse(line, tmp_path)) != first


# ----------------------------------------------------------------- the schema


def test_the_shipped_schema_is_the_one_the_models_make() -> None:
    assert fmt.shipped_schema() == fmt.line_schema(), (
        "worker/replay/script.schema.json is stale: regenerate it with\n"
        "  .venv/bin/agentworker replay --schema > worker/replay/script.schema.json"
    )


def test_the_shipped_schema_is_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(fmt.shipped_schema())


VALID_LINES: list[dict[str, Any]] = [
    {"agentworker_replay": 1},
    {"agentworker_replay": 1, "agent": "me", "plan": "p", "task": "t", "note": "demo"},
    {"action": "fs_stat"},
    {"action": "workerHost.fs_stat", "args": {"path": "."}},
    {"action": "workerDiag.probe", "args": {"sleep_ms": 1}, "wait_ms": 0, "timeout_ms": 5},
    {"action": "fs_write", "args": {}, "blob": "a/b.txt", "note": "x"},
    {"action": "exec", "expect": {"exit_code": 0, "status": "ok"}},
    {"action": "fs_read", "expect": {"blob_sha256": "0" * 64, "result": {"eof": True}}},
    {"action": "fs_stat", "expect": {"error_code": "not_found"}},
    {"action": "fs_stat", "expect": {"status": "error", "error_code": "scope_required"}},
    {"action": "fs_stat", "expect": {}},
    {"action": "fs_stat", "plan": None, "expect": None},
]

INVALID_LINES: list[Any] = [
    {},
    [],
    "fs_stat",
    {"action": ""},
    {"action": "fs stat"},
    {"action": 5},
    {"action": "fs_stat", "args": []},
    {"action": "fs_stat", "args": "{}"},
    {"action": "fs_stat", "unknown": 1},
    {"action": "fs_stat", "wait_ms": -1},
    {"action": "fs_stat", "wait_ms": 1.5},
    {"action": "fs_stat", "wait_ms": True},
    {"action": "fs_stat", "timeout_ms": 0},
    {"action": "fs_stat", "blob": ""},
    {"action": "fs_stat", "plan": 7},
    {"action": "fs_stat", "expect": {"status": "OK"}},
    {"action": "fs_stat", "expect": {"error_code": "nope"}},
    {"action": "fs_stat", "expect": {"exit_code": "0"}},
    {"action": "fs_stat", "expect": {"exit_code": False}},
    {"action": "fs_stat", "expect": {"blob_sha256": "A" * 64}},
    {"action": "fs_stat", "expect": {"result": [1]}},
    {"action": "fs_stat", "expect": {"stdout": "x"}},
    {"agentworker_replay": 0},
    {"agentworker_replay": "1"},
    {"agentworker_replay": 1, "action": "fs_stat"},
    {"agentworker_replay": 1, "extra": True},
]


def _parser_accepts(value: Any) -> bool:
    raw = json.dumps(value)
    try:
        if isinstance(value, dict) and fmt.HEADER_KEY in value:
            Header.model_validate_json(raw)
        else:
            Step.model_validate_json(raw)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("line", VALID_LINES + INVALID_LINES, ids=json.dumps)
def test_the_schema_and_the_parser_agree_on_a_line(line: Any) -> None:
    validator = jsonschema.Draft202012Validator(fmt.shipped_schema())
    expected = line in VALID_LINES
    assert validator.is_valid(line) is expected, list(validator.iter_errors(line))
    assert _parser_accepts(line) is expected


def test_the_documented_example_scripts_parse_and_match_the_schema() -> None:
    """Every script in docs/replay/ is a good example: no malformed line, every line valid."""
    validator = jsonschema.Draft202012Validator(fmt.shipped_schema())
    scripts = sorted((ROOT / "docs" / "replay").glob("*.jsonl"))
    assert scripts, "docs/replay/ holds the worked example"
    for path in scripts:
        parsed = fmt.load(path)
        assert parsed.malformed == [], (path, parsed.malformed)
        for raw in path.read_text().splitlines():
            if not fmt.is_comment(raw):
                assert validator.is_valid(json.loads(raw)), (path, raw)


def test_entries_and_malformed_lines_keep_script_order() -> None:
    script = _parse('{"action": "fs_stat"}\nnot json\n{"action": "fs_list"}\n')
    kinds = [type(item) for item in script.items]
    assert kinds == [Entry, Malformed, Entry]
    assert [item.index for item in script.items] == [1, 2, 3]


# --- a script from someone else: its blobs stay in its folder -------------------------


def _one_blob(folder: Path, name: str) -> fmt.Script:
    line = json.dumps({"action": "fs_write", "args": {"path": "a"}, "blob": name})
    return parse(line + "\n", base=folder)


def _refused(script: fmt.Script, problem: str) -> None:
    assert script.entries == []
    (bad,) = script.malformed
    assert bad.line == 1 and any(problem in p for p in bad.problems), bad.problems


def test_a_blob_that_is_a_link_or_behind_one_leading_out_is_refused(tmp_path: Path) -> None:
    """`notes.txt -> ~/.ssh/id_ed25519` in a folder of recorded plans copied the key
    into the workspace at replay."""
    key = tmp_path / "ssh" / "id_ed25519"
    key.parent.mkdir()
    key.write_text("PRIVATE KEY")
    plans = tmp_path / "plans"
    (plans / "inside").mkdir(parents=True)
    (plans / "inside" / "real.txt").write_text("fine")
    (plans / "notes.txt").symlink_to(key)
    (plans / "ssh").symlink_to(key.parent)
    (plans / "alias.txt").symlink_to("inside/real.txt")  # inside, but a link all the same
    _refused(_one_blob(plans, "notes.txt"), "symbolic link")
    _refused(_one_blob(plans, "ssh/id_ed25519"), "outside")
    _refused(_one_blob(plans, "alias.txt"), "symbolic link")
    (entry,) = _one_blob(plans, "inside/real.txt").entries
    assert entry.read_blob() == b"fine"


def test_a_blob_swapped_for_a_link_after_the_script_was_read_is_refused(tmp_path: Path) -> None:
    key = tmp_path / "id_ed25519"
    key.write_text("PRIVATE KEY")
    plans = tmp_path / "plans"
    plans.mkdir()
    (plans / "notes.txt").write_text("notes")
    (entry,) = _one_blob(plans, "notes.txt").entries
    (plans / "notes.txt").unlink()
    (plans / "notes.txt").symlink_to(key)
    with pytest.raises(fmt.BlobError, match="symbolic link"):
        entry.read_blob()


def test_a_blob_that_is_not_a_regular_file_is_refused_unopened(tmp_path: Path) -> None:
    """A FIFO blob blocked the parse (and so a dry run) until something wrote to it."""
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "folder").mkdir()
    _refused(_one_blob(tmp_path, "pipe"), "not a regular file")
    _refused(_one_blob(tmp_path, "folder"), "not a regular file")


def test_a_blob_larger_than_an_fs_write_is_refused(tmp_path: Path) -> None:
    with (tmp_path / "big.bin").open("wb") as big:  # sparse: no 16 MiB written
        big.truncate(fmt.BLOB_BYTES + 1)
    _refused(_one_blob(tmp_path, "big.bin"), f"at most {fmt.BLOB_BYTES:,}")


def test_a_line_nested_too_deeply_is_a_malformed_line() -> None:
    deep = "[" * 200_000
    script = _parse(f'{{"action": "fs_stat", "args": {{"path": "."}}}}\n{deep}\n')
    assert [e.line for e in script.entries] == [1]
    (bad,) = script.malformed
    assert bad.line == 2 and bad.action == "?" and "nested too deeply" in bad.problems[0]


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u0085", "\v", "\f", "\x1c"])
def test_a_line_holding_a_unicode_line_separator_stays_one_step(separator: str) -> None:
    # `agentworker record` writes JSON with ensure_ascii=False: a file's text holding
    # U+2028 (minified JavaScript) lands in the line as it is (review25 G3).
    line = json.dumps(
        {"action": "fs_write", "args": {"path": f"a{separator}b"}}, ensure_ascii=False
    )
    script = _parse(line + "\r\n" + '{"action": "fs_stat", "args": {"path": "."}}\n')
    first, second = script.entries
    assert isinstance(first, Entry) and first.step.args == {"path": f"a{separator}b"}
    assert (first.line, second.line) == (1, 2)
    assert not script.malformed
