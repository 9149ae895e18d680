"""This machine's hub is told apart from whoever listens on its port (review11 finding 06).

A real `agentworker hub` serves on its Unix socket in the data folder too, and a real
`agentworker run` with no --server dials that socket, as the CLI's verbs do. Another
user (a child that becomes uid 65534 before it binds) who takes the hub's TCP port while
the hub is away is sent nothing: no connection from the worker or the verbs, no token,
and the person is told what happened and what to do."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, cluster, free_port, wait_for
from tests.support.port_squatter import Squatter
from worker.config import Paths

WITHIN_S = 60.0  # a ceiling for a loaded machine, not a pace


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Cluster]:
    with cluster(tmp_path / "home") as c:
        yield c


def hub_socket(live: Cluster) -> Path:
    return Paths.at(live.home).hub_socket


def cli(live: Cluster, *argv: str) -> subprocess.CompletedProcess[str]:
    return live.cli(*argv, timeout=WITHIN_S)


def test_run_and_the_verbs_reach_their_hub_on_its_socket(live: Cluster) -> None:
    path = hub_socket(live)
    info = path.lstat()
    assert stat.S_ISSOCK(info.st_mode) and info.st_uid == os.getuid()
    assert stat.S_IMODE(info.st_mode) & 0o077 == 0  # this user's alone
    worker = next(p for p in live.procs if p.name == "worker")
    wait_for(lambda: f"connected to unix:{path}" in worker.log(), WITHIN_S, worker)
    done = cli(live, "call", "fs_stat", '{"path": "."}', "--agent", "tester")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "ok"
    status = cli(live, "status", "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == "connected"
    # Stopped, the hub takes its socket with it.
    hub = next(p for p in live.procs if p.name == "hub")
    hub.signal(signal.SIGTERM)
    hub.wait(WITHIN_S)
    assert not path.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="becoming another user needs root")
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["stopped", "crashed"])
def test_another_user_on_the_hub_port_is_sent_nothing(live: Cluster, stop: int) -> None:
    hub = next(p for p in live.procs if p.name == "hub")
    worker = next(p for p in live.procs if p.name == "worker")
    tokens = [(live.home / name).read_text().strip() for name in ("hub.token", "hub-workers.token")]
    hub.signal(stop)
    hub.wait(WITHIN_S)
    # A stopped hub took its socket with it; a crashed one left it, answering no one.
    assert hub_socket(live).exists() is (stop == signal.SIGKILL)
    squatter = Squatter(live.listen)
    seen = len(worker.log())  # what the worker says from here on, with the squatter there
    try:
        status = cli(live, "status")
        call = cli(live, "call", "fs_stat", '{"path": "."}', "--agent", "tester")
        kill = cli(live, "kill", "plan-sq")
        if stop == signal.SIGTERM:
            # No socket: the port is asked about, and it is another user's.
            said = "not dialling this machine's hub: refusing to send a token to"
            for answer in (status, call):
                assert answer.returncode == 7, answer.stderr
                assert f"refusing to send a token to {live.listen}" in answer.stderr
                assert "held by another user (uid 65534)" in answer.stderr
                assert "Nothing was sent" in answer.stderr and "Traceback" not in answer.stderr
        else:
            # The crashed hub's socket: the hub is down, and nothing else is dialled.
            said = f"no hub to dial yet: no hub answered at {hub_socket(live)}"
            assert status.returncode == 3 and "no hub answered" in status.stderr
            assert call.returncode == 3 and "no hub answered" in call.stderr
        assert kill.returncode == 0 and "the hub was not told" in kill.stdout
        # The worker decided twice while the squatter listened, and dialled it neither time.
        wait_for(lambda: worker.log()[seen:].count(said) >= 2, WITHIN_S, worker)
    finally:
        got = squatter.report()
    assert got["uid"] == 65534
    assert got["connections"] == 0, got
    assert not any(token in str(got["received"]) for token in tokens)
    # The person's own hub, back, is the worker's hub again.
    live.start_hub()
    wait_for(live._worker_in, WITHIN_S, worker)
    assert cli(live, "status").returncode == 0


def test_a_verb_sends_this_hubs_token_to_no_other_server(live: Cluster, tmp_path: Path) -> None:
    """`--server X` with no token sent this machine's hub.token to X, which could then
    call the person's hub as the person (review27 I2). The verbs refuse, dialling
    nothing, and say which token to give; their own hub named by its address still gets
    it."""
    other = f"127.0.0.1:{free_port()}"
    squatter = Squatter(other)
    script = tmp_path / "one.jsonl"
    script.write_text(json.dumps({"action": "workerHost.fs_stat", "args": {"path": "."}}) + "\n")
    try:
        for argv, code in (
            (("status", "--server", other), 5),
            (("call", "fs_stat", '{"path": "."}', "--agent", "tester", "--server", other), 5),
            (("replay", str(script), "--server", other), 5),
            (("kill", "plan-x", "--server", other), 0),  # killed here, and says why not there
            (("sandbox", "teardown", "plan-x", "--server", other), 5),  # review28 r4
        ):
            done = cli(live, *argv)
            said = done.stdout + done.stderr
            assert done.returncode == code, (argv, said)
            assert f"--server {other} is not this machine's hub" in said, said
            assert "--token-file" in said, said
        # A worker too: it dials with this machine's workers' token by default.
        done = cli(live, "run", "--headless", "--server", other)
        said = done.stdout + done.stderr
        assert done.returncode == 5, said
        assert f"{other} is not this machine's hub" in said and "--token-file" in said, said
        # And doctor, for a worker configured for that server.
        doctor = subprocess.run(
            [sys.executable, "-m", "worker", "doctor"],
            env={**live.env, "AGENTWORKER_SERVER": other},
            capture_output=True,
            text=True,
            timeout=WITHIN_S,
            check=False,
        )
        assert f"{other} is not this machine's hub" in doctor.stdout, doctor.stdout
    finally:
        seen = squatter.report()
    assert seen["connections"] == 0, seen
    done = cli(
        live, "call", "fs_stat", '{"path": "."}', "--agent", "tester", "--server", live.listen
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="becoming another user needs root")
def test_this_hub_named_by_its_address_is_dialled_as_this_hub(
    live: Cluster, tmp_path: Path
) -> None:
    """review28 r3: `--server` spelling this hub's own `[hub] listen`, with no token,
    sends this machine's token, so it is dialled as this hub is: `run` (the workers'
    token and worker.key), `replay` (hub.token) and doctor dialled the address as named,
    and another user on the port while the hub was away was sent them."""
    for name in ("worker", "hub"):  # the data folder's own worker, then its hub, away
        proc = next(p for p in live.procs if p.name == name)
        proc.signal(signal.SIGTERM)
        proc.wait(WITHIN_S)
    script = tmp_path / "one.jsonl"
    script.write_text(json.dumps({"action": "workerHost.fs_stat", "args": {"path": "."}}) + "\n")
    refusal = f"refusing to send a token to {live.listen}"
    squatter = Squatter(live.listen)
    try:
        for argv in (
            ("replay", str(script), "--server", live.listen),
            ("sandbox", "teardown", "plan-x", "--server", live.listen),
        ):
            done = cli(live, *argv)
            assert done.returncode == 7, (argv, done.stdout, done.stderr)
            assert refusal in done.stderr and "Traceback" not in done.stderr, done.stderr
        doctor = subprocess.run(
            [sys.executable, "-m", "worker", "doctor"],
            env={**live.env, "AGENTWORKER_SERVER": live.listen},
            capture_output=True,
            text=True,
            timeout=WITHIN_S,
            check=False,
        )
        assert refusal in doctor.stdout, doctor.stdout
        worker = live.spawn("named", "run", "--headless", "--server", live.listen)
        wait_for(lambda: refusal in worker.log(), WITHIN_S, worker)
        worker.signal(signal.SIGTERM)
        worker.wait(WITHIN_S)
        # With a token given too, however the port is spelled (review29 k3): the key for
        # the address is one the hub accepts unasked, and it went with the token; the
        # port with a leading zero is the same port to gRPC.
        port = live.listen.rpartition(":")[2]
        tokens = str(live.home / "hub-workers.token")
        spellings = (live.listen, f"localhost:{port}", f"dns:///[::1]:{port}", f"127.0.0.1:0{port}")
        for i, server in enumerate(spellings):
            given = live.spawn(f"given-{i}", "run", "--server", server, "--token-file", tokens)
            said = f"refusing to send a token to {server}"
            wait_for(lambda said=said, given=given: said in given.log(), WITHIN_S, given)  # type: ignore[misc]
            assert "held by another user (uid 65534)" in given.log()
            given.signal(signal.SIGTERM)
            given.wait(WITHIN_S)
    finally:
        seen = squatter.report()
    assert seen["connections"] == 0, seen


def test_replay_and_teardown_say_a_hub_that_does_not_answer(live: Cluster, tmp_path: Path) -> None:
    """review28 r5: `replay --server` and `sandbox teardown --server` to a hub that does
    not answer ended in a gRPC traceback (exit 1 and 0); now they say so, exit 3."""
    script = tmp_path / "one.jsonl"
    script.write_text(json.dumps({"action": "workerHost.fs_stat", "args": {"path": "."}}) + "\n")
    nobody = f"127.0.0.1:{free_port()}"
    token = str(live.home / "hub.token")
    for argv in (
        ("replay", str(script)),
        ("sandbox", "teardown", "plan-x"),
    ):
        done = cli(live, *argv, "--server", nobody, "--token-file", token)
        assert done.returncode == 3, (argv, done.stdout, done.stderr)
        assert "the hub answered UNAVAILABLE" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr, done.stderr
