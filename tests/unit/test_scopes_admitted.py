"""Scopes.allowed keeps what a config grant that never expires admitted (a call's look
is one lookup), and nothing else: a reload of the config forgets it, an expiring
grant and the live grants (grant, revoke, an approval) are looked at each time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from worker.core import scopes
from worker.core.scopes import ASK_PREFIX, Grant, Scopes


class _Clock:
    """datetime for worker.core.scopes, its `now` set by the test."""

    def __init__(self) -> None:
        self.at = datetime(2026, 1, 1, tzinfo=UTC)

    def now(self, tz: object = None) -> datetime:
        return self.at


def test_a_config_grant_is_matched_once_and_forgotten_when_the_config_is_read_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    matched: list[str] = []
    admits = Grant.admits

    def counted(self: Grant, agent: str, scope: str, plan: str, now: datetime) -> bool:
        matched.append(self.scope)
        return admits(self, agent, scope, plan, now)

    monkeypatch.setattr(Grant, "admits", counted)
    checks = Scopes([Grant("a", "workerHost.fs_*")])
    assert all(checks.allowed("a", "workerHost.fs_stat", "p") for _ in range(3))
    assert matched == ["workerHost.fs_*"]  # once, then remembered
    assert not checks.allowed("b", "workerHost.fs_stat", "p")
    assert not checks.allowed("a", "workerHost.exec", "p")
    checks.replace_static([Grant("a", "workerHost.fs_read")])
    assert not checks.allowed("a", "workerHost.fs_stat", "p")
    assert checks.allowed("a", "workerHost.fs_read", "p")


def test_an_expiring_grant_and_the_live_ones_are_looked_at_each_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _Clock()
    monkeypatch.setattr(scopes, "datetime", clock)
    live: list[Grant] = [Grant("a", "workerHost.exec")]
    checks = Scopes(
        [Grant("a", "workerHost.fs_stat", expires=clock.at + timedelta(hours=1))], lambda: live
    )
    assert checks.allowed("a", "workerHost.fs_stat", "p")
    assert checks.allowed("a", "workerHost.exec", "p")
    clock.at += timedelta(hours=2)
    assert not checks.allowed("a", "workerHost.fs_stat", "p")
    live.clear()  # revoked
    assert not checks.allowed("a", "workerHost.exec", "p")
    # An ask is answered by an approval of it alone, never from what was kept.
    ask = ASK_PREFIX + "workerHost.exec ls (1 arg) in / (sha256 " + "0" * 64 + ")"
    assert not checks.allowed("a", ask, "p")


def test_what_is_kept_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scopes, "ADMITTED_KEPT", 4)
    checks = Scopes([Grant("*", "*")])
    for plan in range(10):
        assert checks.allowed("a", "workerHost.fs_stat", f"plan {plan}")
        assert len(checks._admitted) <= 4
