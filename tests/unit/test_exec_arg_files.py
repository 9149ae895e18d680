"""Which files an exec's arguments name, and what binds each (review16 F7): the
regular files in the shared folders, by contents while small, else by identity;
never a FIFO, a device, a folder or a file outside, and never more read than the cap.
What cannot be bound fails closed (review18 F1): a folder by its listing, and the rest
(past the 64th argument, through /proc or /dev, a link out, a FIFO) by a nonce: the
approval answers that call only."""

from __future__ import annotations

import hashlib
import os
import py_compile
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from sandbox import Root
from worker.actions.host import exec_arg_files
from worker.actions.host.exec_arg_files import arg_files


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / "script.py").write_text("print('hi')\n")
    (folder / "lib").mkdir()
    (folder / "lib" / "p.diff").write_text("--- a\n+++ b\n")
    return folder.resolve()


def _roots(shared: Path) -> list[Root]:
    return [Root(path=shared, writable=True)]


def _found(shared: Path, argv: list[str]) -> list[tuple[int, str, str]]:
    roots = [Root(path=shared, writable=True)]
    return [
        (f.index, f.path, f.sha256) for f in arg_files(roots, str(shared), argv) if f.kind == "file"
    ]


def _kinds(shared: Path, argv: list[str]) -> list[tuple[int, str]]:
    roots = [Root(path=shared, writable=True)]
    return [(f.index, f.kind) for f in arg_files(roots, str(shared), argv)]


def _bound(shared: Path, argv: list[str]) -> list[dict[str, object]]:
    roots = [Root(path=shared, writable=True)]
    return [f.bound() for f in arg_files(roots, str(shared), argv)]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_relative_absolute_and_option_values_are_bound_by_contents(shared: Path) -> None:
    argv = ["python3", "script.py", "-v", f"--patch={shared}/lib/p.diff", "lib/p.diff", "lib"]
    assert _found(shared, argv) == [
        (1, "script.py", _sha(shared / "script.py")),
        (3, f"{shared}/lib/p.diff", _sha(shared / "lib" / "p.diff")),
        (4, "lib/p.diff", _sha(shared / "lib" / "p.diff")),
    ]  # -v names nothing, lib is a folder


def test_nothing_outside_the_shared_folders_nor_anything_but_a_regular_file(
    shared: Path, tmp_path: Path
) -> None:
    (tmp_path / "outside.py").write_text("x")
    os.symlink(tmp_path / "outside.py", shared / "out.py")
    os.mkfifo(shared / "fifo")  # opened for reading, it would block the thread for ever
    argv = ["sh", str(tmp_path / "outside.py"), "out.py", "fifo", "/proc/self/environ", "/dev/zero"]
    assert _found(shared, argv) == []


def test_a_symlink_inside_is_bound_to_what_it_leads_to(shared: Path) -> None:
    (shared / "b.py").write_text("print('other')\n")
    os.symlink("script.py", shared / "run.py")
    before = _found(shared, ["python3", "run.py"])
    os.replace(shared / "run.py", shared / "old")
    os.symlink("b.py", shared / "run.py")
    assert before != _found(shared, ["python3", "run.py"])
    assert _found(shared, ["python3", "run.py"])[0][2] == _sha(shared / "b.py")


def test_past_the_cap_a_file_is_bound_by_its_identity_not_read(
    shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(exec_arg_files, "HASHED_FILE_BYTES", 8)
    roots = [Root(path=shared, writable=True)]
    (first,) = arg_files(roots, str(shared), ["python3", "script.py"])
    assert first.sha256 == "" and first.identity and "too large" in first.line()
    again = arg_files(roots, str(shared), ["python3", "script.py"])
    assert again == (first,)
    (shared / "script.py").write_text("print('HI')\n")  # the same size, another file
    assert arg_files(roots, str(shared), ["python3", "script.py"]) != (first,)


def test_what_is_read_in_all_is_bounded(shared: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exec_arg_files, "HASHED_BYTES", 20)
    roots = [Root(path=shared, writable=True)]
    found = arg_files(roots, str(shared), ["cat", "script.py", "lib/p.diff"])
    assert [bool(f.sha256) for f in found] == [True, False]  # 12 bytes read, 12 more past 20


def test_what_cannot_be_bound_binds_differently_each_time(shared: Path, tmp_path: Path) -> None:
    """review18 F1: /proc/self/cwd/x.py, the 65th argument on, a link out, a FIFO were
    left out, so an approval "for this plan" answered the rewritten script unasked."""
    (tmp_path / "outside.py").write_text("x")
    os.symlink(tmp_path / "outside.py", shared / "out.py")
    os.mkfifo(shared / "fifo")
    for argv in (
        ["python3", "/proc/self/cwd/script.py"],
        ["python3", "/dev/fd/3"],
        ["python3", "out.py"],
        ["cat", "fifo"],
        ["python3", *["-E"] * 64, "script.py"],
    ):
        first, again = _bound(shared, argv), _bound(shared, argv)
        assert first != again, argv
        assert "unbound" in str(first), (argv, first)
    assert _kinds(shared, ["python3", *["-E"] * 70])[-1] == (65, "unbound")
    roots = [Root(path=shared, writable=True)]
    (named,) = arg_files(roots, str(shared), ["python3", "/proc/self/cwd/script.py"])
    assert "cannot be bound" in named.line() and "asks again" in named.line()


def test_a_file_made_where_an_argument_named_nothing_binds_anew(shared: Path) -> None:
    """`python3 s.py` approved with no s.py: left out then (as most arguments name
    nothing), a script written there later is bound, and so asks again."""
    argv = ["python3", "s.py", "-m", "a message"]
    before = _bound(shared, argv)
    assert before == [] and _bound(shared, argv) == before
    (shared / "s.py").write_text("import os\n")
    assert _bound(shared, argv) != before and _kinds(shared, argv) == [(1, "file")]


def test_a_folder_is_bound_by_what_is_in_it(shared: Path) -> None:
    """`python3 lib` runs lib/__main__.py: a file in it rewritten (its size kept) asks
    again; nothing changed, the same binding."""
    (shared / "lib" / "__main__.py").write_text("print(1)\n")
    argv = ["python3", "lib"]
    assert _kinds(shared, argv) == [(1, "folder")]
    before = _bound(shared, argv)
    assert _bound(shared, argv) == before
    (shared / "lib" / "__main__.py").write_text("print(2)\n")  # the same size
    assert _bound(shared, argv) != before


def test_a_folder_too_large_to_list_binds_differently_each_time(
    shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(exec_arg_files, "LISTED_AT_MOST", 1)
    (shared / "lib" / "more.txt").write_text("x")
    assert _kinds(shared, ["ls", "lib"]) == [(1, "unbound")]
    assert _bound(shared, ["ls", "lib"]) != _bound(shared, ["ls", "lib"])


def test_a_shared_folder_named_through_a_link_outside_is_bound(
    shared: Path, tmp_path: Path
) -> None:
    """/elsewhere/alias -> the shared folder: alias/script.py is the shared script, and
    is bound as it (left out, a rewrite of it ran under the approval)."""
    alias = tmp_path / "alias"
    alias.symlink_to(shared)
    assert _found(shared, ["python3", str(alias / "script.py")]) == [
        (1, str(alias / "script.py"), _sha(shared / "script.py"))
    ]


def test_the_places_held_are_each_argument_as_written_and_as_its_links_lead(
    shared: Path,
) -> None:
    """review18 F5: held from before the look until the program ends (sandbox.held):
    a link's target too, a name that names nothing yet, an option's value; not past
    the 64th argument (those bind nothing: the approval answers one call)."""
    (shared / "run.py").symlink_to("script.py")
    argv = ["python3", "run.py", "--out=late.txt", "lib", *["-v"] * 70, "far.py"]
    places = set(exec_arg_files.held_places(_roots(shared), str(shared), argv))
    for name in ("run.py", "script.py", "late.txt", "lib", "-v"):
        assert str(shared / name) in places, name
    assert str(shared / "far.py") not in places


@pytest.mark.parametrize("spelled", ["//proc/self/cwd/script.py", "/dev//fd/0", "//dev/stdin"])
def test_a_path_through_proc_or_dev_however_spelled_binds_nothing(
    shared: Path, spelled: str
) -> None:
    """review19 A1: a leading `//` slipped past the /proc check; left out, a rewritten
    script ran under an approval for the plan."""
    assert _kinds(shared, ["python3", spelled]) == [(1, "unbound")]


def test_a_short_options_attached_value_and_an_implied_suffix_are_bound(shared: Path) -> None:
    """review19 A1c: `awk -fp3.awk`, `make -vfb.mk` and `node app` (app.js) were left out."""
    (shared / "p3.awk").write_text("{ print }\n")
    (shared / "app.js").write_text("console.log(1)\n")
    for argv, name in [
        (["awk", "-fp3.awk"], "p3.awk"),
        (["make", "-vfp3.awk"], "p3.awk"),
        (["node", "app"], "app.js"),
    ]:
        assert _found(shared, argv) == [(1, name, _sha(shared / name))], argv
    assert str(shared / "app.js") in exec_arg_files.held_places(
        _roots(shared), str(shared), ["node", "app"]
    )


def test_a_folders_links_are_bound_by_what_they_point_at(shared: Path) -> None:
    """review19 A2: pkg/__main__.py -> ../script.py was bound by the link alone, and the
    script rewritten ran unasked; a link to a folder fails closed."""
    (shared / "pkg").mkdir()
    (shared / "pkg" / "__main__.py").symlink_to("../script.py")
    before = _bound(shared, ["python3", "pkg"])
    (shared / "script.py").write_text("print('rewritten')\n")
    assert _bound(shared, ["python3", "pkg"]) != before
    (shared / "pkg" / "lib").symlink_to("../lib")
    assert _kinds(shared, ["python3", "pkg"]) == [(1, "unbound")]


def _counted(monkeypatch: pytest.MonkeyPatch, name: str) -> list[object]:
    """Each call of exec_arg_files.`name` (a lookup), counted."""
    calls: list[object] = []
    real = getattr(exec_arg_files, name)

    def counting(*args: object, **kwargs: object) -> object:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(exec_arg_files, name, counting)
    return calls


def test_a_name_the_kernel_refuses_is_not_looked_at(
    shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review21 B4: "a/" x 65,000 (130,000 bytes) cost 16 s of lookups before anyone
    was asked; longer than PATH_MAX-1, or with a part longer than NAME_MAX, it names
    nothing for any program, and is left out before any lookup."""
    argv = ["python3", "script.py", "a/" * 65_000, "x" * 256 + "/s.py"]
    looked, resolved = _counted(monkeypatch, "_bound"), _counted(monkeypatch, "_resolved")
    assert _found(shared, argv) == [(1, "script.py", _sha(shared / "script.py"))]
    # script.py, the names node adds to it (script.py.js, ...), and the class `java
    # script.py` would run: script/py.class
    implied = [f"script.py{suffix}" for suffix in exec_arg_files.IMPLIED_SUFFIXES]
    looked_for = ["script.py", *implied, "script/py.class"]
    held = exec_arg_files.held_places(_roots(shared), str(shared), argv)
    assert held == tuple(sorted(str(shared / name) for name in looked_for))
    assert [call[2] for call in looked] == looked_for  # the one lookup each
    assert len(resolved) == len(looked_for)


def test_the_names_looked_at_are_bounded_and_past_it_the_approval_answers_one_call(
    shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review21 B4: a short option's tails and the names implied for each are many (64
    arguments of 4,095 bytes: 8 GiB of names); past NAMES_AT_MOST names or
    NAME_BYTES_AT_MOST bytes none is looked at, and what binds is a nonce."""
    looked = _counted(monkeypatch, "_bound")
    roots = [Root(path=shared, writable=True)]
    hexes = [hashlib.sha256(bytes([at])).hexdigest() for at in range(64)]
    for argv in (["make", *["-" + "ab/" * 1365] * 64], ["ls", *(f"-{x}" for x in hexes)]):
        looked.clear()
        first, again = (arg_files(roots, str(shared), argv) for _ in range(2))
        assert [f.bound() for f in first] != [f.bound() for f in again], argv[1][:8]
        assert len(looked) <= 2 * exec_arg_files.NAMES_AT_MOST
        assert first[-1].kind == "unbound" and "not looked at" in first[-1].line()
        assert "approval is for this call only" in first[-1].line()
        places = exec_arg_files.held_places(_roots(shared), str(shared), argv)
        assert len(places) <= 2 * exec_arg_files.NAMES_AT_MOST  # as written and resolved


def test_links_are_resolved_as_realpath_does_in_a_few_lookups(
    shared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review21 B4: os.path.realpath looks at every prefix (quadratic in a path's parts);
    the kernel resolves the same places, the deepest part it reaches found by halving."""
    (shared / "run.py").symlink_to("script.py")
    (shared / "gone.py").symlink_to("not-yet.py")  # names nothing: held as its target
    (shared / "up").symlink_to(tmp_path)
    (shared / "loop").symlink_to("loop")
    for named in (
        "run.py",
        "gone.py",
        "up/shared/lib/p.diff",
        "missing/../run.py",
        "lib/missing/deeper/x.py",
        "script.py/..",
        "loop/x",
        "/proc/self/cwd/x.py",
        "/dev/fd/0",
    ):
        path = os.path.join(shared, named)
        assert exec_arg_files._resolved(path) == os.path.realpath(path), named
    walks = _counted(monkeypatch, "_kernel_real")
    exec_arg_files._resolved(os.path.join(shared, "a/" * 2000 + "x.py"))
    assert len(walks) <= 2 + 12  # the whole, its folder, then halving 2,000 parts


@pytest.mark.parametrize(
    ("argv", "name"),
    [(["make", "-fb=3.mk"], "b=3.mk"), (["awk", "-fp=5.awk"], "p=5.awk")],
)
def test_a_short_options_attached_value_holding_an_equals_sign_is_bound(
    shared: Path, argv: list[str], name: str
) -> None:
    """review21 B3: `make -fb=3.mk` reads b=3.mk; only the `=value` (3.mk) was looked at."""
    (shared / name).write_text("all:\n")
    assert _found(shared, argv) == [(1, name, _sha(shared / name))]
    assert str(shared / name) in exec_arg_files.held_places(_roots(shared), str(shared), argv)


def test_an_attached_value_after_many_flags_is_bound(shared: Path) -> None:
    """review21 B3: `make -kkkkkkkkkfb4.mk`: past 8 letters the tails were not looked at."""
    (shared / "b4.mk").write_text("all:\n")
    assert _found(shared, ["make", "-kkkkkkkkkfb4.mk"]) == [(1, "b4.mk", _sha(shared / "b4.mk"))]


@pytest.mark.parametrize("argv", [["python3", "-m", "mod"], ["python3", "-mmod"]])
def test_a_module_python_runs_from_the_working_folder_is_bound(
    shared: Path, argv: list[str]
) -> None:
    """review21 B3: `python3 -m mod` runs ./mod.py, and "mod" named nothing."""
    (shared / "mod.py").write_text("print(1)\n")
    assert [name for _, name, _ in _found(shared, argv)] == ["mod.py"]
    assert str(shared / "mod.py") in exec_arg_files.held_places(_roots(shared), str(shared), argv)


def test_a_dotted_modules_package_files_are_bound(shared: Path) -> None:
    """`python3 -m a.b` runs a/__init__.py, then a/b.py or a/b/__init__.py and
    a/b/__main__.py."""
    for name in ("a/__init__.py", "a/b/__init__.py", "a/b/__main__.py"):
        (shared / name).parent.mkdir(parents=True, exist_ok=True)
        (shared / name).write_text(f"# {name}\n")
    assert [name for _, name, _ in _found(shared, ["python3", "-Im", "a.b"])] == [
        "a/__init__.py",
        "a/b/__init__.py",
        "a/b/__main__.py",
    ]


def _unchecked_pyc(source: Path, cached: Path) -> None:
    """`cached` compiled from `source` as an "unchecked hash-based" pyc (PEP 552): the
    import system takes it whatever the source beside it holds."""
    cached.parent.mkdir(parents=True, exist_ok=True)
    py_compile.compile(
        str(source),
        cfile=str(cached),
        doraise=True,
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )


@pytest.mark.parametrize("tag", [sys.implementation.cache_tag, "cpython-312", "pypy310"])
@pytest.mark.parametrize(
    ("argv", "stem"), [(["python3", "-m", "mod"], "mod"), (["python3", "-m", "pkg.mod"], "pkg/mod")]
)
def test_a_modules_caches_of_any_python_are_bound_and_held(
    shared: Path, argv: list[str], stem: str, tag: str
) -> None:
    """review23 C5: `python3 -m mod` runs __pycache__/mod.<tag>.pyc, valid whatever
    mod.py holds when unchecked hash-based, and an fs_write of it ran under the
    approval; C15: the allowlisted python (3.12) may be another than the worker's."""
    (shared / "pkg").mkdir()
    (shared / "pkg" / "__init__.py").write_text("")
    (shared / f"{stem}.py").write_text("print('benign')\n")
    caches = (shared / stem).parent / "__pycache__"
    before = _bound(shared, argv)
    assert str(caches) in exec_arg_files.held_places(
        _roots(shared), str(shared), argv
    )  # names nothing yet
    _unchecked_pyc(shared / "script.py", caches / f"{(shared / stem).name}.{tag}.pyc")
    assert _bound(shared, argv) != before
    assert (1 + argv.index("-m"), "folder") in _kinds(shared, argv)


@pytest.mark.parametrize("stem", ["mod", "mod/__init__"])
def test_a_modules_compiled_forms_of_any_cpython_are_bound(shared: Path, stem: str) -> None:
    """review23 C5, C15: FileFinder takes an extension module (mod.<abi>.so, mod.so)
    over mod.py, and a sourceless mod.pyc; the abi of whichever python runs."""
    (shared / "mod").mkdir()
    (shared / "mod.py").write_text("print('benign')\n")
    tag = sys.implementation.cache_tag
    for suffix in (
        EXTENSION_SUFFIXES[0],
        EXTENSION_SUFFIXES[0].replace(f".{tag}-", ".cpython-312-"),
        EXTENSION_SUFFIXES[0].replace(f".{tag}-", ".cpython-313t-"),
        ".abi3.so",
        ".so",
        ".pyc",
    ):
        (shared / f"{stem}{suffix}").write_bytes(b"\x7fELF")
        assert f"{stem}{suffix}" in [
            path for _, path, _ in _found(shared, ["python3", "-m", "mod"])
        ]
        assert str(shared / f"{stem}{suffix}") in exec_arg_files.held_places(
            _roots(shared), str(shared), ["python3", "-m", "mod"]
        )


@pytest.mark.parametrize(
    ("argv", "module"),
    [
        (["python3", "-m", "unittest", "test_mod"], "test_mod.py"),
        (["python3", "-m", "unittest", "-v", "tests.test_mod"], "tests/test_mod.py"),
        (["python3", "-m", "unittest", "tests/test_mod.py"], "tests/__init__.py"),
        (["python3", "-m", "runpy", "mod"], "mod.py"),
        (["python3", "-mrunpy", "mod"], "mod.py"),
    ],
)
def test_modules_a_runner_imports_by_name_are_bound(
    shared: Path, argv: list[str], module: str
) -> None:
    """review23 C6: `-m unittest test_mod` and `-m runpy mod` import ./test_mod.py and
    ./mod.py by name, and only the module after `-m` was bound."""
    (shared / "tests").mkdir()
    for name in ("test_mod.py", "mod.py", "tests/__init__.py", "tests/test_mod.py"):
        (shared / name).write_text(f"# {name}\n")
    assert module in [path for _, path, _ in _found(shared, argv)]
    assert str(shared / module) in exec_arg_files.held_places(_roots(shared), str(shared), argv)


def test_a_modules_names_are_made_no_further_than_they_are_looked_at(
    shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review21 B4 for modules: a dotted name of 2,048 parts names ~16 names a part,
    each up to 4 KiB; past NAMES_AT_MOST none is made, and what binds is a nonce."""
    looked = _counted(monkeypatch, "_bound")
    argv = ["python3", "-m", "unittest", *[".".join(["a"] * 2047)] * 62]
    first = arg_files([Root(path=shared, writable=True)], str(shared), argv)
    assert first[-1].kind == "unbound" and "not looked at" in first[-1].line()
    assert len(looked) <= exec_arg_files.NAMES_AT_MOST


def test_the_file_an_at_sign_names_is_bound(shared: Path) -> None:
    """review21 B3: `gcc @args` reads more arguments from ./args (`-include evil.h`)."""
    (shared / "args").write_text("-O2\n")
    assert _found(shared, ["gcc", "@args"]) == [(1, "args", _sha(shared / "args"))]


def test_an_implied_name_is_bound_beside_a_folder_of_the_same_name(shared: Path) -> None:
    """review21 B3: `node app8` with a folder app8/ and app8.js runs app8.js; the folder
    was bound and app8.js never looked for."""
    (shared / "app8").mkdir()
    (shared / "app8.js").write_text("console.log(1)\n")
    assert _kinds(shared, ["node", "app8"]) == [(1, "folder"), (1, "file")]
    assert _found(shared, ["node", "app8"]) == [(1, "app8.js", _sha(shared / "app8.js"))]


def test_a_java_class_is_bound(shared: Path) -> None:
    """review21 B3: `java Main` runs ./Main.class (the class path is "." by default)."""
    (shared / "Main.class").write_bytes(b"\xca\xfe\xba\xbe")
    assert _found(shared, ["java", "Main"]) == [(1, "Main.class", _sha(shared / "Main.class"))]


def test_the_value_of_a_name_equals_value_argument_is_bound(shared: Path) -> None:
    """review21 B3: `make -f b9.mk MAKEFILES=inc9.mk` reads inc9.mk first."""
    (shared / "inc9.mk").write_text("$(info hi)\n")
    assert _found(shared, ["make", "MAKEFILES=inc9.mk"]) == [
        (1, "inc9.mk", _sha(shared / "inc9.mk"))
    ]


@pytest.mark.parametrize("linked", [False, True])
def test_a_folder_holding_a_fifo_binds_differently_each_time(shared: Path, linked: bool) -> None:
    """review21 B6: `make -C sub`, sub/Makefile a FIFO, was bound by the FIFO's times,
    which a program beside writing into it leaves as they were: approved for the plan,
    it read whatever the agent fed it, unasked."""
    (shared / "sub").mkdir()
    if linked:
        os.mkfifo(shared / "fifo")
        (shared / "sub" / "Makefile").symlink_to("../fifo")
    else:
        os.mkfifo(shared / "sub" / "Makefile")
    argv = ["make", "-C", "sub"]
    assert _kinds(shared, argv) == [(2, "unbound")]
    assert _bound(shared, argv) != _bound(shared, argv)
    roots = [Root(path=shared, writable=True)]
    assert "FIFO" in arg_files(roots, str(shared), argv)[0].line()


CLASS = b"\xca\xfe\xba\xbe the approved class"
SWAPPED = b"\xca\xfe\xba\xbe the agent's class"


@pytest.mark.parametrize(
    ("argv", "swapped"),
    [
        (["java", "-cp", "cls:none", "pkg.Main"], "cls/pkg/Main.class"),
        (["java", "-classpath", "none::cls", "pkg.Main"], "cls/pkg/Main.class"),
        (["java", "--class-path=cls:none", "pkg.Main"], "cls/pkg/Main.class"),
        (["java", "-Djava.class.path=cls:none", "pkg.Main"], "cls/pkg/Main.class"),
        (["java", "-cp", "none:app.jar", "pkg.Main"], "app.jar"),
        (["java", "-cp", "jars/*", "pkg.Main"], "jars/a.jar"),
        (["java", "-cp", "none:jars/*", "pkg.Main"], "jars/a.jar"),
        (["javac", "-cp", "none:cls", "-d", "out", "Main.java"], "cls/pkg/Main.class"),
        (["ruby", "-Icls:none", "main.rb"], "cls/pkg/Main.class"),
    ],
)
def test_each_part_of_a_class_path_is_bound_and_held(
    shared: Path, argv: list[str], swapped: str
) -> None:
    """bind23 r1: `java -cp cls:x pkg.Main` bound nothing ("cls:x" names nothing), and
    cls/pkg/Main.class swapped ran under the approval "for this plan"; so did a jar in
    the list or in a `dir/*`. Each part of a list of paths is looked at as a name."""
    for name in ("cls/pkg/Main.class", "app.jar", "jars/a.jar"):
        (shared / name).parent.mkdir(parents=True, exist_ok=True)
        (shared / name).write_bytes(CLASS)
    before = _bound(shared, argv)
    assert before == _bound(shared, argv)  # unchanged: the same binding
    (shared / swapped).write_bytes(SWAPPED)
    assert _bound(shared, argv) != before, argv
    held = exec_arg_files.held_places(_roots(shared), str(shared), argv)
    bound_as = swapped.split("/")[0]  # the jar, or the folder the list names
    assert str(shared / bound_as) in held, held


def test_a_class_named_by_its_package_is_bound(shared: Path) -> None:
    """bind23 r1: `java pkg.Main` runs ./pkg/Main.class (the class path is "." by
    default, or holds an empty part): "pkg.Main" named nothing, and the class swapped
    ran unasked."""
    (shared / "pkg").mkdir()
    (shared / "pkg" / "Main.class").write_bytes(CLASS)
    (shared / "pkg" / "Inner$1.class").write_bytes(CLASS)
    for argv, name in [
        (["java", "pkg.Main"], "pkg/Main.class"),
        (["java", "-cp", ":none", "pkg.Main"], "pkg/Main.class"),
        (["java", "pkg.Inner$1"], "pkg/Inner$1.class"),
    ]:
        assert _found(shared, argv)[-1:] == [(len(argv) - 1, name, _sha(shared / name))], argv
        assert str(shared / name) in exec_arg_files.held_places(_roots(shared), str(shared), argv)


def test_a_folders_links_are_followed_within_a_bound(
    shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review23 C3: a folder of 400 links into a chain of 40 links with 4 KiB `d/../`
    targets cost ~8 s before anyone was asked (os.walk stats each link, then each was
    stat'ed and read, two walks more). Links are followed by the binder alone, at most
    LINKS_FOLLOWED_AT_MOST a folder and _STEPS_AT_MOST steps a link; past either the
    folder binds a nonce."""
    (shared / "pkg").mkdir()
    for at in range(3):
        (shared / "pkg" / f"l{at}").symlink_to("../script.py")
    followed = _counted(monkeypatch, "followed_as_run")
    assert _kinds(shared, ["python3", "pkg"]) == [(1, "folder")]
    assert len(followed) == 3
    monkeypatch.setattr(exec_arg_files, "LINKS_FOLLOWED_AT_MOST", 2)
    (unbound,) = arg_files(_roots(shared), str(shared), ["python3", "pkg"])
    assert "more than 2 links" in unbound.line()
    (shared / "far").mkdir()
    (shared / "far" / "d").mkdir()
    (shared / "far" / "l").symlink_to("d/../" * 300 + "../script.py")
    followed.clear()
    (unbound,) = arg_files(_roots(shared), str(shared), ["python3", "far"])
    assert unbound.kind == "unbound" and len(followed) == 1


@pytest.mark.parametrize(
    "target", ["/proc/self/cwd/script.py", "/proc/thread-self/cwd/script.py", "/dev/fd/0"]
)
def test_a_folders_link_through_proc_or_dev_binds_differently_each_time(
    shared: Path, target: str
) -> None:
    """review23 C14: the binder followed pkg/__main__.py -> /proc/self/cwd/s.py through
    the worker's /proc (its cwd: nothing there), the program through its own (its
    working folder's s.py), so a rewritten s.py ran unasked."""
    (shared / "pkg").mkdir()
    (shared / "pkg" / "__main__.py").symlink_to(target)
    assert _kinds(shared, ["python3", "pkg"]) == [(1, "unbound")]
    assert _bound(shared, ["python3", "pkg"]) != _bound(shared, ["python3", "pkg"])


def test_a_folders_link_out_of_the_shared_folders_is_bound_by_where_it_leads(
    shared: Path, tmp_path: Path
) -> None:
    """review23 C16: a link to a file outside every shared folder was bound by that
    file's digest, which went to the agent in the ask's name: a guess of a secret the
    worker could read was confirmed offline. Nothing there is the agent's: bound by
    where the link leads, unread."""
    (tmp_path / "secret.txt").write_text("1234")
    (tmp_path / "other.txt").write_text("1234")
    (shared / "pkg").mkdir()
    (shared / "pkg" / "s").symlink_to(tmp_path / "secret.txt")
    before = _bound(shared, ["python3", "pkg"])
    (tmp_path / "secret.txt").write_text("5678")
    assert _bound(shared, ["python3", "pkg"]) == before
    (shared / "pkg" / "s").unlink()
    (shared / "pkg" / "s").symlink_to(tmp_path / "other.txt")
    assert _bound(shared, ["python3", "pkg"]) != before


def test_node_runs_a_dotted_name_with_its_implied_suffix(shared: Path) -> None:
    """review23 C6: `node app.v2` runs app.v2.js; a last part with a dot got no implied
    names, and an approval of it ran app.v2.js rewritten."""
    (shared / "app.v2.js").write_text("console.log(1)\n")
    assert _found(shared, ["node", "app.v2"]) == [(1, "app.v2.js", _sha(shared / "app.v2.js"))]


def test_a_module_node_preloads_by_a_bare_name_binds_nothing_that_lasts(shared: Path) -> None:
    """review23 C6: `node -r mymod app.js` loads node_modules/mymod/index.js, found by
    node's own search up the folders: not bound, it binds a nonce (the approval answers
    that call only); a preload by path is bound as any path is."""
    (shared / "app.js").write_text("console.log(1)\n")
    (shared / "pre.js").write_text("console.log(0)\n")
    for argv in (
        ["node", "-r", "mymod", "app.js"],
        ["node", "--require=mymod", "app.js"],
        ["node", "--import", "mymod", "app.js"],
    ):
        assert "unbound" in [kind for _, kind in _kinds(shared, argv)], argv
    by_path = ["node", "-r", "./pre.js", "app.js"]
    assert "unbound" not in [kind for _, kind in _kinds(shared, by_path)]
    assert (2, "./pre.js", _sha(shared / "pre.js")) in _found(shared, by_path)
    grep = ["grep", "-r", "mymod", "."]
    assert "unbound" not in [kind for _, kind in _kinds(shared, grep)]  # not node's -r


def test_what_an_argument_file_names_is_bound_and_held(shared: Path) -> None:
    """bind23 r1: `java @args` (args: `-cp cls pkg.Main`) bound args, not the class
    folder it named, and the class swapped ran unasked; `gcc @opts` the same for a
    header it includes. The arguments an `@file` holds are looked at as the argv's."""
    (shared / "cls" / "pkg").mkdir(parents=True)
    (shared / "cls" / "pkg" / "Main.class").write_bytes(CLASS)
    (shared / "args").write_text("-cp cls\npkg.Main\n")
    (shared / "evil.h").write_text("#define X 1\n")
    (shared / "opts").write_text("-O2 -include evil.h\t-Ifar @more\n")
    (shared / "more").write_text("script.py\n")
    java = ["java", "@args"]
    assert _kinds(shared, java) == [(1, "file"), (1, "folder")]  # args, cls
    before = _bound(shared, java)
    (shared / "cls" / "pkg" / "Main.class").write_bytes(SWAPPED)
    assert _bound(shared, java) != before
    assert str(shared / "cls") in exec_arg_files.held_places(_roots(shared), str(shared), java)
    gcc = ["gcc", "@opts", "-c", "x.c"]
    assert [name for _, name, _ in _found(shared, gcc)] == ["opts", "evil.h", "more", "script.py"]
    assert {index for index, _, _ in _found(shared, gcc)} == {1}  # each shown as @opts's
    held = exec_arg_files.held_places(_roots(shared), str(shared), gcc)
    assert {str(shared / n) for n in ("evil.h", "far", "more", "script.py")} <= set(held)


@pytest.mark.parametrize(
    "text", ['-cp "cls"\n', "-cp 'cls'\n", "-cp cl\\s\n", "-cp c#x\nls\n", "-cp cls\0\n"]
)
def test_an_argument_file_each_program_reads_its_own_way_binds_differently_each_time(
    shared: Path, text: str
) -> None:
    """Quotes, a backslash, `#` or a NUL are read one way by gcc and another by java
    (`-cp c#x` then `ls` is `-cp ls` to java 17): what such a file names cannot
    be known, and the approval answers that call only."""
    (shared / "cls").mkdir()
    (shared / "args").write_text(text)
    argv = ["java", "@args", "pkg.Main"]
    assert (1, "unbound") in _kinds(shared, argv)
    assert _bound(shared, argv) != _bound(shared, argv)
    (unbound,) = (f for f in arg_files(_roots(shared), str(shared), argv) if f.kind == "unbound")
    assert "each program reads its own way" in unbound.line()
    assert "approval is for this call only" in unbound.line()


def test_an_argument_file_that_cannot_be_read_whole_binds_differently_each_time(
    shared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outside the shared folders (a host file, whose words would be looked up and held),
    past ARGUMENT_FILE_BYTES, or past ARGUMENT_FILES_AT_MOST read: not read, and the
    approval answers that call only. One naming nothing, or a folder, is not read."""
    (tmp_path / "host-args").write_text("script.py\n")
    (shared / "a1").write_text("@a2 @a1\n")  # itself again: read once
    (shared / "a2").write_text("@a3\n")
    (shared / "a3").write_text("script.py\n")
    (shared / "big").write_text("script.py " * 10)
    monkeypatch.setattr(exec_arg_files, "ARGUMENT_FILE_BYTES", 50)
    monkeypatch.setattr(exec_arg_files, "ARGUMENT_FILES_AT_MOST", 2)
    for argv, why in [
        (["gcc", f"@{tmp_path}/host-args"], "outside the shared folders"),
        (["gcc", "@big"], "of more than 0 KiB"),
        (["gcc", "@a1"], "past the 2 read"),
    ]:
        (unbound,) = (
            f for f in arg_files(_roots(shared), str(shared), argv) if f.kind == "unbound"
        )
        assert why in unbound.line(), (argv, unbound.line())
        assert _bound(shared, argv) != _bound(shared, argv)
    assert _kinds(shared, ["gcc", "@nothing", "@lib"]) == [(2, "folder")]


def test_the_words_of_argument_files_count_towards_the_names_looked_at(
    shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An argument file may hold 256 KiB of words: they are names looked at before
    anyone is asked, within the call's NAMES_AT_MOST; past it a nonce."""
    monkeypatch.setattr(exec_arg_files, "NAMES_AT_MOST", 10)
    looked = _counted(monkeypatch, "_bound")
    (shared / "many").write_text(" ".join(f"f{at}.c" for at in range(100)))
    found = arg_files(_roots(shared), str(shared), ["gcc", "@many"])
    assert found[-1].kind == "unbound" and "not looked at" in found[-1].line()
    assert len(looked) <= 10


@pytest.mark.parametrize(
    ("argv", "swapped"),
    [
        (["java", "-javaagent:agent.jar=opts", "-cp", "cls", "pkg.Main"], "agent.jar"),
        (["java", "-agentpath:lib/agent.so=opts", "pkg.Main"], "lib/agent.so"),
    ],
)
def test_a_java_agents_file_before_its_options_is_bound(
    shared: Path, argv: list[str], swapped: str
) -> None:
    """bind23 r1 `agent`: `java -javaagent:agent.jar=opts` runs agent.jar's premain
    before the class; the tails "agent.jar=opts", "=opts"... named nothing, and the
    agent's jar swapped ran unasked. The part of a tail before its '=' is looked at."""
    for name in ("agent.jar", "lib/agent.so"):  # lib/: the fixture's
        (shared / name).write_bytes(CLASS)
    before = _bound(shared, argv)
    (shared / swapped).write_bytes(SWAPPED)
    assert _bound(shared, argv) != before
    assert str(shared / swapped) in exec_arg_files.held_places(_roots(shared), str(shared), argv)
