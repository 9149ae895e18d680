"""Keys typed into a terminal before `agentworker ui` attached there are not read by
it (review26). Textual reads whatever waits in the terminal as it starts, and until
the worker knows a UI, key_type types into its terminal like any other: an agent
could type `agentworker ui` and Return, then keys the TUI would take as the person's
("s" stops every plan, or resumes them). The real command on a real pseudo-terminal, against a
real hub and worker."""

from __future__ import annotations

import signal

from tests.support.cluster import Cluster, wait_for
from tests.support.terminal import AGENTWORKER, Terminal
from worker.core.pause import PauseSwitch

# Textual asks for focus reports right after it put the terminal in raw mode: from
# then on it reads each key as it comes.
READING_KEYS = "\x1b[?1004h"
READY = "● ready"


def test_keys_typed_before_the_ui_attached_are_dropped(live: Cluster) -> None:
    """The TUI reads keys (raw mode) while the worker has not answered its attach yet
    (the worker stopped meanwhile, SIGSTOP). Keys typed then went to the calls filter,
    focused as the TUI starts and not shown: "zz" hid every call from the person. They
    are dropped now; keys typed once it attached count ("s" stops all)."""
    pause = PauseSwitch.in_dir(live.home)
    worker = next(p for p in live.procs if p.name == "worker")
    worker.signal(signal.SIGSTOP)
    ui = None
    try:
        ui = Terminal([AGENTWORKER, "ui"], live.env)
        ui.expect(READING_KEYS)
        ui.type("zz")
    finally:
        worker.signal(signal.SIGCONT)
    try:
        ui.expect(READY)
        mark = ui.mark()
        assert live.call("workerHost.fs_stat", '{"path": "."}')["status"] == "ok"
        ui.expect("fs_stat", after=mark)  # its row shows: nothing filters the calls
        assert not pause.current().active
        ui.type("s")
        wait_for(lambda: pause.current().active, 60)
    finally:
        ui.close()
