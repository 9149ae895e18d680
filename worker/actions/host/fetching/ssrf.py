"""The URL guard of http_fetch: public internet addresses only, unless opened on purpose.

An agent that can make this machine fetch a URL could otherwise read what only
this machine can reach: services on loopback, the home or office network, the
cloud metadata endpoint at 169.254.169.254. So every URL (and every redirect hop)
passes `UrlGuard.check` before a connection exists: http or https only, no
user@ part, the host resolved here and every address it resolves to checked.
What is refused: loopback, private, link-local, carrier-grade NAT, multicast,
reserved and unspecified addresses, IPv4 addresses hidden inside IPv6 forms
(mapped, 6to4, Teredo, NAT64) that are any of those, and this machine's own
addresses. `[http] allow_hosts` opens chosen hosts on purpose.

The check answers with the one address it approved; the connection is then
pinned to that address (see fetching.pinned), so a name cannot resolve to a public
address for the check and a private one for the connect (DNS rebinding).
"""

from __future__ import annotations

import ipaddress
import re
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final

import httpx
import psutil

from worker.actions.host.fetching.lookups import lookups
from worker.errors import WorkerError
from worker.hosts import HostPattern, canonical_host

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]
OwnAddresses = Callable[[], frozenset[IPAddress]]

DEFAULT_PORTS: Final = {"http": 80, "https": 443}
_CGNAT: Final = ipaddress.IPv4Network("100.64.0.0/10")
_NAT64: Final = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL: Final = ipaddress.IPv6Network("64:ff9b:1::/48")
_OWN_TTL_S: Final = 30.0
# A host as httpx sends it: an IDNA-encoded name, an IPv4 or a bracket-less IPv6 address.
_HOST_CHARS: Final = re.compile(rb"[A-Za-z0-9._:-]+")
_OPEN_HINT: Final = (
    "Only public internet addresses can be fetched. If the person at this worker "
    "wants this host reachable, they can add {entry!r} to allow_hosts under [http] "
    "in config.toml."
)


@dataclass(frozen=True)
class Destination:
    """A checked hop: connect to `address`, while Host and TLS SNI stay `host`."""

    host: str  # as httpx connects to it: IDNA-encoded, IPv6 without brackets
    port: int
    address: str
    opened: bool  # reached through allow_hosts rather than by being public


def refusal(ip: IPAddress) -> str | None:
    """Why `ip` may not be fetched from, or None when it is a public address."""
    if isinstance(ip, ipaddress.IPv6Address):
        hidden = _embedded_ipv4(ip)
        if hidden is not None:
            why = refusal(hidden)
            if why is not None:
                return f"an IPv4 address in IPv6 form, {why}"  # the address itself: not echoed
            if ip.ipv4_mapped is not None or ip in _NAT64:
                return None  # the IPv4 address is the destination, and it is public
    if ip.is_unspecified:
        return "the unspecified address, which reaches this machine"
    if ip.is_loopback:
        return "a loopback address (this machine)"
    if ip.is_link_local:
        return "a link-local address (where cloud metadata services answer)"
    if ip.is_multicast:
        return "a multicast address"
    if isinstance(ip, ipaddress.IPv4Address) and ip in _CGNAT:
        return "a carrier-grade NAT address (shared by an internet provider's customers)"
    if isinstance(ip, ipaddress.IPv6Address) and (ip.is_site_local or ip in _NAT64_LOCAL):
        return "a site-local address"
    if ip.is_reserved:
        return "a reserved address"
    if ip.is_private:
        return "a private or special-purpose network address"
    if not ip.is_global:
        return "not a public internet address"
    return None


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for (mapped, 6to4, Teredo, NAT64), if any."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]  # the client's own address
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


async def system_resolve(host: str, port: int) -> list[IPAddress]:
    """Every address `host` resolves to, in the system's preference order (looked up
    in a thread of its own: fetching.lookups)."""
    infos = await lookups.resolve(host, port)
    found: dict[IPAddress, None] = {}
    for _family, _type, _proto, _name, sockaddr in infos:
        text = str(sockaddr[0]).split("%", 1)[0]  # an IPv6 zone: the address is what counts
        found[ipaddress.ip_address(text)] = None
    return list(found)


class _OwnAddressCache:
    """This machine's interface addresses, looked up again every 30 seconds."""

    def __init__(self) -> None:
        self._at = -_OWN_TTL_S
        self._addresses: frozenset[IPAddress] = frozenset()

    def __call__(self) -> frozenset[IPAddress]:
        now = time.monotonic()
        if now - self._at >= _OWN_TTL_S:
            found = set()
            for entries in psutil.net_if_addrs().values():
                for entry in entries:
                    if entry.family in (socket.AF_INET, socket.AF_INET6):
                        found.add(ipaddress.ip_address(entry.address.split("%", 1)[0]))
            self._addresses, self._at = frozenset(found), now
        return self._addresses


own_addresses: Final = _OwnAddressCache()


def _refused(url: str, why: str, **details: object) -> WorkerError:
    return WorkerError("url_not_allowed", f"{url[:200]!r} {why}", {"url": url[:2000], **details})


class UrlGuard:
    """Checks URLs against the rules above; `resolve` and `own` are injectable for tests."""

    def __init__(
        self,
        allow: Sequence[HostPattern] = (),
        *,
        resolve: Resolver = system_resolve,
        own: OwnAddresses = own_addresses,
    ) -> None:
        self._allow = tuple(allow)
        self._resolve = resolve
        self._own = own

    def parse(self, text: str) -> httpx.URL:
        """`text` as the URL httpx will use, or url_not_allowed when it is unusable."""
        if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
            raise _refused(text, "contains spaces or control characters; percent-encode them.")
        _scheme, sep, rest = text.partition("://")
        authority = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0] if sep else ""
        if "\\" in authority:
            raise _refused(
                text, "has a backslash before its path, which clients read in different ways."
            )
        try:
            url = httpx.URL(text)
        except httpx.InvalidURL as exc:
            raise _refused(text, f"is not a valid URL ({exc}).") from None
        self.check_shape(url)
        return url

    def check_shape(self, url: httpx.URL) -> None:
        """What can be refused without resolving anything: scheme, user info, host."""
        shown = str(url)
        if url.scheme not in DEFAULT_PORTS:
            what = f"a {url.scheme}: URL" if url.scheme else "not an absolute URL"
            raise _refused(shown, f"is {what}; only http:// and https:// URLs can be fetched.")
        if url.userinfo:
            raise _refused(
                shown,
                "carries a user name or password before the host (user@host), which is refused: "
                "it hides the real host from a reader. Send credentials in a header instead.",
            )
        if not url.raw_host:
            raise _refused(shown, "has no host.")
        if not _HOST_CHARS.fullmatch(url.raw_host):
            raise _refused(shown, "has a host with characters no host name can have.")
        if url.port is not None and not 0 < url.port < 65536:
            raise _refused(shown, "has a port outside 1-65535.")

    async def check(self, url: httpx.URL) -> Destination:
        """Approve one hop: resolve its host and check every address; pick one to pin."""
        self.check_shape(url)
        shown = str(url)
        host = url.raw_host.decode("ascii")
        port = url.port or DEFAULT_PORTS[url.scheme]
        opened = any(pattern.matches(canonical_host(host), port) for pattern in self._allow)
        try:
            literal = _literal(host)
            addresses = [literal] if literal is not None else await self._resolve(host, port)
        except (OSError, UnicodeError) as exc:
            raise _lookup_failed(host, shown, exc) from None
        if not addresses:
            raise WorkerError("not_found", f"the host {host!r} has no address.", {"host": host})
        if not opened:
            self._check_addresses(shown, host, port, addresses, literal=literal is not None)
        return Destination(host=host, port=port, address=str(addresses[0]), opened=opened)

    def _check_addresses(
        self, shown: str, host: str, port: int, addresses: list[IPAddress], *, literal: bool
    ) -> None:
        own = self._own()
        for ip in addresses:
            why = refusal(ip)
            if why is None and (ip in own or _unmapped(ip) in own):
                why = "one of this machine's own addresses"
            if why is None:
                continue
            # The address a name resolves to is not echoed: the caller could map the
            # private network by asking for names one after another.
            subject = "is" if literal else "resolves to"
            entry = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            raise _refused(shown, f"{subject} {why}. " + _OPEN_HINT.format(entry=entry), reason=why)


def _literal(host: str) -> IPAddress | None:
    """`host` as an IP address when it is written as one (`127.1` is not: it is a name)."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _unmapped(ip: IPAddress) -> IPAddress:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


# getaddrinfo's answers that mean "no answer now" rather than "no such name".
_DNS_DOWN: Final = frozenset({socket.EAI_AGAIN, socket.EAI_FAIL})


def _lookup_failed(host: str, shown: str, exc: OSError | UnicodeError) -> WorkerError:
    details = {"url": shown[:2000], "host": host}
    if isinstance(exc, socket.gaierror) and exc.errno in _DNS_DOWN:
        return WorkerError(
            "not_found",
            f"could not look up {host!r}: the DNS server did not answer ({exc.strerror}). "
            "This machine may be offline or its network down; try again later.",
            {**details, "reason": "dns_unavailable"},
            retryable=True,
        )
    return WorkerError(
        "not_found",
        f"the host {host!r} could not be found ({exc}). Check the URL's spelling.",
        details,
    )
