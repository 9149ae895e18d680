"""Landlock inside the exec sandbox, for real: the entry helper (sandbox/entry.c) built
with this machine's compiler, bubblewrap, and programs trying what Landlock refuses."""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import subprocess
import textwrap
from pathlib import Path

import pytest

from sandbox import _entry, environment
from sandbox._bwrap import command, find_tools
from sandbox.process import Limits, Mount, PidCap, SandboxUnavailableError, View, run

PYTHON = "/usr/bin/python3"

# Run inside: what the kernel says of this process, then each attempt and its errno.
PROBE = textwrap.dedent(
    """
    import os, sys
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
    print("seccomp", status["Seccomp"].strip(), "nnp", status["NoNewPrivs"].strip(), flush=True)
    def attempt(name, action):
        try:
            action()
            print(name, "ok", flush=True)
        except OSError as exc:
            print(name, exc.errno, flush=True)
    for path in sys.argv[1:]:
        attempt("write " + path, lambda: open(path, "w").write("x"))
    attempt("exec", lambda: os.execv("/usr/bin/true", ["true"]))
    """
)


def view_of(share: Path, entry: str, **changes: object) -> View:
    fields: dict[str, object] = {
        "cwd": str(share),
        "mounts": (Mount(str(share), True),),
        "env": environment.build({}, []),
        "entry": entry,
    }
    fields.update(changes)
    return View(**fields)  # type: ignore[arg-type]


def probe(view: View, *paths: str) -> dict[str, str]:
    done = asyncio.run(run([PYTHON, "-c", PROBE, *paths], view, Limits(), pid_cap=PidCap()))
    assert done.exit_code == 0, done
    lines = done.stdout.decode().splitlines()
    return {line.rsplit(" ", 1)[0]: line.rsplit(" ", 1)[1] for line in lines[1:]} | {
        "status": lines[0]
    }


def test_a_program_may_execute_only_itself(share: Path, entry: str) -> None:
    seen = probe(view_of(share, entry))
    assert seen["status"] == "seccomp 2 nnp 1"  # the filter and no_new_privs hold
    assert seen["exec"] == str(errno.EACCES)  # /usr/bin/true exists and is visible, yet
    allowed = probe(view_of(share, entry, may_execute=("/usr/bin/true",)))
    assert "exec" not in allowed  # execv replaced the probe with true: nothing more printed


def test_writes_go_only_to_the_read_write_folders_tmp_and_dev(share: Path, entry: str) -> None:
    seen = probe(view_of(share, entry), f"{share}/new.txt", "/tmp/t", "/dev/null", "/x", "/dev/x")
    assert seen[f"write {share}/new.txt"] == "ok" and (share / "new.txt").read_text() == "x"
    assert seen["write /tmp/t"] == "ok" and seen["write /dev/null"] == "ok"
    # The sandbox's root is a tmpfs mount a program could write without Landlock; /dev is
    # read-only besides (its devices take writes, not new files).
    assert seen["write /x"] == str(errno.EACCES)
    assert seen["write /dev/x"] in {str(errno.EACCES), str(errno.EROFS)}
    read_only = view_of(share, entry, mounts=(Mount(str(share), False),))
    assert probe(read_only, f"{share}/other.txt")[f"write {share}/other.txt"] in {
        str(errno.EACCES),
        str(errno.EROFS),
    }
    assert not (share / "other.txt").exists()


def test_the_entry_refuses_to_start_the_program_once_the_worker_is_gone(
    share: Path, entry: str, tmp_path: Path
) -> None:
    """The lifeline: the read end of a pipe whose write end is gone, as after a worker's
    SIGKILL. The program must not start (its file would appear)."""
    view = view_of(share, entry)
    lifeline_r, lifeline_w = os.pipe()
    os.close(lifeline_w)
    argv = ["/usr/bin/touch", f"{share}/started"]
    line = command(find_tools(), argv, view, Limits(), info_fd=None, lifeline_fd=lifeline_r)
    try:
        done = subprocess.run(line, capture_output=True, pass_fds=(lifeline_r,), check=False)
    finally:
        os.close(lifeline_r)
    assert done.returncode == _entry.FAILED
    assert done.stderr.startswith(b"agentworker-entry: the worker is gone")
    assert not (share / "started").exists()


def test_an_entry_that_cannot_confine_is_sandbox_unavailable(share: Path, entry: str) -> None:
    view = view_of(share, entry, mounts=(Mount(str(share), True, target="/gone"),), cwd="/")
    broken = View(**{**view.__dict__, "may_execute": ("/no/such/program",)})
    with pytest.raises(SandboxUnavailableError, match="cannot open /no/such/program"):
        asyncio.run(run(["/usr/bin/true"], broken, Limits(), pid_cap=PidCap()))


def test_the_helper_is_built_once_per_source_and_kept_private(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    built = Path(_entry.build(cache, "cc"))
    assert built == _entry.cached(cache) and built.name == f"entry-{_entry.digest()}"
    assert stat.S_IMODE(built.stat().st_mode) == 0o500
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert [p.name for p in cache.iterdir()] == [built.name]  # no temporary left behind
    first = built.stat().st_mtime_ns
    assert _entry.build(cache, "/no/compiler") == str(built)  # built: no compiler needed
    assert built.stat().st_mtime_ns == first


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="built with the C library elsewhere")
def test_on_x86_64_the_helper_is_built_without_the_c_library(entry: str) -> None:
    assert _entry.interpreter_of(entry) is None  # static: no loader, no C library's start
    assert _entry.recipes()[0] == _entry.FREESTANDING


def test_the_helper_built_with_the_c_library_confines_alike(
    share: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the build without the C library fails, or on other machines."""
    monkeypatch.setattr(_entry, "recipes", lambda machine=None: [_entry.WITH_LIBC])
    built = _entry.build(tmp_path / "cache", "cc")
    assert _entry.interpreter_of(built) is not None  # the C library's, dynamically
    seen = probe(view_of(share, built), f"{share}/new.txt", "/x")
    assert seen["status"] == "seccomp 2 nnp 1"
    assert seen["exec"] == str(errno.EACCES)
    assert seen[f"write {share}/new.txt"] == "ok" and seen["write /x"] == str(errno.EACCES)


def test_the_helper_refuses_a_line_it_cannot_read_whole(entry: str) -> None:
    """Run outside a sandbox (Landlock then binds only it): each malformed line exits 125
    with its message before anything runs; a whole one runs the program."""
    loader = _entry.interpreter_of("/usr/bin/true")
    run_true = ["-x", "/usr/bin/true", *(["-x", loader] if loader else []), "--", "/usr/bin/true"]
    for line, says in [
        (["-r", "4:0", "--", "/usr/bin/true"], b"not a number in -r"),
        (["-r", "4:0:1x", "--", "/usr/bin/true"], b"not a number in -r"),
        (["-r", "4:0:99999999999999999999", "--", "/usr/bin/true"], b"too large a number"),
        (["-L", "", "--", "/usr/bin/true"], b"not a number in -L"),
        # -O (run outside, first on its line: see sandbox._startline.settle)
        (["-O", "3x", "-N", "300"], b"not a number in -O"),
        (["-O", "3", "-N", "3x"], b"not a number in -N"),
        (["-O", "3", "-N", "5000"], b"too large a last pid in -N"),
        (["-O", "99", "-N", "300"], b"cannot join the sandbox's pid namespace: Bad file"),
        (["-O", "99", "-u", "max_inotify_instances:8"], b"cannot join the sandbox's user"),
        (["-O", "3", "-u", "../../kernel/pid_max:8"], b"not a limit's name in -u"),
        (["-O", "3", "-u", "max_inotify_instances"], b"not a limit's name in -u"),
        (["-O", "3", "-u", "max_inotify_instances:"], b"not a number in -u"),
        (["-O", "3", "-u", "max_inotify_instances:4294967296"], b"too large a limit in -u"),
        (["-O", "3", "-u", "m" * 49 + ":8"], b"too long a limit's name in -u"),
        (["-O", "3", "-u", "max_inotify_instances:8", "-N", "300"], b"-N comes before"),
        (["-O", "3", "-x", "/usr/bin/true"], b"unknown option outside the sandbox -x"),
        (["-O", "3", "-N"], b"no value for -N"),
        (["-N", "300", "--", "/usr/bin/true"], b"unknown option -N"),
        (["-O", "3", "--", "/usr/bin/true"], b"unknown option outside the sandbox --"),
        (["-q", "1", "--", "/usr/bin/true"], b"unknown option -q"),
        (["-xx", "/usr/bin/true", "--", "/usr/bin/true"], b"unknown option -xx"),
        (["-w", "/tmp", "-x"], b"no value for -x"),
        (["-x", "/usr/bin/true", "--"], b"no program was named"),
        (["-x", "/usr/bin/true"], b"no program was named"),
        (["-x", "/no/such", "--", "/usr/bin/true"], b"cannot open /no/such: No such file"),
        # Its loader may not execute: Landlock's refusal, told as the helper's.
        *([(["-x", "/usr/bin/true", "--", "/usr/bin/true"], b"cannot execute")] if loader else []),
    ]:
        done = subprocess.run([entry, *line], capture_output=True, check=False)
        assert (done.returncode, done.stderr[: len(_entry.SAYS) + len(says)]) == (
            _entry.FAILED,
            _entry.SAYS + says,
        ), line
    done = subprocess.run([entry, "-r", "4:0:0", *run_true], capture_output=True, check=False)
    assert (done.returncode, done.stderr) == (0, b"")


def test_a_folder_others_can_write_is_never_used(tmp_path: Path) -> None:
    cache = tmp_path / "open"
    cache.mkdir()
    os.chmod(cache, 0o777)  # noqa: S103 - the folder others could write, on purpose
    with pytest.raises(_entry.EntryUnavailableError, match="only it can write"):
        _entry.build(cache, "cc")


def test_no_compiler_says_what_to_install(tmp_path: Path) -> None:
    with pytest.raises(_entry.EntryUnavailableError, match="apt install gcc libc6-dev"):
        _entry.build(tmp_path / "cache", "/no/such/cc")


def test_the_interpreter_of_a_program_is_found_for_landlock() -> None:
    loader = _entry.interpreter_of("/usr/bin/true")
    assert loader is not None and os.path.exists(loader) and "ld-" in loader
    script = _entry.interpreter_of("/usr/bin/ldd")  # a shell script on Debian
    assert script is None or os.path.exists(script)
    assert _entry.interpreter_of("/no/such/program") is None
