"""What an asked program holds is held as the files it is, not only by the names its
arguments give (review21 B1, B2 and r8): another name of a held file (a hard link the
agent made earlier) cannot change it while the approved program runs; a link's target
out of a held folder is held too; and an argument outside the call's own read-write
shared folders (`/`) holds nothing, so it cannot make every write wait on a prompt.

Real hub and `agentworker run` subprocesses over loopback; /usr/bin/python3 is an ask,
`python3x` the same interpreter the agent may run unasked; a UI attached over the
console socket answers (tests.integration.test_ask_binds_stdin)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.held import LINKS_FOLLOWED_AT_MOST
from tests.integration.test_ask_binds_stdin import OTHER, WAITS, Person, attached, waiting
from tests.support.cluster import Cluster, cluster
from tests.support.policies import PYTHON3_ASKS, PYTHON3_BESIDE, exec_config
from worker.hub.client import result_to_dict

APPENDS = b"open('h.py', 'a').write('import evil\\n'); print('appended')\n"


def _hard_links_allowed(tmp_path: Path) -> str:
    return exec_config(tmp_path / "policy", PYTHON3_ASKS, PYTHON3_BESIDE) + (
        "[fs]\nallow_hard_links = true\n"
    )


@pytest.fixture
def linked(tmp_path: Path) -> Iterator[Cluster]:
    """s.py (it waits on the FIFO `gate`) with a second name, h.py."""
    with cluster(tmp_path / "home", extra_config=_hard_links_allowed(tmp_path)) as live:
        ws = live.workspace
        (ws / "s.py").write_bytes(WAITS)
        os.link(ws / "s.py", ws / "h.py")
        (ws / "appends.py").write_bytes(APPENDS)
        os.mkfifo(ws / "gate")
        yield live


async def _approved_and_waiting(person: Person, *args: str) -> tuple[asyncio.Future[Any], Any]:
    """`python3 *args` asked, approved once, and waiting on the gate."""
    held = person.run(*args)
    assert await person.answered_or_asked(held) is None
    command = {"op": "decide", "prompt_id": person.prompts[-1]["id"], "choice": "once"}
    assert (await person.ui.command(command))["ok"]
    return held, await waiting(held, person.live.workspace / "gate")


def test_a_program_beside_does_not_start_while_a_held_file_has_another_name(
    linked: Cluster,
) -> None:
    """A program started beside is shown held names read-only; another name of the
    same file it was not: its append through h.py went into the approved script."""

    async def scenario() -> None:
        async with attached(linked) as person:
            held, writer = await _approved_and_waiting(person, "s.py")
            with writer:
                refused = result_to_dict(await person.exec(["python3x", "appends.py"]))
                writer.write("approved\n")
            assert refused["status"] == "error", refused
            assert refused["error"]["code"] == "busy", refused
            assert "other names (hard links)" in refused["error"]["message"], refused
            assert result_to_dict(await held)["status"] == "ok"
            # Once it has ended, the program beside runs.
            after = result_to_dict(await person.exec(["python3x", "appends.py"]))
            assert after["status"] == "ok", after

    asyncio.run(scenario())


def test_an_append_through_another_name_of_a_held_file_is_refused(linked: Cluster) -> None:
    """fs_write's append to h.py wrote into the held s.py (`busy` only by its name);
    a replacement of h.py leaves s.py as it was, and goes."""

    async def scenario() -> None:
        async with attached(linked) as person:
            held, writer = await _approved_and_waiting(person, "s.py")
            with writer:
                appended = await person.write("h.py", OTHER, "append")
                replaced = await person.write("h.py", OTHER, "overwrite")
                writer.write("approved\n")
            assert appended["status"] == "error", appended
            assert appended["error"]["code"] == "busy", appended
            assert replaced["status"] == "ok", replaced
            assert result_to_dict(await held)["status"] == "ok"

    asyncio.run(scenario())
    assert (linked.workspace / "s.py").read_bytes() == WAITS


@pytest.fixture
def asks(tmp_path: Path) -> Iterator[Cluster]:
    with cluster(
        tmp_path / "home", extra_config=exec_config(tmp_path / "policy", PYTHON3_ASKS)
    ) as live:
        os.mkfifo(live.workspace / "gate")
        yield live


def test_a_link_target_out_of_a_held_folder_is_held(asks: Cluster) -> None:
    """`python3 pkg` runs pkg/__main__.py -> ../s3.py: the folder's binding covers the
    target's contents, and now so does the hold (the agent's overwrites of s3.py went,
    and ran unasked under the approval: review21 r8)."""
    ws = asks.workspace
    (ws / "pkg").mkdir()
    (ws / "s3.py").write_bytes(WAITS)
    (ws / "pkg" / "__main__.py").symlink_to("../s3.py")

    async def scenario() -> None:
        async with attached(asks) as person:
            held, writer = await _approved_and_waiting(person, "pkg")
            with writer:
                refused = await person.write("s3.py", OTHER, "overwrite")
                writer.write("approved\n")
            assert refused["status"] == "error", refused
            assert refused["error"]["code"] == "busy", refused
            assert result_to_dict(await held)["status"] == "ok"

    asyncio.run(scenario())
    assert (ws / "s3.py").read_bytes() == WAITS


def test_an_argument_outside_the_calls_shared_folders_holds_nothing(asks: Cluster) -> None:
    """`python3 s.py /` held `/`, so every fs_write of every plan answered `busy` for
    as long as the prompt waited (review21 B2)."""
    (asks.workspace / "s.py").write_bytes(b"print('hi')\n")

    async def scenario() -> None:
        async with attached(asks) as person:
            asked = person.run("s.py", "/")
            assert await person.answered_or_asked(asked) is None  # the prompt waits
            written = await person.write("elsewhere.txt", b"x", "create")
            assert written["status"] == "ok", written
            assert (await person.decide(asked, "deny"))["error"]["code"] == "scope_denied"

    asyncio.run(scenario())


def test_a_held_script_shaped_like_a_leftover_is_not_swept(asks: Cluster) -> None:
    """fs_write sweeps stale temporary names of its own shape from the folder it wrote
    in; an agent gave its script that shape and an old mtime, and the sweep unlinked it
    while the approved program held it, which took its pins away in every sandbox
    beside (review23 C10). A held name is left be."""
    ws = asks.workspace
    script = ws / ".s.py.0123abcd.agentworker-tmp"
    script.write_bytes(WAITS)
    os.utime(script, (0, 0))

    async def scenario() -> None:
        async with attached(asks) as person:
            held, writer = await _approved_and_waiting(person, script.name)
            with writer:
                wrote = await person.write("note.txt", OTHER, "overwrite")
                assert script.exists()
                writer.write("approved\n")
            assert wrote["status"] == "ok", wrote
            assert result_to_dict(await held)["status"] == "ok"

    asyncio.run(scenario())
    assert script.read_bytes() == WAITS


def test_a_folder_holding_a_read_write_shared_folder_holds_that_folder(tmp_path: Path) -> None:
    """review23 C13: a folder argument in a read-only shared folder that holds a
    read-write one (a project shared read-only, its build/ read-write) was beneath no
    read-write folder, so nothing was held: the agent's fs_write into build/ while the
    prompt waited went, and the approved program ran it. That folder is held now."""
    proj = tmp_path / "proj"
    build = proj / "build"
    build.mkdir(parents=True)
    (proj / "__main__.py").write_bytes(b"exec(open('build/gen.py').read())\n")
    (build / "gen.py").write_bytes(b"print('benign')\n")
    roots = f'\n[[root]]\npath = "{proj}"\nmode = "ro"\n\n[[root]]\npath = "{build}"\nmode = "rw"\n'
    config = exec_config(tmp_path / "policy", PYTHON3_ASKS) + roots

    async def scenario(live: Cluster) -> None:
        async with attached(live) as person:
            asked = person.run(str(proj))
            assert await person.answered_or_asked(asked) is None
            wrote = await person.write(str(build / "gen.py"), OTHER, "overwrite")
            assert wrote["status"] == "error", wrote
            assert wrote["error"]["code"] == "busy", wrote
            assert (await person.decide(asked, "deny"))["status"] == "error"
            after = await person.write(str(build / "gen.py"), OTHER, "overwrite")
            assert after["status"] == "ok", after  # let go with the refused command

    with cluster(tmp_path / "home", extra_config=config) as live:
        asyncio.run(scenario(live))


def test_a_folder_of_more_links_than_are_followed_binds_once_and_holds_no_one_up(
    tmp_path: Path,
) -> None:
    """review23 C3 and C11: past LINKS_FOLLOWED_AT_MOST links a folder's hold does not
    know where the rest lead. Holding up every program that could write beside it
    stopped every plan's `ls` while the prompt waited; the prompt says it instead, and
    the approval answers that call only."""
    config = exec_config(tmp_path / "policy", PYTHON3_ASKS, PYTHON3_BESIDE)
    with cluster(tmp_path / "home", extra_config=config) as live:
        ws = live.workspace
        (ws / "lnk").mkdir()
        (ws / "t.txt").write_text("target")
        for i in range(LINKS_FOLLOWED_AT_MOST + 1):
            (ws / "lnk" / f"l{i:03}").symlink_to("../t.txt")
        (ws / "s.py").write_bytes(b"print('hi')\n")

        async def scenario() -> None:
            async with attached(live) as person:
                asked = person.run("s.py", "lnk")
                assert await person.answered_or_asked(asked) is None
                assert "lead is not held while it waits and runs" in person.prompts[-1]["preview"]
                beside = result_to_dict(await person.exec(["python3x", "-c", "print(1)"]))
                assert beside["status"] == "ok", beside
                assert (await person.decide(asked, "deny"))["status"] == "error"

        asyncio.run(scenario())
