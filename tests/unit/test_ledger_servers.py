"""The ledger keeps each call with the server that sent it (review10 finding 16): only
that server is told of it, sent its result, acks it and is answered from it; the
others' results are held, counted, and dropped at the ledger's TTL. A state.db from
before servers were recorded is converted in place, its rows held, never sent."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.support.cluster import write_config
from worker import app
from worker.clock import now_ms
from worker.config import Paths, load
from worker.core import ledger
from worker.core.connection import Target, local_hub_key, server_key
from worker.core.ledger import (
    ALL_PLANS,
    FILE_BLOB_BYTES,
    MAX_SERVER_KILLS,
    NEXT_SERVER,
    NO_SERVER,
    UNRECORDED_SERVER,
    UNSORTED_SERVER,
    HeldForOther,
    Seen,
    State,
)
from worker.errors import TokenNotSentError
from worker.wire.protocol import plan_digest
from worker.wire.transport import read_or_create_token

DIGEST = "blake3:" + "cd" * 32
A = server_key("127.0.0.1:7000", "token-of-a", tls=False)
B = server_key("127.0.0.1:7001", "token-of-b", tls=False)
DAY_MS = 24 * 3600 * 1000

# The calls table as state.db had it before servers were recorded (what a person's
# worker made until this change), and its index.
OLD_CALLS = """
CREATE TABLE calls (
    correlation_id TEXT PRIMARY KEY,
    args_digest    TEXT NOT NULL,
    plan_id        TEXT NOT NULL,
    state          TEXT NOT NULL CHECK (state IN ('RUNNING', 'DONE')),
    result         BLOB,
    acked          INTEGER NOT NULL DEFAULT 0,
    created_ms     INTEGER NOT NULL,
    finished_ms    INTEGER,
    result_blob    BLOB,
    blob_bytes     INTEGER NOT NULL DEFAULT 0,
    blob_file      INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX calls_unacked ON calls (state, acked);
"""


def _record(state: State, cid: str, blob: bytes) -> None:
    assert state.begin(cid, DIGEST, "p").seen is Seen.NEW
    state.finish(cid, b"result of " + cid.encode(), blob)


def test_each_server_is_told_sent_and_acks_only_its_own_results(tmp_path: Path) -> None:
    state = State(tmp_path / "state.db")
    state.server = A
    big = b"a" * FILE_BLOB_BYTES  # kept in a file until A acks it
    _record(state, "a-file", big)
    _record(state, "a-row", b"small")
    state.hold("a-held", DIGEST, "p", b"r", b"held blob")  # effect-free, in memory
    assert state.begin("a-run", DIGEST, "p").seen is Seen.NEW
    a_bytes = state.unacked_bytes

    state.server = B
    assert state.unacked_results() == [] and state.unacked_ids() == []
    assert state.running_ids() == [] and not state.has_unacked()
    assert state.running_ids(every_server=True) == ["a-run"]
    assert {u.correlation_id for u in state.unacked_results(every_server=True)} == {
        "a-file",
        "a-row",
        "a-held",
    }
    # B's ack of A's ids lets nothing go: not the rows, not the file, not the held one.
    state.ack(["a-file", "a-row", "a-held"])
    assert state.unacked_bytes == a_bytes  # still counted against the budget
    held = state.held_for_others()
    assert [(h.server, h.count) for h in held] == [(A, 3)]
    assert held[0].bytes == a_bytes
    # An id of A's, sent by B, is answered from none of it, whatever its args.
    for cid in ("a-file", "a-row", "a-held", "a-run"):
        assert state.begin(cid, DIGEST, "p").seen is Seen.OTHER_SERVER
        assert state.begin(cid, "blake3:" + "00" * 32, "p", claim=False).seen is Seen.OTHER_SERVER
    state.forget("a-run")  # never B's to drop
    _record(state, "b-1", b"")
    assert state.unacked_ids() == ["b-1"] and state.has_unacked()
    state.close()  # the held result is written, with its server

    again = State(tmp_path / "state.db")
    again.sweep_blob_files()  # as the worker does at its start
    again.server = A
    assert sorted(again.unacked_ids()) == ["a-file", "a-held", "a-row"]
    assert again.running_ids() == ["a-run"]
    by_id = {u.correlation_id: u for u in again.unacked_results()}
    assert by_id["a-file"].blob == big and by_id["a-held"].blob == b"held blob"
    again.ack(["a-file", "a-row", "a-held"])
    assert again.unacked_ids() == [] and not again.blob_path("a-file").exists()
    assert [h.server for h in again.held_for_others()] == [B]
    again.close()


def test_results_held_for_another_server_go_at_the_ledgers_ttl(tmp_path: Path) -> None:
    state = State(tmp_path / "state.db")
    state.server = A
    _record(state, "a-old", b"a" * FILE_BLOB_BYTES)
    _record(state, "a-new", b"n")
    state.server = B
    _record(state, "b-old", b"b")
    old = now_ms() - DAY_MS - 1000  # finished past the TTL (24 h)
    state.connection.execute(
        "UPDATE calls SET finished_ms = ? WHERE correlation_id IN ('a-old', 'b-old')", (old,)
    )
    assert state.blob_path("a-old").exists()
    state.server = NO_SERVER  # a State no connection names (yet) judges no server's
    assert state.prune() == 0
    kept = {u.correlation_id for u in state.unacked_results(every_server=True)}
    assert kept == {"a-new", "a-old", "b-old"}
    state.server = B
    assert state.prune() == 1
    assert not state.blob_path("a-old").exists()
    # B's own unacked result stays however old (it is re-sent to B); A's newer one too.
    assert state.unacked_ids() == ["b-old"]
    assert [(h.server, h.count) for h in state.held_for_others()] == [(A, 1)]
    assert state.unacked_bytes == len(b"result of b-old") + 1 + len(b"result of a-new") + 1
    state.close()


def test_an_old_state_db_is_converted_and_its_results_are_held(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with sqlite3.connect(path) as old:
        old.executescript(OLD_CALLS)
        now = now_ms()
        old.executemany(
            "INSERT INTO calls (correlation_id, args_digest, plan_id, state, result, acked,"
            " created_ms, finished_ms, result_blob, blob_bytes) VALUES (?, ?, 'p', ?, ?, ?,"
            " ?, ?, ?, ?)",
            [
                ("done", DIGEST, "DONE", b"its result", 0, now, now, b"its blob", 8),
                ("acked", DIGEST, "DONE", b"acked result", 1, now, now, None, 0),
                ("running", DIGEST, "RUNNING", None, 0, now, None, None, 0),
            ],
        )
    old.close()

    state = State(path, convert=True)  # the worker's own open
    state.server = A
    columns = {row[1] for row in state.connection.execute("PRAGMA table_info(calls)")}
    assert "server" in columns
    servers = dict(state.connection.execute("SELECT correlation_id, server FROM calls"))
    assert servers == dict.fromkeys(("done", "acked", "running"), UNRECORDED_SERVER)
    # Whose they were is not known: told to no server, sent to none, answered to none.
    assert state.unacked_ids() == [] and state.running_ids() == []
    assert state.running_ids(every_server=True) == ["running"]
    size = len(b"its result") + 8
    assert state.held_for_others() == [HeldForOther(UNRECORDED_SERVER, 1, size, now)]
    assert state.unacked_bytes == size  # counted against the budget until they go
    for cid in ("done", "acked", "running"):
        assert state.begin(cid, DIGEST, "p").seen is Seen.OTHER_SERVER
    state.ack(["done"])
    assert state.unacked_bytes == size
    # New calls are stamped with the server that sends them.
    _record(state, "new", b"")
    assert state.unacked_ids() == ["new"]
    state.close()

    again = State(path, convert=True)  # a second open changes nothing more
    again.server = A
    assert again.unacked_ids() == ["new"]
    again.connection.execute("UPDATE calls SET finished_ms = ?", (now - DAY_MS - 1000,))
    again.prune()  # the acked row and the held one go; A's own stays
    assert sorted(
        cid for (cid,) in again.connection.execute("SELECT correlation_id FROM calls")
    ) == [
        "new",
        "running",
    ]
    again.close()


def test_a_server_is_known_by_its_address_and_its_tokens_digest() -> None:
    key = server_key("Agents.Example.com:443", "s3cret-token", tls=True)
    assert key == server_key("dns:///agents.example.com:443", "s3cret-token", tls=True)
    assert "s3cret" not in key and key.startswith("tls://agents.example.com:443#")
    assert key != server_key("agents.example.com:443", "another-token", tls=True)
    assert key != server_key("agents.example.com:443", "s3cret-token", tls=False)
    assert key != server_key("other.example.com:443", "s3cret-token", tls=True)
    assert Target("127.0.0.1:7421", "t").server_key == server_key("127.0.0.1:7421", "t", tls=False)
    tls = Target("h:443", "t", tls_ca=Path("ca.pem"))
    assert tls.server_key == server_key("h:443", "t", tls=True)
    # This data folder's own hub: by its token, whatever port it has this time.
    local = Target("127.0.0.1:40001", "t", key=local_hub_key("t"))
    assert local.server_key == Target("127.0.0.1:40002", "t", key=local_hub_key("t")).server_key
    assert local.server_key != local_hub_key("another")


def test_run_knows_this_machines_hub_as_up_does_and_a_named_server_by_its_address(
    tmp_path: Path,
) -> None:
    write_config(tmp_path, "127.0.0.1:7421")
    paths = Paths(tmp_path, tmp_path)
    paths.ensure()
    token = read_or_create_token(paths.workers_token_file)
    config = load(paths)
    assert app.worker_target(paths, config).server_key == local_hub_key(token)
    named = config.model_copy(
        update={"worker": config.worker.model_copy(update={"server": "127.0.0.1:7421"})}
    )
    assert app.worker_target(paths, named).server_key == server_key(
        "127.0.0.1:7421", token, tls=False
    )
    other = config.model_copy(
        update={"worker": config.worker.model_copy(update={"token": "another token"})}
    )
    assert app.worker_target(paths, other).server_key == server_key(
        "127.0.0.1:7421", "another token", tls=False
    )
    # Another server named with no token of its own: this machine's is not sent there.
    elsewhere = config.model_copy(
        update={"worker": config.worker.model_copy(update={"server": "127.0.0.1:9"})}
    )
    with pytest.raises(TokenNotSentError, match=r"127\.0\.0\.1:9 is not this machine's hub"):
        app.worker_target(paths, elsewhere)


def test_a_plans_server_is_known_only_when_its_calls_came_from_it_alone(tmp_path: Path) -> None:
    state = State(tmp_path / "state.db")
    for server, cid, plan in (
        ("a", "a-1", "only-a"),
        ("a", "a-2", "only-a"),
        ("a", "a-3", "both"),
        ("b", "b-1", "both"),
        (UNRECORDED_SERVER, "old-1", "old"),
        ("a", "a-4", "old"),
    ):
        state.server = server
        assert state.begin(cid, DIGEST, plan).seen is Seen.NEW
    state.server = "b"
    state.hold("b-held", DIGEST, "held-b", b"r", b"")
    wanted = ["only-a", "both", "old", "held-b", "never"]
    assert state.servers_of_plans(wanted) == {"only-a": "a", "held-b": "b"}
    state.close()


OLD_GRANTS = """
CREATE TABLE grants (
    id         INTEGER PRIMARY KEY,
    agent      TEXT NOT NULL,
    scope      TEXT NOT NULL,
    plan       TEXT NOT NULL,
    expires_ms INTEGER,
    granted_by TEXT NOT NULL,
    created_ms INTEGER NOT NULL
);
"""


def test_grants_are_per_server_and_old_ones_go_to_a_known_server_once(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    old = sqlite3.connect(path)
    old.executescript(OLD_GRANTS)
    for agent, plan in (("a", "only-a"), ("b", "*"), ("c", "both")):
        old.execute(
            "INSERT INTO grants (agent, scope, plan, expires_ms, granted_by, created_ms)"
            " VALUES (?, 'workerHost.fs_stat', ?, NULL, 'ui:plan', 1)",
            (agent, plan),
        )
    old.commit()
    old.close()
    state = State(path, convert=True)
    assert state.served() is None
    assert {g.server for g in state.grants(every_server=True)} == {UNSORTED_SERVER}
    for server, cid, plan in (("A", "a-1", "only-a"), ("A", "a-2", "both"), ("B", "b-1", "both")):
        state.server = server
        assert state.begin(cid, DIGEST, plan).seen is Seen.NEW
    state.server = "A"
    state.record_served()
    sorted_now = {g.agent: g.server for g in state.sort_old_grants()}
    assert sorted_now == {"a": "A", "b": UNRECORDED_SERVER, "c": UNRECORDED_SERVER}
    assert state.sort_old_grants() == []  # once
    assert [g.agent for g in state.grants()] == ["a"]
    made = state.add_grant("d", "workerHost.*", "*", None, "cli")  # for the server served
    state.add_grant("e", "workerHost.*", "*", None, "cli", server="B")
    assert [g.agent for g in state.grants()] == ["a", "d"]
    state.server = "B"
    assert [g.agent for g in state.grants()] == ["e"]
    assert len(state.grants(every_server=True)) == 5
    assert state.revoke_grant(made) and len(state.grants(every_server=True)) == 4
    state.close()
    again = State(path)  # the person's CLI: which server the worker here served last
    assert again.served() == "A"
    again.close()


def test_a_grant_made_before_any_server_was_served_is_the_first_ones(tmp_path: Path) -> None:
    state = State(tmp_path / "state.db")
    state.add_grant("me", "workerHost.fs_stat", "*", None, "cli", server=NEXT_SERVER)
    assert state.grants() == [] and state.served() is None
    state.server = A
    state.record_served()
    assert [(g.agent, g.server) for g in state.grants()] == [("me", A)]
    state.add_grant("later", "workerHost.fs_stat", "*", None, "cli", server=NEXT_SERVER)
    state.server = B
    state.record_served()  # not the first: a later mark waits for no one
    assert state.served() == B and state.grants() == []
    state.close()


def test_a_servers_kill_binds_its_own_plan_and_the_persons_every_servers(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    old = sqlite3.connect(path)  # a kill from before kills were kept per server
    old.executescript(
        "CREATE TABLE killed_plans (plan_id TEXT PRIMARY KEY, reason TEXT NOT NULL,"
        " killed_by TEXT NOT NULL, killed_ms INTEGER NOT NULL);"
        "INSERT INTO killed_plans VALUES ('old', 'then', 'server', 1);"
    )
    old.commit()
    old.close()
    state = State(path, convert=True)
    state.server = A
    state.kill_plan("p", "A's", "server")
    state.kill_plan("mine", "the person's", "cli")
    state.kill_plan("both", "A's", "server")
    assert state.kill_reason("p") == "A's (by server)" and state.killed("mine")
    assert sorted(plan for plan, _ in state.killed_plans()) == ["both", "mine", "old", "p"]
    state.server = B
    assert state.kill_reason("p") is None and state.killed("p") is None
    assert state.kill_reason("mine") and state.kill_reason("old")
    state.kill_plan("both", "B's", "server")  # two servers killed the id: every server's
    state.kill_plan("p", "the person's now", "ui")  # the person's replaces A's
    state.server = "plain://elsewhere:1#0000000000000000"
    assert {plan for plan, _ in state.killed_plans()} == {"both", "mine", "old", "p"}
    assert state.kill_reason("p") == "the person's now (by ui)"
    assert {plan: server for plan, _, _, _, server in state.kills()} == {
        "old": "*",
        "p": "*",
        "mine": "*",
        "both": "*",
    }
    state.close()


def test_a_hubs_kills_recorded_are_known_by_its_epoch_under_any_token_of_its_address(
    tmp_path: Path,
) -> None:
    """The mark of a hub's kills recorded here is read by the hub's epoch, under the key
    of any token at the same address (the person rotated hub-workers.token), never under
    another address's (review14 finding 07)."""
    path = tmp_path / "state.db"
    old = sqlite3.connect(path)  # a mark as a state.db before this kept it
    old.executescript(
        "CREATE TABLE kill_marks (server TEXT PRIMARY KEY, epoch TEXT NOT NULL,"
        " through INTEGER NOT NULL);"
        f"INSERT INTO kill_marks VALUES ('{A}', 'epoch-a', 7);"
    )
    old.commit()
    old.close()
    state = State(path, convert=True)
    state.server = server_key("127.0.0.1:7000", "rotated", tls=False)
    assert state.kill_mark() == ("", 0)  # its Hello names no mark: the hub sends them all
    assert state.hub_kills_recorded("epoch-a") == 7
    assert state.hub_kills_recorded("another-epoch") == 0 and state.hub_kills_recorded("") == 0
    state.server = B  # another address: another server, whatever epoch it claims
    assert state.hub_kills_recorded("epoch-a") == 0
    state.mark_kills("epoch-a", 9)
    state.server = A
    assert state.hub_kills_recorded("epoch-a") == 7
    local = local_hub_key("t1")
    state.server = local
    state.mark_kills("epoch-l", 3)
    state.server = local_hub_key("t2")
    assert state.hub_kills_recorded("epoch-l") == 3
    state.close()


def test_a_hubs_kills_under_its_earlier_token_bind_its_new_one(tmp_path: Path) -> None:
    """review19 A5: the person rotated hub-workers.token; the same hub (its kills'
    epoch) under the new key: the old key's kills, whole and kept apart, bind the new
    key. Before, they bound the old key only, and the plan ran. Another address's, or
    another epoch's (another hub.db), stay theirs."""
    state = State(tmp_path / "state.db")
    rotated = server_key("127.0.0.1:7000", "rotated", tls=False)
    state.server = A
    state.mark_kills("epoch-a", 3)
    state.kill_plan("whole", "A's", "server", in_use=True)
    state.kill_apart(plan_digest("apart"))
    state.server = B
    state.mark_kills("epoch-b", 1)
    state.kill_plan("b's", "B's", "server")
    state.server = rotated
    assert state.kill_reason("whole") is None and state.killed("apart") is None
    assert state.carry_kills_over("another-epoch") == 0
    assert state.kill_reason("whole") is None
    assert state.carry_kills_over("epoch-a") == 2
    assert state.kill_reason("whole") == "A's (by server)" and state.killed("apart")
    assert state.kill_reason("b's") is None  # another address's
    state.mark_kills("epoch-a", 0)
    assert state.carry_kills_over("epoch-a") == 0  # once: its own mark is of the epoch
    state.close()


def test_a_kill_the_server_says_is_of_a_plan_in_use_is_pruned_last(tmp_path: Path) -> None:
    """review14 finding 02, variant B: no call of the plan came here (the hub refused
    it itself), but the server says the plan is in use (KillPlan.in_use), as it may say
    again of a kill recorded before: such a kill outlives a flood of made-up kills."""
    state = State(tmp_path / "state.db")
    state.server = A
    state.kill_plan("told-at-once", "stop", "server", True)
    state.kill_plan("told-later", "stop", "server")
    state.kill_plan("told-later", "stop", "server", True)  # the same kill, again, in use
    state.kill_plan("never", "stop", "server")
    for n in range(MAX_SERVER_KILLS):
        state.kill_plan(f"made-up-{n}", "flood", "server")
    assert state.killed("told-at-once") and state.killed("told-later")
    assert state.killed("never") is None


def test_a_pruned_kill_of_a_plan_in_use_is_kept_apart_not_a_stop_of_every_plan(
    tmp_path: Path,
) -> None:
    """review16 F4: past MAX_SERVER_KILLS kills of plans in use (a Dispatch and a KillPlan
    of each made-up plan) the oldest is kept apart by its digest: its plan stays killed
    for that server alone, other plans run, and the person can lift it by its id.
    Before, the worker stopped every plan of the server (a kill of ALL_PLANS)."""
    state = State(tmp_path / "state.db")
    state.server = A
    state.kill_plan("victim", "the person's, through the hub", "server", True)
    for n in range(MAX_SERVER_KILLS):  # the last one prunes the victim's
        state.kill_plan(f"in-use-{n}", "flood", "server", True)
    assert "victim" not in [plan for plan, *_ in state.kills()]
    assert state.kills_kept_apart() == 1
    assert state.kill_reason("victim") is not None
    assert state.killed("victim") is not None  # what a UI shows, and lifts
    # Sent again (a new key: hub-workers.token rotated), it is not taken as lifted.
    assert state.server_kill_of("victim") and not state.server_kill_of("never-killed")
    assert state.kill_reason("never-killed") is None
    assert ALL_PLANS not in [plan for plan, *_ in state.kills()]
    state.server = B  # another server's plan of the same id
    assert state.kill_reason("victim") is None
    state.server = A
    assert state.lift_kill("victim")
    assert state.kill_reason("victim") is None
    assert state.kills_kept_apart() == 0
    state.close()


def test_past_max_kills_apart_every_plan_of_the_server_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kills kept apart are bounded too (ledger.MAX_KILLS_APART, 1,000,000 of a
    server's, ~18 bytes a row): past it the worker can no longer tell which of the
    server's plans are killed, and stops them all until the person lifts `*`."""
    monkeypatch.setattr(ledger, "MAX_KILLS_APART", 2)
    state = State(tmp_path / "state.db")
    state.server = A
    for n in range(MAX_SERVER_KILLS + 2):  # two kept apart: the share there is full
        state.kill_plan(f"in-use-{n}", "flood", "server", True)
    assert state.kills_kept_apart() == 2
    assert state.kill_reason("never-killed") is None
    state.kill_plan("one-more", "flood", "server", True)
    assert state.kills_kept_apart() == 2
    assert ALL_PLANS in [plan for plan, *_ in state.kills()]
    assert state.kill_reason("never-killed") is not None
    state.server = B  # the stop binds the flooding server's plans only
    assert state.kill_reason("never-killed") is None
    state.close()


def test_a_servers_kill_of_every_plan_outlives_a_flood_of_kills_of_plans_in_use(
    tmp_path: Path,
) -> None:
    """A hub sends a kill of ALL_PLANS in place of kills it dropped (review16 E1). Past
    MAX_SERVER_KILLS kills of plans in use it was the oldest pruned, and the worker's own
    stop, recorded in its place, went with it: the dropped plans ran."""
    state = State(tmp_path / "state.db")
    state.server = A
    state.kill_plan(ALL_PLANS, "kills dropped at the hub", "server", True)
    for n in range(MAX_SERVER_KILLS):  # the last one prunes one
        state.kill_plan(f"in-use-{n}", "flood", "server", True)
    assert state.killed("never-killed") is not None
    state.close()
