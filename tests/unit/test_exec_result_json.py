"""exec writes its result as JSON with orjson, without building ExecResult: that JSON
is exactly what the model makes, for every way a program ends."""

from __future__ import annotations

import pytest

from sandbox.process import Completed
from worker.actions.host.exec_cmd import ExecResult, result_of
from worker.core.registry import Json


@pytest.mark.parametrize(
    ("program", "done", "plan_limits"),
    [
        ("/usr/bin/true", Completed(0, None, b"", b"", False, False, 0.0042), ()),
        ("/usr/bin/cat", Completed(1, None, b"x" * 10, b"no", False, False, 1.5), ()),
        ("/usr/bin/yes", Completed(None, 9, b"y\n" * 9, b"", True, True, 30.0), ("memory",)),
        ('/opt/é ü \\ " \u2028/tool', Completed(None, 77, b"", b"", False, False, 0.0), ()),
    ],
)
def test_the_exec_json_is_the_result_models_own(
    program: str, done: Completed, plan_limits: tuple[str, ...]
) -> None:
    result = result_of(program, "rule-1", done, plan_limits=plan_limits)
    assert isinstance(result, Json)
    model = ExecResult.model_validate_json(result.text)
    assert model.model_dump_json() == result.text
    assert (model.exit_code, model.stdout_bytes, model.plan_limits) == (
        done.exit_code,
        len(done.stdout),
        list(plan_limits),
    )


def test_a_name_orjson_will_not_write_gets_the_model() -> None:
    done = Completed(0, None, b"", b"", False, False, 0.0)
    result = result_of("/opt/\udcff", "r", done)
    assert isinstance(result, ExecResult) and result.program == "/opt/\udcff"
