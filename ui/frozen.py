"""The one-file build's way in (packaging/onefile): the `agentworker` command with
its TUI, as ui.launch gives it to an installed agentworker.

A one-file binary is no Python interpreter: the worker cannot start the TUI's own
process as `python -m ui.child`. It starts the binary again with `UI_CHILD_FLAG`
first (ui.launch.Tui.command), and that is told apart here, before the command line
is parsed. The flag gives nothing the command line does not: the child only attaches
to a worker's console socket, as `agentworker ui` does.
"""

from __future__ import annotations

import sys

UI_CHILD_FLAG = "--ui-child"


def main() -> int:
    if sys.argv[1:2] == [UI_CHILD_FLAG]:
        from ui.child import run_and_leave

        run_and_leave(sys.argv[2:])  # never returns
    from ui.launch import main as launch

    return launch()


if __name__ == "__main__":
    sys.exit(main())
