"""The `workerHost` actions: exec, files and HTTP fetches on this machine."""

import sys

# httpx imports its own command-line client (and with it click, rich and pygments)
# whenever those happen to be installed, as they are beside the TUI: over 40% of its
# import, paid at every worker start, for a program the worker never runs. A None in
# sys.modules makes that import fail, and httpx then goes without it (it expects
# them missing: `pip install httpx` has no CLI). Set before any module here imports
# httpx; a process that imported httpx already keeps its own.
if "httpx" not in sys.modules:
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
