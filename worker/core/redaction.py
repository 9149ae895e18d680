"""What telemetry keeps of a call's args: a short preview with secrets masked.

People read `args_preview` to see what an agent asked for; a token or password in
the args must not end up there, nor a megabyte of text.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

PREVIEW_CHARS: Final = 240
_SECRET_KEY: Final = re.compile(r"token|secret|passw|authori[sz]ation|api[-_]?key|cookie", re.I)
_LONG_STRING: Final = 80
_PARSED_AT_MOST: Final = 1024 * 1024  # args past this are refused anyway; cut, they fail to parse


def args_preview(args_json: str) -> str:
    """A short, redacted look at the args for people reading telemetry."""
    if len(args_json) <= PREVIEW_CHARS and not _SECRET_KEY.search(args_json):
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
    masked = _redact(value, cut=False)
    return json.dumps(masked, ensure_ascii=False), masked != value


def _redact(value: Any, cut: bool = True) -> Any:
    if isinstance(value, dict):
        return {
            k: "***" if _SECRET_KEY.search(str(k)) else _redact(v, cut) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_redact(v, cut) for v in value]
    if cut and isinstance(value, str) and len(value) > _LONG_STRING:
        return value[:_LONG_STRING] + "…"
    return value
