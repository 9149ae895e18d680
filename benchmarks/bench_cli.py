"""How soon the command answers: `agentworker --help` and `agentworker call` to their
first output, and the worker's start to READY, beside `python -c pass`, same run.

Rows, each a fresh process, run in turns (one of each, then again) so all see the
same load:

  python -c pass       the raw baseline: the interpreter starting and leaving
  import grpc + proto  the interpreter importing gRPC (asyncio with it) and the project's
                       generated protobuf module: what any gRPC client in Python pays
                       before it can send a call, `call`'s floor
  --help               `agentworker --help` (the installed entry point), to its first byte
  call workerHost...   `agentworker call workerHost.fs_stat` through a running `up`
  call fs_stat         the same with a bare name (the computer surface's list is read)
  up → ready           `agentworker up --headless` in a fresh home (so its first start,
                       writing config and token), to its `ready:` line: the hub and the
                       worker both started, the worker dialled in and said Hello

Printed: the median wall time to first output, its ratio to the baseline, the
median wall time until the process has exited (what a script waiting for the
command sees; the interpreter's own teardown of gRPC, protobuf and asyncio takes
about 20 ms after the answer), and the median CPU time (user + system) of the
process, which load on a shared machine does not inflate; the goals (issue 12:
150 ms, and 0.5 s to READY) beside them.

    python benchmarks/bench_cli.py [--runs 15]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import Home, agentworker, connected, goal, machine, make_home

# The installed command, as a person types it; `python -m worker` where there is none.
COMMAND = [shutil.which("agentworker") or str(Path(sys.executable).parent / "agentworker")]
if not Path(COMMAND[0]).exists():
    COMMAND = [sys.executable, "-m", "worker"]

GRPC_FLOOR = "import grpc; from worker.wire.proto import agentworker_pb2; print(end='.')"

# wall ms to first output, wall ms to its exit (None: stopped once ready), CPU ms of
# the whole process
Sample = tuple[float, float | None, float]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def first_output(argv: list[str], env: dict[str, str], ready: bytes | None = None) -> Sample:
    """Start `argv`; the time to its first byte on stdout (or, with `ready`, to the
    first stderr line holding it), to its exit (None with `ready`: it is stopped
    then), and the CPU time it used once it has ended.

    Bytecode caching stays on: a person's command starts from its .pyc files, and
    a PYTHONDONTWRITEBYTECODE in this shell (some sandboxes set it) would have every
    run compile the whole worker from source (about 0.35 s of `up`'s start)."""
    env = {name: value for name, value in env.items() if name != "PYTHONDONTWRITEBYTECODE"}
    cpu = _children_cpu()
    begun = time.perf_counter()
    if ready is None:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert proc.stdout is not None
        proc.stdout.read(1)
        took = time.perf_counter() - begun
        proc.stdout.read()
        if proc.wait() not in (0,):
            raise RuntimeError(f"{argv} failed ({proc.returncode})")
        ended: float | None = (time.perf_counter() - begun) * 1000
    else:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert proc.stderr is not None
        for line in proc.stderr:  # reading is waiting: each line arrives when written
            if ready in line:
                break
        else:
            raise RuntimeError(f"{argv} exited ({proc.wait()}) before it was ready")
        took = time.perf_counter() - begun
        ended = None
        proc.terminate()
        proc.stderr.read()
        proc.wait(30)
    return took * 1000, ended, (_children_cpu() - cpu) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    opts = parser.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory(prefix="aw-bench-cli-") as tmp:
        home = make_home(Path(tmp) / "home", mode="ro", scopes=["workerHost.fs_stat"])
        env = home.env
        stat = '{"path": "."}'
        rows: dict[str, Callable[[], Sample]] = {
            "python -c pass": lambda: first_output([sys.executable, "-c", "print(end='.')"], env),
            "import grpc + proto": lambda: first_output([sys.executable, "-c", GRPC_FLOOR], env),
            "--help": lambda: first_output([*COMMAND, "--help"], env),
            "call workerHost.fs_stat": lambda: first_output(
                [*COMMAND, "call", "workerHost.fs_stat", stat, "--agent", "bench"], env
            ),
            "call fs_stat": lambda: first_output(
                [*COMMAND, "call", "fs_stat", stat, "--agent", "bench"], env
            ),
            "up → ready": lambda: _up_ready(Path(tmp)),
        }
        samples: dict[str, list[Sample]] = {name: [] for name in rows}
        with agentworker(["up", "--headless"], home):
            asyncio.run(_until_connected(home))
            for name in rows:  # warm the file cache and the .pyc files
                rows[name]()
            for _ in range(opts.runs):
                for name, one in rows.items():
                    samples[name].append(one())
    _print(samples)


_up_homes = 0


def _up_ready(tmp: Path) -> Sample:
    """`up` in a fresh home each time (on a free port): its first start, too."""
    global _up_homes
    _up_homes += 1
    fresh = make_home(tmp / f"up-{_up_homes}", mode="ro", scopes=[])
    return first_output([*COMMAND, "up", "--headless"], fresh.env, ready=b"ready:")


async def _until_connected(home: Home) -> None:
    async with connected(home):
        pass


GOALS = {"--help": 150.0, "call workerHost.fs_stat": 150.0, "call fs_stat": 150.0}
READY_GOAL_MS = 500.0


def _print(samples: dict[str, list[Sample]]) -> None:
    base_wall = statistics.median(s[0] for s in samples["python -c pass"])
    base_cpu = statistics.median(s[2] for s in samples["python -c pass"])
    print("\nstart to first output (median of each row; exit = wall ms until the process")
    print("has ended; CPU = user + system of the process)")
    print(f"  {'':24}{'wall ms':>9}{'/raw':>7}{'exit ms':>9}{'CPU ms':>9}{'/raw':>7}{'goal ms':>9}")
    walls = {name: statistics.median(s[0] for s in rows) for name, rows in samples.items()}
    for name, rows in samples.items():
        wall = walls[name]
        exits = [s[1] for s in rows if s[1] is not None]
        exit_text = f"{statistics.median(exits):9.1f}" if exits else f"{'':9}"
        cpu = statistics.median(s[2] for s in rows)
        limit = _goal_of(name)
        goal_text = f"{limit:9.0f}" if limit else f"{'':9}"
        print(
            f"  {name:24}{wall:9.1f}{wall / base_wall:7.1f}{exit_text}{cpu:9.1f}"
            f"{cpu / base_cpu:7.1f}{goal_text}"
        )
    print()
    for name, wall in walls.items():
        limit = _goal_of(name)
        if limit:
            what = f"agentworker {name}" + ("" if "ready" in name else " to first output")
            goal(what, wall, " ms", limit, baseline=base_wall, baseline_name="python -c pass")


def _goal_of(name: str) -> float | None:
    return GOALS.get(name, READY_GOAL_MS if "ready" in name else None)


if __name__ == "__main__":
    main()
