"""workerHost.exec through the whole pipeline, beside raw bubblewrap, same run.

Two commands: `true` (the fixed cost of a call) and `cat` of a 1 MiB file (the
cost of carrying output back). Each is timed these ways, interleaved (one call of
each per round, so a busy moment of a shared machine lands on every row alike):

  raw                 subprocess.run(argv): no isolation at all
  raw bwrap           subprocess.run of bubblewrap with exec's exact namespaces and
                      mounts, running the program directly: the floor
  raw bwrap +prlimit  the same with prlimit setting the limits (exec's line without
                      the entry helper: no Landlock) and no seccomp
  raw bwrap +LL+sc    exec's exact command line: the entry helper (limits, the pid cap
                      as root, Landlock) and the seccomp filter; without the hold at
                      --block-fd while the worker writes the sandbox's user limits
                      and, as root, sets its last pid (sandbox._startline.settle):
                      that is counted to sandbox.run and the pipeline, not to this
                      line
  sandbox.run         sandbox.process.run with that line (its child handling included)
  pipeline            caller → hub → worker → allowlist → sandbox → back (`agentworker up`)
  raw two-hop relay   a bare gRPC relay (_common.RELAY: caller → relay → its worker and
                      back, nothing of ours) carrying the program's output back, spaced
                      as the pipeline's calls are: the floor of the hops alone
  sandbox built ahead
                      sandbox.process.run taking the sandbox built ahead for its plan
                      after its previous call (sandbox.warm), as the worker's exec does

Each call is followed by an untimed pause (--pause-ms, 40): what a call leaves to do
after it answered (the worker builds the plan's next sandbox 5 ms after a call's program
ended, and writes telemetry) then lands in no other row's time. Without it, the
next sandbox built during the raw rows made them slower, and the ratio look better.

Printed: p50/p99 latency and each figure's ratio to raw, what each step of exec's
line adds (the median of the rounds' differences, each round running the lines
back to back, and their middle half), what the pipeline adds to exec's line and how
much of that the bare relay's hops alone take, then the two budgets: Landlock +
seccomp add at most 1 ms to raw bwrap (p50), and exec through the hub is at most
1.5x exec's exact bwrap line.

    python benchmarks/bench_exec.py [--calls 200] [--pause-ms 40]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import (
    MIB,
    OneCall,
    agentworker,
    connected,
    dispatch_call,
    goal,
    machine,
    make_home,
    relay,
    relay_call,
    report,
)
from sandbox import _entry, _pidcap, _seccomp, environment
from sandbox._bwrap import command, find_tools
from sandbox._spawn import Starts
from sandbox.process import Limits, Mount, PidCap, View, run
from sandbox.warm import WarmSandboxes


def raw_call(argv: list[str], cwd: Path, expect: int) -> OneCall:
    async def one() -> None:
        out = subprocess.run(argv, cwd=cwd, capture_output=True, check=True)
        if len(out.stdout) != expect:
            raise RuntimeError("raw output has the wrong size")

    return one


def view_of(workspace: Path, entry: str | None, *, seccomp: bool) -> View:
    return View(
        cwd=str(workspace),
        mounts=(Mount(str(workspace), False),),
        env=environment.build(os.environ, ["LANG"]),
        seccomp=seccomp,
        entry=entry,
    )


def raw_bwrap_call(argv: list[str], workspace: Path, expect: int, mode: str, entry: str) -> OneCall:
    """bubblewrap with exec's own flags, run directly. `mode`: "direct" (the program
    right after bwrap's options), "prlimit" (exec's line without the entry helper, no
    seccomp) or "entry" (exec's exact line: entry helper and seccomp)."""
    with_entry = mode == "entry"
    view = view_of(workspace, entry if with_entry else None, seccomp=with_entry)
    tools = find_tools(view.bwrap)
    rules = _seccomp.filter_for_machine() if with_entry else None
    cap = _pidcap.cap_for(Limits().processes) if _pidcap.needed() and with_entry else None

    async def one() -> None:
        fd = None
        if rules is not None:
            fd = os.memfd_create("seccomp")
            os.write(fd, rules)
            os.lseek(fd, 0, os.SEEK_SET)
        try:
            line = command(tools, argv, view, Limits(), info_fd=None, seccomp_fd=fd, pid_cap=cap)
            if mode == "direct":
                line = [*line[: line.index("--")], "--", *argv]
            out = subprocess.run(
                line, capture_output=True, check=True, pass_fds=() if fd is None else (fd,)
            )
        finally:
            if fd is not None:
                os.close(fd)
        if len(out.stdout) != expect:
            raise RuntimeError("raw bwrap output has the wrong size")

    return one


def sandbox_call(
    argv: list[str], workspace: Path, expect: int, entry: str, *, ahead: bool = False
) -> OneCall:
    view = view_of(workspace, entry, seccomp=True)
    pid_cap, starts = PidCap(), Starts()  # kept from one call to the next, as a worker's
    warm = WarmSandboxes() if ahead else None

    async def one() -> None:
        done = await run(
            argv, view, Limits(), pid_cap=pid_cap, starts=starts, warm=warm, warm_for="bench"
        )
        if done.exit_code != 0 or len(done.stdout) != expect:
            raise RuntimeError(f"sandboxed {argv} failed: {done}")

    return one


def paired(before: list[float], after: list[float]) -> tuple[float, float, float]:
    """What `after` adds to `before`, round by round: the quartiles of the differences."""
    q1, median, q3 = statistics.quantiles([b - a for a, b in zip(before, after, strict=True)])
    return q1, median, q3


async def interleaved(calls: list[OneCall], rounds: int, pause_s: float) -> list[list[float]]:
    """Latencies (ms) of each call, one of each per round, after a warm-up round; each
    call followed by an untimed pause of `pause_s` (see the module's doc)."""
    for one in calls:
        for _ in range(5):
            await one()
            await asyncio.sleep(pause_s)
    samples: list[list[float]] = [[] for _ in calls]
    for _ in range(rounds):
        for index, one in enumerate(calls):
            start = time.perf_counter()
            await one()
            samples[index].append((time.perf_counter() - start) * 1000)
            await asyncio.sleep(pause_s)
    return samples


async def bench(calls: int, home_dir: Path, pause_s: float) -> None:
    home = make_home(home_dir, mode="ro", scopes=["workerHost.exec"])
    (home.workspace / "one-mib.bin").write_bytes(os.urandom(MIB))
    entry = _entry.build(home_dir / "bench-exec-cache", "cc")
    with agentworker(["up"], home), relay() as relay_address:
        async with (
            connected(home) as client,
            grpc.aio.insecure_channel(relay_address) as relayed,
        ):
            for argv, expect in ((["true"], 0), (["cat", "one-mib.bin"], MIB)):
                pinned = ["/usr/bin/" + argv[0], *argv[1:]]
                ws = home.workspace
                rows = [
                    ("raw subprocess.run", raw_call(pinned, ws, expect)),
                    ("raw bwrap", raw_bwrap_call(pinned, ws, expect, "direct", entry)),
                    ("raw bwrap +prlimit", raw_bwrap_call(pinned, ws, expect, "prlimit", entry)),
                    ("raw bwrap +LL+seccomp", raw_bwrap_call(pinned, ws, expect, "entry", entry)),
                    ("sandbox.run", sandbox_call(pinned, ws, expect, entry)),
                    (
                        "exec via hub → worker",
                        dispatch_call(client, "workerHost.exec", {"argv": argv}, b"", expect),
                    ),
                    ("raw two-hop relay", relay_call(relayed, b"", expect)),
                    (
                        "sandbox built ahead",
                        sandbox_call(pinned, ws, expect, entry, ahead=True),
                    ),
                ]
                samples = await interleaved([one for _, one in rows], calls, pause_s)
                label = f"exec {' '.join(argv)}: {calls} rounds, 1 in flight, interleaved"
                report(label, list(zip([n for n, _ in rows], samples, strict=True)), name_width=26)
                p50 = [statistics.median(s) for s in samples]
                what = " ".join(argv)
                steps = [(1, 2, "+prlimit"), (2, 3, "+LL+seccomp over +prlimit"), (1, 3, "+LL+sc")]
                print("  added, median of the rounds' differences (and their middle half):")
                for before, after, name in steps:
                    added = paired(samples[before], samples[after])
                    print(f"    {name:28}{added[1]:+7.2f} ms  [{added[0]:+.2f}..{added[2]:+.2f}]")
                over = p50[5] - p50[3]
                print(
                    f"  the pipeline over exec's line: {over:+.2f} ms, of which the bare relay's "
                    f"hops alone take {p50[6]:.2f} ms (ours beyond them {over - p50[6]:+.2f} ms)"
                )
                goal(
                    f"exec {what}: Landlock + seccomp (+ limits) over raw bwrap",
                    p50[3],
                    " ms",
                    1.0,
                    baseline=p50[1],
                    baseline_name="raw bwrap",
                    on="added",
                )
                goal(
                    f"exec {what}: hub → worker / exec's exact bwrap line",
                    p50[5],
                    " ms",
                    1.5,
                    baseline=p50[3],
                    baseline_name="exec's bwrap line",
                    on="ratio",
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--pause-ms", type=float, default=40.0)
    args = parser.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory() as home:
        asyncio.run(bench(args.calls, Path(home), args.pause_ms / 1000))


if __name__ == "__main__":
    main()
