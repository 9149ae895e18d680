"""workerHost.exec through the whole pipeline, beside a raw subprocess.run, same run.

Two commands: `true` (the fixed cost of a call) and `cat` of a 1 MiB file (the
cost of carrying output back). Each is timed these ways, one call at a time:

  raw        subprocess.run(argv) in this process, no isolation at all
  raw bwrap  subprocess.run of the exact bubblewrap command line exec builds
             (sandbox._bwrap.command), without and with the seccomp filter
  sandbox    sandbox.process.run: bubblewrap + prlimit (+ the pid cap as root),
             without and with the seccomp filter
  pipeline   caller → hub → worker → allowlist → sandbox → back (`agentworker up`),
             the filter on, as always

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
from sandbox import _seccomp, environment
from sandbox._bwrap import command, find_tools
from sandbox.process import Limits, Mount, View, run


def raw_call(argv: list[str], cwd: Path, expect: int) -> OneCall:
    async def one() -> None:
        out = subprocess.run(argv, cwd=cwd, capture_output=True, check=True)
        if len(out.stdout) != expect:
            raise RuntimeError("raw output has the wrong size")

    return one


def view_of(workspace: Path, *, seccomp: bool) -> View:
    return View(
        cwd=str(workspace),
        mounts=(Mount(str(workspace), False),),
        env=environment.build(os.environ, ["LANG"]),
        seccomp=seccomp,
    )


def raw_bwrap_call(argv: list[str], workspace: Path, expect: int, *, seccomp: bool) -> OneCall:
    """bubblewrap with exec's own flags, run directly: the floor under sandbox.process.run."""
    view = view_of(workspace, seccomp=seccomp)
    tools = find_tools(view.bwrap)
    rules = _seccomp.filter_for_machine() if seccomp else None

    async def one() -> None:
        fd = None
        if rules is not None:
            fd = os.memfd_create("seccomp")
            os.write(fd, rules)
            os.lseek(fd, 0, os.SEEK_SET)
        try:
            line = command(tools, argv, view, Limits(), info_fd=-1, block_fd=-1, seccomp_fd=fd)
            at = line.index("--info-fd")
            del line[at : at + 4]  # --info-fd N --block-fd N: run()'s handshake, not confinement
            out = subprocess.run(
                line, capture_output=True, check=True, pass_fds=() if fd is None else (fd,)
            )
        finally:
            if fd is not None:
                os.close(fd)
        if len(out.stdout) != expect:
            raise RuntimeError("raw bwrap output has the wrong size")

    return one


def sandbox_call(argv: list[str], workspace: Path, expect: int, *, seccomp: bool) -> OneCall:
    view = view_of(workspace, seccomp=seccomp)

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
                ws = home.workspace
                pipeline = dispatch_call(client, "workerHost.exec", {"argv": argv}, b"", expect)
                calls_of = [
                    ("raw subprocess.run", raw_call(pinned, ws, expect)),
                    ("raw bwrap, no seccomp", raw_bwrap_call(pinned, ws, expect, seccomp=False)),
                    ("raw bwrap + seccomp", raw_bwrap_call(pinned, ws, expect, seccomp=True)),
                    ("sandbox.run, no seccomp", sandbox_call(pinned, ws, expect, seccomp=False)),
                    ("sandbox.run + seccomp", sandbox_call(pinned, ws, expect, seccomp=True)),
                    ("exec via hub → worker", pipeline),
                ]
                rows = [(name, await timed(one, calls)) for name, one in calls_of]
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
