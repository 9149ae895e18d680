"""Sandbox mode: an allowlist `ask` is bound to the files its arguments name, inside
the plan's workspace too (review16 F7), as `/workspace/...` or relative. Headless, the
ask is refused `scope_required` naming what a grant must match: the name changes when
the script does, and only then. Real hub, real `agentworker run --sandbox`, bubblewrap."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

from tests.support.cluster import Cluster
from tests.support.policies import PYTHON3_ASKS, exec_config
from tests.support.workbench import call, files_of, run, sandbox_cluster
from worker.config import Paths
from worker.core.console_socket import SocketLink
from worker.hub.client import ControlClient, result_to_dict


def _asked_as(live: Cluster, plan: str, argv: list[str]) -> str:
    """What a headless refusal of `argv` in `plan` names for a grant to match."""
    answer, _ = run(live, plan, argv)
    assert answer["error"]["code"] == "scope_required", answer
    return str(answer["error"]["details"]["needs_approval"])


def _write(live: Cluster, plan: str, text: str) -> None:
    """The plan's s.py overwritten with `text`."""
    answer, _ = call(
        live, plan, "fs_write", {"path": "s.py", "mode": "overwrite"}, blob=text.encode()
    )
    assert answer["status"] == "ok", answer


def test_the_ask_of_a_workspace_script_is_named_anew_when_the_script_changes(
    tmp_path: Path,
) -> None:
    plan = f"asks-{uuid.uuid4().hex[:8]}"
    with sandbox_cluster(
        tmp_path, extra_config=exec_config(tmp_path / "policy", PYTHON3_ASKS)
    ) as live:
        _write(live, plan, "print(1)\n")
        first = _asked_as(live, plan, ["python3", "s.py"])
        assert _asked_as(live, plan, ["python3", "s.py"]) == first  # unchanged: the same ask
        absolute = _asked_as(live, plan, ["python3", "/workspace/s.py"])
        _write(live, plan, "print(2)\n")
        assert _asked_as(live, plan, ["python3", "s.py"]) != first
        assert _asked_as(live, plan, ["python3", "/workspace/s.py"]) != absolute
        # back as it was: the first approval would answer it again
        _write(live, plan, "print(1)\n")
        assert _asked_as(live, plan, ["python3", "s.py"]) == first


def test_every_spelling_of_a_workspace_script_is_bound_or_asks_each_time(
    tmp_path: Path,
) -> None:
    """review19 A1b: `//workspace/s.py`, `/./workspace/s.py`, `/tmp/../workspace/s.py` and
    `../workspace/s.py` were taken for host paths naming nothing, and an approval kept
    for the plan ran the rewritten script. Now the first two are the workspace's s.py,
    bound by its contents; the two a `..` leads round to it bind nothing that lasts."""
    plan = f"spelled-{uuid.uuid4().hex[:8]}"
    with sandbox_cluster(
        tmp_path, extra_config=exec_config(tmp_path / "policy", PYTHON3_ASKS)
    ) as live:

        def asked_as(path: str) -> str:
            return _asked_as(live, plan, ["python3", path])

        _write(live, plan, "print(1)\n")
        bound = ["//workspace/s.py", "/./workspace/s.py"]
        first = {path: asked_as(path) for path in bound}
        assert {path: asked_as(path) for path in bound} == first  # unchanged: the same ask
        for path in ["/tmp/../workspace/s.py", "../workspace/s.py"]:
            assert asked_as(path) != asked_as(path)  # a nonce: each call asks anew
        _write(live, plan, "print(2)\n")
        assert all(asked_as(path) != first[path] for path in bound)


def test_a_folders_link_into_the_workspace_is_bound_by_what_it_leads_to(tmp_path: Path) -> None:
    """review23 C1: pkg/__main__.py -> /workspace/s.py leads nowhere on the host, so the
    folder was bound by the link's text, and a grant of `python3 pkg` ran s.py
    rewritten, unasked (3 of 3). The link is followed as the program follows it: to
    the workspace's s.py, bound by its contents; through a way out of the workspace
    and back, nothing that lasts."""
    plan = f"linked-{uuid.uuid4().hex[:8]}"
    with sandbox_cluster(
        tmp_path, extra_config=exec_config(tmp_path / "policy", PYTHON3_ASKS)
    ) as live:
        _write(live, plan, "print(1)\n")
        for folder, target in [("pkg", "/workspace/s.py"), ("far", "/tmp/../workspace/s.py")]:
            (files_of(live, "bench", plan) / folder).mkdir()
            (files_of(live, "bench", plan) / folder / "__main__.py").symlink_to(target)
        first = _asked_as(live, plan, ["python3", "pkg"])
        assert _asked_as(live, plan, ["python3", "pkg"]) == first  # unchanged: the same ask
        _write(live, plan, "print(2)\n")
        assert _asked_as(live, plan, ["python3", "pkg"]) != first
        far = _asked_as(live, plan, ["python3", "far"])
        assert far != _asked_as(live, plan, ["python3", "far"])  # a nonce: each call asks


def test_a_folders_link_into_the_workspace_is_held_while_the_prompt_waits(tmp_path: Path) -> None:
    """review23 C17: with the link followed as the program follows it (C1), the binding
    covered s.py, but the hold followed it on the host, where /workspace/s.py names
    nothing: the agent's fs_write of s.py while the prompt waited went, and the approved
    `python3 pkg` ran it. The hold follows links as the binder does now."""
    plan = f"held-{uuid.uuid4().hex[:8]}"
    with sandbox_cluster(
        tmp_path, extra_config=exec_config(tmp_path / "policy", PYTHON3_ASKS)
    ) as live:
        _write(live, plan, "print('approved')\n")
        pkg = files_of(live, "bench", plan) / "pkg"
        pkg.mkdir()
        (pkg / "__main__.py").symlink_to("/workspace/s.py")
        home = live.home.parent / "bench"

        async def scenario() -> None:
            ui = SocketLink(Paths(config_dir=home, data_dir=home).ui_socket)
            client = ControlClient.connect(live.listen, live.token)
            prompts: list[dict[str, Any]] = []
            shown = asyncio.Event()

            def told(event: dict[str, Any]) -> None:
                if event.get("type") == "prompt":
                    prompts.append(event["prompt"])
                    shown.set()

            def dispatched(action: str, args: dict[str, Any], blob: bytes = b"") -> Any:
                return client.dispatch(
                    agent_id="tester",
                    plan_id=plan,
                    surface="workbenchHost",
                    action=action,
                    args_json=json.dumps(args),
                    blob=blob,
                    timeout_ms=120_000,
                )

            await ui.open(told)
            try:
                asked = asyncio.ensure_future(dispatched("exec", {"argv": ["python3", "pkg"]}))
                await shown.wait()
                args = {"path": "s.py", "mode": "overwrite"}
                wrote = result_to_dict(await dispatched("fs_write", args, b"print('EVIL')\n"))
                assert wrote["status"] == "error", wrote
                assert wrote["error"]["code"] == "busy", wrote
                decided = {"op": "decide", "prompt_id": prompts[-1]["id"], "choice": "once"}
                assert (await ui.command(decided))["ok"]
                ran = await asked
                assert ran.result.blob == b"approved\n", result_to_dict(ran)
                await ui.close()
            finally:
                await client.close()

        asyncio.run(scenario())
