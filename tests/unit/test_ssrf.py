"""The URL guard on its own: which addresses and URLs it refuses, before any connection.

Nothing here opens a socket. Name resolution is the far side of the guard's
boundary, so where a test needs a name to resolve somewhere (a private address,
a public one) it passes a resolver that answers from a table.
"""

from __future__ import annotations

import asyncio
import ipaddress

import httpx
import pytest
from pydantic import ValidationError

from worker.actions.host.fetching.ssrf import Destination, IPAddress, Resolver, UrlGuard, refusal
from worker.config import Config
from worker.errors import WorkerError
from worker.hosts import HostPattern, parse_pattern

PUBLIC = ipaddress.ip_address("93.184.216.34")


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("127.255.0.9", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "link-local"),
        ("100.64.0.1", "carrier-grade NAT"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("255.255.255.255", "reserved"),
        ("240.0.0.1", "reserved"),
        ("198.18.0.1", "private"),
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("fe80::1", "link-local"),
        ("fd00::1", "private"),
        ("fec0::1", "site-local"),
        ("ff02::1", "multicast"),
        ("::ffff:127.0.0.1", "IPv4 address in IPv6 form, a loopback"),
        ("::ffff:169.254.169.254", "IPv4 address in IPv6 form, a link-local"),
        ("2002:7f00:1::", "IPv6 form, a loopback"),  # 6to4
        ("2002:a00:1::", "IPv6 form, a private"),
        ("64:ff9b::a9fe:a9fe", "IPv6 form, a link-local"),  # NAT64
        ("::7f00:1", "reserved"),  # IPv4-compatible, deprecated
        ("2001:db8::1", "special-purpose"),
    ],
)
def test_non_public_addresses_are_refused(address: str, why: str) -> None:
    reason = refusal(ipaddress.ip_address(address))
    assert reason is not None and why in reason


@pytest.mark.parametrize(
    "address", ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700::1111", "::ffff:8.8.8.8"]
)
def test_public_addresses_pass(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is None


def test_nat64_of_a_public_address_passes() -> None:
    # IPv6-only networks reach IPv4 sites through 64:ff9b::/96; that must keep working.
    assert refusal(ipaddress.ip_address("64:ff9b::808:808")) is None


def table(answers: dict[str, list[str]]) -> tuple[list[str], Resolver]:
    asked: list[str] = []

    async def resolve(host: str, port: int) -> list[IPAddress]:
        asked.append(host)
        if host not in answers:
            raise OSError(f"unknown host {host}")
        return [ipaddress.ip_address(a) for a in answers[host]]

    return asked, resolve


def guard(answers: dict[str, list[str]], *, allow: str = "", own: tuple[str, ...] = ()) -> UrlGuard:
    _, resolve = table(answers)
    patterns = [parse_pattern(allow)] if allow else []
    mine = frozenset(ipaddress.ip_address(a) for a in own)
    return UrlGuard(patterns, resolve=resolve, own=lambda: mine)


def check(g: UrlGuard, url: str) -> Destination:
    return asyncio.run(g.check(g.parse(url)))


def refused(g: UrlGuard, url: str, code: str = "url_not_allowed") -> WorkerError:
    with pytest.raises(WorkerError) as caught:
        check(g, url)
    assert caught.value.code == code, caught.value
    return caught.value


def test_a_name_resolving_to_a_private_address_is_refused_without_echoing_it() -> None:
    error = refused(guard({"intranet.example": ["10.20.30.40"]}), "http://intranet.example/")
    assert "resolves to a private" in error.message
    assert "10.20.30.40" not in error.message + str(error.details), "no map of the network"


def test_one_private_answer_among_public_ones_is_enough_to_refuse() -> None:
    g = guard({"mixed.example": ["93.184.216.34", "127.0.0.1"]})
    assert "loopback" in refused(g, "https://mixed.example/").message


def test_a_public_name_is_pinned_to_the_address_checked() -> None:
    destination = check(guard({"example.com": ["93.184.216.34"]}), "https://Example.COM/x")
    assert destination.address == "93.184.216.34"
    assert destination.host == "example.com"
    assert destination.port == 443


def test_the_machines_own_addresses_are_refused() -> None:
    g = guard({"me.example": ["8.8.8.8"]}, own=("8.8.8.8",))
    assert "this machine's own" in refused(g, "http://me.example/").message
    assert "this machine's own" in refused(g, "http://[::ffff:8.8.8.8]/").message


def test_allow_hosts_opens_exactly_the_host_and_port_listed() -> None:
    answers = {"localhost": ["127.0.0.1"], "127.0.0.1": ["127.0.0.1"]}
    g = guard(answers, allow="localhost:8000")
    assert check(g, "http://localhost:8000/").opened
    refused(g, "http://localhost:8001/")
    refused(g, "http://127.0.0.1:8000/")  # same address, other name: not what was opened
    any_port = guard(answers, allow="localhost")
    assert check(any_port, "http://localhost:9/").opened


def test_an_unresolvable_name_is_not_found() -> None:
    refused(guard({}), "https://no-such-host.invalid/", code="not_found")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("file:///etc/passwd", "file: URL"),
        ("ftp://example.com/x", "ftp: URL"),
        ("gopher://example.com/", "gopher: URL"),
        ("javascript:alert(1)", "javascript: URL"),
        ("data:text/plain,hi", "data: URL"),
        ("//example.com/x", "not an absolute URL"),
        ("example.com", "not an absolute URL"),
        ("http://user:pass@example.com/", "user name or password"),
        ("http://example.com@127.0.0.1/", "user name or password"),
        ("http://127.0.0.1:80@example.com/", "user name or password"),
        ("http://example.com\\@127.0.0.1/", "backslash"),
        ("http://exa mple.com/", "spaces or control"),
        ("http://example.com/\r\nHost: evil", "spaces or control"),
        ("http:///path", "no host"),
        ("http://example.com:99999/", "port"),
        ("http://%31%32%37.0.0.1/", "characters no host name"),
        ("http://127.0.0.1%00.example.com/", "characters no host name"),
    ],
)
def test_unusable_urls_are_refused_before_resolving(url: str, why: str) -> None:
    asked, resolve = table({})
    g = UrlGuard(resolve=resolve, own=frozenset)
    with pytest.raises(WorkerError) as caught:
        asyncio.run(g.check(g.parse(url)))
    assert caught.value.code == "url_not_allowed"
    assert why in caught.value.message
    assert asked == [], "nothing was resolved"


def test_legacy_ipv4_spellings_stay_names_and_meet_the_address_check() -> None:
    # The real resolver reads 127.1 and 0x7f000001 as 127.0.0.1; the guard checks
    # what the name resolves to, so the spelling cannot slip past it.
    g = UrlGuard()
    for url in ("http://127.1/", "http://0x7f000001/", "http://017700000001/"):
        with pytest.raises(WorkerError) as caught:
            asyncio.run(g.check(httpx.URL(url)))
        assert "loopback" in caught.value.message


@pytest.mark.parametrize(
    ("entry", "pattern"),
    [
        ("localhost", HostPattern("localhost", None)),
        ("LocalHost:8000", HostPattern("localhost", 8000)),
        ("127.0.0.1:80", HostPattern("127.0.0.1", 80)),
        ("[::1]:8080", HostPattern("::1", 8080)),
        ("::1", HostPattern("::1", None)),
        ("bücher.example", HostPattern("xn--bcher-kva.example", None)),
    ],
)
def test_allow_host_entries_parse(entry: str, pattern: HostPattern) -> None:
    assert parse_pattern(entry) == pattern


@pytest.mark.parametrize(
    "entry", ["http://localhost", "localhost/x", "a@b", "host:0", "host:http", "[::1", ""]
)
def test_bad_allow_host_entries_are_config_errors(entry: str) -> None:
    with pytest.raises(ValidationError, match="allow_hosts"):
        Config.model_validate({"http": {"allow_hosts": [entry]}})
