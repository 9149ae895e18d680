"""doctor's word on the descriptors a sandbox may keep in flight (I1)."""

from __future__ import annotations

import os

from worker.cli.doctor import _in_flight
from worker.config import Config


def test_the_default_open_files_leaves_the_users_programs_room() -> None:
    finding = _in_flight(Config())
    assert finding.status == "ok", finding
    assert finding.details == {"open_files": 512, "most_in_flight": 765}
    assert "keep 259 under the usual limit of 1,024" in finding.summary


def test_open_files_raised_past_512_is_said_with_what_it_costs() -> None:
    config = Config.model_validate({"exec": {"open_files": 4096}})
    finding = _in_flight(config)
    assert finding.status == ("info" if os.geteuid() == 0 else "warn")
    assert (
        "ETOOMANYREFS" in finding.summary and finding.fix == "set [exec] open_files = 512 or less"
    )
