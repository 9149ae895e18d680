"""Workspaces whose plans each have a uid of their own ([sandbox] uids, a root worker):
the uid kept in plan.json, never two live plans' alike, files/ and what the worker
writes there the uid's (real folders, real chown and setfsuid)."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox import plan_uids
from sandbox.workspaces import META, WorkspaceError, WorkspaceProblem, Workspaces

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plans' uids need root")

# Above login.defs' default SUB_UID_MAX (600100000): ids useradd gives out later.
FIRST = 2_000_000_000 + (os.getpid() % 10_000) * 10
UIDS = range(FIRST, FIRST + 3)


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A folder plans' uids may pass through (pytest's own is 700)."""
    place = Path(tempfile.mkdtemp(prefix="aw-uids-", dir="/tmp"))
    place.chmod(0o711)
    yield place
    shutil.rmtree(place)


def bench(base: Path, uids: range | None = UIDS) -> Workspaces:
    found = Workspaces(base / "workbench", quota_bytes=1024**2, uids=uids)
    found.prepare()
    return found


def uid_in_meta(folder: Path) -> object:
    return json.loads((folder / META).read_text()).get("uid")


def test_each_plan_gets_a_free_uid_kept_in_plan_json_across_restarts(tmp_path: Path) -> None:
    spaces = bench(tmp_path)
    first, second = spaces.open("one"), spaces.open("two")
    assert (first.uid, second.uid) == (FIRST, FIRST + 1)
    for each in (first, second):
        assert uid_in_meta(each.folder) == each.uid
        st = os.lstat(each.files)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (each.uid, each.uid, 0o700)
        folder = os.lstat(each.folder)  # its uid's group alone passes through
        assert (folder.st_uid, folder.st_gid) == (os.geteuid(), each.uid)
        assert stat.S_IMODE(folder.st_mode) == 0o710
    assert stat.S_IMODE(os.lstat(spaces.base).st_mode) == 0o701
    again = bench(tmp_path)  # the worker started again
    assert again.open("two").uid == FIRST + 1
    assert again.open("three").uid == FIRST + 2
    with pytest.raises(WorkspaceError) as refused:
        again.open("four")
    assert refused.value.problem == WorkspaceProblem.TOO_MANY_PLANS
    assert "widen the range" in refused.value.message
    assert again.teardown("one")
    assert again.open("four").uid == FIRST  # free again once its files are gone


def test_no_other_user_reaches_what_a_plans_uid_leaves_in_its_files(tmp_path: Path) -> None:
    """review29b r1: with every folder above files/ 0701, a program could open its
    files/ to all and leave a program set-uid to its uid there; any local user could
    run it as that uid, keep it, and reach the next plan given the uid. Another user
    (nobody) now cannot pass the plan's folder; the plan's uid still can."""
    spaces = bench(tmp_path)
    plan = spaces.open("one")
    assert plan.uid is not None
    os.chmod(plan.files, 0o755)  # noqa: S103 - what the plan's program may do
    planted = plan.files / "shell"
    planted.write_bytes(b"#!/bin/sh\n")
    os.chown(planted, plan.uid, plan.uid)
    os.chmod(planted, 0o4755)  # noqa: S103 - set-uid, as a program could

    def reach(uid: int) -> str:
        read, write = os.pipe()
        child = os.fork()
        if child == 0:  # pragma: no cover - the child reports through the pipe
            os.close(read)
            try:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
                os.stat(planted)
                answer = b"reached"
            except PermissionError:
                answer = b"refused"
            except Exception:  # noqa: BLE001 - said through the pipe
                answer = b"error"
            os.write(write, answer)
            os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as got:
            said = got.read().decode()
        os.waitpid(child, 0)
        return said

    assert reach(65534) == "refused"
    assert reach(plan.uid) == "reached"


def test_a_uid_stays_taken_while_its_plans_files_are_being_removed(tmp_path: Path) -> None:
    spaces = bench(tmp_path)
    gone = spaces.open("one")
    trash = spaces.detach("one")
    assert trash is not None and gone.uid == uid_in_meta(trash)
    assert spaces.open("two").uid == FIRST + 1  # not the one of the files still there
    spaces.remove(trash)
    assert not trash.exists()
    assert spaces.open("three").uid == FIRST


def test_a_plan_from_before_the_setting_is_given_a_uid_with_its_files(tmp_path: Path) -> None:
    before = bench(tmp_path, None)
    old = before.open("old")
    assert old.uid is None and uid_in_meta(old.folder) is None
    (old.files / "sub").mkdir()
    (old.files / "sub" / "a.txt").write_text("a")
    os.symlink("/etc/passwd", old.files / "link")
    now = bench(tmp_path).open("old")
    assert now.uid == FIRST and uid_in_meta(now.folder) == FIRST
    for name in ("", "sub", "sub/a.txt", "link"):
        assert os.lstat(now.files / name).st_uid == FIRST, name
    assert os.lstat("/etc/passwd").st_uid == 0  # a link is never followed
    off = bench(tmp_path, None).open("old")  # the setting taken away: the worker's again
    assert off.uid is None and uid_in_meta(off.folder) is None
    assert os.lstat(off.files / "sub" / "a.txt").st_uid == 0


def test_what_a_thread_makes_acting_as_the_plans_uid_is_the_uids(tmp_path: Path) -> None:
    made = bench(tmp_path).open("one")
    assert made.uid is not None and made.root.owner == made.uid
    seen: list[object] = []

    def write() -> None:
        with plan_uids.acting_as(made.uid):
            (made.files / "d").mkdir()
            (made.files / "d" / "f").write_text("x")
            seen.append(plan_uids.acting_uid())
            try:  # as the uid, not as root: the worker's own files are out of reach
                (made.folder / META).read_text()
            except PermissionError:
                seen.append("refused")
        seen.append(plan_uids.acting_uid())

    thread = threading.Thread(target=write)
    thread.start()
    thread.join()
    assert seen == [made.uid, "refused", 0]
    assert plan_uids.acting_uid() == 0  # this thread never changed
    for name in ("d", "d/f"):
        st = os.lstat(made.files / name)
        assert (st.st_uid, st.st_gid) == (made.uid, made.uid)


def test_a_count_opens_up_what_a_plans_program_shut(tmp_path: Path) -> None:
    spaces = bench(tmp_path)
    made = spaces.open("one")
    with plan_uids.acting_as(made.uid):
        (made.files / "shut").mkdir()
        (made.files / "shut" / "f").write_bytes(b"x" * 8192)
        os.chmod(made.files / "shut", 0)
    assert spaces.use(made).entries == 2
    assert spaces.teardown("one")


def test_a_range_this_machine_gives_out_is_refused(tmp_path: Path) -> None:
    """review29b r2: only accounts were looked for; a range of subordinate ids (a
    rootless container's) or of uids useradd gives out later passed."""
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "subuid").write_text("alice:165536:65536\n")
    (etc / "subgid").write_text("bob:300000:65536\n")
    (etc / "login.defs").write_text(
        "# comment\nUID_MIN\t\t 2000\nUID_MAX\t\t 70000\n"
        "SUB_UID_MIN 1000000000\nSUB_UID_MAX 1100000000\n"  # away from the files' ids
        "SUB_GID_MIN 1000000000\nSUB_GID_MAX 1100000000\n"
    )
    assert plan_uids.given_out_in(range(200_000, 201_000), etc) == [
        "alice's subordinate ids in /etc/subuid"
    ]
    assert plan_uids.given_out_in(range(310_000, 310_010), etc) == [
        "bob's subordinate ids in /etc/subgid"
    ]
    assert plan_uids.given_out_in(range(65_600, 65_610), etc) == [
        f"the uids useradd gives new accounts (UID_MIN-UID_MAX in {etc}/login.defs: 2000-70000)"
    ]
    assert plan_uids.given_out_in(range(1_900_000_000, 1_900_001_000), etc) == []


def test_the_spans_login_defs_gives_out_later_are_refused_by_default_too(tmp_path: Path) -> None:
    """review29b r2, the rest: SUB_UID_MIN-SUB_UID_MAX, where useradd takes each new
    user's subordinate ids (100000-600100000 where login.defs names none), passed: a
    range such as "200000-200999" was a later user's rootless container's. A plan's gid
    being its uid, groupadd's GID_MIN-GID_MAX and SUB_GID_MIN-SUB_GID_MAX count too."""
    etc = tmp_path / "etc"
    etc.mkdir()
    defs = etc / "login.defs"
    defs.write_text("UID_MIN 1000\nUID_MAX 60000\n")  # no other span: shadow's defaults
    assert plan_uids.given_out_in(range(200_000, 201_000), etc) == [
        "where useradd takes new users' subordinate uids "
        f"(SUB_UID_MIN-SUB_UID_MAX in {defs}: 100000-600100000)",
        "where useradd takes new users' subordinate gids "
        f"(SUB_GID_MIN-SUB_GID_MAX in {defs}: 100000-600100000)",
    ]
    defs.write_text(
        "GID_MIN 70000\nGID_MAX 80000\nSUB_UID_MIN 1000000000\nSUB_UID_MAX 1100000000\n"
        "SUB_GID_MIN 1200000000\nSUB_GID_MAX 1300000000\n"
    )
    assert plan_uids.given_out_in(range(75_000, 75_010), etc) == [
        f"the gids groupadd gives new groups (GID_MIN-GID_MAX in {defs}: 70000-80000)"
    ]
    assert plan_uids.given_out_in(range(1_250_000_000, 1_250_000_010), etc) == [
        "where useradd takes new users' subordinate gids "
        f"(SUB_GID_MIN-SUB_GID_MAX in {defs}: 1200000000-1300000000)",
        "the uids systemd-nspawn gives containers (524288-1879048191, systemd's)",
    ]
    assert plan_uids.given_out_in(range(200_000, 201_000), etc) == []  # moved away
    # Every range the docs and the refusals give as an example passes, by the
    # defaults and on this machine.
    defs.unlink()
    root = Path(__file__).resolve().parents[2]
    said = [
        root / "README.md",
        root / "docs" / "architecture.md",
        root / "sandbox" / "plan_uids.py",
    ]
    examples = {
        found for text in said for found in re.findall(r'"(\d{4,}-\d{4,})"', text.read_text())
    }
    assert examples
    for example in examples:
        assert plan_uids.given_out_in(plan_uids.parse(example), etc) == [], example
        assert plan_uids.given_out_in(plan_uids.parse(example)) == [], example


def test_login_defs_values_are_read_as_shadow_reads_them(tmp_path: Path) -> None:
    """review30 on uid30: a value in quotes, in hexadecimal or in octal (shadow reads
    each) was taken for none, and the default span used: "1900000000-1900000999" passed
    under SUB_UID_MAX "2000000000". One that cannot be read refuses the range; so do
    /etc/subuid's hexadecimal lines (newuidmap reads them)."""
    etc = tmp_path / "etc"
    etc.mkdir()
    defs = etc / "login.defs"
    said = f"(SUB_UID_MIN-SUB_UID_MAX in {defs}"
    uids = range(1_900_000_000, 1_900_000_010)  # past the default SUB_UID_MAX
    for text, last in (
        ('SUB_UID_MAX "2000000000"\n', 2_000_000_000),
        ("SUB_UID_MAX\t0x7FFFF000\n", 2_147_479_552),
        ("SUB_UID_MAX 017000000000\n", 2_013_265_920),  # octal
    ):
        defs.write_text(text)
        found = [line for line in plan_uids.given_out_in(uids, etc) if said in line]
        assert found == [
            f"where useradd takes new users' subordinate uids {said}: 100000-{last})"
        ], (text, found)
    defs.write_text("SUB_UID_MIN 65536 # a comment shadow does not allow\n")
    assert f"SUB_UID_MIN in {defs}, whose value cannot be read" in plan_uids.given_out_in(
        range(1_900_000_000, 1_900_000_010), etc
    )
    defs.unlink()
    (etc / "subuid").write_text("carol:0x71000000:0x10000\n")
    assert plan_uids.given_out_in(range(0x71000000, 0x71000010), etc) == [
        "carol's subordinate ids in /etc/subuid"
    ]


def test_the_ids_systemd_gives_out_are_refused(tmp_path: Path) -> None:
    """review30 on uid30: systemd hands out ids no file names (homed, DynamicUser=,
    nspawn's containers, the foreign range); a plan's uid there would be theirs."""
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "login.defs").write_text("SUB_UID_MIN 2147480000\nSUB_GID_MIN 2147480000\n")
    for uids, what in (
        (range(60_100, 60_110), "systemd-homed"),
        (range(62_000, 62_010), "DynamicUser="),
        (range(700_000_000, 700_000_010), "systemd-nspawn"),
        (range(2_147_400_000, 2_147_400_010), "foreign uid range"),
    ):
        found = plan_uids.given_out_in(uids, etc)
        assert any(what in line and "systemd's" in line for line in found), (uids, found)
