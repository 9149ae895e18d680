"""fs_write through the real hub and worker: modes, the 16 MiB cap, atomic replace."""

from __future__ import annotations

import hashlib
import os
import resource
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox import ConfinedDir
from sandbox._leftovers import temp_name
from tests.sandbox.support import crash_mid_write
from tests.support.cluster import Cluster, cluster
from tests.support.host_calls import call, error_code, shared_cluster

MIB = 1024 * 1024
CAP = 16 * MIB


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("write")
    (base / "readonly").mkdir()
    (base / "readonly" / "kept.txt").write_text("read me\n")
    extra = f'[[root]]\npath = "{base / "readonly"}"\nmode = "ro"\n'
    with shared_cluster(base / "home", extra_config=extra) as c:
        yield c


def write(live: Cluster, path: str, data: bytes, **args: object) -> tuple[dict[str, object], bytes]:
    return call(live, "fs_write", {"path": path, **args}, data)


def test_create_makes_a_new_file_and_refuses_an_existing_one(live: Cluster, box: Path) -> None:
    out, _ = write(live, f"{box.name}/new.txt", b"hello\n")
    assert out["status"] == "ok", out
    assert out["result"] == {
        "path": f"{box.name}/new.txt",
        "mode": "create",
        "bytes_written": 6,
        "sha256": hashlib.sha256(b"hello\n").hexdigest(),
        "size": 6,
        "created": True,
    }
    again, _ = write(live, f"{box.name}/new.txt", b"other\n")
    assert error_code(again) == "already_exists"
    assert "overwrite" in again["error"]["message"]
    assert (box / "new.txt").read_bytes() == b"hello\n"


def test_overwrite_replaces_and_keeps_permissions(live: Cluster, box: Path) -> None:
    (box / "f").write_bytes(b"old content that is longer\n")
    (box / "f").chmod(0o640)
    out, _ = write(live, f"{box.name}/f", b"new\n", mode="overwrite")
    assert out["result"]["created"] is False and out["result"]["size"] == 4
    assert (box / "f").read_bytes() == b"new\n"
    assert stat.S_IMODE((box / "f").stat().st_mode) == 0o640
    out, _ = write(live, f"{box.name}/missing", b"made\n", mode="overwrite")
    assert out["result"]["created"] is True


def test_append_adds_at_the_end(live: Cluster, box: Path) -> None:
    for line in (b"one\n", b"two\n"):
        out, _ = write(live, f"{box.name}/log", line, mode="append")
        assert out["status"] == "ok"
    assert (box / "log").read_bytes() == b"one\ntwo\n"
    assert (
        out["result"]["size"] == 8
        and out["result"]["sha256"] == hashlib.sha256(b"two\n").hexdigest()
    )


def test_missing_folders_only_on_request(live: Cluster, box: Path) -> None:
    out, _ = write(live, f"{box.name}/a/b/c.txt", b"x")
    assert error_code(out) == "not_found"
    assert "make_parents" in out["error"]["message"]
    out, _ = write(live, f"{box.name}/a/b/c.txt", b"x", make_parents=True)
    assert out["status"] == "ok"
    assert (box / "a" / "b" / "c.txt").read_bytes() == b"x"


def test_an_empty_blob_makes_an_empty_file(live: Cluster, box: Path) -> None:
    out, _ = write(live, f"{box.name}/empty", b"")
    assert out["status"] == "ok" and (box / "empty").read_bytes() == b""


def test_sixteen_mib_exactly_is_written(live: Cluster, box: Path) -> None:
    data = os.urandom(CAP)
    out, _ = write(live, f"{box.name}/big", data)
    assert out["status"] == "ok", out
    assert out["result"]["bytes_written"] == CAP
    assert out["result"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert (box / "big").read_bytes() == data


def test_a_blob_given_as_a_view_is_written_as_it_is(live: Cluster, box: Path) -> None:
    # A caller may hand ControlClient a view of its own buffer (no bytes made of it
    # first); the request carries the view's bytes, and only those.
    buffer = bytearray(os.urandom(3 * MIB))
    view = memoryview(buffer)[1:-1]
    out, _ = write(live, f"{box.name}/viewed", view)  # type: ignore[arg-type]
    assert out["status"] == "ok", out
    assert (box / "viewed").read_bytes() == bytes(view)
    assert out["result"]["sha256"] == hashlib.sha256(view).hexdigest()


def test_one_byte_over_sixteen_mib_is_too_large(live: Cluster, box: Path) -> None:
    out, _ = write(live, f"{box.name}/big", bytes(CAP + 1))
    assert error_code(out) == "too_large", out
    assert out["error"]["details"] == {"bytes": CAP + 1, "limit": CAP}
    assert "append" in out["error"]["message"], "the message says how to write more"
    assert not (box / "big").exists()


@pytest.mark.parametrize("mode", ["create", "overwrite", "append"])
def test_a_planted_symlink_is_never_written_through(live: Cluster, box: Path, mode: str) -> None:
    target = box.parent.parent / "victim.txt"  # beside the workspace: outside every root
    (box / "link").symlink_to(target)
    (box / "inner").symlink_to("kept.txt")
    (box / "kept.txt").write_bytes(b"kept\n")
    for link in ("link", "inner"):
        out, _ = write(live, f"{box.name}/{link}", b"pwned", mode=mode)
        assert error_code(out) == "path_not_allowed", out
        assert "symbolic link" in out["error"]["message"]
    assert not target.exists()
    assert (box / "kept.txt").read_bytes() == b"kept\n"
    assert (box / "link").is_symlink() and (box / "inner").is_symlink()


def test_a_read_only_root_can_be_read_but_not_written(live: Cluster) -> None:
    ro = live.home.parent / "readonly"
    out, blob = call(live, "fs_read", {"path": str(ro / "kept.txt")})
    assert out["status"] == "ok" and blob == b"read me\n"
    for mode in ("create", "overwrite", "append"):
        out, _ = write(live, str(ro / "kept.txt"), b"changed", mode=mode)
        assert error_code(out) == "path_not_allowed", out
        assert 'mode = "rw"' in out["error"]["message"], "the message says how to allow it"
    out, _ = write(live, str(ro / "new.txt"), b"x")
    assert error_code(out) == "path_not_allowed"
    assert sorted(os.listdir(ro)) == ["kept.txt"]
    assert (ro / "kept.txt").read_text() == "read me\n"


def test_folders_and_the_root_itself_are_not_files(live: Cluster, box: Path) -> None:
    (box / "sub").mkdir()
    out, _ = write(live, f"{box.name}/sub", b"x", mode="overwrite")
    assert error_code(out) == "is_directory"
    out, _ = write(live, ".", b"x", mode="overwrite")
    assert error_code(out) == "path_not_allowed"
    os.mkfifo(box / "fifo")
    args = {"path": f"{box.name}/fifo", "mode": "append"}
    out, _ = call(live, "fs_write", args, b"x", timeout_ms=10_000)
    assert error_code(out) == "not_supported"


def test_readers_see_the_old_file_or_the_new_one_never_half(live: Cluster, box: Path) -> None:
    size = 4 * MIB
    versions = [b"A" * size, b"B" * size]
    (box / "f").write_bytes(versions[0])
    stop = threading.Event()
    seen: set[bytes] = set()

    def watch() -> None:
        while not stop.is_set():
            data = (box / "f").read_bytes()
            seen.add(data[:1] + data[-1:] if len(data) == size and len(set(data)) == 1 else b"torn")

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for i in range(12):
            out, _ = write(live, f"{box.name}/f", versions[(i + 1) % 2], mode="overwrite")
            assert out["status"] == "ok"
    finally:
        stop.set()
        watcher.join()
    assert seen == {b"AA", b"BB"}, seen  # both versions seen, and never a torn one
    assert leftovers(box) == []


def leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.endswith(".agentworker-tmp")]


def test_a_write_failing_part_way_leaves_the_old_content_whole(tmp_path: Path) -> None:
    """The worker's file size limit is lowered to 4 MiB and 8 MiB are written: the
    kernel stops the write half way (EFBIG). The old file stays whole, and the
    half-written temporary file is removed. (sandbox/test_files.py kills a writer
    mid-write outright.)"""
    old = b"precious\n" * 100_000
    with cluster(tmp_path / "home") as live:
        (live.workspace / "precious").write_bytes(old)
        worker = next(p for p in live.procs if p.name == "worker")
        resource.prlimit(worker.pid, resource.RLIMIT_FSIZE, (4 * MIB, 4 * MIB))
        out, _ = write(live, "precious", b"N" * (8 * MIB), mode="overwrite")
        assert error_code(out) == "too_large", out
        assert "'precious'" in out["error"]["message"]
        assert (live.workspace / "precious").read_bytes() == old
        assert leftovers(live.workspace) == []


def test_a_crashed_writes_temporary_file_is_swept_by_the_next_write(
    live: Cluster, box: Path
) -> None:
    """A write killed part-way (a real crash of the same code, in a child) leaves its
    temporary file; the worker's next write in that folder removes it once it is
    stale, and leaves a fresh one (perhaps a write in progress) and the person's
    look-alike files alone."""
    (box / "precious").write_bytes(b"old\n")
    with ConfinedDir(box) as root:
        crash_mid_write(root, "precious")
    [stale] = leftovers(box)
    hour_ago = time.time() - 3600
    os.utime(box / stale, (hour_ago, hour_ago))
    fresh = box / temp_name("other")
    fresh.write_bytes(b"being written")
    mine = box / "my.12345678.agentworker-tmp"
    mine.write_bytes(b"a person's file")
    os.utime(mine, (hour_ago, hour_ago))
    out, _ = write(live, f"{box.name}/new.txt", b"x")
    assert out["status"] == "ok", out
    assert sorted(leftovers(box)) == sorted([fresh.name, mine.name])
    assert (box / "precious").read_bytes() == b"old\n"


def test_a_read_only_folder_shared_inside_the_workspace_stays_read_only(tmp_path: Path) -> None:
    """Neither a relative path nor a symbolic link in the read-write workspace writes
    into a read-only root nested in it."""
    home = tmp_path / "home"
    docs = home / "workspace" / "docs"
    extra = f'[[root]]\npath = "{docs}"\nmode = "ro"\n'
    docs.mkdir(parents=True)
    (docs / "kept.txt").write_text("read me\n")
    with shared_cluster(home, extra_config=extra) as live:
        assert live.workspace / "docs" == docs
        (live.workspace / "to-docs").symlink_to("docs")
        for path in ("docs/kept.txt", "docs/new.txt", "to-docs/kept.txt", "to-docs/new.txt"):
            for mode in ("create", "overwrite", "append"):
                out, _ = write(live, path, b"changed", mode=mode)
                assert error_code(out) == "path_not_allowed", (path, mode, out)
        out, _ = write(live, "elsewhere.txt", b"fine")
        assert out["status"] == "ok"
    assert sorted(os.listdir(docs)) == ["kept.txt"]
    assert (docs / "kept.txt").read_text() == "read me\n"


def test_make_parents_creates_no_folder_inside_a_nested_read_only_root(tmp_path: Path) -> None:
    """A symbolic link in the workspace into a read-only root nested in it: the missing
    folders a write would need there are refused, not created."""
    home = tmp_path / "home"
    docs = home / "workspace" / "docs"
    extra = f'[[root]]\npath = "{docs}"\nmode = "ro"\n'
    docs.mkdir(parents=True)
    with shared_cluster(home, extra_config=extra) as live:
        (live.workspace / "to-docs").symlink_to("docs")
        out, _ = write(live, "to-docs/new/deeper/f.txt", b"x", make_parents=True)
        assert error_code(out) == "path_not_allowed", out
        out, _ = write(live, "fresh/deeper/f.txt", b"x", make_parents=True)
        assert out["status"] == "ok", out
    assert os.listdir(docs) == []
