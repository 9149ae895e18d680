"""The worker's start leaves its args and result models unbuilt (each is built at its
first use), and pydantic's plugins are not looked for unless the environment asks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

_PROBE = """
import json
from worker import actions

specs = actions.build()
models = [spec.args for spec in specs.values()] + [spec.result for spec in specs.values()]
built = sorted({m.__name__ for m in models if m.__pydantic_complete__})
stat = specs["workerHost.fs_stat"].args
refused = []
for text in ('{"path": 7}', '{"path": "a", "extra": 1}'):  # as strict as ever, first use too
    try:
        stat.model_validate_json(text)
    except ValueError as exc:
        refused.append(exc.errors()[0]["type"])
stat.model_validate_json('{"path": "a"}')
print(json.dumps([len(models), built, refused, stat.__pydantic_complete__]))
"""


def test_the_start_builds_no_action_model_each_is_built_at_its_first_use() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True
    )
    count, built, refused, stat_built = json.loads(done.stdout.splitlines()[-1])
    assert count > 30 and built == [], built
    assert refused == ["string_type", "extra_forbidden"]
    assert stat_built


_PLUGINS = """
import contextlib, io, os, sys
from ui.launch import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    main()
print(os.environ.get("PYDANTIC_DISABLE_PLUGINS"))
"""


def test_pydantic_plugins_are_off_unless_the_environment_says() -> None:
    def seen(env: dict[str, str]) -> str:
        done = subprocess.run(
            [sys.executable, "-c", _PLUGINS, "--version"],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
        return done.stdout.splitlines()[-1]

    env = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    assert seen(env) == "__all__"
    assert seen({**env, "PYDANTIC_DISABLE_PLUGINS": "logfire"}) == "logfire"
