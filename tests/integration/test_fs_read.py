"""fs_read through the real hub and worker: pages, caps, and files that are not files."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import Cluster
from tests.support.host_calls import call, error_code, shared_cluster

MIB = 1024 * 1024

# /dev is shared read-only so its devices can be named; they must still never be read.
DEV_ROOT = '[[root]]\npath = "/dev"\nmode = "ro"\n'


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with shared_cluster(tmp_path_factory.mktemp("read") / "home", extra_config=DEV_ROOT) as c:
        yield c


def read(live: Cluster, path: str, **args: object) -> tuple[dict[str, object], bytes]:
    out, blob = call(live, "fs_read", {"path": path, **args})
    assert out["status"] == "ok", out
    return out["result"], blob  # type: ignore[return-value]


def pattern(size: int) -> bytes:
    return bytes(i % 251 for i in range(size))


def test_reads_a_small_file_whole(live: Cluster, box: Path) -> None:
    (box / "f").write_bytes(pattern(3000))
    result, blob = read(live, f"{box.name}/f")
    assert blob == pattern(3000)
    assert result["size"] == 3000 and result["length"] == 3000 and result["next_offset"] == 3000
    assert result["eof"] is True and result["truncated"] is False


def test_a_big_file_is_read_in_pages_of_at_most_one_mib(live: Cluster, box: Path) -> None:
    data = pattern(5 * MIB // 2)
    (box / "big").write_bytes(data)
    out, first = call(live, "fs_read", {"path": f"{box.name}/big"})
    assert len(first) == MIB
    assert out["result"]["truncated"] is True and out["result"]["eof"] is False
    assert out["invocation"]["truncated"] is True, "telemetry records the cut"
    pages, offset, eof = [first], out["result"]["next_offset"], False
    while not eof:
        result, blob = read(live, f"{box.name}/big", offset=offset)
        pages.append(blob)
        offset, eof = result["next_offset"], result["eof"]
    assert b"".join(pages) == data
    # An explicit length is honoured exactly, and is not a truncation.
    result, blob = read(live, f"{box.name}/big", offset=10, length=100)
    assert blob == data[10:110] and result["truncated"] is False and result["eof"] is False


@pytest.mark.parametrize(
    "args", [{"length": MIB + 1}, {"offset": -1}, {"length": -5}, {"encoding": "utf-7"}]
)
def test_out_of_range_paging_is_a_validation_error(
    live: Cluster, box: Path, args: dict[str, object]
) -> None:
    (box / "f").write_bytes(b"x")
    out, _ = call(live, "fs_read", {"path": f"{box.name}/f", **args})
    assert error_code(out) == "validation_error"


def test_text_pages_never_split_a_character(live: Cluster, box: Path) -> None:
    text = "naïve café — 日本語 ✓ " * 50
    (box / "t.txt").write_text(text, encoding="utf-8")
    pieces, offset, eof = [], 0, False
    while not eof:
        result, blob = read(live, f"{box.name}/t.txt", offset=offset, length=7, encoding="utf-8")
        assert blob == b"", "decoded text travels in the result, not the blob"
        assert "\ufffd" not in result["text"]
        pieces.append(result["text"])
        offset, eof = result["next_offset"], result["eof"]
    assert "".join(pieces) == text


def test_undecodable_bytes_become_replacement_characters(live: Cluster, box: Path) -> None:
    (box / "bad.txt").write_bytes(b"ok \xff\xfe end")
    result, _ = read(live, f"{box.name}/bad.txt", encoding="utf-8")
    assert result["text"] == "ok \ufffd\ufffd end"
    result, _ = read(live, f"{box.name}/bad.txt", encoding="latin-1")
    assert result["text"] == "ok ÿþ end"


def test_a_fifo_answers_at_once_and_never_hangs(live: Cluster, box: Path) -> None:
    os.mkfifo(box / "fifo")  # no writer: a blocking open would wait forever
    started = time.monotonic()
    out, _ = call(live, "fs_read", {"path": f"{box.name}/fifo"}, timeout_ms=10_000)
    assert error_code(out) == "not_supported", out
    assert "fifo" in out["error"]["message"]
    assert time.monotonic() - started < 5


def test_devices_are_refused_even_inside_a_root(live: Cluster, box: Path) -> None:
    for device in ("/dev/zero", "/dev/null", "/dev/urandom"):
        out, blob = call(live, "fs_read", {"path": device}, timeout_ms=10_000)
        assert error_code(out) == "not_supported", out
        assert "char device" in out["error"]["message"] and blob == b""
    (box / "zero").symlink_to("/dev/zero")  # from the workspace, /dev is another root
    out, _ = call(live, "fs_read", {"path": f"{box.name}/zero"})
    assert error_code(out) == "path_not_allowed"


def test_a_socket_is_refused(live: Cluster, box: Path) -> None:
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(box / "sock"))
        server.listen(1)
        out, _ = call(live, "fs_read", {"path": f"{box.name}/sock"})
    assert error_code(out) == "not_supported"
    assert "socket" in out["error"]["message"]


def test_a_folder_is_refused(live: Cluster, box: Path) -> None:
    out, _ = call(live, "fs_read", {"path": box.name})
    assert error_code(out) == "is_directory"
    assert "List it" in out["error"]["message"]


def test_missing_file_is_not_found(live: Cluster, box: Path) -> None:
    out, _ = call(live, "fs_read", {"path": f"{box.name}/nope"})
    assert error_code(out) == "not_found"


def test_a_sparse_terabyte_file_costs_one_capped_page(live: Cluster, box: Path) -> None:
    tera = 1 << 40
    with (box / "sparse").open("wb") as f:
        f.truncate(tera)
    started = time.monotonic()
    result, blob = read(live, f"{box.name}/sparse")
    assert blob == bytes(MIB) and result["size"] == tera
    assert result["truncated"] is True and result["eof"] is False
    result, blob = read(live, f"{box.name}/sparse", offset=tera - 5)
    assert blob == bytes(5) and result["eof"] is True
    result, blob = read(live, f"{box.name}/sparse", offset=2 * tera)
    assert blob == b"" and result["eof"] is True and result["length"] == 0
    assert time.monotonic() - started < 10


def test_a_file_growing_while_read_is_paged_consistently(live: Cluster, box: Path) -> None:
    stream = pattern(3 * MIB)
    path = box / "growing"
    path.write_bytes(b"")
    done = threading.Event()

    def grow() -> None:
        with path.open("ab", buffering=0) as f:
            for start in range(0, len(stream), 16384):
                f.write(stream[start : start + 16384])
                time.sleep(0.001)
        done.set()

    writer = threading.Thread(target=grow)
    writer.start()
    pages: list[bytes] = []
    offset = 0
    try:
        while True:
            result, blob = read(live, f"{box.name}/growing", offset=offset, length=64 * 1024)
            assert len(blob) <= 64 * 1024
            assert result["size"] >= offset + len(blob)
            pages.append(blob)
            offset = result["next_offset"]
            if done.is_set() and result["eof"] and offset == len(stream):
                break
    finally:
        writer.join()
    assert b"".join(pages) == stream, "every page is exactly the bytes at its offset"
    # Read without a length while it grew: never more than the cap.
    result, blob = read(live, f"{box.name}/growing")
    assert len(blob) == MIB and result["truncated"] is True
