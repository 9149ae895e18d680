"""The TUI's costs, in a real terminal (tmux): memory beside a headless worker, and
the time from a call reaching the hub to its approval prompt on the screen.

  memory      RSS of `agentworker up` with the TUI, beside `agentworker up --headless`,
              each after the same calls
  prompt      a call with no grant is dispatched (the clock starts as the request
              leaves this process), and the screen is read until the prompt shows;
              the person's Deny key then answers it. Beside it, two baselines: one
              read of the screen (tmux capture-pane), which bounds how finely the
              prompt's arrival can be seen, and a granted call's whole round trip
              through the same hub and worker (what reaching the worker costs).

Goal: a prompt on screen within 100 ms of the call arriving.

    python benchmarks/bench_tui.py [--prompts 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import Home, connected, goal, make_home, percentile
from worker.wire.proto import agentworker_pb2 as pb

AGENTWORKER = str(Path(sys.executable).parent / "agentworker")
PROMPT_TEXT = "A call outside the agent's grants"


class Tmux:
    def __init__(self, home: Home) -> None:
        self.socket = f"aw-bench-{uuid.uuid4().hex[:8]}"
        self.env = {**home.env, "TERM": "xterm-256color"}
        for name in ("TMUX", "DISPLAY", "WAYLAND_DISPLAY"):
            self.env.pop(name, None)

    def run(self, *argv: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.socket, *argv],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        ).stdout

    def screen(self) -> str:
        return self.run("capture-pane", "-t", "main", "-p")

    def wait_for(self, text: str, within_s: float = 30.0) -> None:
        deadline = time.monotonic() + within_s
        while text not in self.screen():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{text!r} never showed:\n{self.screen()}")

    def wait_gone(self, text: str, within_s: float = 30.0) -> None:
        deadline = time.monotonic() + within_s
        while text in self.screen():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{text!r} never went away:\n{self.screen()}")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


async def warm_calls(home: Home, calls: int) -> None:
    async with connected(home) as client:
        for _ in range(calls):
            reply = await client.dispatch(
                agent_id="bench", surface="workerHost", action="fs_stat", args_json='{"path": "."}'
            )
            assert reply.result.status == pb.ActionResult.OK, reply.result.error


async def prompts(
    home: Home, tmux: Tmux, count: int
) -> tuple[list[float], list[float], list[float]]:
    """Per prompt: ms from dispatch to the prompt on screen, ms of one screen read, and
    ms of a granted call's whole round trip through the same hub and worker."""
    shown, reads, granted = [], [], []
    async with connected(home) as client:
        for _ in range(count):
            start = time.perf_counter()
            reply = await client.dispatch(
                agent_id="bench", surface="workerHost", action="fs_stat", args_json='{"path": "."}'
            )
            granted.append((time.perf_counter() - start) * 1000)
            assert reply.result.status == pb.ActionResult.OK, reply.result.error
        for i in range(count):
            request = pb.DispatchRequest(
                agent_id="stranger",
                plan_id=f"plan-{i}",
                surface="workerHost",
                action="fs_stat",
                args_json='{"path": "."}',
            )
            start = time.perf_counter()
            call = asyncio.ensure_future(client.stub.Dispatch(request, metadata=client.metadata))
            while True:
                before = time.perf_counter()
                screen = await asyncio.to_thread(tmux.screen)
                reads.append((time.perf_counter() - before) * 1000)
                if PROMPT_TEXT in screen:
                    break
            shown.append((time.perf_counter() - start) * 1000)
            tmux.run("send-keys", "-t", "main", "d")
            reply = await call
            assert reply.result.error.code == "scope_denied", reply.result
            await asyncio.to_thread(tmux.wait_gone, PROMPT_TEXT)
    return shown, reads, granted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--calls", type=int, default=200, help="calls before reading RSS")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        headless_home = make_home(Path(tmp) / "headless", mode="ro", scopes=["workerHost.*"])
        log = (headless_home.path / "up.log").open("ab")
        proc = subprocess.Popen(
            [AGENTWORKER, "up", "--headless"], env=headless_home.env, stdout=log, stderr=log
        )
        try:
            asyncio.run(warm_calls(headless_home, args.calls))
            headless_rss = rss_mib(proc.pid)
        finally:
            proc.terminate()
            proc.wait(30)
            log.close()

        home = make_home(Path(tmp) / "tui", mode="ro", scopes=["workerHost.*"])
        tmux = Tmux(home)
        tmux.run(
            "new-session", "-d", "-s", "main", "-x", "120", "-y", "36", f"exec {AGENTWORKER} up"
        )
        try:
            tmux.wait_for("● ready")
            pid = int(tmux.run("display-message", "-p", "-t", "main", "#{pane_pid}").strip())
            asyncio.run(warm_calls(home, args.calls))
            tui_rss = rss_mib(pid)
            shown, reads, granted = asyncio.run(prompts(home, tmux, args.prompts))
            tui_rss_after = rss_mib(pid)
        finally:
            tmux.run("send-keys", "-t", "main", "q")
            time.sleep(0.5)
            tmux.run("kill-server")

    print(f"\nmemory after {args.calls} calls (RSS, MiB)")
    print(f"  {'agentworker up --headless':34}{headless_rss:9.1f}{1.0:9.2f}")
    print(f"  {'agentworker up (TUI)':34}{tui_rss:9.1f}{tui_rss / headless_rss:9.2f}")
    print(f"  {'  … after the prompts':34}{tui_rss_after:9.1f}{tui_rss_after / headless_rss:9.2f}")
    print(f"\nprompt on screen ({args.prompts} prompts, ms)")
    print(f"  {'':34}{'p50':>9}{'p99':>9}{'max':>9}")
    for name, samples in (
        ("raw: one screen read (capture-pane)", reads),
        ("raw: a granted call's round trip", granted),
        ("call dispatched → prompt on screen", shown),
    ):
        print(
            f"  {name:34}{statistics.median(samples):9.1f}"
            f"{percentile(samples, 0.99):9.1f}{max(samples):9.1f}"
        )
    print()
    goal(
        "prompt on screen after the call is dispatched, p50",
        statistics.median(shown),
        " ms",
        100,
        baseline=statistics.median(granted),
        baseline_name="a granted call's round trip",
    )


if __name__ == "__main__":
    main()
