"""fs_list and fs_stat through the real hub and worker."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import Cluster
from tests.support.host_calls import call, error_code, shared_cluster


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with shared_cluster(tmp_path_factory.mktemp("list") / "home") as c:
        yield c


@pytest.fixture
def box(box: Path) -> Path:
    """The shared per-test folder, filled with a small tree."""
    folder = box
    (folder / "a.txt").write_text("alpha\n")
    (folder / "sub").mkdir()
    (folder / "sub" / "b.txt").write_text("beta\n")
    (folder / "sub" / "deep").mkdir()
    (folder / "sub" / "deep" / "c.txt").write_text("gamma\n")
    (folder / ".hidden").write_text("h\n")
    return folder


def listing(live: Cluster, path: str, **args: object) -> dict[str, object]:
    out, _ = call(live, "fs_list", {"path": path, **args})
    assert out["status"] == "ok", out
    return out["result"]  # type: ignore[no-any-return]


def names(result: dict[str, object]) -> list[str]:
    return [entry["path"] for entry in result["entries"]]  # type: ignore[attr-defined, index]


def test_lists_one_level_with_details(live: Cluster, box: Path) -> None:
    result = listing(live, box.name)
    assert names(result) == ["a.txt", "sub"]
    first = result["entries"][0]  # type: ignore[index]
    assert first["type"] == "file" and first["size"] == 6 and first["name"] == "a.txt"
    assert first["mode"] == oct((box / "a.txt").stat().st_mode & 0o7777)
    assert first["mtime"] == pytest.approx((box / "a.txt").stat().st_mtime)
    assert result["truncated"] is False


def test_depth_and_hidden(live: Cluster, box: Path) -> None:
    assert names(listing(live, box.name, depth=3)) == [
        "a.txt",
        "sub",
        "sub/b.txt",
        "sub/deep",
        "sub/deep/c.txt",
    ]
    assert ".hidden" in names(listing(live, box.name, hidden=True))


def test_a_name_that_is_not_utf8_is_listed_escaped_and_marked(live: Cluster, box: Path) -> None:
    """Such a name cannot travel in JSON as it is: the entry shows its other bytes as
    \\xNN and says no fs_* call can name it; the rest of the listing is untouched."""
    folder = os.fsencode(box / "sub")
    os.close(os.open(folder + b"/caf\xe9.txt", os.O_CREAT | os.O_WRONLY, 0o644))
    os.mkdir(folder + b"/d\xff")
    os.close(os.open(folder + b"/d\xff/inner.txt", os.O_CREAT | os.O_WRONLY, 0o644))
    os.symlink(b"b\xfe", folder + b"/link")
    entries = listing(live, f"{box.name}/sub", depth=2)["entries"]
    marked = {e["path"]: (e["name"], e["error"]) for e in entries}  # type: ignore[attr-defined]
    assert marked == {
        "b.txt": ("b.txt", None),
        "caf\\xe9.txt": ("caf\\xe9.txt", "name_not_utf8"),
        "d\\xff": ("d\\xff", "name_not_utf8"),
        "d\\xff/inner.txt": ("inner.txt", "name_not_utf8"),
        "deep": ("deep", None),
        "deep/c.txt": ("c.txt", None),
        "link": ("link", "name_not_utf8"),
    }
    out, _ = call(live, "fs_stat", {"path": f"{box.name}/sub/link"})
    assert out["result"]["symlink_target"] == f"{box.name}/sub/b\\xfe", out


def test_the_entry_limit_truncates(live: Cluster, box: Path) -> None:
    for i in range(30):
        (box / f"n{i:02}").write_text("")
    out, _ = call(live, "fs_list", {"path": box.name, "limit": 10})
    assert len(out["result"]["entries"]) == 10 and out["result"]["truncated"] is True
    assert out["invocation"]["truncated"] is True


@pytest.mark.parametrize("args", [{"limit": 0}, {"limit": 10_001}, {"depth": 0}, {"depth": 33}])
def test_limits_out_of_range_are_validation_errors(
    live: Cluster, box: Path, args: dict[str, object]
) -> None:
    out, _ = call(live, "fs_list", {"path": box.name, **args})
    assert error_code(out) == "validation_error"


def test_symlinks_are_reported_not_followed(live: Cluster, box: Path) -> None:
    (box / "in").symlink_to("sub")
    (box / "out").symlink_to("/etc")
    result = listing(live, box.name, depth=4)
    entries = {e["path"]: e for e in result["entries"]}  # type: ignore[attr-defined]
    assert entries["in"]["type"] == "symlink"
    assert entries["in"]["symlink_target"] == f"{box.name}/sub"
    assert entries["out"]["type"] == "symlink" and entries["out"]["symlink_target"] is None
    assert not any(p.startswith(("in/", "out/")) for p in entries)


def test_listing_a_file_or_a_missing_folder(live: Cluster, box: Path) -> None:
    out, _ = call(live, "fs_list", {"path": f"{box.name}/a.txt"})
    assert error_code(out) == "not_directory"
    out, _ = call(live, "fs_list", {"path": f"{box.name}/nope"})
    assert error_code(out) == "not_found"


def test_the_default_lists_the_first_root(live: Cluster, box: Path) -> None:
    assert box.name in names(listing(live, "."))


def test_stat_reports_type_size_mode_owner_times(live: Cluster, box: Path) -> None:
    out, _ = call(live, "fs_stat", {"path": f"{box.name}/a.txt"})
    result = out["result"]
    st = (box / "a.txt").stat()
    assert result["type"] == "file" and result["size"] == 6
    assert result["mode"] == oct(st.st_mode & 0o7777)
    assert result["uid"] == st.st_uid and result["owner"] is not None
    assert result["mtime"] == pytest.approx(st.st_mtime)
    assert result["nlink"] == 1


def test_stat_shows_a_symlink_target_only_when_inside(live: Cluster, box: Path) -> None:
    (box / "in").symlink_to("sub/b.txt")
    (box / "out").symlink_to("/etc/passwd")
    out, _ = call(live, "fs_stat", {"path": f"{box.name}/in"})
    assert out["result"]["type"] == "symlink"
    assert out["result"]["symlink_target"] == f"{box.name}/sub/b.txt"
    followed, _ = call(live, "fs_stat", {"path": f"{box.name}/in", "follow_symlinks": True})
    assert followed["result"]["type"] == "file" and followed["result"]["size"] == 5
    out, _ = call(live, "fs_stat", {"path": f"{box.name}/out"})
    assert out["result"]["symlink_target"] is None
    out, _ = call(live, "fs_stat", {"path": f"{box.name}/out", "follow_symlinks": True})
    assert error_code(out) == "path_not_allowed"
    os.mkfifo(box / "fifo")
    out, _ = call(live, "fs_stat", {"path": f"{box.name}/fifo"})
    assert out["result"]["type"] == "fifo"
