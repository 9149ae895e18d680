"""Each benchmark runs end to end on a few calls and prints every row beside its
baseline, and records its goals for `make bench`'s summary table, so a change that
breaks a benchmark fails here rather than at `make bench`. The figures themselves
are not judged: speed lives in the benchmarks, not in tests.

A benchmark is judged hung by its silence, not by its length: it prints as it goes
(each row, and its processes' warnings), and fails here when no line came for
SILENT_S, stretched with the machine's load (tests.support.bounds). A fixed bound on
the whole run (240 s, 300 s) failed at a load of 30, where a short run takes minutes;
a benchmark stuck anywhere still fails, in SILENT_S on an idle machine."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

import pytest

from benchmarks._common import GOALS_ENV, Goal, read_goals
from tests.support.bounds import Bound

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# The longest a benchmark may print nothing on an idle machine. Their longest quiet
# stretches at a load of 15-20 on 2 cores (x8-10 here): 33 s (bench_sandbox, its
# start), 24 s (bench_hub_scale, bench_computer, bench_fs), 17 s (bench_roundtrip).
SILENT_S = 60.0
# Bounded by `_run` itself: the suite's per-test timeout would cut a loaded run short.
pytestmark = pytest.mark.timeout(0)


@pytest.fixture
def goals_file(tmp_path: Path) -> Path:
    return tmp_path / "goals.jsonl"


def _run(script: str, *args: str, goals: Path | None = None) -> str:
    """The benchmark's standard output once it exits 0; fails with what it printed
    when it exits otherwise, or when it prints nothing for SILENT_S (stretched)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **({GOALS_ENV: str(goals)} if goals else {})}
    out: list[str] = []
    err: list[str] = []
    lines = threading.Semaphore(0)  # one release per line printed, on either stream

    def read(stream: IO[str], into: list[str]) -> None:
        for line in stream:
            into.append(line)
            lines.release()

    with subprocess.Popen(
        [sys.executable, str(BENCHMARKS / script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its hub and worker too, should it have to be ended
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        readers = [
            threading.Thread(target=read, args=(stream, into), daemon=True)
            for stream, into in ((proc.stdout, out), (proc.stderr, err))
        ]
        for reader in readers:
            reader.start()
        quiet = Bound(SILENT_S)
        hung = False
        while any(reader.is_alive() for reader in readers):
            if lines.acquire(timeout=0.5):
                quiet.restart()
            elif quiet.passed():
                hung = True
                with contextlib.suppress(ProcessLookupError):  # all gone meanwhile
                    os.killpg(proc.pid, signal.SIGKILL)
                for reader in readers:
                    reader.join()
        proc.wait()
    if hung:
        last = (out or err or ["(nothing)"])[-1].rstrip()
        pytest.fail(
            f"{script} printed nothing for {quiet}: hung after {last!r}\n"
            f"stdout:\n{''.join(out)[-3000:]}\nstderr:\n{''.join(err)[-3000:]}"
        )
    assert proc.returncode == 0, "".join(err)[-3000:]
    return "".join(out)


def _recorded(goals: Path, bench: str, count: int) -> list[Goal]:
    """The goals `bench` recorded, checked: `count` of them, each printed beside its
    baseline where it has one, and the summary prints them all in one table."""
    rows = read_goals(goals)
    assert [row.bench for row in rows] == [bench] * count, rows
    for row in rows:
        assert row.on == "value" or row.baseline, row
    summary = _run("summary.py", str(goals))
    for row in rows:
        assert row.figure in summary and row.goal_text in summary, summary
    assert f"of {count} goals met" in summary, summary
    return rows


def test_roundtrip_benchmark_prints_every_row_with_its_ratio(goals_file: Path) -> None:
    out = _run("bench_roundtrip.py", "--calls", "50", goals=goals_file)
    for row in (
        "raw gRPC bidi echo",
        "raw gRPC unary echo",
        "raw two-hop relay",
        "raw stream-unary echo",
        "fs_stat hub → worker → hub",
        "via Dispatch, `up`",
        "via Dispatch, hub + run",
    ):
        # A row's name is padded to its column ("beside the relay" lines name it too).
        assert out.count(f"{row}  ") == 2, f"{row!r} missing for 1 or 64 in flight:\n{out}"
    assert "1 in flight" in out and "64 in flight" in out
    assert out.count("beside the raw two-hop relay") == 4, out
    # Each topology's CPU a call, process by process, and the rate the cores allow it,
    # beside the bare unary echo server's.
    # the unary echo's and the stream-unary echo's too
    assert out.count("CPU us a call: caller ") == 8, out
    assert out.count(", run ") == 2 and out.count(", echo server ") == 4, out
    rows = _recorded(goals_file, "bench_roundtrip", 4)
    assert {row.unit for row in rows} == {" ms", " calls/s"}


def test_exec_and_fs_benchmarks_run_beside_their_baselines(goals_file: Path) -> None:
    exec_out = _run("bench_exec.py", "--calls", "5", goals=goals_file)
    for row in (
        "raw subprocess.run",
        "raw bwrap   ",  # the row of that name alone
        "raw bwrap +prlimit",
        "raw bwrap +LL+seccomp",
        "sandbox.run",
        "exec via hub → worker",
        "raw two-hop relay",
        "the pipeline over exec's line",
        "Landlock + seccomp (+ limits) over raw bwrap",
        "hub → worker / exec's exact bwrap line",
    ):
        assert exec_out.count(row) == 2, f"{row!r} missing for exec true or exec cat:\n{exec_out}"
    _recorded(goals_file, "bench_exec", 4)
    goals_file.unlink()
    fs_out = _run(
        "bench_fs.py",
        *("--reads", "5", "--writes", "2", "--lists", "2", "--stats", "30"),
        goals=goals_file,
    )
    for row in (
        "raw open/write/close",
        "raw gRPC unary, 16 MiB one way",
        "fs_write via `up`",
        "fs_write via hub + run",
        "fs_write 16 MiB via `up` / its stages in series",
        "fs_write 16 MiB via hub + run / its stages in series",
        "the same, unary Dispatch, `up`",
        "fully overlapped floor",
        "CPU per 16 MiB fs_write (user + system, whole processes): via hub + run",
        "the bare parts of a write via hub + run, this run: raw two-hop relay 16 MiB down",
        "fs_read",
        "raw os.scandir + lstat",
        "fs_list via hub → worker",
        "CPU per call: raw scandir+lstat",
        "`up` per fs_list",
        "raw two-hop relay, 1 MiB back",
        "raw two-hop relay, 16 MiB down",
        "fs_read 1 MiB beside the raw two-hop relay",
        "16 MiB to a no-op via `up` beside the raw two-hop relay",
        "raw small echo, 16 MiB echoes streaming",
        "fs_stat, 16 MiB fs_writes streaming",
    ):
        assert row in fs_out, f"{row!r} missing:\n{fs_out}"
    # fs_read, fs_write through each topology beside the echo and beside its stages in series,
    # fs_list, head of line.
    _recorded(goals_file, "bench_fs", 7)


def test_sandbox_benchmark_prints_exec_beside_raw_bwrap_and_first_calls() -> None:
    out = _run("bench_sandbox.py", "--calls", "5")
    for row in (
        "raw true",
        "raw bwrap … true",
        "workerHost.exec true",
        "workbenchHost.exec true",
        "fs_stat, later call of a plan",
        "fs_stat, first call of a plan",
        "exec, later call of a plan",
        "exec, first call of a plan",
    ):
        assert row in out, f"{row!r} missing:\n{out}"


def test_replay_benchmark_runs_beside_the_raw_dispatch_rate() -> None:
    out = _run("bench_replay.py", "--steps", "25")
    for row in (
        "raw ControlService.Dispatch",
        "the same, caller's ids",
        "replay through the hub",
        "replay in-process",
    ):
        assert row in out, f"{row!r} missing:\n{out}"


def test_hub_scale_benchmark_reports_memory_per_worker_and_the_p50_ratio(
    goals_file: Path,
) -> None:
    out = _run(
        "bench_hub_scale.py", "--workers", "30", "--calls", "20", "--rounds", "2", goals=goals_file
    )
    for row in ("Dispatch, worker alone (raw)", "Dispatch, 1 of 30", "KB per idle worker"):
        assert row in out, f"{row!r} missing:\n{out}"
    _recorded(goals_file, "bench_hub_scale", 2)


def test_computer_benchmark_runs_beside_its_baselines(goals_file: Path) -> None:
    out = _run("bench_computer.py", "--calls", "5", goals=goals_file)
    for row in (
        "raw mss grab",
        "raw grab + PNG (zlib-ng level 1)",
        "screenshot PNG hub → worker → hub",
        "raw grab + Pillow JPEG q75",
        "screenshot JPEG q75 hub → worker → hub",
        "cursor_position hub → worker → hub",
        "mouse_click hub → worker → hub",
        "key_type 100 characters hub → worker → hub",
    ):
        assert row in out, f"{row!r} missing:\n{out}"
    assert out.count("goal ") == 4
    _recorded(goals_file, "bench_computer", 4)


def test_tui_benchmark_prints_memory_and_prompt_latency_beside_baselines(goals_file: Path) -> None:
    out = _run(
        "bench_tui.py",
        *("--prompts", "3", "--calls", "10", "--rounds", "2", "--per-round", "3"),
        *("--gap-ms", "10"),
        goals=goals_file,
    )
    for row in (
        "raw: headless, back to back",
        "with the TUI, back to back",
        "raw: headless, 10 ms apart",
        "with the TUI, 10 ms apart",
        "agentworker up --headless",
        "agentworker up (TUI)",
        "the TUI process",
        "raw: one screen read",
        "raw: a granted call's round trip",
        "call dispatched → prompt on screen",
    ):
        assert row in out, f"{row!r} missing:\n{out}"
    assert out.count("ratio TUI / headless, p50") == 2, out
    assert out.count("ratio TUI / headless, p99") == 2, out
    _recorded(goals_file, "bench_tui", 4)


def test_cli_benchmark_prints_each_start_beside_python_itself(goals_file: Path) -> None:
    out = _run("bench_cli.py", "--runs", "1", goals=goals_file)
    for row in (
        "python -c pass",
        "import grpc + proto",
        "--help",
        "call workerHost.fs_stat",
        "call fs_stat",
        "up → ready",
    ):
        assert row in out, out
    _recorded(goals_file, "bench_cli", 4)
