"""What telemetry keeps of a call's args: a short preview with secrets masked.

People read `args_preview` to see what an agent asked for; a secret in the args
must not end up there, nor a megabyte of text. Masked, whatever the action:

- the value of a key whose name looks secret (token, password, cookie, ...);
- every header value (the names stay: they say what was sent, not what it held);
- every query value and fragment of a URL, and a password in its user part (the
  parameter names stay);
- content (`content`, `data`, `body`, `text`): what a call writes or types is
  the person's, not telemetry's.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final
from urllib.parse import SplitResult, urlsplit, urlunsplit

PREVIEW_CHARS: Final = 240
MASK: Final = "***"
_SECRET_KEY: Final = re.compile(r"token|secret|passw|authori[sz]ation|api[-_]?key|cookie", re.I)
_ALL_VALUES_KEY: Final = re.compile(r"headers?", re.I)
_CONTENT_KEY: Final = re.compile(r"content|data|body|text", re.I)
# A scheme is short: bounded, so a long run of letters costs linear time, not quadratic.
_URL: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,31}://[^\s\"'<>]*")
_LONG_STRING: Final = 80
_PARSED_AT_MOST: Final = 1024 * 1024  # args past this are refused anyway; cut, they fail to parse


def args_preview(args_json: str) -> str:
    """A short, redacted look at the args for people reading telemetry."""
    plain = not _SECRET_KEY.search(args_json) and "://" not in args_json
    if len(args_json) <= PREVIEW_CHARS and plain and not _masked_keys_in(args_json):
        return args_json  # nothing to shorten or hide
    try:
        value = json.loads(args_json[:_PARSED_AT_MOST]) if args_json else {}
        return json.dumps(_redact(value), ensure_ascii=False)[:PREVIEW_CHARS]
    except ValueError:
        return "<invalid json>"
    except RecursionError:  # 2 KB of `[` nest deeper than Python's stack goes
        return "<json nested too deeply>"


def args_for_replay(args_json: str) -> tuple[str | None, bool]:
    """The args as a recorded plan keeps them for replay: whole, with the values of
    secret-looking keys masked as in previews. (None, False) when they are not a JSON
    object; the flag says whether anything was masked."""
    try:
        value = json.loads(args_json) if args_json else {}
    except ValueError:
        return None, False
    if not isinstance(value, dict):
        return None, False
    if not _SECRET_KEY.search(args_json):
        return json.dumps(value, ensure_ascii=False), False
    masked = _secret_keys_masked(value)
    return json.dumps(masked, ensure_ascii=False), masked != value


def _secret_keys_masked(value: Any) -> Any:
    """Only the values of secret-looking keys masked, nothing cut: for replay."""
    if isinstance(value, dict):
        return {
            k: MASK if _SECRET_KEY.search(str(k)) else _secret_keys_masked(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_secret_keys_masked(v) for v in value]
    return value


def masked_url(text: str) -> str:
    """Every URL in `text` with its query values, fragment and password masked."""
    if "://" not in text:
        return text
    return _URL.sub(lambda found: _mask_url(found.group(0)), text)


def _masked_keys_in(args_json: str) -> bool:
    return bool(_ALL_VALUES_KEY.search(args_json) or _CONTENT_KEY.search(args_json))


def _redact(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _redact_item(str(k), v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v) for v in value]
    if isinstance(value, str):
        value = masked_url(value)
        return value[:_LONG_STRING] + "…" if len(value) > _LONG_STRING else value
    return value


def _redact_item(key: str, value: Any) -> Any:
    if _SECRET_KEY.search(key) or _CONTENT_KEY.fullmatch(key):
        return MASK
    if _ALL_VALUES_KEY.fullmatch(key):
        if isinstance(value, dict):
            return {str(name): MASK for name in value}
        if isinstance(value, list):  # [[name, value], ...]
            return [
                [str(pair[0]), MASK] if isinstance(pair, list) and pair else MASK for pair in value
            ]
        return MASK
    return _redact(value)


def _mask_url(url: str) -> str:
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            user, _, host = netloc.rpartition("@")
            name, has_password, _ = user.partition(":")
            netloc = f"{name}:{MASK}@{host}" if has_password else f"{user}@{host}"
        query = "&".join(
            f"{field.partition('=')[0]}={MASK}" if "=" in field else MASK
            for field in parts.query.split("&")
            if field
        )
        fragment = MASK if parts.fragment else ""
        return urlunsplit(SplitResult(parts.scheme, netloc, parts.path, query, fragment))
    except ValueError:
        return MASK  # not a URL after all, and not worth the risk
