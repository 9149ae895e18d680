"""workerHost.http_fetch: one HTTP(S) request on the agent's behalf, guarded and capped.

The request body is the call's blob (at most 16 MiB); the response body comes
back in the result blob, at most 5 MiB after decoding (`truncated` past it).
Every hop — the first URL and each redirect, at most 5, followed here rather
than by httpx so that each is checked — passes the URL guard (see ssrf), and the
connection goes to the address the guard approved (see fetching.pinned). Proxy
settings from the environment are ignored: a proxy would make the guard's
check meaningless. A redirect to another origin (scheme, host or port) takes
none of the headers the agent set but `FOLLOWING_HEADERS`: any other may be a
credential for the first origin alone (X-Api-Key, Private-Token, ...). Nor
does it take the body: a 307 or 308 to another origin, which would re-send it,
is answered as it is, not followed (`redirect_not_followed` says why).
Timeouts: connect, read (between bytes) and total (the whole call, redirects
and body included); each defaults to, and may not exceed, the `[http]` setting.
The request itself, on httpx, is in fetching/request.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import re
import sys
from typing import Annotated, Final, Literal

from pydantic import AfterValidator, Field, StringConstraints

from worker.core import redaction
from worker.core.registry import MIB, ActionSpec, Args, Context, Outcome, Result
from worker.errors import ErrorCode

BODY_BYTES: Final = 5 * MIB  # the response body, counted after decoding
# Raw bytes read for one response: bounds a compressed stream that inflates to nothing.
RAW_BYTES: Final = 10 * MIB
REQUEST_BYTES: Final = 16 * MIB
REDIRECTS: Final = 5
# The only headers of the agent's that a redirect carries to another origin (scheme,
# host or port); the rest stay with the origin they were meant for, for every later
# hop too. These say how to answer, never who asks.
FOLLOWING_HEADERS: Final = frozenset(
    {"accept", "accept-encoding", "accept-language", "content-type", "user-agent"}
)

Method = Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Framing and routing belong to the client, not the caller: a caller's Host or
# Content-Length could make the request mean something other than what was checked.
_RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "upgrade",
        "te",
        "trailer",
        "expect",
        "proxy-authorization",
        "proxy-connection",
    }
)


def _header_name(name: str) -> str:
    if not _TOKEN.fullmatch(name):
        raise ValueError("a header name is letters, digits and !#$%&'*+-.^_`|~ only")
    if name.lower() in _RESERVED_HEADERS:
        raise ValueError(f"the {name} header is set by the worker itself")
    return name


def _header_value(value: str) -> str:
    if any(ch in value for ch in "\r\n\x00"):
        raise ValueError("a header value must not contain CR, LF or NUL")
    # What HTTP/1.1 sends as it is: anything else (a control character, or "é", which
    # httpx cannot encode and answered internal_error for: review25 r4) is refused here.
    if not all(ch == "\t" or " " <= ch <= "~" for ch in value):
        raise ValueError(
            "a header value is printable ASCII and tabs only; encode anything else "
            "(percent-encoding, or RFC 8187's UTF-8'' form)"
        )
    return value


HeaderName = Annotated[str, StringConstraints(max_length=256), AfterValidator(_header_name)]
HeaderValue = Annotated[str, StringConstraints(max_length=8192), AfterValidator(_header_value)]
Seconds = Annotated[float, Field(gt=0, le=3_600)]


class HttpFetchArgs(Args):
    url: Annotated[str, StringConstraints(min_length=1, max_length=8192)]
    method: Method = "GET"
    # Sent to the URL's origin; a redirect to another origin keeps FOLLOWING_HEADERS only.
    headers: Annotated[dict[HeaderName, HeaderValue], Field(max_length=64)] = {}
    follow_redirects: bool = True
    connect_timeout_s: Seconds | None = None
    read_timeout_s: Seconds | None = None  # the longest wait for the next bytes
    total_timeout_s: Seconds | None = None  # the whole call: redirects and body included


class HttpFetchResult(Result):
    url: str  # the final URL, after redirects
    status: int
    reason: str
    http_version: str
    headers: list[tuple[str, str]]  # as received, in order, repeats kept
    content_type: str | None
    body_bytes: int  # in the blob, after decoding
    truncated: bool  # the 5 MiB cap ended the body (or its pieces' cap: see body_error)
    decoded: bool  # the Content-Encoding (gzip or deflate) was undone
    # Why the body is incomplete: the server ended it badly, or sent it in too many pieces.
    body_error: str | None
    redirects: list[str]  # each URL redirected to, in order
    redirect_limit_reached: bool  # stopped at a 6th redirect; this is that response
    # Why the redirect this response is was not followed: a 307 or 308 to another
    # origin would re-send the request body there. None when nothing was withheld.
    redirect_not_followed: str | None
    address: str  # the IP address connected to
    elapsed_ms: int

    def at_rest(self) -> HttpFetchResult | None:
        """This result as it is kept once delivered, or None when nothing in it is
        masked: a response's Set-Cookie, token and auth headers are its caller's to
        use, not for the ledger's and the server's stores to keep for a day (review25
        G10), as a request's headers are kept only masked (its args' preview). The
        final URL and those redirected to, as the preview keeps a request's: their
        query values and fragments masked (an OAuth `code=`, `#access_token=`)."""
        kept = self.model_copy(
            update={
                "headers": redaction.masked_headers(self.headers),
                "url": redaction.masked_text(self.url),
                "redirects": [redaction.masked_text(url) for url in self.redirects],
            }
        )
        return None if kept == self else kept


_REQUEST: Final = "worker.actions.host.fetching.request"


async def http_fetch(ctx: Context, args: HttpFetchArgs) -> Outcome[HttpFetchResult]:
    if _REQUEST not in sys.modules:  # the first fetch: httpx's imports, off the event loop
        await asyncio.to_thread(importlib.import_module, _REQUEST)
    from worker.actions.host.fetching import request

    outcome = await request.fetch(ctx, args)
    if isinstance(outcome.result, HttpFetchResult):
        # Up to 100 KiB of a response's head (httpcore's bound) and five redirect URLs
        # through the masking's patterns: milliseconds, off the event loop.
        kept = await asyncio.to_thread(outcome.result.at_rest)
        if kept is not None:
            outcome = dataclasses.replace(outcome, at_rest=kept)
    return outcome


SPEC: Final = ActionSpec(
    surface="workerHost",
    name="http_fetch",
    args=HttpFetchArgs,
    result=HttpFetchResult,
    handler=http_fetch,
    summary="one HTTP(S) request to a public address (or a host opened in [http]); the blob "
    "is the request body, the result blob the response body, at most 5 MiB; a redirect to "
    "another origin drops the headers set but Accept, Accept-Encoding, Accept-Language, "
    "Content-Type and User-Agent, and a 307/308 that would re-send the body there is answered, "
    "not followed",
    takes_blob=True,
    codes=frozenset(
        {
            ErrorCode.URL_NOT_ALLOWED,
            ErrorCode.TOO_LARGE,
            ErrorCode.NOT_FOUND,
            ErrorCode.NOT_SUPPORTED,
        }
    ),
    caps={
        "body_bytes": BODY_BYTES,
        "raw_bytes": RAW_BYTES,
        "request_bytes": REQUEST_BYTES,
        "redirects": REDIRECTS,
    },
)
