"""sandbox.held: an asked program's places and the worker's writes exclude each other
(review18 F5). Each side registers under one lock, so whichever comes second is
refused, with who holds or writes the place; a folder held holds what is beneath it;
a registration ends with its block, and the place is free again."""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

import pytest

from sandbox import Root
from sandbox import held as held_module
from sandbox.held import (
    HeldError,
    HeldFile,
    HeldFiles,
    HeldPlaces,
    PinDeniedError,
    held_files,
    pins_for,
)
from tests.sandbox.test_paths import unprivileged


def test_a_write_of_a_place_held_or_beneath_a_folder_held_is_refused() -> None:
    held = HeldPlaces()
    with held.hold(["/w/s.py", "/w/pkg"], "call-1"):
        for place, blocked in [("/w/s.py", "/w/s.py"), ("/w/pkg/__main__.py", "/w/pkg")]:
            with pytest.raises(HeldError) as refused:
                held.write(place, "call-2")
            assert (refused.value.path, refused.value.by) == (blocked, "call-1")
            assert refused.value.holding
        with held.write("/w/s.pyc", "call-3"), held.write("/w/pkgs", "call-4"):
            pass  # a name that only starts the same is another place
    with held.write("/w/s.py", "call-5"):
        pass  # let go with its block


def test_a_hold_of_a_place_being_written_is_refused_and_the_write_ends_its_claim() -> None:
    held = HeldPlaces()
    with held.write("/w/pkg/mod.py", "call-1"):
        with pytest.raises(HeldError) as refused:
            held.hold(["/w/other", "/w/pkg"], "call-2")
        assert (refused.value.path, refused.value.by, refused.value.holding) == (
            "/w/pkg/mod.py",
            "call-1",
            False,
        )
    with held.hold(["/w/pkg"], "call-2"):
        pass
    with held.write("/w/pkg/mod.py", "call-3"):
        pass  # the refused hold left nothing behind, nor did the one that ended


def test_from_many_threads_a_hold_and_a_write_of_one_place_never_both_stand() -> None:
    """Each thread registers and, while registered, marks the place; a second mark
    while one stands would mean both were let in."""
    held = HeldPlaces()
    standing: list[str] = []
    both: list[tuple[str, ...]] = []
    start = threading.Barrier(8)

    def side(number: int) -> None:
        start.wait()
        for _ in range(500):
            try:
                registered = (
                    held.hold(["/w/s.py"], f"h{number}")
                    if number % 2
                    else held.write("/w/s.py", f"w{number}")
                )
            except HeldError:
                continue
            with registered:
                standing.append(f"{number}")
                if number % 2 and any(int(n) % 2 == 0 for n in standing):
                    both.append(tuple(standing))
                if not number % 2 and any(int(n) % 2 for n in standing):
                    both.append(tuple(standing))
                standing.remove(f"{number}")

    threads = [threading.Thread(target=side, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert both == []


def test_a_hold_knows_the_programs_running_that_may_write_its_places() -> None:
    """One running before the hold, in a read-write folder over the place: a writer;
    one that started during another hold and was shown the place read-only too: its
    pin was of the place as it was then, and went with a rename over it once that hold
    ended (review23 C8); the asker's own program, or one in another folder: not."""
    held = HeldPlaces()
    early, elsewhere = held.run(["/w"], "early")[0], held.run(["/other"], "elsewhere")[0]
    hold = held.hold(["/w/s.py"], "asker")
    with early, elsewhere, hold as writers:
        assert writers == ("early",)
        hold.know(HeldFiles())
        registered, shown = held.run(["/w"], "later")
        assert shown == ("/w/s.py",)
        own = held.run(["/w"], "asker")[0]
        with registered, own, held.hold(["/w/s.py"], "second") as seen:
            assert seen == ("asker", "early", "later")
    with held.hold(["/w/s.py"], "asker") as writers:
        assert writers == ()  # each let go with its block


def test_a_program_sharing_a_folder_beneath_a_held_folder_read_write_is_a_writer() -> None:
    """review23 C7: a read-write shared folder nested in a held folder was bound on top
    of the held folder's pin, writable; one running before the hold may write there."""
    held = HeldPlaces()
    with held.run(["/w/proj/build"], "early")[0], held.hold(["/w/proj"], "asker") as writers:
        assert writers == ("early",)


def test_pins_are_what_exists_read_only_with_the_folders_on_the_way(tmp_path: Path) -> None:
    shared = (tmp_path / "shared").resolve()
    (shared / "a" / "b").mkdir(parents=True)
    (shared / "a" / "b" / "s.py").write_text("print()\n")
    (shared / "link.py").symlink_to("a/b/s.py")
    (tmp_path / "outside.py").write_text("secret\n")
    (shared / "out").symlink_to(tmp_path)
    roots = [Root(path=shared, writable=True)]
    places = [f"{shared}/{name}" for name in ("a/b/s.py", "link.py", "none.py", "out/outside.py")]
    pins = pins_for(roots, places, inside=lambda path: "/in" + path)
    try:
        found = [(pin.inside, pin.on_the_way) for pin in pins]
        assert found == [
            (f"/in{shared}/a", True),
            (f"/in{shared}/a/b", True),
            (f"/in{shared}/a/b/s.py", False),
        ]
        assert os.path.samefile(f"/proc/self/fd/{pins[-1].fd}", shared / "a" / "b" / "s.py")
    finally:
        for pin in pins:
            os.close(pin.fd)
    assert pins_for([Root(path=shared, writable=False)], places) == []  # read-only already


def test_a_hold_knows_its_files_by_inode_and_a_link_target_by_its_path(tmp_path: Path) -> None:
    """review21 B1 and r8: `held_files` finds a held file, and the files of a held
    folder (a link's target out of it by its real path), each with its count of names;
    a write in place into one of them by another name is refused, and so is a write of
    the target's own name."""
    (tmp_path / "s.py").write_text("shown")
    os.link(tmp_path / "s.py", tmp_path / "h.py")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "t.py").write_text("target")
    (tmp_path / "pkg" / "__main__.py").symlink_to("../t.py")
    found = held_files([str(tmp_path / "s.py"), str(tmp_path / "pkg")], most=100)
    files = found.files
    by_place = {file.place: file for file in files}
    assert set(by_place) == {str(tmp_path / "s.py"), str(tmp_path / "t.py")}
    assert by_place[str(tmp_path / "s.py")].names == 2
    assert by_place[str(tmp_path / "t.py")].names == 1
    other = os.stat(tmp_path / "h.py")
    held = HeldPlaces()
    hold = held.hold([str(tmp_path / "s.py"), str(tmp_path / "pkg")], "call-1")
    with hold:
        hold.know(found)
        with pytest.raises(HeldError) as refused:
            held.write(str(tmp_path / "h.py"), "call-2", (other.st_dev, other.st_ino))
        assert refused.value.by == "call-1"
        with pytest.raises(HeldError):
            held.write(str(tmp_path / "t.py"), "call-3")
        with held.write(str(tmp_path / "h.py"), "call-4"):
            pass  # a replacement of the name h.py (no inode: not in place) goes
    with held.write(str(tmp_path / "h.py"), "call-5", (other.st_dev, other.st_ino)):
        pass  # let go with its block


def test_a_program_that_could_write_does_not_start_while_a_held_file_has_other_names() -> None:
    held = HeldPlaces()
    hold = held.hold(["/w/s.py"], "call-1")
    with hold:
        hold.know(HeldFiles((HeldFile("/w/s.py", (1, 2), names=2),)))
        with pytest.raises(HeldError) as refused:
            held.run(["/w"], "call-2")
        assert (refused.value.path, refused.value.by, refused.value.other_names) == (
            "/w/s.py",
            "call-1",
            True,
        )
        registered, shown = held.run([], "call-3")  # nothing writable: it may start
        with registered:
            assert shown == ()
    registered, _ = held.run(["/w"], "call-4")
    with registered:
        pass


def test_a_program_started_while_a_holds_files_are_looked_for_is_a_writer() -> None:
    """review23 C2: between `hold` and `know` a hold has neither its files' other names
    nor its folders' link targets: a program started then got no pin for them, was no
    writer the hold knew of, and changed the approved script after the look. It starts
    (refusing it stopped every program of every plan while any ask looked: C12), and
    the hold names it once it knows its files, ended or not: one that made a hard link
    of a held link target and ended before `know` was no writer, and a program started
    after it rewrote the target through that name (C21). While such a hold lasts, no
    program that could write beside it starts."""
    held = HeldPlaces()
    hold = held.hold(["/w/pkg"], "call-1", roots=["/w"])
    with hold as writers:
        assert writers == ()
        with held.run(["/w"], "call-2")[0]:
            pass  # ended before `know`
        with held.run(["/x"], "call-3")[0]:
            pass  # another folder: nothing it could reach
        hold.know(HeldFiles((HeldFile("/w/t.py", (1, 2), names=1),)))  # a target out of pkg
        assert hold.writers == ("call-2",)
        with pytest.raises(HeldError) as refused:
            held.run(["/w"], "call-4")
        assert (refused.value.by, refused.value.other_names) == ("call-1", True)
        with held.run(["/x"], "call-5")[0]:
            pass
    quiet = held.hold(["/w/pkg"], "call-6")
    with quiet:
        quiet.know(HeldFiles((HeldFile("/w/t.py", (1, 2), names=1),)))
        registered, shown = held.run(["/"], "call-7")
        with registered:
            assert shown == ("/w/pkg", "/w/t.py")  # nobody started while it looked


def test_a_link_is_held_by_the_path_the_kernel_resolves_it_to(tmp_path: Path) -> None:
    """held_files follows a link in one lookup the kernel walks, not a stat a part (a
    4 KiB `d/../d/..` target made os.path.realpath take 2 ms a link: review23); a link
    to a folder is counted, not walked into."""
    (tmp_path / "d").mkdir()
    (tmp_path / "t.py").write_text("target")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "long").symlink_to("../" + "d/../" * 600 + "t.py")
    (tmp_path / "pkg" / "folder").symlink_to("../d")
    (tmp_path / "d" / "inside.py").write_text("not walked into through the link")
    found = held_files([str(tmp_path / "pkg")], most=100)
    assert [file.place for file in found.files] == [str((tmp_path / "t.py").resolve())]
    assert held_files([str(tmp_path / "pkg" / "long")], most=100) == found


def test_only_a_program_sharing_a_folder_the_holding_call_may_write_is_held_up() -> None:
    """review23 C4: in sandbox mode one plan's waiting prompt (its held file with other
    names) stopped every program of every other plan; those names can only be where
    the holding call may write."""
    held = HeldPlaces()
    hold = held.hold(["/w/a/s.py"], "call-1", roots=["/w/a"])
    with hold:
        hold.know(HeldFiles((HeldFile("/w/a/s.py", (1, 2), names=2),)))
        with held.run(["/w/b"], "call-3")[0]:
            pass  # another plan's workspace: it starts
        for writable in (["/w"], ["/w/a/sub"], ["/w/a"]):
            with pytest.raises(HeldError) as refused:
                held.run(writable, "call-4")
            assert refused.value.by == "call-1"


def test_a_hold_keeps_only_files_the_holding_call_may_write(tmp_path: Path) -> None:
    """review23 C4: a link to /usr/bin/perl (two names on Debian) made the hold one of a
    file with other names; a file out of the call's read-write folders is not its to
    change, and is not held."""
    (tmp_path / "work" / "pkg").mkdir(parents=True)
    (tmp_path / "elsewhere.py").write_text("not the call's")
    os.link(tmp_path / "elsewhere.py", tmp_path / "elsewhere-too.py")
    (tmp_path / "work" / "pkg" / "p").symlink_to(tmp_path / "elsewhere.py")
    (tmp_path / "work" / "pkg" / "own.py").write_text("the call's")
    pkg = str(tmp_path / "work" / "pkg")
    found = held_files([pkg], most=100, within=[str(tmp_path / "work")])
    assert [file.place for file in found.files] == [f"{pkg}/own.py"]
    everywhere = held_files([pkg], most=100).files  # within / (the default)
    assert sorted(file.place for file in everywhere) == [
        str(tmp_path / "elsewhere.py"),
        f"{pkg}/own.py",
    ]


def test_a_folder_with_more_links_than_are_followed_says_which_it_did_not_follow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review23 C3: each link costs a lookup of up to 40 links of 4 KiB (minutes for a
    folder of them, before anyone was asked): past LINKS_FOLLOWED_AT_MOST the rest are
    not followed, and where they lead is not held (the approval then answers one call:
    holding up every program beside instead stopped every plan, review23 C11)."""
    monkeypatch.setattr(held_module, "LINKS_FOLLOWED_AT_MOST", 3)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "t.py").write_text("target")
    for i in range(3):
        (tmp_path / "pkg" / f"l{i}").symlink_to("../t.py")
    assert held_files([str(tmp_path / "pkg")], most=100).complete
    (tmp_path / "pkg" / "l3").symlink_to("../t.py")
    found = held_files([str(tmp_path / "pkg")], most=100)
    assert len(found.unfollowed) == 1 and found.unfollowed[0].startswith(str(tmp_path / "pkg"))
    assert [file.place for file in found.files] == [str(tmp_path / "t.py")]


def test_a_link_through_proc_is_not_followed_as_the_workers(tmp_path: Path) -> None:
    """review23 C14: /proc/self/cwd/s.py is the program's working folder's s.py, and the
    worker's on the host: such a link is not followed, and said so."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__main__.py").symlink_to("/proc/self/cwd/s.py")
    (tmp_path / "pkg" / "fd").symlink_to("/dev/fd/0")
    found = held_files([str(tmp_path / "pkg")], most=100)
    assert sorted(found.unfollowed) == [
        str(tmp_path / "pkg" / "__main__.py"),
        str(tmp_path / "pkg" / "fd"),
    ]


def test_knowing_a_file_being_written_in_place_refuses_the_hold() -> None:
    held = HeldPlaces()
    with held.write("/w/h.py", "call-1", (1, 2)):
        hold = held.hold(["/w/s.py"], "call-2")
        with hold, pytest.raises(HeldError) as refused:
            hold.know(HeldFiles((HeldFile("/w/s.py", (1, 2), names=2),)))
        assert (refused.value.path, refused.value.by, refused.value.holding) == (
            "/w/h.py",
            "call-1",
            False,
        )


def test_a_held_place_the_permissions_keep_from_pinning_stops_the_program() -> None:
    """A program beside made a folder on a held place's way 000: a second one, started
    next, got no pin for the place (the lookup's EACCES was taken for "names nothing")
    and could make the folder 755 again and write the held file (review21). As a user
    without root's power over permissions, the pin now fails closed."""
    # Beneath /tmp, not pytest's folder (root's alone), so that nobody reaches it.
    with tempfile.TemporaryDirectory() as top:
        shared = Path(top) / "shared"
        (shared / "a").mkdir(parents=True)
        (shared / "a" / "s.py").write_text("print()\n")
        for path in (Path(top), shared, shared / "a", shared / "a" / "s.py"):
            os.chown(path, 65534, 65534)
        _unpinnable_as_a_user(shared)


def _unpinnable_as_a_user(shared: Path) -> None:
    (shared / "a").chmod(0)
    roots = [Root(path=shared, writable=True)]

    def check() -> None:
        with pytest.raises(PinDeniedError) as refused:
            pins_for(roots, [f"{shared}/a/s.py"])
        assert refused.value.path == f"{shared}/a/s.py"
        assert pins_for(roots, [f"{shared}/none.py"]) == []  # names nothing: no pin, no refusal

    try:
        unprivileged(check)
    finally:
        (shared / "a").chmod(0o755)


def test_a_held_folders_own_files_are_not_held_again_one_by_one() -> None:
    """Known by inode, they are pinned with the folder: a program beside got a pin, a
    descriptor and a mount for each of up to 4,096 files otherwise."""
    held = HeldPlaces()
    hold = held.hold(["/w/pkg"], "call-1")
    with hold:
        hold.know(
            HeldFiles(
                (
                    HeldFile("/w/pkg/a.py", (1, 1), names=1),
                    HeldFile("/w/pkg/sub/b.py", (1, 2), names=1),
                    HeldFile("/w/t.py", (1, 3), names=1),  # a link's target out of it
                )
            )
        )
        registered, shown = held.run(["/w"], "call-2")
        with registered:
            assert shown == ("/w/pkg", "/w/t.py")


def test_a_held_folder_is_looked_at_no_further_than_its_bound_folders_included(
    tmp_path: Path,
) -> None:
    """A tree of empty folders (an agent's, beneath a folder argument) was walked to
    its end: only files counted towards the bound."""
    deep = tmp_path / "pkg"
    for i in range(20):
        (deep / f"d{i:02}").mkdir(parents=True)
    (deep / "d19" / "s.py").write_text("print()\n")
    assert held_files([str(deep)], most=5).files == ()
    assert len(held_files([str(deep)], most=100).files) == 1
