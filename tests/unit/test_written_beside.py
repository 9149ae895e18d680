"""`agentworker record -o FILE` writes its script and blobs where an agent may have
planted links (review25 G4): nothing is ever written through one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from worker.cli._written_beside import LinkedError, replacing, write_beside

BLOBS = {"s.blobs/step-1.bin": b"the agent's bytes", "s.blobs/step-2.bin": b"more"}


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "outside" / "bashrc"
    victim.parent.mkdir()
    victim.write_text("# the person's file\n")
    return victim


def test_the_script_and_its_blobs_are_written_beside_each_other(tmp_path: Path) -> None:
    write_beside(tmp_path / "s.jsonl", "line\n", BLOBS)
    assert (tmp_path / "s.jsonl").read_text() == "line\n"
    assert (tmp_path / "s.blobs/step-1.bin").read_bytes() == b"the agent's bytes"
    assert sorted(os.listdir(tmp_path / "s.blobs")) == ["step-1.bin", "step-2.bin"]


def test_a_blob_name_planted_as_a_link_is_replaced_not_written_through(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    (tmp_path / "s.blobs").mkdir()
    (tmp_path / "s.blobs/step-1.bin").symlink_to(victim)
    write_beside(tmp_path / "s.jsonl", "line\n", BLOBS)
    assert victim.read_text() == "# the person's file\n"
    blob = tmp_path / "s.blobs/step-1.bin"
    assert not blob.is_symlink() and blob.read_bytes() == b"the agent's bytes"


def test_a_script_name_planted_as_a_link_is_replaced_not_written_through(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    (tmp_path / "s.jsonl").symlink_to(victim)
    write_beside(tmp_path / "s.jsonl", "line\n", {})
    assert victim.read_text() == "# the person's file\n"
    assert not (tmp_path / "s.jsonl").is_symlink()


def test_a_blobs_folder_planted_as_a_link_is_refused_and_nothing_written(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    (tmp_path / "s.blobs").symlink_to(victim.parent)
    with pytest.raises(LinkedError, match="symbolic link"):
        write_beside(tmp_path / "s.jsonl", "line\n", BLOBS)
    assert os.listdir(victim.parent) == ["bashrc"]
    assert not (tmp_path / "s.jsonl").exists()


def test_a_failed_write_leaves_no_temporary_file(tmp_path: Path) -> None:
    (tmp_path / "s.blobs").mkdir()
    (tmp_path / "s.blobs/step-1.bin").mkdir()  # a folder: the rename over it fails
    with pytest.raises(OSError):
        write_beside(tmp_path / "s.jsonl", "line\n", BLOBS)
    assert os.listdir(tmp_path / "s.blobs") == ["step-1.bin"]


def test_an_export_replaces_a_planted_link_and_a_failed_one_leaves_the_old_file(
    tmp_path: Path,
) -> None:
    victim = _victim(tmp_path)
    (tmp_path / "rows.csv").symlink_to(victim)
    with replacing(tmp_path / "rows.csv") as out:
        out.write("a,b\n")
    assert victim.read_text() == "# the person's file\n"
    assert (tmp_path / "rows.csv").read_text() == "a,b\n"
    with pytest.raises(RuntimeError), replacing(tmp_path / "rows.csv") as out:
        out.write("half")
        raise RuntimeError("the export failed")
    assert (tmp_path / "rows.csv").read_text() == "a,b\n"
    assert sorted(os.listdir(tmp_path)) == ["outside", "rows.csv"]
