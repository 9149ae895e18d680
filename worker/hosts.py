"""Host names as http_fetch compares them: one spelling per host, whoever wrote it.

The config's `[http] allow_hosts` and the URL an agent sends must be compared in
the same form, or an entry meant for one host could match another (or fail to
match its own). Names are lower-cased and IDNA-encoded exactly as httpx encodes
a URL's host; IP addresses are written the one way `ipaddress` prints them.
Legacy spellings such as `127.1` or `0x7f000001` are not IP addresses here: they
stay names, are resolved like names, and so meet the address checks.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass


@dataclass(frozen=True)
class HostPattern:
    """An `allow_hosts` entry: a host, and one port or (None) every port."""

    host: str
    port: int | None

    def matches(self, host: str, port: int) -> bool:
        return self.host == host and self.port in (None, port)


def canonical_host(host: str) -> str:
    """`host` (a URL's raw host, no brackets) in the form used for comparisons."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.lower().rstrip(".")


def parse_pattern(entry: str) -> HostPattern:
    """Parse `host`, `host:port`, `[v6]`, `[v6]:port` or a bare IPv6 address.

    Raises ValueError with a message for the config file's reader.
    """
    text = entry.strip()
    port: str | None = None
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"{entry!r}: write an IPv6 address as [addr] or [addr]:port")
        port = rest[1:] if rest else None
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host = text  # a name, an IPv4 address, or an IPv6 address without a port
    if not host or any(c in host for c in "/@?#\\ \t") or "://" in text:
        raise ValueError(f"{entry!r}: give a host or host:port only, like 'localhost:8000'")
    number = None
    if port is not None:
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{entry!r}: the port must be a number from 1 to 65535")
        number = int(port)
    import httpx  # here, not above: reading a config file must not load an HTTP client

    try:
        raw = httpx.URL(f"http://{_bracketed(host)}/").raw_host.decode("ascii")
    except (httpx.InvalidURL, UnicodeError) as exc:
        raise ValueError(f"{entry!r}: not a valid host name ({exc})") from None
    return HostPattern(canonical_host(raw), number)


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host
