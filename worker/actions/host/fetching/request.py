"""The request behind workerHost.http_fetch (see ../http_fetch.py for the action): the
guard, the pinned transport, timeouts, redirects and the body, on httpx.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import ssl
import time
from typing import Final

import httpx

from worker.actions.host.fetching.body import read_body
from worker.actions.host.fetching.lookups import LOOKUP_FOR
from worker.actions.host.fetching.pinned import PinnedTransport, Pins
from worker.actions.host.fetching.ssrf import DEFAULT_PORTS, UrlGuard
from worker.actions.host.http_fetch import (
    BODY_BYTES,
    FOLLOWING_HEADERS,
    RAW_BYTES,
    REDIRECTS,
    REQUEST_BYTES,
    HttpFetchArgs,
    HttpFetchResult,
)
from worker.config import HttpSection
from worker.core.registry import Context, Outcome
from worker.errors import WorkerError
from worker.hosts import parse_pattern
from worker.wire.protocol import VERSION


async def fetch(ctx: Context, args: HttpFetchArgs) -> Outcome[HttpFetchResult]:
    settings = ctx.config.http
    if len(ctx.blob) > REQUEST_BYTES:
        raise WorkerError(
            "too_large",
            f"the request body is {len(ctx.blob):,} bytes; at most {REQUEST_BYTES:,} can be sent",
            {"bytes": len(ctx.blob), "limit": REQUEST_BYTES},
        )
    timeouts, total = _timeouts(args, settings)
    LOOKUP_FOR.set(ctx.agent_id)  # the call's own task: its lookups are its agent's
    guard = _guard(tuple(settings.allow_hosts))
    url = guard.parse(args.url)
    try:
        async with asyncio.timeout(total):
            return await _fetch(guard, url, args, ctx.blob, timeouts)
    except TimeoutError:
        raise WorkerError(
            "timeout",
            f"fetching {str(url)[:200]!r} took longer than its total timeout of {total:g} s "
            "and was stopped",
            {"url": str(url)[:2000], "total_timeout_s": total},
        ) from None
    except httpx.HTTPError as exc:
        raise _translate(exc, url) from None


@functools.cache
def _guard(allow_hosts: tuple[str, ...]) -> UrlGuard:
    return UrlGuard([parse_pattern(entry) for entry in allow_hosts])


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    # trust_env=False: SSL_CERT_FILE and friends are no more the agent's to steer than proxies.
    return httpx.create_ssl_context(trust_env=False)


def _timeouts(args: HttpFetchArgs, settings: HttpSection) -> tuple[httpx.Timeout, float]:
    asked = {
        "connect_timeout_s": (args.connect_timeout_s, settings.connect_timeout_s),
        "read_timeout_s": (args.read_timeout_s, settings.read_timeout_s),
        "total_timeout_s": (args.total_timeout_s, settings.total_timeout_s),
    }
    chosen = {}
    for name, (value, ceiling) in asked.items():
        if value is not None and value > ceiling:
            raise WorkerError(
                "validation_error",
                f"{name} may be at most {ceiling:g} s on this worker ([http] {name} in its "
                "config.toml)",
                {"errors": [{"loc": [name], "msg": f"at most {ceiling:g}", "type": "less_than"}]},
            )
        chosen[name] = ceiling if value is None else value
    connect, read = chosen["connect_timeout_s"], chosen["read_timeout_s"]
    timeout = httpx.Timeout(connect=connect, read=read, write=read, pool=connect)
    return timeout, chosen["total_timeout_s"]


async def _fetch(
    guard: UrlGuard, url: httpx.URL, args: HttpFetchArgs, body: bytes, limits: httpx.Timeout
) -> Outcome[HttpFetchResult]:
    started = time.monotonic()
    pins = Pins()
    headers = httpx.Headers(
        {"User-Agent": f"agentworker/{VERSION}", "Accept-Encoding": "gzip, deflate"}
    )
    headers.update(args.headers)
    method: str = args.method
    content: bytes | None = body or None
    redirects: list[str] = []
    withheld: str | None = None
    client = httpx.AsyncClient(
        transport=PinnedTransport(pins, _ssl_context()),
        trust_env=False,  # HTTP_PROXY, ALL_PROXY, NO_PROXY, .netrc: all ignored
        follow_redirects=False,
        timeout=limits,
    )
    async with client:
        while True:
            try:
                destination = await guard.check(url)
            except WorkerError as exc:
                if not redirects:
                    raise
                hop = f"{args.url[:200]!r} redirected to a refused URL (hop {len(redirects)}): "
                raise WorkerError(exc.code, hop + exc.message, exc.details) from None
            pins.pin(destination.host, destination.port, destination.address)
            request = client.build_request(method, url, headers=headers, content=content)
            pins.in_body = False  # this hop's status line and headers count (pinned.HEAD_BYTES)
            try:
                response = await client.send(request, stream=True)
            except httpx.InvalidURL as exc:  # httpx reads a Location header even unfollowed
                raise WorkerError(
                    "url_not_allowed",
                    f"{str(url)[:200]!r} answered with a redirect to a location that is not a "
                    f"usable URL ({exc})",
                    {"url": str(url)[:2000]},
                ) from None
            limit_reached = response.is_redirect and len(redirects) == REDIRECTS
            if not (args.follow_redirects and response.is_redirect) or limit_reached:
                break
            location = response.headers["location"]
            try:
                if "\\" in location or any(ch.isspace() or ord(ch) < 0x20 for ch in location):
                    raise httpx.InvalidURL("a backslash, space or control character in it")
                target = guard.parse(str(url.join(location)))
            except WorkerError as exc:
                raise WorkerError(
                    exc.code,
                    f"{str(url)[:200]!r} redirected to a refused URL: {exc.message}",
                    {"url": str(url)[:2000], "location": location[:2000]},
                ) from None
            except (httpx.InvalidURL, ValueError) as exc:
                raise WorkerError(
                    "url_not_allowed",
                    f"{str(url)[:200]!r} redirected to {location[:200]!r}, which is not a "
                    f"valid URL ({exc})",
                    {"url": str(url)[:2000], "location": location[:2000]},
                ) from None
            next_method, next_content = _redirected_method(response.status_code, method, content)
            if next_content is not None and _origin(target) != _origin(url):
                # A 307 or 308 re-sends the body, which may hold what was meant for this
                # origin alone: the redirect is answered, not followed.
                withheld = (
                    f"a {response.status_code} redirect to another origin "
                    f"({_shown_origin(target)}) would re-send the request body there; "
                    "it was not followed. Send the request to that URL yourself if it "
                    "should have the body."
                )
                break
            await response.aclose()
            redirects.append(str(target))
            method, content = next_method, next_content
            if content is None:
                headers.pop("content-type", None)
            if _origin(target) != _origin(url):
                # Any header the agent set may hold a secret for this origin alone
                # (X-Api-Key, Private-Token, ...): only the few that say how to answer
                # go on to another scheme, host or port (and never come back).
                for name in args.headers:
                    if name.lower() not in FOLLOWING_HEADERS:
                        headers.pop(name, None)
            url = target
        pins.in_body = True
        received = await read_body(response, cap=BODY_BYTES, raw_cap=RAW_BYTES)
    result = HttpFetchResult(
        url=str(url),
        status=response.status_code,
        reason=response.reason_phrase,
        http_version=response.http_version,
        headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers.raw],
        content_type=response.headers.get("content-type"),
        body_bytes=len(received.data),
        truncated=received.truncated,
        decoded=received.decoded,
        body_error=received.error,
        redirects=redirects,
        redirect_limit_reached=limit_reached,
        redirect_not_followed=withheld,
        address=destination.address,
        elapsed_ms=int((time.monotonic() - started) * 1000),
    )
    return Outcome(result, blob=received.data, truncated=received.truncated)


def _redirected_method(status: int, method: str, content: bytes | None) -> tuple[str, bytes | None]:
    """The method and body for the next hop, as browsers (and httpx) do it."""
    if (status == 303 and method != "HEAD") or (status in (301, 302) and method == "POST"):
        return "GET", None
    return method, content


def _origin(url: httpx.URL) -> tuple[str, bytes, int]:
    return url.scheme, url.raw_host, url.port or DEFAULT_PORTS.get(url.scheme, 0)


def _shown_origin(url: httpx.URL) -> str:
    scheme, _host, port = _origin(url)
    return f"{scheme}://{url.host[:200]}:{port}"


def _translate(exc: httpx.HTTPError, url: httpx.URL) -> WorkerError:
    """The one mapping from httpx's failures to wire errors."""
    where = f"{url.host}:{url.port or DEFAULT_PORTS.get(url.scheme, 0)}"
    details = {"url": str(url)[:2000], "reason": str(exc)[:500]}
    if isinstance(exc, httpx.TimeoutException):
        phase = "connecting to" if isinstance(exc, httpx.ConnectTimeout) else "waiting for"
        return WorkerError(
            "timeout", f"timed out {phase} {where}; it may be slow or unreachable", details
        )
    if _is_tls_failure(exc):
        return WorkerError(
            "permission_denied",
            f"the secure (TLS) connection to {where} failed: {exc}. Its certificate may not be "
            "valid for this name; the request was not sent.",
            details,
        )
    if isinstance(exc, httpx.ConnectError) and _errno_in_chain(exc) in _OFFLINE:
        return WorkerError(
            "not_found",
            f"could not reach {where}: the network is unreachable from this machine (it may "
            "be offline); try again later",
            {**details, "reason": "network_unreachable"},
            retryable=True,
        )
    if isinstance(exc, httpx.ConnectError):
        return WorkerError(
            "not_found",
            f"could not connect to {where} ({exc}); nothing may be listening there",
            details,
        )
    if isinstance(exc, httpx.ProtocolError):
        return WorkerError(
            "not_supported", f"{where} did not answer with valid HTTP/1.1 ({exc})", details
        )
    if isinstance(exc, httpx.NetworkError):
        return WorkerError(
            "not_found", f"the connection to {where} broke ({exc}); try again later", details
        )
    return WorkerError("internal_error", f"fetching from {where} failed: {exc}", details)


_OFFLINE: Final = frozenset({errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN})


def _errno_in_chain(exc: BaseException) -> int | None:
    """The first OSError's errno among an exception's causes (httpx wraps httpcore's)."""
    seen: BaseException | None = exc
    for _ in range(8):  # the cause chain is short; never loop on a cycle
        if seen is None:
            return None
        if isinstance(seen, OSError) and seen.errno is not None:
            return seen.errno
        seen = seen.__cause__ or seen.__context__
    return None


def _is_tls_failure(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(8):  # the cause chain is short; never loop on a cycle
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
