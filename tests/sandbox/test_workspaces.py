"""Per-plan workspaces: made lazily and privately, counted, torn down, swept."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

import sandbox.workspaces as workspaces_module
from sandbox.workspaces import (
    EMPTY,
    FILES,
    META,
    TRASH_PREFIX,
    WorkspaceError,
    WorkspaceProblem,
    Workspaces,
    count_use,
    disk_use,
    plan_key,
)

ROOT = Path(__file__).resolve().parents[2]  # the repository: `sandbox` imports from it


@pytest.fixture
def spaces(tmp_path: Path) -> Workspaces:
    found = Workspaces(tmp_path / "workbench", quota_bytes=64 * 1024)
    found.prepare()
    return found


def test_a_workspace_is_made_on_first_use_owner_only(spaces: Workspaces) -> None:
    assert spaces.plans() == []
    assert not (spaces.base / plan_key("plan-a")).exists()
    workspace = spaces.open("plan-a")
    for folder in (spaces.base, workspace.folder, workspace.files):
        st = os.lstat(folder)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
        assert st.st_uid == os.geteuid()
    assert workspace.files == workspace.folder / FILES
    assert [p.plan_id for p in spaces.plans()] == ["plan-a"]


def test_a_later_open_finds_what_an_earlier_call_left(spaces: Workspaces) -> None:
    (spaces.open("plan-a").files / "kept.txt").write_text("still here")
    again = Workspaces(spaces.base, quota_bytes=spaces.quota_bytes)  # a restarted worker
    assert (again.open("plan-a").files / "kept.txt").read_text() == "still here"


def test_a_workspace_keeps_the_placement_token_its_calls_last_brought(
    spaces: Workspaces,
) -> None:
    """Beside the files (never in them), through a restart; a call without one leaves
    it, a new one replaces it, the last use stays the file's mtime, and a token too
    long to keep in a plan.json that is read whole is not kept."""

    def tokens(found: Workspaces) -> dict[str, str]:
        return {plan.plan_id: plan.placement_token for plan in found.plans(sizes=False)}

    workspace = spaces.open("plan-a", placement_token="t1")
    spaces.open("plan-b")
    assert tokens(spaces) == {"plan-a": "t1", "plan-b": ""}
    assert "t1" not in repr(spaces.plans())
    spaces.open("plan-a")
    assert spaces.find("plan-c", placement_token="t3") is None  # a look makes none
    assert tokens(spaces) == {"plan-a": "t1", "plan-b": ""}
    again = Workspaces(spaces.base, quota_bytes=spaces.quota_bytes)  # a restarted worker
    assert tokens(again) == {"plan-a": "t1", "plan-b": ""}
    os.utime(workspace.folder / META, (1_000_000, 1_000_000))
    again.find("plan-b", placement_token="t2")
    assert tokens(again)["plan-b"] == "t2"
    again.open("plan-a", placement_token="t1b")
    assert tokens(again) == {"plan-a": "t1b", "plan-b": "t2"}
    assert os.lstat(workspace.folder / META).st_mtime > 1_000_000  # used now
    again.open("plan-b", placement_token="x" * (workspaces_module.MAX_TOKEN_CHARS + 1))
    assert tokens(again)["plan-b"] == "t2"
    assert not any(path.name == META for path in workspace.files.rglob("*"))


def test_any_plan_id_makes_a_safe_folder_name(spaces: Workspaces) -> None:
    for plan in ("../../etc", "/abs/olute", "a b\nc", "é" * 200):
        workspace = spaces.open(plan)
        assert workspace.folder.parent == spaces.base
    assert sorted(p.plan_id for p in spaces.plans()) == sorted(
        ["../../etc", "/abs/olute", "a b\nc", "é" * 200]
    )


@pytest.mark.parametrize("plan", ["", "x\0y", "p" * 2000])
def test_an_empty_or_unusable_plan_id_is_refused(spaces: Workspaces, plan: str) -> None:
    with pytest.raises(WorkspaceError) as caught:
        spaces.open(plan)
    assert caught.value.problem is WorkspaceProblem.BAD_PLAN_ID


def test_a_folder_opened_up_to_others_is_refused_not_used(spaces: Workspaces) -> None:
    workspace = spaces.open("plan-a")
    os.chmod(workspace.files, 0o755)  # noqa: S103 - the mistake under test
    fresh = Workspaces(spaces.base, quota_bytes=spaces.quota_bytes)
    with pytest.raises(WorkspaceError) as caught:
        fresh.open("plan-a")
    assert caught.value.problem is WorkspaceProblem.NOT_PRIVATE and "700" in caught.value.message


def test_a_link_in_place_of_the_workspace_is_refused(spaces: Workspaces, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    folder = spaces.base / plan_key("plan-a")
    folder.mkdir(mode=0o700)
    (folder / FILES).symlink_to(elsewhere)
    with pytest.raises(WorkspaceError) as caught:
        spaces.open("plan-a")
    assert caught.value.problem is WorkspaceProblem.NOT_PRIVATE
    assert "not a folder" in caught.value.message


def test_the_quota_counts_disk_use_and_says_quota_and_use(spaces: Workspaces) -> None:
    workspace = spaces.open("plan-a")
    spaces.check_room(workspace, 60 * 1024)
    (workspace.files / "big").write_bytes(os.urandom(40 * 1024))
    spaces.changed(workspace)
    used = spaces.use(workspace).bytes
    assert used >= 40 * 1024
    with pytest.raises(WorkspaceError) as caught:
        spaces.check_room(workspace, 30 * 1024)
    error = caught.value
    assert error.problem is WorkspaceProblem.NO_ROOM
    assert error.details["quota_bytes"] == 64 * 1024 and error.details["used_bytes"] == used
    assert f"{used:,}" in error.message and f"{64 * 1024:,}" in error.message
    assert spaces.room(workspace) == 64 * 1024 - used


def test_disk_use_never_follows_a_link_out(spaces: Workspaces, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "huge").write_bytes(os.urandom(256 * 1024))
    workspace = spaces.open("plan-a")
    (workspace.files / "out").symlink_to(outside)
    assert disk_use(workspace.files) < 16 * 1024


def test_teardown_removes_everything_and_is_idempotent(spaces: Workspaces) -> None:
    workspace = spaces.open("plan-a")
    deep = workspace.files / "a" / "b"
    deep.mkdir(parents=True)
    (deep / "f").write_text("x")
    os.chmod(workspace.files / "a", 0o000)  # a program made a folder unreadable
    assert spaces.teardown("plan-a") is True
    assert not workspace.folder.exists()
    assert spaces.teardown("plan-a") is False
    assert spaces.teardown("never-ran") is False
    assert os.listdir(spaces.base) == [EMPTY]
    assert not (spaces.open("plan-a").files / "a").exists()  # a new start is empty


def test_prepare_finishes_a_removal_a_crash_left(spaces: Workspaces) -> None:
    spaces.open("plan-a")
    trash = spaces.detach("plan-a")
    assert trash is not None and trash.name.startswith(TRASH_PREFIX)
    assert spaces.plans() == []
    spaces.prepare()
    assert not trash.exists()


def test_the_sweep_removes_idle_plans_only_and_spares_busy_ones(spaces: Workspaces) -> None:
    for plan in ("old", "busy-old", "fresh"):
        spaces.open(plan)
    long_ago = time.time() - 3600
    for plan in ("old", "busy-old"):
        os.utime(spaces.base / plan_key(plan) / META, (long_ago, long_ago))
    assert spaces.sweep(idle_s=600, busy={("", "busy-old")}) == [("", "old")]
    assert sorted(p.plan_id for p in spaces.plans()) == ["busy-old", "fresh"]


def test_use_marks_the_plan_used(spaces: Workspaces) -> None:
    spaces.open("plan-a")
    meta = spaces.base / plan_key("plan-a") / META
    os.utime(meta, (1000.0, 1000.0))
    spaces.open("plan-a")
    assert os.lstat(meta).st_mtime > 1000.0
    (listed,) = spaces.plans()
    assert listed.last_used_unix > 1000.0 and listed.bytes_used >= 0


def test_last_used_reads_one_plan_and_none_once_it_is_gone(spaces: Workspaces) -> None:
    assert spaces.last_used("plan-a") is None
    spaces.open("plan-a")
    used = spaces.last_used("plan-a")
    assert used is not None and abs(used - time.time()) < 60
    spaces.teardown("plan-a")
    assert spaces.last_used("plan-a") is None


def test_the_count_caps_entries_and_refuses_a_plan_at_its_cap(tmp_path: Path) -> None:
    """Empty files take no disk: the plan's entries are capped, and the walk stops there."""
    spaces = Workspaces(tmp_path / "workbench", quota_bytes=64 * 1024, max_entries=100)
    spaces.prepare()
    workspace = spaces.open("plan-a")
    os.mkdir(workspace.files / "d")
    for i in range(99):
        (workspace.files / "d" / str(i)).touch()
    used = spaces.use(workspace)
    assert (used.entries, used.complete) == (100, True)
    with pytest.raises(WorkspaceError) as caught:
        spaces.check_room(workspace, 0)
    assert caught.value.problem is WorkspaceProblem.NO_ROOM
    assert "max_entries = 100" in caught.value.message
    for i in range(99, 500):
        (workspace.files / "d" / str(i)).touch()
    spaces.changed(workspace)
    assert spaces.use(workspace) == count_use(workspace.files, 100)
    assert (spaces.use(workspace).entries, spaces.use(workspace).complete) == (101, False)
    with pytest.raises(WorkspaceError) as caught:
        spaces.check_room(workspace, 0)
    assert "more than 100 files" in caught.value.message


def test_a_folder_shut_by_a_program_is_counted_when_the_worker_is_not_root() -> None:
    """A plan's program writes, then chmods the folder 000 (or 100, or 400): the worker
    (a regular user, the files' owner) opens it up and counts it, without following a
    link; what it still cannot count refuses further writes. As uid 1000: root reads
    anything."""
    share = Path(tempfile.mkdtemp(prefix="aw-user-", dir="/tmp"))
    os.chown(share, 1000, 1000)
    script = textwrap.dedent(
        f"""
        import os, stat
        from pathlib import Path
        from sandbox.workspaces import Workspaces, WorkspaceError
        spaces = Workspaces(Path({str(share)!r}) / "wb", quota_bytes=1 << 20)
        spaces.prepare()
        ws = spaces.open("plan-a")
        outside = Path({str(share)!r}) / "outside"
        outside.mkdir(mode=0o500)
        for mode, name in ((0o000, "a"), (0o100, "b"), (0o400, "c"), (0o200, "d")):
            os.makedirs(ws.files / name / "inner")
            (ws.files / name / "inner" / "big").write_bytes(os.urandom(256 * 1024))
            os.chmod(ws.files / name / "inner", 0)
            os.chmod(ws.files / name, mode)
        (ws.files / "link").symlink_to(outside)
        used = spaces.use(ws)
        assert used.bytes >= 4 * 256 * 1024 and used.entries == 13, used
        try:
            spaces.check_room(ws, 1)
        except WorkspaceError as exc:
            assert "quota" in exc.message
        else:
            raise AssertionError("not refused")
        assert stat.S_IMODE(outside.stat().st_mode) == 0o500  # never through the link
        print("counted", used.bytes)
        """
    )
    try:
        out = subprocess.run(
            [
                "setpriv",
                "--reuid=1000",
                "--regid=1000",
                "--clear-groups",
                sys.executable,
                "-c",
                script,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
            env={"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PATH": "/usr/bin:/bin"},
        )
        assert out.returncode == 0, out.stderr
        assert "counted" in out.stdout
    finally:
        shutil.rmtree(share)


def _deep_tree(top: Path, levels: int) -> None:
    """`levels` nested folders under `top`, a file in each (made by handle: the path
    would be too long to name)."""
    here = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir("a", dir_fd=here)
            below = os.open("a", os.O_RDONLY | os.O_DIRECTORY, dir_fd=here)
            os.close(here)
            here = below
            os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=here))
    finally:
        os.close(here)


def test_a_tree_thousands_of_levels_deep_is_removed_and_nothing_beyond_it(
    spaces: Workspaces, tmp_path: Path
) -> None:
    """One fs_write with `make_parents` makes a tree 1,200 levels deep; shutil.rmtree
    recursed per level and raised RecursionError: teardown failed, and the leftover
    stopped the next start."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    workspace = spaces.open("plan-a")
    _deep_tree(workspace.files, 3000)
    (workspace.files / "out").symlink_to(outside)
    assert spaces.teardown("plan-a") is True
    assert os.listdir(spaces.base) == [EMPTY] and (outside / "keep").exists()
    # Left by a crash mid-removal: the next start finishes it.
    _deep_tree(spaces.open("plan-b").files, 3000)
    trash = spaces.detach("plan-b")
    spaces.prepare()
    assert trash is not None and not trash.exists()


REMOVE_AS_OWNER = """
import os, sys
from pathlib import Path
from sandbox.workspaces import remove_tree
top = Path(sys.argv[1])
(top / "locked" / "deep").mkdir(parents=True)
(top / "locked" / "deep" / "f").write_text("x")
(top / "readonly").mkdir()
(top / "readonly" / "f").write_text("x")
os.chmod(top / "locked" / "deep", 0)
os.chmod(top / "locked", 0)  # unreadable: not listed, not entered
os.chmod(top / "readonly", 0o500)  # its entries cannot be unlinked
remove_tree(top)
print("gone" if not top.exists() else "left")
"""


def test_folders_a_program_locked_are_opened_up_and_removed() -> None:
    """As the worker's own (unprivileged) user: root would not notice the locks."""
    holder = Path(tempfile.mkdtemp(prefix="aw-locked-"))  # pytest's folders are root's own
    try:
        top = holder / "tree"
        top.mkdir()
        argv = [sys.executable, "-c", REMOVE_AS_OWNER, str(top)]
        if os.geteuid() == 0:
            for owned in (holder, top):  # as the worker owns its base folder and the tree
                os.chown(owned, 4242, 4242)
            argv = ["setpriv", "--reuid", "4242", "--regid", "4242", "--clear-groups", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert done.stdout.strip() == "gone", done.stderr
    finally:
        shutil.rmtree(holder, ignore_errors=True)


def test_a_new_plan_past_max_plans_gets_no_workspace_until_one_goes(tmp_path: Path) -> None:
    """Each plan may take its quota: the number of plans bounds what all take."""
    spaces = Workspaces(tmp_path / "workbench", quota_bytes=64 * 1024, max_plans=2)
    spaces.prepare()
    spaces.open("plan-a")
    spaces.open("plan-b")
    with pytest.raises(WorkspaceError) as caught:
        spaces.open("plan-c")
    assert caught.value.problem is WorkspaceProblem.TOO_MANY_PLANS
    assert "max_plans = 2" in caught.value.message and "Tear down" in caught.value.message
    assert caught.value.details == {"plans": 2, "max_plans": 2}
    assert not (spaces.base / plan_key("plan-c")).exists()
    restarted = Workspaces(spaces.base, quota_bytes=spaces.quota_bytes, max_plans=2)
    assert restarted.open("plan-a").plan_id == "plan-a", "a plan that has one keeps it"
    (spaces.base / f"{TRASH_PREFIX}left").mkdir()  # a removal's leftovers do not count
    assert spaces.teardown("plan-b")
    assert spaces.open("plan-c").plan_id == "plan-c"


def test_one_agent_may_hold_at_most_max_plans_per_agent(tmp_path: Path) -> None:
    """One agent of the server cannot take every workspace from the others."""
    spaces = Workspaces(tmp_path / "wb", quota_bytes=64 * 1024, max_plans=5, max_plans_per_agent=2)
    spaces.prepare()
    spaces.open("plan-m1", "mallory")
    spaces.open("plan-m2", "mallory")
    with pytest.raises(WorkspaceError) as caught:
        spaces.open("plan-m3", "mallory")
    assert caught.value.problem is WorkspaceProblem.TOO_MANY_PLANS
    assert "max_plans_per_agent = 2" in caught.value.message
    assert caught.value.details == {"plans": 2, "max_plans_per_agent": 2}
    assert spaces.open("plan-a1", "alice").plan_id == "plan-a1"
    assert spaces.open("plan-m1", "mallory").plan_id == "plan-m1", "a plan that has one keeps it"


def test_a_new_plan_reads_each_plans_owner_once_not_every_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review4 finding 06: each new plan read every plan's plan.json (2.5 s at 20,000
    plans). A torn-down plan made again for another agent counts as that agent's."""
    made = Workspaces(tmp_path / "wb", quota_bytes=64 * 1024, max_plans=50)
    made.prepare()
    for n in range(10):
        made.open(f"plan-{n}", f"agent-{n}")
    spaces = Workspaces(made.base, quota_bytes=64 * 1024, max_plans=50, max_plans_per_agent=3)
    read: list[str] = []
    real_read = workspaces_module._read_meta

    def reading(folder: Path) -> dict[str, object] | None:
        read.append(folder.name)
        return real_read(folder)

    monkeypatch.setattr(workspaces_module, "_read_meta", reading)
    spaces.open("plan-x1", "mallory")
    first = len(read)
    assert first >= 10
    spaces.open("plan-x2", "mallory")
    spaces.open("plan-x3", "mallory")
    assert len(read) - first <= 4, read[first:]  # the new plans' own, not every plan's
    with pytest.raises(WorkspaceError):
        spaces.open("plan-x4", "mallory")
    assert spaces.teardown("plan-x1")
    assert spaces.open("plan-x1", "alice").plan_id == "plan-x1"
    assert spaces.open("plan-x4", "mallory").plan_id == "plan-x4", "x1 is alice's now"


def test_finding_a_plan_never_makes_its_workspace(tmp_path: Path) -> None:
    spaces = Workspaces(tmp_path / "wb", quota_bytes=64 * 1024, max_plans=1)
    spaces.prepare()
    assert spaces.find("plan-looked-at") is None
    assert spaces.plans(sizes=False) == []
    assert list(spaces.empty.path.iterdir()) == [] and not spaces.empty.writable
    made = spaces.open("plan-made")
    assert spaces.find("plan-made") == made
    restarted = Workspaces(spaces.base, quota_bytes=spaces.quota_bytes)
    assert restarted.find("plan-made") == made


FULL_DISK_OPEN = r"""
import resource, signal, sys
from pathlib import Path
from sandbox.workspaces import Workspaces, WorkspaceError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))  # every write fails, as on a full disk
try:
    Workspaces(Path(sys.argv[1]), quota_bytes=1 << 20, max_plans=1).open("plan-disk-full")
except WorkspaceError as exc:
    print(exc.problem)
"""


def test_a_workspace_whose_plan_json_could_not_be_written_takes_no_slot(tmp_path: Path) -> None:
    spaces = Workspaces(tmp_path / "wb", quota_bytes=1 << 20, max_plans=1)
    spaces.prepare()
    done = subprocess.run(
        [sys.executable, "-c", FULL_DISK_OPEN, str(spaces.base)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.stdout.strip() == "failed", done.stderr
    assert not (spaces.base / plan_key("plan-disk-full")).exists()
    assert spaces.open("plan-later").plan_id == "plan-later", "the slot is free"
    spaces.prepare()  # a restart removes the half-made folder's leftovers
    assert sorted(os.listdir(spaces.base)) == sorted([EMPTY, plan_key("plan-later")])


def test_a_plan_folder_without_its_plan_json_is_removed_at_start(tmp_path: Path) -> None:
    """As an earlier version could leave one (its folder made before its plan.json)."""
    spaces = Workspaces(tmp_path / "wb", quota_bytes=1 << 20, max_plans=2)
    spaces.prepare()
    phantom = spaces.base / plan_key("plan-phantom")
    (phantom / "files").mkdir(parents=True, mode=0o700)
    (phantom / "plan.json").write_bytes(b"")
    kept = spaces.base / plan_key("plan-unreadable-now")
    (kept / "files").mkdir(parents=True, mode=0o700)
    (kept / "plan.json").mkdir()  # reads fail (EISDIR), as EIO would: not a reason to remove
    spaces.prepare()
    assert not phantom.exists()
    assert (kept / "files").is_dir()
    assert spaces.open("plan-later").plan_id == "plan-later"


# Walks made at most while waiting for one that sees the swap (a few milliseconds each).
WALKS_AT_MOST = 5000
# Swaps `x` between a folder, a file and a link for as long as it runs (its own
# process, as a program in the sandbox would be: truly beside the walk).
FLIP = r"""
import os, sys, time
os.chdir(sys.argv[1])
print("flipping", flush=True)
while True:
    os.mkdir("x"); time.sleep(0.0003); os.rmdir("x")
    open("x", "w").close(); time.sleep(0.0003); os.unlink("x")
    os.symlink(".", "x"); time.sleep(0.0003); os.unlink("x")
"""


def test_a_folder_swapped_for_a_file_or_link_while_counted_is_not_uncountable(
    tmp_path: Path,
) -> None:
    """A program may swap a folder for a file or a link as the walk passes (a build
    replacing its output folder): the count goes on, as for an entry that went. (Before,
    about one walk in six here failed as "cannot be counted", and the watch stopped
    the program.)"""
    files = tmp_path / "files"
    files.mkdir()
    for i in range(2000):  # a listing long enough for the swap to fall inside it
        (files / f"f{i}").touch()
    with subprocess.Popen([sys.executable, "-c", FLIP, str(files)], stdout=subprocess.PIPE) as flip:
        try:
            assert flip.stdout is not None and flip.stdout.readline() == b"flipping\n"
            # A hundred walks at least, and on until one saw the folder move under it
            # (whether a swap falls inside a walk is the scheduler's: on a quiet machine
            # none of the first hundred did, once). Every one of them counts everything.
            moved = walks = 0
            while walks < 100 or (not moved and walks < WALKS_AT_MOST):
                use = count_use(files)
                assert use.entries >= 2000
                moved += use.moved
                walks += 1
            # ... and the count says a folder moved under it (the watch counts again).
            assert moved, f"no walk of {walks} saw the swap"
        finally:
            flip.kill()
