"""A server a worker dials learns nothing that lets it pose as that worker to another
server (review27 I2's rest; docs/architecture.md, "Each server gets a key of its own"):
real hub and real workers over loopback, a recording server on the far side of the
boundary (a typo'd address, a hostile host) that then tries what it got on the hub."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tests.integration.test_worker_enrolment import (
    HeldStream,
    decide,
    listed,
    say_hello,
    start_own_home_worker,
)
from tests.support.cluster import Cluster, cluster, wait_for, write_config
from tests.support.recording_server import RecordingServer
from worker.hub.store import HubStore
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.transport import WORKER_KEY_HEADER, worker_key_digest_of

TOKEN_OF_THE_OTHER_SERVER = "a-token-the-other-server-gave"


def test_a_server_the_worker_dialled_cannot_pose_as_it_to_the_hub(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The person's worker, accepted by their hub, is pointed once at another server (a
    typo, a colleague's, a hostile one). That server keeps what the worker sent and
    says Hello to the person's hub under the worker's id with it (and the workers'
    token, as an insider would have): refused, never welcomed. Before, the worker sent
    its worker.key itself, the key the hub knows it by, and the server was served as
    the worker (given its plans, calls and args)."""
    with cluster(tmp_path / "hub", worker=False, accept_new_workers=False) as live:
        real = start_own_home_worker(live, "far")
        wait_for(lambda: any(w.enrolment == "pending" for w in live.workers()), 60, real)
        [row] = live.workers()
        worker_id = row.worker_id
        assert decide(live, "accept", worker_id)[0] == 0
        wait_for(lambda: live.status().connected_workers == 1, 60, real)
        real.signal(signal.SIGTERM)
        assert real.wait(60) == 0, real.log()
        wait_for(lambda: live.status().connected_workers == 0, 60)

        other = RecordingServer()
        try:
            home = live.home.parent / "far"
            astray = live.spawn(
                "astray",
                "run",
                "--server",
                other.address,
                "--token",
                TOKEN_OF_THE_OTHER_SERVER,
                env={"AGENTWORKER_HOME": str(home)},
            )
            wait_for(lambda: len(other.recorded()) >= 2, 60, astray)  # dialled, and again
            astray.signal(signal.SIGTERM)
            astray.wait(60)
        finally:
            other.stop()
        got = other.recorded()
        raw_key = (home / "worker.key").read_text().strip()
        assert all(raw_key not in str(seen) for seen in got), got
        sent = {seen.get(WORKER_KEY_HEADER, "") for seen in got}
        assert len(sent) == 1 and "" not in sent, got  # one key, the same at each dial
        [stolen] = sent
        code, why, message = say_hello(live, worker_id, stolen)
        assert code != "welcome", "the other server was served as the worker"
        assert (code, why) == ("PERMISSION_DENIED", "key_mismatch"), (code, why, message)
        # The hub still serves the worker itself, with the key it made for this hub.
        again = live.spawn_worker_at("again", home)
        wait_for(lambda: live.status().connected_workers == 1, 60, again)
        rows = {w.enrolment: w for w in listed(live, worker_id)}
        assert sorted(rows) == ["accepted", "pending"]  # the other server's try only waits
        assert rows["accepted"].connected and rows["accepted"].fingerprint == row.fingerprint
        # The operator is told what the second key may be, and how to tell.
        said = live.cli("workers").stdout
        stolen_fp = rows["pending"].fingerprint
        assert f"{worker_id}: a second key (fingerprint {stolen_fp}) says Hello" in said, said
        assert f"accept {worker_id} --fingerprint {stolen_fp}`" in said, said


def accepted_by_an_older_hub(live: Cluster) -> tuple[pb.WorkerInfo, str]:
    """A worker with a home of its own ("far"), accepted by its worker.key's digest as a
    hub from before per-server keys kept it; the hub restarted. (Its row, worker.key.)"""
    home = live.home.parent / "far"
    real = start_own_home_worker(live, "far")
    wait_for(lambda: any(w.enrolment == "pending" for w in live.workers()), 60, real)
    [row] = live.workers()
    real.signal(signal.SIGTERM)
    real.wait(60)
    live.stop_all()
    raw_key = (home / "worker.key").read_text().strip()
    store = HubStore(live.home / "hub.db")
    try:
        store.enrolments.forget(row.worker_id)
        store.enrolments.accept(row.worker_id, worker_key_digest_of(raw_key), by="operator")
        store._db.execute("UPDATE enrolments SET per_server = 0")
    finally:
        store.close()
    live.start_hub()
    assert [w.enrolment for w in listed(live, row.worker_id)] == ["accepted"]
    return row, raw_key


def test_a_worker_accepted_by_its_older_key_waits_to_be_accepted_again(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A hub.db from before per-server keys accepted a worker by its worker.key itself.
    The upgraded worker proves a key made for this hub instead: it is not taken for a
    rogue (it waits, pending, rather than stopping), the operator accepts its new
    fingerprint, and it is served; the older key is dropped with that. Meanwhile the
    older key, which every server the worker dialled before was sent, is served no more
    (review29 k1: it was welcomed, and given the worker's calls)."""
    with cluster(tmp_path / "hub", worker=False, accept_new_workers=False) as live:
        row, raw_key = accepted_by_an_older_hub(live)
        upgraded = start_own_home_worker(live, "far")
        # It waits (as a new worker does), saying why, rather than stopping.
        wait_for(lambda: "proves a key made for this hub" in upgraded.log(), 60, upgraded)
        assert upgraded.running()
        code, why, message = say_hello(live, row.worker_id, raw_key)
        assert (code, why) == ("PERMISSION_DENIED", "pending"), (code, why, message)
        assert "served no more" in message and "workers accept" in message, message
        waiting = [w for w in listed(live, row.worker_id) if w.enrolment == "pending"]
        assert [w.fingerprint for w in waiting] == [row.fingerprint]
        rc, said = decide(live, "accept", row.worker_id, "--fingerprint", row.fingerprint)
        assert rc == 0, said
        wait_for(lambda: live.status().connected_workers == 1, 60, upgraded)
        assert [w.enrolment for w in listed(live, row.worker_id)] == ["accepted"]
        assert say_hello(live, row.worker_id, raw_key)[:2] == ("PERMISSION_DENIED", "key_mismatch")


def test_a_stream_of_the_older_key_ends_when_the_upgraded_worker_comes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Whoever holds the older key and is connected with it (a server the worker dialled
    before, with the workers' token) loses its stream as the upgraded worker says
    Hello: it was served the worker's calls until the operator acted (review29 k1)."""
    with cluster(tmp_path / "hub", worker=False, accept_new_workers=False) as live:
        row, raw_key = accepted_by_an_older_hub(live)
        held = HeldStream(live, row.worker_id, raw_key)
        try:
            assert held.welcomed.wait(60), held.ended
            upgraded = start_own_home_worker(live, "far")
            assert held.done.wait(60), "the older key's stream was still served"
            assert held.ended[:2] == ("PERMISSION_DENIED", "pending"), held.ended
            assert "served no more" in held.ended[2]
            assert upgraded.running()
        finally:
            held.close()


def test_the_hubs_own_worker_accepted_by_its_older_key_is_served_unasked(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`agentworker hub` and `run` sharing a data folder, upgraded: the hub.db row that
    accepted the worker by its worker.key gives way to the key made from it for the own
    hub, so the worker is served with no step (not refused as another key of its id)."""
    with cluster(tmp_path / "hub", accept_new_workers=False) as live:
        [row] = live.workers()
        live.stop_all()
        store = HubStore(live.home / "hub.db")
        try:
            raw = worker_key_digest_of((live.home / "worker.key").read_text().strip())
            store.enrolments.forget(row.worker_id)
            store.enrolments.accept(row.worker_id, raw, by="own")
            store._db.execute("UPDATE enrolments SET per_server = 0")
        finally:
            store.close()
        live.start_hub()
        live.start_worker()
        [again] = live.workers()
        assert (again.worker_id, again.enrolment, again.connected) == (
            row.worker_id,
            "accepted",
            True,
        )
        assert again.fingerprint == row.fingerprint


def test_the_hubs_own_worker_dialling_it_by_its_address_is_served_unasked(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A worker sharing the hub's data folder that names the hub by its address (`run
    --server ADDRESS --token ...`, as the benchmarks do) brings the key made for that
    name, which the hub knows as its own: served with no step, as before."""
    with cluster(tmp_path / "hub", worker=False, accept_new_workers=False) as live:
        live.start_worker("--server", live.listen, "--token", live.token)
        [row] = live.workers()
        assert (row.enrolment, row.connected) == ("accepted", True)


@pytest.mark.parametrize("server", ["own-hub", "dns:///own-hub", "OWN-HUB"])
def test_a_server_named_like_the_own_hub_key_is_refused(tmp_path, server: str) -> None:  # type: ignore[no-untyped-def]
    """review29 k2: a server named `own-hub` (any spelling) was sent the key this
    machine's hub accepts unasked, its own workers' key."""
    with cluster(tmp_path / "hub", worker=False, accept_new_workers=False) as live:
        home = live.home.parent / "far"
        write_config(home, live.listen)
        ca = tmp_path / "ca.pem"  # over TLS, as a host so named would be dialled
        ca.write_text("")
        argv = ["run", "--server", server, "--token", "t", "--tls-ca", str(ca)]
        done = subprocess.run(
            [sys.executable, "-m", "worker", *argv],
            env={**live.env, "AGENTWORKER_HOME": str(home)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 4, (done.stdout, done.stderr)
        assert "'own-hub' is the name of the key" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
