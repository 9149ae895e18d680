"""workerHost.exec through the whole pipeline, beside a raw subprocess.run, same run.

Two commands: `true` (the fixed cost of a call) and `cat` of a 1 MiB file (the
cost of carrying output back). Each is timed three ways, one call at a time:

  raw        subprocess.run(argv) in this process, no isolation at all
  sandbox    sandbox.process.run: bubblewrap + prlimit (+ the pid cap as root)
  pipeline   caller → hub → worker → allowlist → sandbox → back (`agentworker up`)

Printed: p50/p99 latency and each figure's ratio to raw.

    python benchmarks/bench_exec.py [--calls 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import (
    MIB,
    OneCall,
    agentworker,
    connected,
    dispatch_call,
    make_home,
    report,
    timed,
)
from sandbox import environment
from sandbox.process import Limits, Mount, View, run


def raw_call(argv: list[str], cwd: Path, expect: int) -> OneCall:
    async def one() -> None:
        out = subprocess.run(argv, cwd=cwd, capture_output=True, check=True)
        if len(out.stdout) != expect:
            raise RuntimeError("raw output has the wrong size")

    return one


def sandbox_call(argv: list[str], workspace: Path, expect: int) -> OneCall:
    view = View(
        cwd=str(workspace),
        mounts=(Mount(str(workspace), False),),
        env=environment.build(os.environ, ["LANG"]),
    )

    async def one() -> None:
        done = await run(argv, view, Limits())
        if done.exit_code != 0 or len(done.stdout) != expect:
            raise RuntimeError(f"sandboxed {argv} failed: {done}")

    return one


async def bench(calls: int, home_dir: Path) -> None:
    home = make_home(home_dir, mode="ro", scopes=["workerHost.exec"])
    (home.workspace / "one-mib.bin").write_bytes(os.urandom(MIB))
    with agentworker(["up"], home):
        async with connected(home) as client:
            for argv, expect in ((["true"], 0), (["cat", "one-mib.bin"], MIB)):
                pinned = ["/usr/bin/" + argv[0], *argv[1:]]
                raw = raw_call(pinned, home.workspace, expect)
                sandbox = sandbox_call(pinned, home.workspace, expect)
                pipeline = dispatch_call(client, "workerHost.exec", {"argv": argv}, b"", expect)
                rows = [
                    ("raw subprocess.run", await timed(raw, calls)),
                    ("sandbox.process.run", await timed(sandbox, calls)),
                    ("exec via hub → worker", await timed(pipeline, calls)),
                ]
                label = f"exec {' '.join(argv)}: {calls} calls, 1 in flight"
                report(label, rows, name_width=26)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    root = "root (pid cap via pid_max)" if os.geteuid() == 0 else "a regular user"
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, {os.uname().release}, {root}")
    with tempfile.TemporaryDirectory() as home:
        asyncio.run(bench(args.calls, Path(home)))


if __name__ == "__main__":
    main()
