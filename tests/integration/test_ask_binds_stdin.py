"""An allowlist ask's approval "for this plan" is bound to what the command runs: its
stdin (review15 finding 05: exec's blob is the program's stdin, and for `python3 -`
the stdin is the program) and the files its arguments name (review16 F7: for
`python3 script.py` the file is). Before, the approval was bound to [argv, cwd]
alone, and a second call of `python3 -` with another stdin, or of `python3 script.py`
after the agent rewrote the script, ran unasked.

Real hub and `agentworker run` subprocesses over loopback gRPC; the allowlist makes
/usr/bin/python3 an `ask` rule; a UI is attached over the worker's console socket (as
`agentworker ui` is) and answers the prompts."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.support.cluster import Cluster, cluster
from tests.support.policies import PYTHON3_ASKS, PYTHON3_BESIDE, exec_config
from worker.config import Paths
from worker.core.console_socket import SocketLink
from worker.hub.client import ControlClient, result_to_dict

_T = TypeVar("_T")

# A step of a scenario (a prompt to come, a reply, an answer) takes a second or so, tens
# at a load of 20 on 2 cores: past this it is a hang.
STEP_S = 60

SHOWN = b"print('hello from the approved script')\n"
OTHER = b"import pathlib; pathlib.Path('PWNED').write_text('ran unasked')\n"


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Cluster]:
    config = exec_config(tmp_path / "policy", PYTHON3_ASKS)
    with cluster(tmp_path / "home", extra_config=config) as c:
        yield c


class Person:
    """A UI attached over the console socket: the prompts it was shown, in order, and
    its answers; and the agent's exec calls of python3 in plan-1."""

    def __init__(self, live: Cluster, ui: SocketLink, client: ControlClient) -> None:
        self.live, self.ui, self.client = live, ui, client
        self.prompts: list[dict[str, Any]] = []
        self.came = asyncio.Event()

    def told(self, event: dict[str, Any]) -> None:
        if event.get("type") == "prompt":
            self.prompts.append(event["prompt"])
            self.came.set()

    def run(self, *args: str, blob: bytes = b"") -> asyncio.Future[Any]:
        """`python3 *args` in the workspace, with `blob` as its stdin."""
        return self.exec(["python3", *args], blob)

    def exec(self, argv: list[str], blob: bytes = b"") -> asyncio.Future[Any]:
        """An exec of `argv` in the workspace, with `blob` as its stdin."""
        args = {"argv": argv, "cwd": str(self.live.workspace)}
        return asyncio.ensure_future(self._call("exec", args, blob, 120_000))

    async def write(self, name: str, content: bytes, mode: str) -> dict[str, Any]:
        """The agent's fs_write of `name` in the workspace, in plan-1."""
        args = {"path": str(self.live.workspace / name), "mode": mode}
        return result_to_dict(await self._call("fs_write", args, content, 60_000))

    def _call(self, action: str, args: dict[str, Any], blob: bytes, timeout_ms: int) -> Any:
        return self.client.dispatch(
            agent_id="tester",
            plan_id="plan-1",
            surface="workerHost",
            action=action,
            args_json=json.dumps(args),
            blob=blob,
            timeout_ms=timeout_ms,
        )

    async def answered_or_asked(self, pending: asyncio.Future[Any]) -> dict[str, Any] | None:
        """The call's result if it ran without a prompt, None once it asks."""
        self.came.clear()
        asked = asyncio.ensure_future(self.came.wait())
        done, _ = await self._within(
            asyncio.wait({pending, asked}, return_when=asyncio.FIRST_COMPLETED),
            "the call was neither answered nor asked about",
        )
        asked.cancel()
        return result_to_dict(pending.result()) if pending in done else None

    async def decide(self, pending: asyncio.Future[Any], choice: str) -> dict[str, Any]:
        """Answer the last prompt; the asking call's result."""
        command = {"op": "decide", "prompt_id": self.prompts[-1]["id"], "choice": choice}
        reply = await self._within(self.ui.command(command), f"no reply to {command}")
        assert reply["ok"], reply
        return result_to_dict(await self._within(pending, f"no answer after {choice!r}"))

    async def _within(self, step: Awaitable[_T], what: str) -> _T:
        """`step`, or an AssertionError saying `what` once it took STEP_S: the scenario
        then ends on its own, closing its UI link and client, rather than being stopped
        by pytest-timeout with them open (which failed the next test as well)."""
        try:
            async with asyncio.timeout(STEP_S):
                return await step
        except TimeoutError:
            raise AssertionError(
                f"{what} within {STEP_S} s ({len(self.prompts)} prompt(s) shown so far)"
            ) from None


@asynccontextmanager
async def attached(live: Cluster) -> AsyncIterator[Person]:
    ui = SocketLink(Paths(config_dir=live.home, data_dir=live.home).ui_socket)
    client = ControlClient.connect(live.listen, live.token)
    person = Person(live, ui, client)
    try:
        await ui.open(person.told)
        yield person
    finally:  # on a failure too: left open, its socket failed a later test as unclosed
        await ui.close()
        await client.close()


def test_a_plan_approval_of_one_stdin_asks_again_for_another(live: Cluster) -> None:
    async def scenario() -> None:
        async with attached(live) as person:
            first = person.run("-", blob=SHOWN)
            assert await person.answered_or_asked(first) is None
            stdin = hashlib.sha256(SHOWN).hexdigest()
            # The prompt says what the stdin is, and shows it.
            shown = person.prompts[-1]["preview"]
            assert f"stdin: {len(SHOWN)} bytes, sha256 {stdin}: the program's input" in shown
            assert "hello from the approved script" in shown
            assert (await person.decide(first, "plan"))["status"] == "ok"

            # The same command and stdin again: the approval answers it.
            again = await person.answered_or_asked(person.run("-", blob=SHOWN))
            assert again is not None and again["status"] == "ok", again

            # Another stdin: asked again; denied, it never runs.
            other = person.run("-", blob=OTHER)
            assert await person.answered_or_asked(other) is None
            assert "PWNED" in person.prompts[-1]["preview"]
            denied = await person.decide(other, "deny")
            assert denied["status"] == "error" and denied["error"]["code"] == "scope_denied"

            # No stdin at all is another ask too.
            empty = person.run("-")
            assert await person.answered_or_asked(empty) is None
            assert "stdin: none" in person.prompts[-1]["preview"]
            assert (await person.decide(empty, "deny"))["error"]["code"] == "scope_denied"
            assert len(person.prompts) == 3

    asyncio.run(scenario())
    assert not (live.workspace / "PWNED").exists()


def test_a_plan_approval_of_a_script_asks_again_once_the_script_changed(live: Cluster) -> None:
    """A script rewritten, or a symlink swapped to another, asks again; unchanged, the
    approval answers it."""
    script, link = live.workspace / "script.py", live.workspace / "run.py"

    async def scenario() -> None:
        async with attached(live) as person:
            script.write_bytes(SHOWN)
            first = person.run("script.py")
            assert await person.answered_or_asked(first) is None
            digest = hashlib.sha256(SHOWN).hexdigest()
            shown = person.prompts[-1]["preview"]
            assert f"file script.py: {len(SHOWN)} bytes, sha256 {digest}" in shown
            assert (await person.decide(first, "plan"))["status"] == "ok"
            again = await person.answered_or_asked(person.run("script.py"))
            assert again is not None and again["status"] == "ok", again  # unchanged

            script.write_bytes(OTHER)  # as the agent's fs_write would
            rewritten = person.run("script.py")
            assert await person.answered_or_asked(rewritten) is None
            assert hashlib.sha256(OTHER).hexdigest() in person.prompts[-1]["preview"]
            assert (await person.decide(rewritten, "deny"))["error"]["code"] == "scope_denied"

            (live.workspace / "shown.py").write_bytes(SHOWN)
            link.symlink_to("shown.py")
            linked = person.run("run.py")
            assert await person.answered_or_asked(linked) is None
            assert (await person.decide(linked, "plan"))["status"] == "ok"
            link.unlink()
            link.symlink_to("script.py")  # the other script, behind the same name
            swapped = person.run("run.py")
            assert await person.answered_or_asked(swapped) is None
            assert (await person.decide(swapped, "deny"))["error"]["code"] == "scope_denied"
            assert len(person.prompts) == 4

    asyncio.run(scenario())
    assert not (live.workspace / "PWNED").exists()


@pytest.mark.parametrize(
    ("argv", "where"),
    [
        (["/proc/self/cwd/s.py"], "s.py"),  # through /proc: cannot be bound
        ([*["-E"] * 64, "s.py"], "s.py"),  # past the 64th argument: not read
        (["pkg"], "pkg/__main__.py"),  # a folder: bound by what is in it
        (["late.py"], "late.py"),  # named nothing when approved: the file adds itself
    ],
    ids=["proc", "past64", "folder", "absent"],
)
def test_a_plan_approval_of_what_cannot_be_bound_whole_asks_again(
    live: Cluster, argv: list[str], where: str
) -> None:
    """review18 F1: each of these left the script out of the approval, which then ran
    the agent's rewrite of it unasked."""
    script = live.workspace / where
    script.parent.mkdir(exist_ok=True)

    async def scenario() -> None:
        async with attached(live) as person:
            if where != "late.py":
                script.write_bytes(SHOWN)
            first = person.run(*argv)
            assert await person.answered_or_asked(first) is None
            await person.decide(first, "plan")
            script.write_bytes(OTHER)  # as the agent's fs_write would
            rewritten = person.run(*argv)
            assert await person.answered_or_asked(rewritten) is None, "ran unasked"
            assert (await person.decide(rewritten, "deny"))["error"]["code"] == "scope_denied"

    asyncio.run(scenario())
    assert not (live.workspace / "PWNED").exists()


WAITS = b"print(open('gate').read())\n"  # blocks until the test writes the FIFO `gate`


async def waiting(call: asyncio.Future[Any], gate: Path) -> Any:
    """The FIFO `gate` opened to write, once the call's program opened it to read (it
    waits there); should the call end first, its answer as the failure."""
    opening = asyncio.ensure_future(asyncio.to_thread(open, gate, "w"))
    await asyncio.wait({opening, call}, return_when=asyncio.FIRST_COMPLETED)
    if not opening.done():
        reader = os.open(gate, os.O_RDONLY | os.O_NONBLOCK)  # lets the opening thread go
        (await opening).close()
        os.close(reader)
        raise AssertionError(f"the program ended first: {result_to_dict(call.result())}")
    return opening.result()


def test_what_an_approved_program_names_is_held_until_it_ends(live: Cluster) -> None:
    """review18 F5: the binding is a look at the file, and the program opens it again
    by name later; an agent replacing the script every ~2 ms with fs_write had its own
    run under the approval "for this plan" 10 times in 30. Now, from before the look
    until the program ends, the agent's writes there answer `busy` (here while it runs:
    the program waits on a FIFO), through a link too; elsewhere they go on."""
    script, link, gate = (live.workspace / name for name in ("s.py", "run.py", "gate"))
    script.write_bytes(WAITS)
    link.symlink_to("s.py")
    os.mkfifo(gate)

    async def scenario() -> None:
        async with attached(live) as person:
            running = person.run("run.py")
            assert await person.answered_or_asked(running) is None
            command = {"op": "decide", "prompt_id": person.prompts[-1]["id"], "choice": "plan"}
            assert (await person.ui.command(command))["ok"]
            # Opening the FIFO to write returns once the program opened it to read.
            writer = await waiting(running, gate)
            for mode in ("overwrite", "append"):
                refused = await person.write("s.py", OTHER, mode)
                assert refused["status"] == "error", refused
                assert refused["error"]["code"] == "busy", refused
                assert "held by the running call" in refused["error"]["message"]
            assert (await person.write("other.py", OTHER, "create"))["status"] == "ok"
            with writer:
                writer.write("approved and run\n")
            done = result_to_dict(await running)
            assert done["status"] == "ok", done
            assert (await person.write("s.py", OTHER, "overwrite"))["status"] == "ok"

    asyncio.run(scenario())
    assert script.read_bytes() == OTHER


def test_what_an_argument_file_names_is_bound_and_held(live: Cluster) -> None:
    """bind23 r1: `java @args` bound args, not the class folder args named, and the
    agent's swapped class ran under the approval "for this plan". What an `@file`
    names is held from before the prompt and bound: here helper.py, which @names
    names (python3 stands in: the binder goes by the argv's shape, not the program)."""
    for name, content in (("s.py", WAITS), ("names", b"helper.py\n"), ("helper.py", SHOWN)):
        (live.workspace / name).write_bytes(content)
    gate = live.workspace / "gate"
    os.mkfifo(gate)

    async def scenario() -> None:
        async with attached(live) as person:
            running = person.run("s.py", "@names")
            assert await person.answered_or_asked(running) is None
            assert "file helper.py: " in person.prompts[-1]["preview"]
            refused = await person.write("helper.py", OTHER, "overwrite")  # while asked
            assert refused["status"] == "error", refused
            assert refused["error"]["code"] == "busy", refused
            command = {"op": "decide", "prompt_id": person.prompts[-1]["id"], "choice": "plan"}
            assert (await person.ui.command(command))["ok"]
            with await waiting(running, gate) as writer:
                writer.write("approved and run\n")
            assert result_to_dict(await running)["status"] == "ok"
            assert (await person.write("helper.py", OTHER, "overwrite"))["status"] == "ok"
            again = person.run("s.py", "@names")
            assert await person.answered_or_asked(again) is None  # asked again
            assert (await person.decide(again, "deny"))["error"]["code"] == "scope_denied"

    asyncio.run(scenario())


TRIES = b"""import errno, os
def tried(change):
    try:
        change()
        return "changed"
    except OSError as exc:
        return errno.errorcode[exc.errno]
print(tried(lambda: open("sub/s.py", "a").write("import evil")),
      tried(lambda: os.replace("evil.py", "sub/s.py")),
      tried(lambda: os.rename("sub", "sub0")))
"""


@pytest.fixture
def beside(tmp_path: Path) -> Iterator[Cluster]:
    config = exec_config(tmp_path / "policy", PYTHON3_ASKS, PYTHON3_BESIDE)
    with cluster(tmp_path / "home", extra_config=config) as c:
        yield c


def test_a_program_started_beside_an_approved_one_cannot_change_what_it_holds(
    beside: Cluster,
) -> None:
    """review18 F5, with a program of the agent's own: one that starts while an asked
    program holds sub/s.py sees it read-only, and cannot move it or its folder away
    (each change worked before)."""
    ws = beside.workspace
    (ws / "sub").mkdir()
    (ws / "sub" / "s.py").write_bytes(WAITS)
    (ws / "evil.py").write_bytes(OTHER)
    (ws / "tries.py").write_bytes(TRIES)
    os.mkfifo(ws / "gate")

    async def scenario() -> None:
        async with attached(beside) as person:
            held = person.run("sub/s.py")
            assert await person.answered_or_asked(held) is None
            command = {"op": "decide", "prompt_id": person.prompts[-1]["id"], "choice": "once"}
            assert (await person.ui.command(command))["ok"]
            writer = await waiting(held, ws / "gate")
            with writer:
                answer = await person.exec(["python3x", "tries.py"])
                writer.write("approved\n")
            assert result_to_dict(answer)["status"] == "ok", result_to_dict(answer)
            # Written in place: a read-only file; replaced: another mount (EXDEV) or a
            # mount point (EBUSY); its folder moved: a mount point.
            appended, replaced, moved = answer.result.blob.decode().split()
            assert (appended, moved) == ("EROFS", "EBUSY")
            assert replaced in ("EXDEV", "EBUSY")
            assert result_to_dict(await held)["status"] == "ok"

    asyncio.run(scenario())
    assert (ws / "sub" / "s.py").read_bytes().startswith(b"print(open(")


def test_an_approval_is_for_one_call_while_a_program_beside_may_write_there(
    beside: Cluster,
) -> None:
    """A program of the agent's already running when an asked one is looked at could
    change its files before it opens them: the approval binds nothing then (a nonce),
    and the prompt says why; the same command asks again."""
    ws = beside.workspace
    (ws / "s.py").write_bytes(SHOWN)
    (ws / "w.py").write_bytes(WAITS)
    os.mkfifo(ws / "gate")

    async def scenario() -> None:
        async with attached(beside) as person:
            running = person.exec(["python3x", "w.py"])
            writer = await waiting(running, ws / "gate")
            with writer:
                first = person.run("s.py")
                assert await person.answered_or_asked(first) is None
                assert "may write there" in person.prompts[-1]["preview"]
                assert (await person.decide(first, "plan"))["status"] == "ok"
                again = person.run("s.py")
                assert await person.answered_or_asked(again) is None, "ran unasked"
                assert (await person.decide(again, "deny"))["error"]["code"] == "scope_denied"
                writer.write("done\n")
            assert result_to_dict(await running)["status"] == "ok"

    asyncio.run(scenario())
