"""Sandbox mode in rlimits mode end to end: what a plan's programs queue in socket
buffers, kernel memory no rlimit counts, is held to the plan's memory by the watch
(review7 finding 02). A real hub, a real `agentworker run --sandbox` with `[sandbox]
cgroups = "off"`, real bubblewrap and the entry helper."""

from __future__ import annotations

import json
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import Cluster
from tests.support.policies import PYTHON3, exec_config
from tests.support.procs import marker, wait_until_gone
from tests.support.workbench import run, sandbox_cluster, teardown

PLAN_MB = 32

# The finding's attack: WORKERS processes each fill PAIRS socketpairs to EAGAIN, at the
# sockets' default size (setsockopt SO_SNDBUF changes nothing in the sandbox), say
# what they queued, and hold it (a read nobody answers).
FLOOD = textwrap.dedent(
    """
    import os, socket, sys
    workers, pairs = int(sys.argv[1]), int(sys.argv[2])
    for _ in range(workers):
        if os.fork() == 0:
            kept, queued, chunk = [], 0, b"x" * 65536
            for _ in range(pairs):
                a, b = socket.socketpair()
                a.setblocking(False)
                a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 20)
                kept.append((a, b))
                while True:
                    try:
                        queued += a.send(chunk)
                    except BlockingIOError:
                        break
            print(queued, flush=True)
            os.read(os.pipe()[0], 1)
    os.wait()
    """
)

# What ordinary programs do with sockets and pipes: a child's output through pipes,
# a socketpair and a TCP connection over the sandbox's loopback each carrying 1 MiB.
ORDINARY = textwrap.dedent(
    """
    import json, socket, subprocess, sys, threading
    out = subprocess.run([sys.executable, "-c", "print('x' * 100000)"], capture_output=True)
    a, b = socket.socketpair()
    threading.Thread(target=lambda: a.sendall(b"y" * (1 << 20))).start()
    got = 0
    while got < 1 << 20:
        got += len(b.recv(65536))
    server = socket.create_server(("127.0.0.1", 0))
    c = socket.create_connection(server.getsockname())
    d, _ = server.accept()
    threading.Thread(target=lambda: c.sendall(b"z" * (1 << 20))).start()
    over_tcp = 0
    while over_tcp < 1 << 20:
        over_tcp += len(d.recv(65536))
    print(json.dumps([len(out.stdout), got, over_tcp]))
    """
)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("workbench-sockets")
    settings = exec_config(base, PYTHON3) + (
        f'\n[sandbox]\ncgroups = "off"\nplan_memory_mb = {PLAN_MB}\nmax_plans = 100000\n'
    )
    with sandbox_cluster(base, extra_config=settings) as c:
        yield c


def new_plan() -> str:
    return f"plan-{uuid.uuid4().hex[:12]}"


@pytest.mark.parametrize(("workers", "pairs"), [(1, 200), (4, 64)])
def test_a_plan_whose_sockets_hold_more_than_its_memory_is_stopped(
    live: Cluster, workers: int, pairs: int
) -> None:
    """Each socketpair holds about 230 KB: 200 of them (400 descriptors, under the
    sandbox's 512 open files), or 4 processes with 64 each, 45-70 MB, under RLIMIT_AS
    and past the plan's 32 MiB. Without the watch they were held until the program's
    timeout."""
    plan, tag = new_plan(), marker()
    out, blob = run(
        live, plan, ["python3", "-c", FLOOD, str(workers), str(pairs), tag], timeout_s=120
    )
    error = out["error"]
    assert out["status"] == "error" and error["code"] == "too_large", (out, blob)
    assert "socket buffers" in error["message"] and "plan_memory_mb" in error["message"], out
    details = error["details"]
    assert details["stopped"] is True and details["plan_limits"] == ["memory"], details
    assert details["plan_memory_bytes"] == PLAN_MB << 20, details
    assert details["socket_bytes"] > PLAN_MB << 20, details
    assert wait_until_gone(tag, within_s=30) == []
    assert teardown(live, plan)["status"] == "ok"


def test_ordinary_use_of_pipes_and_sockets_is_not_stopped(live: Cluster) -> None:
    plan = new_plan()
    out, blob = run(live, plan, ["python3", "-c", ORDINARY], timeout_s=120)
    assert out["status"] == "ok" and out["result"]["exit_code"] == 0, (out, blob)
    assert json.loads(blob) == [100001, 1 << 20, 1 << 20]
    assert teardown(live, plan)["status"] == "ok"


def test_the_limits_note_says_socket_buffers_are_watched(tmp_path: Path) -> None:
    from sandbox import cgroups
    from worker.actions.workbench import limits_note
    from worker.config import ExecSection, SandboxSection

    choice = cgroups.Choice(None, '[sandbox] cgroups = "off"', cgroups.probe())
    note = limits_note(SandboxSection(cgroups="off", plan_memory_mb=64), ExecSection(), choice)
    assert "socket buffers" in note and "64 MiB" in note, note
