from __future__ import annotations

import pytest

from worker.core.connection import Backoff
from worker.errors import InsecureError
from worker.wire.transport import (
    OWN_HUB_NAME,
    Keepalive,
    client_options,
    is_loopback,
    is_per_server,
    key_for_server,
    open_channel,
    server_name,
    server_options,
)


def test_backoff_is_full_jitter_capped_and_never_zero() -> None:
    backoff = Backoff(base_s=0.5, cap_s=30.0)
    delays = [backoff.delay(down) for down in range(0, 400, 5) for _ in range(50)]
    assert max(delays) <= 30.0
    assert min(delays) >= 0.05, "a floor keeps a flapping link from spinning"
    late = [backoff.delay(200) for _ in range(500)]
    assert max(late) > 20, "late dials spread up to the cap"
    assert min(late) < 10, "full jitter: anywhere from near zero to the cap"


def test_backoff_never_waits_more_than_half_the_time_down() -> None:
    """So a server back after a short restart is redialled at once (issue 11, D5)."""
    backoff = Backoff(base_s=0.5, cap_s=30.0)
    for down in (0.0, 0.5, 1.0, 3.0, 20.0):
        assert max(backoff.delay(down) for _ in range(500)) <= 0.5 + down / 2


def test_keepalive_includes_ping_timeout() -> None:
    """A link with nothing come for the ping timeout is gone (gRPC's keepalive timeout,
    called off by any byte read); a ping's ack may take longer behind what the link
    carries, and gRPC watches the first only while it is the shorter (review21's slow
    link: the two equal, its worker lost the link every 5 s)."""
    options = dict(client_options(Keepalive(time_s=10, ping_timeout_s=5)))
    assert options["grpc.keepalive_time_ms"] == 10_000
    assert options["grpc.keepalive_timeout_ms"] == 5_000
    assert options["grpc.http2.ping_timeout_ms"] == 60_000
    long = dict(server_options(Keepalive(time_s=10, ping_timeout_s=45)))
    assert long["grpc.keepalive_timeout_ms"] < long["grpc.http2.ping_timeout_ms"] == 90_000
    assert options["grpc.max_receive_message_length"] == 32 * 1024 * 1024


def test_the_hubs_server_grows_no_window_ahead_of_its_reads() -> None:
    """A stream's window is the server's, the same for every stream: grown ahead of
    reads (bandwidth probes, a lookahead), it would let every call waiting for its read
    turn, and every worker stream the hub leaves unread, take that much in
    (test_hub_limits: 4 MiB a stream, +64 MiB for 16 waiting calls)."""
    options = dict(server_options(Keepalive()))
    assert options["grpc.http2.bdp_probe"] == 0
    assert "grpc.http2.lookahead_bytes" not in options


@pytest.mark.parametrize(
    ("target", "loopback"),
    [
        ("127.0.0.1:7421", True),
        ("127.9.9.9:1", True),
        ("[::1]:7421", True),
        ("localhost:7421", True),
        ("10.0.0.1:7421", False),
        ("localhost.evil.com:7421", False),
        ("[::ffff:127.0.0.1]:1", False),
        ("agents.example.com:443", False),
    ],
)
def test_only_loopback_counts_as_loopback(target: str, loopback: bool) -> None:
    assert is_loopback(target) is loopback


def test_plaintext_channel_off_loopback_is_refused() -> None:
    with pytest.raises(InsecureError, match="plaintext is allowed only to loopback"):
        open_channel("203.0.113.9:7421", Keepalive())


def test_each_server_gets_a_key_of_its_own_and_none_tells_worker_key() -> None:
    """review27 I2's rest: what one server is sent proves nothing at another."""
    secret = "9f" * 32
    names = ["127.0.0.1:7000", "127.0.0.1:7001", "hub.example:443", OWN_HUB_NAME]
    keys = [key_for_server(secret, name) for name in names]
    assert len(set(keys)) == len(names)
    assert all(is_per_server(key) and secret not in key for key in keys)
    assert key_for_server("8f" * 32, names[0]) != keys[0]  # another worker
    assert key_for_server(secret, server_name("dns:///Hub.Example:443")) == keys[2]
    assert not is_per_server(secret)
    assert key_for_server("", names[0]) == ""  # no worker.key: no key sent
