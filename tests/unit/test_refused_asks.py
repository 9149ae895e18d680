"""What a worker keeps of the allowlist asks it refused, for `agentworker grant` to
check an ask's name against (review21 B7): each command as a prompt shows it, its
passwords masked, for a while and a bounded number of them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker.actions.host.exec_cmd import ask_about
from worker.core.ledger import State
from worker.core.refused_asks import KEPT_S, MAX_REFUSED_ASKS, RefusedAsks
from worker.core.scopes import ASK_PREFIX, ask_binding

NOW = 1_800_000_000_000


@pytest.fixture
def state(tmp_path: Path) -> Iterator[State]:
    state = State(tmp_path / "state.db")
    yield state
    state.close()


def _refuse(asks: RefusedAsks, argv: list[str], now: int = NOW) -> tuple[str, str]:
    """Record `argv`'s ask as refused; its (surface, digest)."""
    name, preview = ask_about("workerHost", argv, "/w", "rule r: the person approves each")
    asks.record(name, preview, json.dumps({"argv": argv, "cwd": "/w"}), now=now)
    bound = ask_binding(ASK_PREFIX + name)
    assert bound is not None
    return bound


def test_a_refused_ask_is_found_by_its_digest_with_its_command(state: State) -> None:
    asks = RefusedAsks(state.connection)
    surface, digest = _refuse(asks, ["python3", "evil.py"])
    found = asks.find(surface, digest, now=NOW)
    assert found is not None
    assert found.name.startswith("workerHost.exec python3 (1 arg) in /w (sha256 ")
    assert "command: python3 evil.py\nworking folder: /w\n" in found.shown
    assert asks.find(surface, "0" * 64, now=NOW) is None
    assert asks.find("workbenchHost", digest, now=NOW) is None


def test_only_the_name_the_refusal_gave_names_it(state: State) -> None:
    asks = RefusedAsks(state.connection)
    found = asks.find(*_refuse(asks, ["python3", "evil.py"]), now=NOW)
    assert found is not None
    assert found.named(found.name)
    assert found.named(ASK_PREFIX + found.name)
    for forged in ("ls (1 arg)", "python3 (2 args)"):
        assert not found.named(found.name.replace("python3 (1 arg)", forged))
    assert not found.named(found.name.replace(" in /w ", " in /home/me "))


def test_a_password_in_the_argv_is_not_kept(state: State) -> None:
    asks = RefusedAsks(state.connection)
    argv = ["python3", "s.py", "--password", "hunter2-secret", "-c", "x"]
    found = asks.find(*_refuse(asks, argv), now=NOW)
    assert found is not None
    assert "--password ***" in found.shown
    rows = state.connection.execute("SELECT * FROM refused_asks").fetchall()
    assert "hunter2-secret" not in repr(rows)


@pytest.mark.parametrize(
    ("argv", "password"),
    [
        (["curl", "-u", "me:hunt'er2secret", "https://example.com/"], "er2secret"),
        (["mysql", "-pse'cret99", "db"], "cret99"),
        (["sshpass", "-p", "pa'ss99", "ssh", "host"], "ss99"),
        (["python3", "s.py", "--password", "a\"b\\c'd99"], "d99"),
    ],
)
def test_a_password_holding_a_quote_is_not_kept(
    state: State, argv: list[str], password: str
) -> None:
    """review23 C9: the prompt quotes the argv as a shell would (`shlex.join` writes
    a word holding ' as 'me:hunt'"'"'er2secret'), so the password as the argv holds it
    was not in the text, and the refusal kept it (and `agentworker grant` printed it)."""
    asks = RefusedAsks(state.connection)
    found = asks.find(*_refuse(asks, argv), now=NOW)
    assert found is not None
    rows = state.connection.execute("SELECT * FROM refused_asks").fetchall()
    assert password not in repr(rows)
    assert password not in found.shown


def test_a_refused_ask_is_kept_for_a_while(state: State) -> None:
    asks = RefusedAsks(state.connection)
    bound = _refuse(asks, ["python3", "old.py"])
    assert asks.find(*bound, now=NOW + KEPT_S * 1000) is not None
    assert asks.find(*bound, now=NOW + KEPT_S * 1000 + 1) is None
    _refuse(asks, ["python3", "new.py"], now=NOW + KEPT_S * 1000 + 1)  # prunes old.py's
    (count,) = state.connection.execute("SELECT count(*) FROM refused_asks").fetchone()
    assert count == 1


def test_a_flood_of_refusals_keeps_the_newest_only(state: State) -> None:
    asks = RefusedAsks(state.connection)
    first = _refuse(asks, ["python3", "first.py"])
    for i in range(MAX_REFUSED_ASKS):
        _refuse(asks, ["python3", f"flood{i}.py"], now=NOW + 1 + i // 7)
    (count,) = state.connection.execute("SELECT count(*) FROM refused_asks").fetchone()
    assert count == MAX_REFUSED_ASKS
    assert asks.find(*first, now=NOW) is None
    assert asks.find(*_refuse(asks, ["python3", "last.py"], now=NOW + 200), now=NOW) is not None


def test_a_command_too_long_to_show_is_not_kept(state: State) -> None:
    asks = RefusedAsks(state.connection)
    bound = _refuse(asks, ["python3", "x" * 20_000])
    assert asks.find(*bound, now=NOW) is None
