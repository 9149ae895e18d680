"""Sandboxes built ahead of their calls (sandbox.warm) for real: bubblewrap, the entry
helper waiting for its call, real programs. What runs in one is what a sandbox built
for the call shows; it goes only to its plan, only with the very same shape, only
after the claim; discards and the end kill and reap it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
import subprocess
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from sandbox import _entry, environment
from sandbox._spawn import Starts
from sandbox.process import Completed, Limits, Mount, PidCap, View, run
from sandbox.warm import WarmSandboxes

PYTHON = "/usr/bin/python3"  # the system's: the sandbox only sees /usr, not the venv
# What its sandbox's /dev/shm holds: the mark `Runner.held` left in a sandbox built ahead
# (each sandbox's /dev/shm is its own, and one built for its call holds nothing).
WHERE = "import os; print(' '.join(sorted(os.listdir('/dev/shm'))))"
# What a program sees of its sandbox: its environment, folder, limits and confinement.
SEEN = (
    "import os, sys; print(sorted(os.environ.items())); print(os.getcwd()); "
    "print(open('/proc/self/limits').read()); "
    "print([l for l in open('/proc/self/status') if l.split(':')[0] in "
    "('NoNewPrivs', 'Seccomp', 'Seccomp_filters', 'CapEff', 'CapBnd', 'NSpid')]); "
    "print(sys.stdin.read()); print(open('a.txt').read())"
)


def view_of(share: Path, entry: str, **changes: object) -> View:
    fields: dict[str, object] = {
        "cwd": str(share),
        "mounts": (Mount(str(share), True),),
        "env": environment.build({"LANG": "C.UTF-8"}, ["LANG"]),
        "entry": entry,
    }
    fields.update(changes)
    return View(**fields)  # type: ignore[arg-type]


class Runner:
    """One worker's way of running programs: its pid cap, starts and held sandboxes."""

    def __init__(self, warm: WarmSandboxes | None = None) -> None:
        self.pid_cap, self.starts = PidCap(), Starts()
        self.warm = warm if warm is not None else WarmSandboxes()
        self.marks: dict[int | None, str] = {}

    async def run(
        self,
        argv: list[str],
        view: View,
        plan: str = "p",
        stdin: bytes | None = None,
        claim: Callable[[], None] | None = None,
    ) -> Completed:
        return await run(
            argv,
            view,
            Limits(),
            stdin,
            pid_cap=self.pid_cap,
            starts=self.starts,
            claim=claim,
            warm=self.warm,
            warm_for=plan,
        )

    async def held(self, plan: str = "p") -> str:
        """`plan`'s sandbox built ahead, once it is built: the mark left in its /dev/shm
        (made the first time; a name no other sandbox holds)."""
        await until(lambda: waiting(self.warm.built(plan)))
        built = self.warm.built(plan)
        assert built is not None
        mark = self.marks.setdefault(built.pid, f"held-{uuid.uuid4().hex}")
        Path(f"/proc/{built.pid}/root/dev/shm/{mark}").touch()
        return mark


def bubblewraps() -> list[int]:
    """This process's children that are bubblewrap (a sandbox not yet reaped)."""
    found = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children", encoding="ascii") as handle:
            for pid in handle.read().split():
                with contextlib.suppress(OSError), open(f"/proc/{pid}/comm") as comm:
                    if comm.read().strip() == "bwrap":
                        found.append(int(pid))
    return found


def waiting(built: object) -> bool:
    """Its entry helper is in place (bubblewrap made the mounts and ran it), waiting."""
    pid = getattr(built, "pid", None)
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return pid is not None and handle.read().startswith(b"/run/agentworker/entry\0-W\0")
    except OSError:
        return False


async def until(condition: Callable[[], object], within_s: float = 60.0) -> None:
    """Wait for `condition` (an event another task brings about), at most `within_s`."""
    async with asyncio.timeout(within_s):
        while not condition():
            await asyncio.sleep(0.01)


def where(done: Completed) -> str:
    assert done.exit_code == 0, done
    return done.stdout.decode().strip()


def running(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro())


def test_the_next_call_runs_in_the_sandbox_built_ahead_which_shows_what_a_new_one_does(
    share: Path, entry: str
) -> None:
    async def go() -> None:
        view = view_of(share, entry)
        ahead, fresh = Runner(), Runner(WarmSandboxes(most=0))
        assert where(await ahead.run([PYTHON, "-c", WHERE], view, stdin=b"x")) == ""
        mark = await ahead.held()
        seen = await ahead.run([PYTHON, "-c", WHERE + "; " + SEEN], view, stdin=b"from stdin")
        assert seen.exit_code == 0, seen
        ran_in, _, what = seen.stdout.decode().partition("\n")
        assert ran_in == mark
        built_now = await fresh.run([PYTHON, "-c", SEEN], view, stdin=b"from stdin")
        assert built_now.exit_code == 0, built_now
        assert what == built_now.stdout.decode()
        assert "from stdin" in what and "inside" in what and "NoNewPrivs" in what
        assert fresh.warm.built("p") is None  # most=0 holds none
        await ahead.warm.aclose()

    running(go)


def test_a_sandbox_built_ahead_goes_to_its_own_plan_only(share: Path, entry: str) -> None:
    async def go() -> None:
        view = view_of(share, entry)
        runner = Runner()
        await runner.run([PYTHON, "-c", WHERE], view, plan="a")
        held_a = await runner.held("a")
        assert where(await runner.run([PYTHON, "-c", WHERE], view, plan="b")) == ""
        assert await runner.held("a") == held_a  # still waiting for its plan
        assert where(await runner.run([PYTHON, "-c", WHERE], view, plan="a")) == held_a
        await runner.warm.aclose()

    running(go)


def test_the_claim_comes_before_the_call_is_sent_and_a_failed_one_runs_nothing(
    share: Path, entry: str
) -> None:
    async def go() -> None:
        view = view_of(share, entry)
        runner = Runner()
        await runner.run([PYTHON, "-c", WHERE], view)
        mark = await runner.held()

        def claim() -> None:
            (share / "claimed").write_text("claimed\n")

        done = await runner.run(
            [PYTHON, "-c", "print(open('claimed').read(), end=''); " + WHERE], view, claim=claim
        )
        assert done.exit_code == 0 and done.stdout.decode() == f"claimed\n{mark}\n"
        await runner.held()
        built = runner.warm.built("p")
        assert built is not None
        pid = built.pid

        def refuse() -> None:
            raise OSError("the ledger's disk is full")

        writes = "open('ran', 'w').write('ran')"
        with pytest.raises(OSError, match="disk is full"):
            await runner.run([PYTHON, "-c", writes], view, claim=refuse)
        assert not (share / "ran").exists()
        assert not os.path.exists(f"/proc/{pid}")  # killed and reaped
        await runner.warm.aclose()

    running(go)


def test_a_shared_folder_replaced_or_a_hidden_place_made_is_never_served_from_before(
    share: Path, entry: str, tmp_path: Path
) -> None:
    """What a sandbox binds is looked up by name when it is built: a folder put in the
    shared folder's place, or a place to hide that came to exist, makes a new sandbox."""

    async def go() -> None:
        hidden = share / "private"
        view = view_of(share, entry, hidden=(str(hidden),))
        runner = Runner()
        await runner.run([PYTHON, "-c", WHERE], view)
        before = await runner.held()
        hidden.mkdir()
        (hidden / "secret").write_text("secret\n")
        done = await runner.run([PYTHON, "-c", WHERE + "; print(os.listdir('private'))"], view)
        assert done.exit_code == 0, done
        assert done.stdout.decode() == "\n[]\n"  # built for it, and the new place hidden
        assert before not in done.stdout.decode()
        before = await runner.held()
        share.rename(tmp_path / "moved")
        share.mkdir()
        (share / "a.txt").write_text("the new folder\n")
        done = await runner.run([PYTHON, "-c", WHERE + "; print(open('a.txt').read())"], view)
        assert done.exit_code == 0, done
        assert done.stdout.decode() == "\nthe new folder\n\n"  # built for it
        await runner.warm.aclose()

    running(go)


def test_a_folder_swapped_only_while_the_next_sandbox_was_built_is_not_served_from(
    share: Path, entry: str, tmp_path: Path
) -> None:
    """The shared folder is another one from the call's start until the plan's next
    sandbox is built, then put back (review11): the next call compares what the names
    led to when that sandbox was built, not when the call before it looked."""

    async def go() -> None:
        view = view_of(share, entry)
        runner = Runner()
        wait = "import os, time\nopen('started', 'w').close()\n" + (
            "while not os.path.exists('go'): time.sleep(0.01)"
        )
        first = asyncio.ensure_future(runner.run([PYTHON, "-c", wait], view))
        await until(lambda: (share / "started").exists())
        other = tmp_path / "other"
        other.mkdir()
        (other / "a.txt").write_text("the other folder\n")
        share.rename(tmp_path / "original")
        other.rename(share)
        (tmp_path / "original" / "go").touch()  # the program sees its own folder
        assert (await first).exit_code == 0
        await runner.held()  # built while the name led to the other folder
        share.rename(other)
        (tmp_path / "original").rename(share)
        done = await runner.run([PYTHON, "-c", "print(open('a.txt').read())"], view)
        assert done.exit_code == 0, done
        assert done.stdout.decode() == "inside\n\n"
        await runner.warm.aclose()

    running(go)


def test_discard_idle_and_close_kill_and_reap_and_build_none_after(share: Path, entry: str) -> None:
    async def go() -> None:
        view = view_of(share, entry)
        runner = Runner()
        await runner.run([PYTHON, "-c", WHERE], view, plan="a")
        await runner.held("a")
        built = runner.warm.built("a")
        assert built is not None
        pid = built.pid
        runner.warm.discard("a")
        await until(lambda: not os.path.exists(f"/proc/{pid}"))
        await runner.run([PYTHON, "-c", WHERE], view, plan="a")
        await runner.held("a")
        built = runner.warm.built("a")
        assert built is not None
        pid = built.pid
        await runner.warm.aclose()
        assert not os.path.exists(f"/proc/{pid}") and runner.warm.plans() == []
        await runner.run([PYTHON, "-c", WHERE], view, plan="a")  # runs, built for itself
        await asyncio.sleep(0)
        assert runner.warm.plans() == []
        # Unused past idle_s: let go, killed and reaped.
        idle = Runner(WarmSandboxes(idle_s=1.0))
        others = set(bubblewraps())  # not reaped yet: killed ones of earlier tests here
        await idle.run([PYTHON, "-c", WHERE], view)
        await until(lambda: idle.warm.plans() == ["p"])
        await until(lambda: idle.warm.plans() == [] and not set(bubblewraps()) - others)

    running(go)


def test_at_most_most_plans_are_held_the_ones_used_last(share: Path, entry: str) -> None:
    async def go() -> None:
        view = view_of(share, entry)
        runner = Runner(WarmSandboxes(most=2))
        for plan in ("a", "b", "c"):
            await runner.run([PYTHON, "-c", WHERE], view, plan=plan)
            await runner.held(plan)
        assert runner.warm.plans() == ["b", "c"]
        await runner.warm.aclose()

    running(go)


def entry_waiting(entry: str, message: bytes) -> subprocess.CompletedProcess[bytes]:
    """The entry helper run with -W, outside any sandbox, sent `message` and EOF."""
    read, write = os.pipe()
    proc = subprocess.Popen(
        [entry, "-W", str(read), "-w", "/tmp"],
        pass_fds=(read,),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    os.close(read)
    os.write(write, message)
    os.close(write)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_the_entry_runs_nothing_on_a_call_cut_short_or_none(entry: str, tmp_path: Path) -> None:
    interpreter = _entry.interpreter_of("/usr/bin/env")
    runs = [b"-x", b"/usr/bin/env"] + ([b"-x", interpreter.encode()] if interpreter else [])
    words = [b"-C", str(tmp_path).encode(), b"-e", b"A=b", *runs, b"--"]
    body = b"\0".join([*words, b"/usr/bin/env"]) + b"\0"
    whole = entry_waiting(entry, struct.pack("<I", len(body)) + body)
    assert (whole.returncode, whole.stdout) == (0, b"A=b\n"), whole
    for cut in (b"", struct.pack("<I", len(body)), struct.pack("<I", len(body)) + body[:-3]):
        said = entry_waiting(entry, cut)
        assert said.returncode == 125 and said.stdout == b"", said
        assert said.stderr.startswith(b"agentworker-entry: no call came"), said
    unended = body[:-1] + b"x"
    said = entry_waiting(entry, struct.pack("<I", len(unended)) + unended)
    assert said.returncode == 125 and b"not ended" in said.stderr, said
    # -C and -e are a waiting entry's only: elsewhere they are unknown options.
    plain = subprocess.run(
        [entry, "-C", "/", "--", "/usr/bin/true"], capture_output=True, check=False
    )
    assert plain.returncode == 125 and b"unknown option" in plain.stderr
