"""file_kind() names what a stat result describes."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from sandbox import file_kind


def test_common_kinds(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    (tmp_path / "d").mkdir()
    (tmp_path / "l").symlink_to("f")
    os.mkfifo(tmp_path / "p")
    assert file_kind(os.lstat(tmp_path / "f")) == "file"
    assert file_kind(os.lstat(tmp_path / "d")) == "directory"
    assert file_kind(os.lstat(tmp_path / "l")) == "symlink"
    assert file_kind(os.stat(tmp_path / "l")) == "file"
    assert file_kind(os.lstat(tmp_path / "p")) == "fifo"


def test_socket(tmp_path: Path) -> None:
    path = tmp_path / "s"
    if len(os.fsencode(path)) >= 108:
        pytest.skip("temporary path too long for a unix socket")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        assert file_kind(os.lstat(path)) == "socket"


def test_devices() -> None:
    assert file_kind(os.stat("/dev/null")) == "char_device"
    with os.scandir("/dev") as entries:
        blocks = [e.path for e in entries if stat.S_ISBLK(e.stat(follow_symlinks=False).st_mode)]
    if not blocks:
        pytest.skip("no block device visible")
    assert file_kind(os.stat(blocks[0])) == "block_device"


def test_anything_else_is_other() -> None:
    assert file_kind(os.stat_result((0,) * 10)) == "other"
