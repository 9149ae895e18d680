"""The ledger's folder of large result blobs: a link planted where it belongs is never
followed, the sweep removes only files of its own making, and a file that cannot be
read answers `blob_gone` rather than breaking the stream."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from worker.core.blob_files import file_name
from worker.core.ledger import FILE_BLOB_BYTES, Seen, State

BIG = b"r" * FILE_BLOB_BYTES
DIGEST = "blake3:" + "ab" * 32


def _finished(state: State, cid: str) -> None:
    assert state.begin(cid, DIGEST, "p").seen is Seen.NEW
    state.finish(cid, b"result", BIG)


def test_a_link_where_the_folder_belongs_is_never_followed(tmp_path: Path) -> None:
    """Planted by a program in a shared folder that holds the data folder, the link
    would have the worker lock down, fill and later sweep a folder of the person's."""
    victim = tmp_path / "Documents"
    victim.mkdir(mode=0o755)
    (victim / "thesis.tex").write_text("years of work")
    (tmp_path / "state.db-blobs").symlink_to(victim)

    state = State(tmp_path / "state.db")
    _finished(state, "big")
    again = state.begin("big", DIGEST, "p")  # answered from the database instead
    assert again.seen is Seen.DONE and again.blob == BIG
    assert [u.blob for u in state.unacked_results()] == [BIG]
    assert state.sweep_blob_files() == 0
    state.close()

    assert os.listdir(victim) == ["thesis.tex"]
    assert stat.S_IMODE(victim.stat().st_mode) == 0o755


def test_the_sweep_removes_only_files_of_its_own_making(tmp_path: Path) -> None:
    state = State(tmp_path / "state.db")
    _finished(state, "kept")  # unacked: its file stays
    folder = tmp_path / "state.db-blobs"
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("not ours")
    (folder / "notes.txt").write_text("not ours either")
    (folder / file_name("a-folder")).mkdir()
    (folder / file_name("a-link")).symlink_to(elsewhere)
    orphan = folder / file_name("never-committed")
    orphan.write_bytes(b"x")

    assert state.sweep_blob_files() == 1 and not orphan.exists()
    left = sorted(os.listdir(folder))
    assert left == sorted(
        [file_name("kept"), "notes.txt", file_name("a-folder"), file_name("a-link")]
    )
    assert elsewhere.read_text() == "not ours"
    state.close()


def test_a_blob_file_that_cannot_be_read_is_gone_not_an_error(tmp_path: Path) -> None:
    state = State(tmp_path / "state.db")
    _finished(state, "big")
    path = state.blob_path("big")
    path.unlink()
    path.mkdir()  # what no read can make sense of (EISDIR), as EACCES or EIO
    seen = state.begin("big", DIGEST, "p")
    assert seen.seen is Seen.DONE and seen.blob_gone
    assert [u.blob for u in state.unacked_results()] == [None]  # re-sent as blob_gone
    state.close()


@pytest.mark.timeout(30)
def test_a_fifo_in_a_blob_files_place_is_gone_not_a_hang(tmp_path: Path) -> None:
    state = State(tmp_path / "state.db")
    _finished(state, "big")
    path = state.blob_path("big")
    path.unlink()
    os.mkfifo(path)  # an open for reading would wait for a writer for ever
    assert state.begin("big", DIGEST, "p").blob_gone
    state.close()
