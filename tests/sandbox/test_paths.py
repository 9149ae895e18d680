"""ConfinedDir against a real file system, with both resolvers (openat2 and the walk).

Each test plants something in a root next to a folder holding a secret and checks
that the secret is never opened, and that what is inside still works.
"""

from __future__ import annotations

import errno
import gc
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox import ConfinedDir, ConfinementError, Problem, Root, openat2_available
from sandbox._walk import MAX_HOPS
from sandbox.paths import moved_root
from tests.sandbox.support import INSIDE, SECRET, Tree


def read(root: ConfinedDir, relative: str) -> str:
    fd = root.open(relative, os.O_RDONLY)
    with os.fdopen(fd) as f:
        return f.read()


def refused(root: ConfinedDir, relative: str, flags: int = os.O_RDONLY) -> ConfinementError:
    with pytest.raises(ConfinementError) as caught:
        fd = root.open(relative, flags)
        os.close(fd)  # only reached on failure of the test; keep the fd table clean
    return caught.value


# --- ordinary use -------------------------------------------------------------------


def test_reads_files_inside(confined: ConfinedDir) -> None:
    assert read(confined, "data.txt") == INSIDE
    assert read(confined, "sub/inner.txt") == "inner\n"
    assert read(confined, "./sub//inner.txt") == "inner\n"


def test_dot_dot_that_stays_inside_is_fine(confined: ConfinedDir) -> None:
    assert read(confined, "sub/../data.txt") == INSIDE


def test_opens_the_root_itself(confined: ConfinedDir) -> None:
    fd = confined.open(".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert sorted(os.listdir(fd)) == ["data.txt", "sub"]
    finally:
        os.close(fd)


def test_creates_files_with_the_given_mode(tree: Tree, confined: ConfinedDir) -> None:
    old = os.umask(0)
    try:
        fd = confined.open("sub/new.txt", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
    finally:
        os.umask(old)
    os.write(fd, b"hello")
    os.close(fd)
    made = tree.root / "sub" / "new.txt"
    assert made.read_text() == "hello"
    assert stat.S_IMODE(made.stat().st_mode) == 0o640


def test_fds_are_close_on_exec(confined: ConfinedDir) -> None:
    fd = confined.open("data.txt", os.O_RDONLY)
    try:
        assert not os.get_inheritable(fd)
    finally:
        os.close(fd)


def test_resolver_choice_is_visible(tree: Tree, use_openat2: bool) -> None:
    with ConfinedDir(tree.root, use_openat2=use_openat2) as root:
        assert root.uses_openat2 is use_openat2
    with ConfinedDir(tree.root) as root:
        assert root.uses_openat2 is openat2_available()


# --- lexical escapes ------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["../outside/secret.txt", "sub/../../outside/secret.txt", "..", "sub/../.."]
)
def test_dot_dot_cannot_climb_out(confined: ConfinedDir, path: str) -> None:
    assert refused(confined, path).problem == Problem.OUTSIDE


def test_absolute_paths_are_refused(tree: Tree, confined: ConfinedDir) -> None:
    error = refused(confined, str(tree.secret))
    assert error.problem == Problem.OUTSIDE
    assert refused(confined, "/etc/passwd").problem == Problem.OUTSIDE


def test_tilde_is_just_a_name(tree: Tree, confined: ConfinedDir) -> None:
    # locate() refuses a leading '~'; beneath a root it can only ever be a literal name.
    assert refused(confined, "~/secret.txt").problem == Problem.MISSING
    (tree.root / "~").mkdir()
    (tree.root / "~" / "x").write_text("tilde\n")
    assert read(confined, "~/x") == "tilde\n"


def test_percent_encoding_is_literal(tree: Tree, confined: ConfinedDir) -> None:
    assert refused(confined, "%2e%2e/outside/secret.txt").problem == Problem.MISSING
    assert refused(confined, "%2e%2e%2foutside%2fsecret.txt").problem == Problem.MISSING
    (tree.root / "%2e%2e").mkdir()
    (tree.root / "%2e%2e" / "secret.txt").write_text("literal\n")
    assert read(confined, "%2e%2e/secret.txt") == "literal\n"


@pytest.mark.parametrize(
    "path", ["..\\..\\outside\\secret.txt", "..\\outside/secret.txt", "sub\\..\\..\\etc"]
)
def test_backslashes_are_ordinary_characters(tree: Tree, confined: ConfinedDir, path: str) -> None:
    assert refused(confined, path).problem == Problem.MISSING
    # A name made of them is simply a file in the root.
    (tree.root / path.split("/")[0]).write_text("backslash\n")
    if "/" not in path:
        assert read(confined, path) == "backslash\n"


def test_nul_bytes_are_refused(confined: ConfinedDir) -> None:
    error = refused(confined, "data.txt\0../../outside/secret.txt")
    assert error.problem == Problem.OUTSIDE
    assert "\\x00" in error.message  # the message shows the byte rather than hiding it


def test_over_long_paths_are_too_large(confined: ConfinedDir) -> None:
    assert refused(confined, "a/" * 2048).problem == Problem.TOO_LONG  # 4,096 bytes
    assert refused(confined, "n" * 256).problem == Problem.TOO_LONG  # a name over 255 bytes


def test_messages_name_the_callers_path(confined: ConfinedDir) -> None:
    error = refused(confined, "sub/missing.txt")
    assert error.problem == Problem.MISSING
    assert "'sub/missing.txt'" in error.message


# --- symlinks ---------------------------------------------------------------------------


@pytest.mark.parametrize("absolute", [False, True], ids=["relative", "absolute"])
def test_symlink_out_as_a_middle_component(
    tree: Tree, confined: ConfinedDir, absolute: bool
) -> None:
    (tree.root / "esc").symlink_to(tree.outside if absolute else Path("../outside"))
    error = refused(confined, "esc/secret.txt")
    assert error.problem == Problem.OUTSIDE
    assert str(tree.outside) not in error.message
    assert refused(confined, "sub/../esc/secret.txt").problem == Problem.OUTSIDE


@pytest.mark.parametrize("absolute", [False, True], ids=["relative", "absolute"])
def test_symlink_out_as_the_last_component(
    tree: Tree, confined: ConfinedDir, absolute: bool
) -> None:
    (tree.root / "link").symlink_to(tree.secret if absolute else Path("../outside/secret.txt"))
    error = refused(confined, "link")
    assert error.problem == Problem.OUTSIDE
    assert "secret" not in error.message
    # The link itself lives inside: it may be examined, just not followed.
    assert stat.S_ISLNK(confined.stat("link").st_mode)
    with pytest.raises(ConfinementError) as caught:
        confined.stat("link", follow_symlinks=True)
    assert caught.value.problem == Problem.OUTSIDE
    assert confined.readlink_inside("link") is None


def test_leaving_and_coming_back_is_still_leaving(tree: Tree, confined: ConfinedDir) -> None:
    # The target names a file inside, but only by stepping out of the root first.
    (tree.root / "sub" / "back").symlink_to(f"../../{tree.root.name}/data.txt")
    assert refused(confined, "sub/back").problem == Problem.OUTSIDE
    assert refused(confined, f"../{tree.root.name}/data.txt").problem == Problem.OUTSIDE


def test_chain_of_links_that_ends_outside(tree: Tree, confined: ConfinedDir) -> None:
    (tree.root / "first").symlink_to("sub/second")
    (tree.root / "sub" / "second").symlink_to("../third")
    (tree.root / "third").symlink_to(tree.secret)
    assert refused(confined, "first").problem == Problem.OUTSIDE


def test_creating_through_a_dangling_link_out_is_refused(tree: Tree, confined: ConfinedDir) -> None:
    (tree.root / "rel").symlink_to("../outside/planted.txt")
    (tree.root / "abs").symlink_to(tree.outside / "planted.txt")
    for name in ("rel", "abs"):
        assert refused(confined, name, os.O_WRONLY | os.O_CREAT).problem == Problem.OUTSIDE
    assert not (tree.outside / "planted.txt").exists()


def test_creating_through_a_dangling_link_inside_follows_it(
    tree: Tree, confined: ConfinedDir
) -> None:
    (tree.root / "later").symlink_to("sub/later.txt")
    os.close(confined.open("later", os.O_WRONLY | os.O_CREAT))
    assert (tree.root / "sub" / "later.txt").is_file()


def test_exclusive_create_never_follows(tree: Tree, confined: ConfinedDir) -> None:
    (tree.root / "later").symlink_to("sub/later.txt")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    assert refused(confined, "later", flags).problem == Problem.EXISTS
    assert refused(confined, "data.txt", flags).problem == Problem.EXISTS
    assert not (tree.root / "sub" / "later.txt").exists()


@pytest.mark.parametrize(
    ("links", "path"),
    [
        ({"loop": "loop"}, "loop"),
        ({"a": "b", "b": "a"}, "a/x"),
        ({"sub/up": "../sub/up"}, "sub/up"),
    ],
    ids=["self", "pair", "through-dot-dot"],
)
def test_symlink_loops_are_refused(
    tree: Tree, confined: ConfinedDir, links: dict[str, str], path: str
) -> None:
    for name, target in links.items():
        (tree.root / name).symlink_to(target)
    error = refused(confined, path)
    assert error.problem == Problem.OUTSIDE
    assert "loop" in error.message


def test_long_chains_stop_at_the_kernel_limit(tree: Tree, confined: ConfinedDir) -> None:
    for i in range(MAX_HOPS + 1):
        (tree.root / f"l{i}").symlink_to(f"l{i + 1}" if i < MAX_HOPS else "data.txt")
    assert read(confined, "l1") == INSIDE  # 40 links: the most the kernel follows
    assert refused(confined, "l0").problem == Problem.OUTSIDE  # 41


def test_symlinks_that_stay_inside_are_followed(tree: Tree, confined: ConfinedDir) -> None:
    (tree.root / "rel").symlink_to("sub")
    (tree.root / "abs").symlink_to(tree.root / "sub")
    (tree.root / "sub" / "up").symlink_to("../data.txt")
    (tree.root / "sub" / "home").symlink_to(tree.root)
    assert read(confined, "rel/inner.txt") == "inner\n"
    assert read(confined, "abs/inner.txt") == "inner\n"
    assert read(confined, "sub/up") == INSIDE
    assert read(confined, "rel/up") == INSIDE
    assert read(confined, "sub/home/data.txt") == INSIDE
    assert read(confined, "abs/home/abs/up") == INSIDE


def test_o_nofollow_leaves_the_last_link_unfollowed(tree: Tree, confined: ConfinedDir) -> None:
    (tree.root / "link").symlink_to("data.txt")
    assert refused(confined, "link", os.O_RDONLY | os.O_NOFOLLOW).problem == Problem.OUTSIDE
    fd = confined.open("link", os.O_PATH | os.O_NOFOLLOW)
    try:
        assert stat.S_ISLNK(os.fstat(fd).st_mode)
    finally:
        os.close(fd)
    # Links before the last component are still followed.
    (tree.root / "dir").symlink_to("sub")
    os.close(confined.open("dir/inner.txt", os.O_RDONLY | os.O_NOFOLLOW))


def test_directory_link_with_o_directory(tree: Tree, confined: ConfinedDir) -> None:
    (tree.root / "dir").symlink_to("sub")
    (tree.root / "out").symlink_to(tree.outside)
    os.close(confined.open("dir", os.O_RDONLY | os.O_DIRECTORY))
    assert refused(confined, "out", os.O_RDONLY | os.O_DIRECTORY).problem == Problem.OUTSIDE


# --- magic links ------------------------------------------------------------------------


def test_proc_self_root_planted_in_the_root(tree: Tree, confined: ConfinedDir) -> None:
    (tree.root / "rootfs").symlink_to("/proc/self/root")
    (tree.root / "climb").symlink_to("../" * 40 + "proc/self/root")
    for path in ("rootfs", "rootfs/etc/hostname", f"rootfs{tree.secret}", "climb/etc"):
        assert refused(confined, path).problem == Problem.OUTSIDE


def test_proc_self_fd_planted_in_the_root(tree: Tree, confined: ConfinedDir) -> None:
    held = os.open(tree.secret, os.O_RDONLY)
    try:
        (tree.root / "fd").symlink_to(f"/proc/self/fd/{held}")
        (tree.root / "fds").symlink_to("/proc/self/fd")
        assert refused(confined, "fd").problem == Problem.OUTSIDE
        assert refused(confined, f"fds/{held}").problem == Problem.OUTSIDE
    finally:
        os.close(held)


def test_magic_links_are_refused_even_when_proc_is_inside(use_openat2: bool) -> None:
    # With "/" as the root, /proc lies inside it; only the links' magic is refused.
    if not Path("/proc/self/status").exists():
        pytest.skip("/proc is not mounted")
    with ConfinedDir(Path("/"), use_openat2=use_openat2) as whole:
        os.close(whole.open("proc/self/status", os.O_RDONLY))  # /proc/self is an ordinary link
        for path in ("proc/self/root/etc/hostname", "proc/self/cwd", "proc/self/fd/0"):
            error = refused(whole, path)
            assert error.problem == Problem.OUTSIDE
            assert "/proc" in error.message


# --- hard links ------------------------------------------------------------------------


def test_hard_link_is_just_a_file_but_nlink_shows(tree: Tree, confined: ConfinedDir) -> None:
    """A hard link inside a root to a file outside cannot be told apart by path: the
    name is inside, and to the kernel it *is* the file. Confinement therefore allows
    it. st_nlink is what a policy above this layer can use to refuse such files."""
    try:
        os.link(tree.secret, tree.root / "hard")
    except OSError as exc:  # e.g. fs.protected_hardlinks for files we do not own
        pytest.skip(f"cannot make a hard link here: {exc}")
    assert read(confined, "hard") == SECRET
    assert confined.stat("hard").st_nlink == 2
    assert confined.stat("data.txt").st_nlink == 1


# --- error codes -----------------------------------------------------------------------


def test_error_codes(tree: Tree, confined: ConfinedDir) -> None:
    assert refused(confined, "missing").problem == Problem.MISSING
    assert refused(confined, "data.txt/x").problem == Problem.NOT_A_FOLDER
    assert (
        refused(confined, "data.txt", os.O_RDONLY | os.O_DIRECTORY).problem == Problem.NOT_A_FOLDER
    )
    assert refused(confined, "sub", os.O_WRONLY).problem == Problem.A_FOLDER
    assert refused(confined, "data.txt", os.O_WRONLY | os.O_CREAT | os.O_EXCL).problem == (
        Problem.EXISTS
    )


def unprivileged(check: Callable[[], None]) -> None:
    """Run `check` without root's power to ignore file permissions.

    As root, `check` runs in a forked child that drops to uid/gid 65534 (nobody);
    fds opened before the fork, such as a ConfinedDir's root, stay usable.
    """
    if os.geteuid() != 0:
        check()
        return
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        # Forked from a process with threads (grpc's, from earlier tests): a garbage
        # collection here can touch their half-copied state and crash the child.
        gc.disable()
        status = 0
        try:
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            check()
        except BaseException as exc:  # noqa: BLE001 - pytest's failures are BaseExceptions
            os.write(write_end, repr(exc).encode())
            status = 1
        os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        failure = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, failure


def test_permission_denied(tree: Tree, confined: ConfinedDir) -> None:
    (tree.root / "data.txt").chmod(0)
    (tree.root / "sub").chmod(0)

    def check() -> None:
        assert refused(confined, "data.txt").problem == Problem.DENIED
        assert refused(confined, "sub/inner.txt").problem == Problem.DENIED
        with pytest.raises(ConfinementError) as caught:
            confined.open_parent("sub/new.txt")
        assert caught.value.problem == Problem.DENIED

    try:
        unprivileged(check)
    finally:
        (tree.root / "sub").chmod(0o755)


def test_other_kernel_errors_pass_through(tree: Tree, confined: ConfinedDir) -> None:
    # Not a confinement question: the caller's general OSError handling deals with it.
    os.mkfifo(tree.root / "fifo")
    with pytest.raises(OSError) as caught:
        confined.open("fifo", os.O_WRONLY | os.O_NONBLOCK)  # no reader: ENXIO
    assert not isinstance(caught.value, ConfinementError)
    assert caught.value.errno == errno.ENXIO


# --- stat, readlink_inside, open_parent ------------------------------------------------


def test_stat_does_not_follow_by_default(tree: Tree, confined: ConfinedDir) -> None:
    (tree.root / "link").symlink_to("data.txt")
    assert stat.S_ISLNK(confined.stat("link").st_mode)
    assert stat.S_ISREG(confined.stat("link", follow_symlinks=True).st_mode)
    assert stat.S_ISDIR(confined.stat(".").st_mode)
    assert confined.stat("data.txt").st_size == len(INSIDE)


def test_stat_of_a_name_in_the_root_is_direct_and_anything_deeper_is_walked(
    tree: Tree, confined: ConfinedDir
) -> None:
    # A name right in the root is answered by one fstatat; it must still not reach out.
    (tree.root / "esc").symlink_to(tree.outside)
    assert stat.S_ISLNK(confined.stat("esc").st_mode)
    assert confined.stat("./data.txt").st_size == len(INSIDE)
    for path in ("esc/secret.txt", "./esc/secret.txt", "..", "../outside", "sub/../.."):
        with pytest.raises(ConfinementError) as caught:
            confined.stat(path)
        assert caught.value.problem == Problem.OUTSIDE, path
    with pytest.raises(ConfinementError) as caught:
        confined.stat("esc", follow_symlinks=True)
    assert caught.value.problem == Problem.OUTSIDE
    with pytest.raises(ConfinementError) as caught:
        confined.stat("missing")
    assert caught.value.problem == Problem.MISSING


def test_readlink_inside(tree: Tree, confined: ConfinedDir) -> None:
    (tree.root / "rel").symlink_to("sub/inner.txt")
    (tree.root / "abs").symlink_to(tree.root / "sub")
    (tree.root / "sub" / "up").symlink_to("../data.txt")
    (tree.root / "dangling").symlink_to("sub/not-yet")
    (tree.root / "out").symlink_to(tree.secret)
    (tree.root / "relout").symlink_to("../outside")
    assert confined.readlink_inside("rel") == "sub/inner.txt"
    assert confined.readlink_inside("abs") == "sub"
    assert confined.readlink_inside("sub/up") == "data.txt"
    assert confined.readlink_inside("dangling") == "sub/not-yet"
    assert confined.readlink_inside("out") is None
    assert confined.readlink_inside("relout") is None
    assert confined.readlink_inside("data.txt") is None
    assert confined.readlink_inside("sub") is None


def test_readlink_inside_never_guesses(tree: Tree, confined: ConfinedDir) -> None:
    # "deep/up" is sub/inner/up, which points at sub/x; the text alone would say "x".
    (tree.root / "sub" / "inner").mkdir()
    (tree.root / "sub" / "x").write_text("sub x\n")
    (tree.root / "x").write_text("root x\n")
    (tree.root / "deep").symlink_to("sub/inner")
    (tree.root / "sub" / "inner" / "up").symlink_to("../x")
    assert read(confined, "deep/up") == "sub x\n"
    assert confined.readlink_inside("deep/up") is None
    assert confined.readlink_inside("sub/inner/up") == "sub/x"
    # Dangling: nothing to compare, so a '..' that text alone may misplace is not guessed.
    (tree.root / "sub" / "inner" / "gone").symlink_to("../nothing")
    (tree.root / "sub" / "inner" / "later").symlink_to("nothing")
    assert confined.readlink_inside("deep/gone") is None
    assert confined.readlink_inside("deep/later") == "deep/nothing"


def test_open_parent_supports_dir_fd_writes(tree: Tree, confined: ConfinedDir) -> None:
    parent, name = confined.open_parent("sub/out.txt")
    try:
        assert name == "out.txt"
        fd = os.open(
            ".out.tmp", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=parent
        )
        os.write(fd, b"atomic")
        os.close(fd)
        os.rename(".out.tmp", name, src_dir_fd=parent, dst_dir_fd=parent)
        os.fsync(parent)
    finally:
        os.close(parent)
    assert (tree.root / "sub" / "out.txt").read_text() == "atomic"


def test_open_parent_does_not_resolve_the_last_name(tree: Tree, confined: ConfinedDir) -> None:
    (tree.root / "out").symlink_to(tree.secret)
    parent, name = confined.open_parent("out")
    try:
        assert name == "out"
        assert os.fstat(parent).st_ino == (tree.root).stat().st_ino
    finally:
        os.close(parent)


@pytest.mark.parametrize("path", [".", "", "sub/..", "sub/../.."])
def test_open_parent_refuses_the_root_itself(confined: ConfinedDir, path: str) -> None:
    with pytest.raises(ConfinementError) as caught:
        os.close(confined.open_parent(path)[0])
    assert caught.value.problem == Problem.OUTSIDE


def test_open_parent_through_a_link_out_is_refused(tree: Tree, confined: ConfinedDir) -> None:
    (tree.root / "esc").symlink_to(tree.outside)
    with pytest.raises(ConfinementError) as caught:
        os.close(confined.open_parent("esc/planted.txt")[0])
    assert caught.value.problem == Problem.OUTSIDE


# --- lifecycle -------------------------------------------------------------------------


def test_closed_root_refuses_use(tree: Tree, use_openat2: bool) -> None:
    root = ConfinedDir(tree.root, use_openat2=use_openat2)
    root.close()
    root.close()  # twice is fine
    with pytest.raises(ValueError, match="closed"):
        root.open("data.txt", os.O_RDONLY)


def test_missing_or_swapped_root(tree: Tree, use_openat2: bool) -> None:
    with pytest.raises(ConfinementError) as caught:
        ConfinedDir(tree.root / "gone", use_openat2=use_openat2)
    assert caught.value.problem == Problem.MISSING
    (tree.root / "swapped").symlink_to(tree.outside)
    with pytest.raises(ConfinementError) as caught:
        ConfinedDir(tree.root / "swapped", use_openat2=use_openat2)
    assert caught.value.problem in {Problem.OUTSIDE, Problem.NOT_A_FOLDER}


def test_a_root_whose_way_was_moved_and_linked_elsewhere_is_refused(
    tree: Tree, use_openat2: bool
) -> None:
    """A shared folder nested in another, its parent moved and a link put in its place:
    the path now leads to a folder the root never was (past the places withheld from
    the outer root), so nothing goes through it, by fs_* or exec."""
    nested = tree.root / "proj" / "vendor" / "docs"
    nested.mkdir(parents=True)
    root = Root(nested, writable=False)
    assert root.moved() is None
    root.confined(use_openat2=use_openat2).close()
    (tree.outside / "docs").mkdir()
    os.rename(tree.root / "proj" / "vendor", tree.root / "proj" / "v0")
    (tree.root / "proj" / "vendor").symlink_to(tree.outside)
    assert root.moved() == moved_root(nested)
    with pytest.raises(ConfinementError) as caught:
        root.confined(use_openat2=use_openat2)
    assert caught.value.problem == Problem.OUTSIDE
    assert f"the shared folder {nested} is no longer at that path" in caught.value.message


def test_a_root_is_refused_while_a_folder_withheld_from_it_is_away(
    tree: Tree, use_openat2: bool
) -> None:
    """A place is withheld by its path: moved away from it by a program outside any
    sandbox (`mv ~/.local ~/old`), the worker's data would be in plain view at its new
    path. The root is refused, by fs_* and exec, until the folder is back."""
    data = tree.root / "home" / ".local" / "aw"
    data.mkdir(parents=True)
    root = Root.sharing(tree.root, writable=True, withheld=(data,))
    assert [anchor.path for anchor in root.anchors] == [data]
    root.confined(use_openat2=use_openat2).close()
    os.rename(tree.root / "home" / ".local", tree.root / "home" / "old")
    why = root.moved()
    assert why is not None and f"the worker's own folder {data} is no longer at that" in why
    with pytest.raises(ConfinementError) as caught:
        root.confined(use_openat2=use_openat2)
    assert caught.value.problem == Problem.OUTSIDE and caught.value.message == why
    data.mkdir(parents=True)  # a new folder at the path is not the one withheld
    assert root.moved() == why
    data.rmdir()
    (tree.root / "home" / ".local").rmdir()
    (tree.root / "home" / ".local").symlink_to("old")  # nor a link to where it went
    assert root.moved() == why
    (tree.root / "home" / ".local").unlink()
    os.rename(tree.root / "home" / "old", tree.root / "home" / ".local")
    assert root.moved() is None
    root.confined(use_openat2=use_openat2).close()
