"""An allowlist ask's approval "for this plan" is bound to the call's stdin too
(review15 finding 05): exec's blob is the program's stdin, and for `python3 -` the
stdin is the program. Before, the approval was bound to [argv, cwd] alone, and a
second call of `python3 -` in the plan with another stdin ran unasked.

Real hub and `agentworker run` subprocesses over loopback gRPC; the allowlist makes
/usr/bin/python3 an `ask` rule; a UI is attached over the worker's console socket (as
`agentworker ui` is) and answers the prompts."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import Cluster, cluster
from tests.support.policies import exec_config
from worker.config import Paths
from worker.core.console_socket import SocketLink
from worker.hub.client import ControlClient, result_to_dict

ASKS = """
[program.python3]
paths = ["/usr/bin/python3"]
[[program.python3.rule]]
id = "python-asks"
decision = "ask"
reason = "the person approves each script"
any_args = true
"""
SHOWN = b"print('hello from the approved script')\n"
OTHER = b"import pathlib; pathlib.Path('PWNED').write_text('ran unasked')\n"


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Cluster]:
    with cluster(tmp_path / "home", extra_config=exec_config(tmp_path / "policy", ASKS)) as c:
        yield c


class Person:
    """A UI attached over the console socket: the prompts it was shown, in order."""

    def __init__(self) -> None:
        self.prompts: list[dict[str, Any]] = []
        self.came = asyncio.Event()

    def told(self, event: dict[str, Any]) -> None:
        if event.get("type") == "prompt":
            self.prompts.append(event["prompt"])
            self.came.set()


def test_a_plan_approval_of_one_stdin_asks_again_for_another(live: Cluster) -> None:
    async def scenario() -> None:
        person = Person()
        ui = SocketLink(Paths(config_dir=live.home, data_dir=live.home).ui_socket)
        await ui.open(person.told)
        client = ControlClient.connect(live.listen, live.token)
        try:

            def call(blob: bytes) -> asyncio.Future[Any]:
                return asyncio.ensure_future(
                    client.dispatch(
                        agent_id="tester",
                        plan_id="plan-1",
                        surface="workerHost",
                        action="exec",
                        args_json=json.dumps({"argv": ["python3", "-"]}),
                        blob=blob,
                        timeout_ms=120_000,
                    )
                )

            async def answered_or_asked(pending: asyncio.Future[Any]) -> dict[str, Any] | None:
                """The call's result if it ran without a prompt, None once it asks."""
                person.came.clear()
                asked = asyncio.ensure_future(person.came.wait())
                done, _ = await asyncio.wait({pending, asked}, return_when=asyncio.FIRST_COMPLETED)
                asked.cancel()
                return result_to_dict(pending.result()) if pending in done else None

            first = call(SHOWN)
            assert await answered_or_asked(first) is None
            prompt = person.prompts[-1]
            stdin = hashlib.sha256(SHOWN).hexdigest()
            # The prompt says what the stdin is, and shows it.
            shown = prompt["preview"]
            assert f"stdin: {len(SHOWN)} bytes, sha256 {stdin}: the program's input" in shown
            assert "hello from the approved script" in shown
            reply = await ui.command({"op": "decide", "prompt_id": prompt["id"], "choice": "plan"})
            assert reply["ok"], reply
            r1 = result_to_dict(await first)
            assert r1["status"] == "ok", r1

            # The same command and stdin again: the approval answers it.
            again = await answered_or_asked(call(SHOWN))
            assert again is not None and again["status"] == "ok", again

            # Another stdin: asked again; denied, it never runs.
            other = call(OTHER)
            assert await answered_or_asked(other) is None
            prompt = person.prompts[-1]
            assert "PWNED" in prompt["preview"]
            reply = await ui.command({"op": "decide", "prompt_id": prompt["id"], "choice": "deny"})
            assert reply["ok"], reply
            denied = result_to_dict(await other)
            assert denied["status"] == "error" and denied["error"]["code"] == "scope_denied"

            # No stdin at all is another ask too.
            empty = call(b"")
            assert await answered_or_asked(empty) is None
            assert "stdin: none" in person.prompts[-1]["preview"]
            reply = await ui.command(
                {"op": "decide", "prompt_id": person.prompts[-1]["id"], "choice": "deny"}
            )
            assert reply["ok"], reply
            assert result_to_dict(await empty)["error"]["code"] == "scope_denied"
            assert len(person.prompts) == 3
            await ui.close()
        finally:
            await client.close()

    asyncio.run(scenario())
    assert not (live.workspace / "PWNED").exists()


def test_a_plan_approval_of_a_script_asks_again_once_the_script_changed(live: Cluster) -> None:
    """review16 F7: `python3 script.py` approved for the plan ran the script the agent
    rewrote afterwards, unasked. Now the files its arguments name are bound: a script
    rewritten, or a symlink swapped to another, asks again; unchanged, it does not."""
    script, link = live.workspace / "script.py", live.workspace / "run.py"

    async def scenario() -> None:
        person = Person()
        ui = SocketLink(Paths(config_dir=live.home, data_dir=live.home).ui_socket)
        await ui.open(person.told)
        client = ControlClient.connect(live.listen, live.token)
        try:

            def run(name: str) -> asyncio.Future[Any]:
                return asyncio.ensure_future(
                    client.dispatch(
                        agent_id="tester",
                        plan_id="plan-1",
                        surface="workerHost",
                        action="exec",
                        args_json=json.dumps(
                            {"argv": ["python3", name], "cwd": str(live.workspace)}
                        ),
                        timeout_ms=120_000,
                    )
                )

            async def answered_or_asked(pending: asyncio.Future[Any]) -> dict[str, Any] | None:
                person.came.clear()
                asked = asyncio.ensure_future(person.came.wait())
                done, _ = await asyncio.wait({pending, asked}, return_when=asyncio.FIRST_COMPLETED)
                asked.cancel()
                return result_to_dict(pending.result()) if pending in done else None

            async def decide(pending: asyncio.Future[Any], choice: str) -> dict[str, Any]:
                reply = await ui.command(
                    {"op": "decide", "prompt_id": person.prompts[-1]["id"], "choice": choice}
                )
                assert reply["ok"], reply
                return result_to_dict(await pending)

            script.write_bytes(SHOWN)
            first = run("script.py")
            assert await answered_or_asked(first) is None
            digest = hashlib.sha256(SHOWN).hexdigest()
            assert (
                f"file script.py: {len(SHOWN)} bytes, sha256 {digest}"
                in (person.prompts[-1]["preview"])
            )
            assert (await decide(first, "plan"))["status"] == "ok"
            again = await answered_or_asked(run("script.py"))
            assert again is not None and again["status"] == "ok", again  # unchanged

            script.write_bytes(OTHER)  # as the agent's fs_write would
            rewritten = run("script.py")
            assert await answered_or_asked(rewritten) is None
            assert "PWNED" not in person.prompts[-1]["preview"]  # the file is not shown...
            assert hashlib.sha256(OTHER).hexdigest() in person.prompts[-1]["preview"]  # ...bound
            assert (await decide(rewritten, "deny"))["error"]["code"] == "scope_denied"

            (live.workspace / "shown.py").write_bytes(SHOWN)
            link.symlink_to("shown.py")
            linked = run("run.py")
            assert await answered_or_asked(linked) is None
            assert (await decide(linked, "plan"))["status"] == "ok"
            link.unlink()
            link.symlink_to("script.py")  # the other script, behind the same name
            swapped = run("run.py")
            assert await answered_or_asked(swapped) is None
            assert (await decide(swapped, "deny"))["error"]["code"] == "scope_denied"
            assert len(person.prompts) == 4
            await ui.close()
        finally:
            await client.close()

    asyncio.run(scenario())
    assert not (live.workspace / "PWNED").exists()
