"""What telemetry keeps of a call's args: a short preview with secrets masked.

People read `args_preview` to see what an agent asked for; a secret in the args
must not end up there, nor a megabyte of text. Masked, whatever the action:

- the value of a key whose name looks secret (token, password, cookie, ...);
- every header value (the names stay: they say what was sent, not what it held);
- every query value and fragment of a URL, and a password in its user part (the
  parameter names stay);
- content (`content`, `data`, `body`, `text`): what a call writes or types is
  the person's, not telemetry's;
- in a list of strings (exec's argv), the value of a secret-looking flag
  (`--password=…`, `--with-token …`) and of a secret-looking `NAME=value`
  (`-c http.extraheader=…`, `API_KEY=…`), and the password a known program takes
  by a short option, in a cluster too (`mysql -Bpsecret`, `curl -vu user:pw`,
  `sshpass -vp X`, `smbclient -NU u%pw`: `_PROGRAMS`);
- in any string, a secret-looking header written out (`Authorization: …`), the
  credentials of an auth scheme (`Bearer …`, `Basic …`), values shaped like the
  tokens services issue (`ghp_…`, `xoxb-…`, `glpat-…`, `AKIA…`, JWTs), and in a
  URL's path the tokens that live there (Telegram's `/bot<token>/`, Slack's and
  Discord's webhooks, any long mixed-case segment).

The args are parsed before anything is decided: JSON may spell a URL `https:\\/\\/`
or a key `"tok\\u0065n"`, which no look at the text finds.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import SplitResult, urlsplit, urlunsplit

PREVIEW_CHARS: Final = 240
MASK: Final = "***"
_SECRET_KEY: Final = re.compile(r"token|secret|passw|authori[sz]ation|api[-_]?key|cookie", re.I)
_ALL_VALUES_KEY: Final = re.compile(r"headers?", re.I)
_CONTENT_KEY: Final = re.compile(r"content|data|body|text", re.I)
# A scheme is short: bounded, so a long run of letters costs linear time, not quadratic.
_URL: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,31}://[^\s\"'<>]*")
# Words that make a name (a key, a flag, a header, a variable) secret-looking.
_MASKED_WORD: Final = (
    r"(?:token|secret|passw|pwd|authori[sz]ation|api[-_]?key|cookie|credential"
    r"|private[-_]?key|access[-_]?key)"
)
_NAME: Final = r"[A-Za-z0-9_.-]{0,40}"
# A flag whose value follows as the next item: --password, --with-token, --api-key.
_SECRET_FLAG: Final = re.compile(rf"--?{_NAME}{_MASKED_WORD}{_NAME}", re.I)
# A secret-looking name given a value: --password=x, API_KEY=x, http.extraheader=x.
_ASSIGNED: Final = re.compile(
    rf"(?<![A-Za-z0-9_.-])(-{{0,2}}{_NAME}(?:{_MASKED_WORD}|extraheader){_NAME})=[^\s&]+",
    re.I,
)
# A header written out, as curl -H and git's extraheader take it: the rest is its value.
_HEADER_LINE: Final = re.compile(
    rf"(?<![A-Za-z0-9_-])([A-Za-z0-9_-]{{0,40}}{_MASKED_WORD}[A-Za-z0-9_-]{{0,40}}:\s*)\S.*",
    re.I | re.S,
)
# An auth scheme's credentials: Authorization's value written without its name.
_SCHEME: Final = re.compile(r"\b(Bearer|Basic|Digest|Token)\s+[A-Za-z0-9._~+/=-]{8,}", re.I)
# Tokens as services issue them: their shapes are public, so they can be told apart.
_TOKEN_SHAPED: Final = re.compile(
    r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{20,}"
    r"|xox[abposre]-[A-Za-z0-9-]{10,}|sk-[A-Za-z0-9_-]{20,}|(?:AKIA|ASIA)[0-9A-Z]{16}"
    r"|AIza[0-9A-Za-z_-]{35}|npm_[A-Za-z0-9]{36}|hf_[A-Za-z0-9]{30,}|pypi-[A-Za-z0-9_-]{50,}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*)"
)
# What any of the above needs to find something, as literals searched in the lowered
# text: one scan, and most strings hold none (a case-blind alternation is ten times
# slower).
_MARKERS: Final = (
    "token|secret|passw|pwd|authori|apikey|api_key|api-key|cookie|credential|private"
    "|accesskey|access_key|access-key|extraheader|bearer|basic|digest|ghp_|gho_|ghu_"
    "|ghs_|ghr_|github_pat_|glpat-|xox|sk-|akia|asia|aiza|npm_|hf_|pypi-|eyj"
)
_SUSPECT: Final = re.compile(_MARKERS)


@dataclass(frozen=True)
class _Options:
    """How a program reads its options, as much as finding its password takes.

    `secret`: its options that take a password or user:password, and how each takes
    its value: "joined" (-pSECRET only: a lone -p asks on the terminal), "either" (-p
    SECRET or -pSECRET), "next" (--user u:p or --user=u:p). Short options cluster
    (getopt, popt, curl, MySQL's my_getopt): -vpSECRET is -v then -p SECRET, and an
    option that takes a value takes the rest of its word, or the next word when none
    is left. So a cluster is read letter by letter up to the first that takes a value:
    `values` (required) and `optional` (the rest of the word only) name those letters,
    lest a value's letters be read as options (curl -XPUT is no -U). `runs_command`:
    its first operand is a command with options of its own (sshpass ssh -p 22: a
    port). `secret_operand`: the operand that is a password (smbclient //h/s PASS)."""

    secret: dict[str, str]
    values: str = ""
    optional: str = ""
    runs_command: bool = False
    secret_operand: int = 0  # 1 for the first operand; 0 for none


_MYSQL: Final = {"-p": "joined"}
_PROGRAMS: Final[dict[str, _Options]] = {
    **{name: _Options(_MYSQL, "DehPSu", "#") for name in ("mysql", "mariadb")},
    **{name: _Options(_MYSQL, "hPSurwT", "#") for name in ("mysqldump", "mariadb-dump")},
    "mysqladmin": _Options(_MYSQL, "hPSuci", "#"),
    "mysqlimport": _Options(_MYSQL, "hPSuc", "#"),
    "sshpass": _Options({"-p": "either"}, "fdP", runs_command=True),
    "curl": _Options(
        {"-u": "either", "--user": "next", "-U": "either", "--proxy-user": "next"},
        "AbcCdDeEFHKmoPQrtTwxXyYz",
    ),
    "smbclient": _Options(
        {"-U": "either", "--user": "next"}, "WIpnsdlORTDcbtmLMAi", secret_operand=2
    ),
}


# And for the args' whole text: a URL, an escape, a key whose values are all masked,
# a program named above.
_NOT_PLAIN: Final = re.compile(
    _MARKERS + r"|://|\\|header|content|data|body|text|" + "|".join(map(re.escape, _PROGRAMS))
)
# In a URL's path: Telegram's bot token, Slack's and Discord's webhook secrets, and any
# long segment mixing upper case, lower case and digits (a hash or a UUID does not).
_PATH_TOKENS: Final = re.compile(
    r"(?<=/bot)\d+:[A-Za-z0-9_-]+"
    r"|(?<=/services/)[^?#]+"
    r"|(?<=/webhooks/)\d+/[A-Za-z0-9_-]+"
    r"|(?<=/)(?=[A-Za-z0-9_-]{0,200}[a-z])(?=[A-Za-z0-9_-]{0,200}[A-Z])"
    r"(?=[A-Za-z0-9_-]{0,200}[0-9])[A-Za-z0-9_-]{20,}(?=/|$)"
)
_LONG_STRING: Final = 80
# The most of one string searched: every pattern's marker comes before what it masks,
# so what the first _LONG_STRING characters show is decided within these.
_SCANNED: Final = 320
_FLAG_CHARS: Final = 100
_PARSED_AT_MOST: Final = 1024 * 1024  # args past this are refused anyway; cut, they fail to parse
# Args nested deeper than this are never parsed here: no action takes them (pydantic's
# JSON parser refuses past 200 levels), and parsing, walking and writing them again
# each recurse once or more a level. Near Python's recursion limit (1,000 frames, the
# C parser's levels counted too), a finalizer the garbage collector runs meanwhile
# meets the limit itself (RecursionError in `__del__`, its clean-up lost): a server's
# 1 KB of `[` took every call's preview there (test_fuzz_stream failed so at load).
NESTED_AT_MOST: Final = 200
_STRING: Final = re.compile(r'"(?:[^"\\]++|\\.)*+"')
_NOT_BRACKET: Final = re.compile(r"[^\[\]{}]++")
_LEVEL: Final = {"[": 1, "{": 1, "]": -1, "}": -1}


def nests_deeper(text: str, levels: int = NESTED_AT_MOST) -> bool:
    """Whether JSON `text` nests arrays and objects more than `levels` deep, told
    without parsing it (no recursion): brackets inside strings do not count."""
    if text.count("[") + text.count("{") <= levels:
        return False
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(itertools.accumulate(map(_LEVEL.__getitem__, brackets)), default=0) > levels


def args_preview(args_json: str) -> str:
    """A short, redacted look at the args for people reading telemetry."""
    if nests_deeper(args_json[:_PARSED_AT_MOST]):
        return "<json nested too deeply>"
    try:
        value = json.loads(args_json[:_PARSED_AT_MOST]) if args_json else {}
        if len(args_json) <= PREVIEW_CHARS and _plain(args_json):
            return args_json  # valid, short, and nothing in it to hide
        return json.dumps(_Redactor().value(value), ensure_ascii=False)[:PREVIEW_CHARS]
    except ValueError:
        return "<invalid json>"
    except RecursionError:  # 2 KB of `[` nest deeper than Python's stack goes
        return "<json nested too deeply>"


def _plain(args_json: str) -> bool:
    """Whether JSON text that parsed holds nothing a preview masks, by its text alone:
    true only without a backslash (no escape can then spell what the patterns look
    for differently), URL, secret-looking word or key whose values are masked."""
    return _NOT_PLAIN.search(args_json.lower()) is None


def args_for_replay(args_json: str) -> tuple[str | None, bool]:
    """The args as a recorded plan keeps them for replay: whole, with only what looks
    secret masked (`_secrets_masked`). (None, False) when they are not a JSON object;
    the flag says whether anything was masked."""
    if nests_deeper(args_json):
        return None, False
    try:
        value = json.loads(args_json) if args_json else {}
    except (ValueError, RecursionError):
        return None, False
    if not isinstance(value, dict):
        return None, False
    masked = _secrets_masked(value)  # on the parsed keys: `tok\u0065n` is a token
    return json.dumps(masked, ensure_ascii=False), masked != value


def _secrets_masked(value: Any) -> Any:
    """For replay, nothing cut and only what looks secret masked: the values of
    secret-looking keys, and in every string what `secrets_in_text` finds; in a list
    like an argv, the value after a secret-looking flag. Content, other query values
    and headers' names stay, so the call replays as it was."""
    if isinstance(value, dict):
        return {
            k: MASK if _SECRET_KEY.search(str(k)) else _secrets_masked(v) for k, v in value.items()
        }
    if isinstance(value, str):
        return secrets_in_text(value)
    if isinstance(value, list):
        return _argv_masked(value, _secrets_masked)
    return value


def secrets_in_text(text: str) -> str:
    """`text` with what looks secret masked and nothing else: a URL's password and the
    tokens its path holds, a secret-looking `NAME=value` (a query's `access_token=`,
    argv's `--password=`), header, auth scheme's credentials and token-shaped value."""
    if "://" in text:
        text = _URL.sub(lambda found: _mask_url_secrets(found.group(0)), text)
    return _secret_words_masked(text)


def masked_url(text: str) -> str:
    """Every URL in `text` with its query values, fragment, password and path tokens
    masked."""
    if "://" not in text:
        return text
    return _URL.sub(lambda found: _mask_url(found.group(0)), text)


def masked_text(text: str) -> str:
    """`text` with its URLs masked (see masked_url) and every secret-looking header,
    auth scheme's credentials, `NAME=value` of a secret-looking name and token-shaped
    value in it masked."""
    return _secret_words_masked(masked_url(text))


def _secret_words_masked(text: str) -> str:
    """Secret-looking headers, auth schemes' credentials, `NAME=value`s and token-shaped
    values masked in `text`."""
    if not _SUSPECT.search(text.lower()):  # one scan for the common case: nothing to see
        return text
    text = _HEADER_LINE.sub(lambda m: f"{m.group(1)}{MASK}", text)
    text = _SCHEME.sub(lambda m: f"{m.group(1)} {MASK}", text)
    text = _ASSIGNED.sub(lambda m: f"{m.group(1)}={MASK}", text)
    return _TOKEN_SHAPED.sub(MASK, text)


# In a message: a secret-looking flag and the value after it (`--password hunter2`),
# as argv items quoted with spaces between them (shlex.join, a list's repr).
_FLAG_THEN_VALUE: Final = re.compile(
    rf"(?<![A-Za-z0-9_.-])(--?{_NAME}{_MASKED_WORD}{_NAME}(?:['\",]+\s*|\s+)['\"]?)"
    r"(?!-)[^\s'\",\]]+",
    re.I,
)


def masked_message(text: str) -> str:
    """A text that quotes a call's args (a refusal's message, a log line), as kept at
    rest: masked as in previews (masked_text), and a secret-looking flag's value that
    follows it as the next word too. Not cut short."""
    text = masked_text(text)
    if not _SUSPECT.search(text.lower()):
        return text
    return _FLAG_THEN_VALUE.sub(lambda m: f"{m.group(1)}{MASK}", text)


def masked_detail(value: Any) -> Any:
    """An audit event's detail with every string in it masked (masked_message): its
    messages quote the refused call's URL or argv."""
    if isinstance(value, str):
        return masked_message(value)
    if isinstance(value, dict):
        return {k: masked_detail(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):  # an argv: the value after a secret flag too
        return _argv_masked(value, masked_detail)
    return value


def _argv_plan(items: list[Any]) -> list[str | None]:
    """For each item of a list like an argv: MASK, the item with its joined secret
    masked (`-p` + MASK), or None to show it as any value is shown. Masked: the value
    after a secret-looking flag (`--password hunter2`, `--with-token ghp_…`), and the
    value of a known program's secret option (mysql -pX, sshpass -p X, curl -u u:p),
    in a cluster of short options too (curl -vu u:p, sshpass -vpX: `_Options`)."""
    options = _program_options(items[0] if items else None)
    plan: list[str | None] = []
    then = ""  # what the next item is: "secret", "value" (an option's, shown) or ""
    operands = 0
    for index, item in enumerate(items):
        text = item if isinstance(item, str) else ""
        now, then = then, ""
        if now == "secret" and isinstance(item, str) and not text.startswith("-"):
            plan.append(MASK)
            continue
        masked = None
        if index > 0 and options is not None and now != "value" and isinstance(item, str):
            if text == "--":
                options = None  # operands only from here
            elif text.startswith("-") and text != "-":
                masked, then = _option_masked(text, options)
            elif options.runs_command:
                options = _program_options(text)  # the command it runs, with its own
            else:
                operands += 1
                masked = MASK if operands == options.secret_operand else None
        plan.append(masked)
        if masked is None and not then and len(text) <= _FLAG_CHARS:  # -psecret is no flag
            then = "secret" if _SECRET_FLAG.fullmatch(text) is not None else ""
    return plan


def _program_options(program: Any) -> _Options | None:
    if not isinstance(program, str):
        return None
    return _PROGRAMS.get(program.rsplit("/", 1)[-1])


def _option_masked(text: str, options: _Options) -> tuple[str | None, str]:
    """An option word of a known program: the word with a password joined to it masked
    (or None), and what the next item is ("secret", "value", or "")."""
    if text.startswith("--"):
        name, equals, _ = text.partition("=")
        if options.secret.get(name) != "next":
            return None, ""
        return (name + "=" + MASK, "") if equals else (None, "secret")
    # A cluster of short options: -vu, -vpX, -Bpsecret; read as far as a flag goes
    # (a word of a megabyte costs no more than one of a hundred characters).
    for at in range(1, min(len(text), _FLAG_CHARS)):
        letter, rest = text[at], text[at + 1 :]
        how = options.secret.get("-" + letter)
        if how is not None:
            if rest:
                return text[: at + 1] + MASK, ""
            return None, "secret" if how == "either" else ""
        if letter in options.values:
            return None, "" if rest else "value"
        if letter in options.optional:
            return None, ""
    return None, ""


def _argv_masked(items: Iterable[Any], each: Callable[[Any], Any]) -> list[Any]:
    """A list like an argv: its secrets masked (_argv_plan), every other item passed
    through `each`."""
    items = list(items)
    return [
        each(item) if masked is None else masked
        for item, masked in zip(items, _argv_plan(items), strict=True)
    ]


class _Redactor:
    """One preview's walk over the parsed args, in the order json.dumps writes them.

    Only what the preview can show is looked at: a string's first `_SCANNED`
    characters (what is masked before them is all its first 80 can hold), and no
    string at all once the preview's length is reached (the rest is cut anyway), so
    a megabyte of args costs one parse, not a megabyte of pattern searches.
    """

    def __init__(self) -> None:
        self.left = PREVIEW_CHARS

    def value(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): self.item(str(k), v) for k, v in value.items()}
        if isinstance(value, list):
            return self.items(value)
        if isinstance(value, str):
            return self.text(value)
        self.left -= 2
        return value

    def text(self, value: str) -> str:
        if self.left <= 0:
            return "…"  # past what the preview shows
        shown = masked_text(value[:_SCANNED])
        if len(value) > _SCANNED or len(shown) > _LONG_STRING:
            shown = shown[:_LONG_STRING] + "…"
        self.left -= len(shown) + 4
        return shown

    def items(self, items: list[Any]) -> list[Any]:
        """A list's items; in one like an argv, its secrets too (_argv_plan)."""
        out = []
        for item, masked in zip(items, _argv_plan(items), strict=True):
            if masked is None:
                out.append(self.value(item))
            else:
                out.append(masked)
                self.left -= len(masked) + 4
        return out

    def item(self, key: str, value: Any) -> Any:
        self.left -= len(key) + 4
        if _SECRET_KEY.search(key) or _CONTENT_KEY.fullmatch(key):
            return MASK
        if _ALL_VALUES_KEY.fullmatch(key):
            if isinstance(value, dict):
                return {str(name): MASK for name in value}
            if isinstance(value, list):  # [[name, value], ...]
                return [
                    [str(pair[0]), MASK] if isinstance(pair, list) and pair else MASK
                    for pair in value
                ]
            return MASK
        return self.value(value)


def _mask_url(url: str) -> str:
    try:
        parts = urlsplit(url)
        netloc = _netloc_masked(parts.netloc)
        query = "&".join(
            f"{field.partition('=')[0]}={MASK}" if "=" in field else MASK
            for field in parts.query.split("&")
            if field
        )
        fragment = MASK if parts.fragment else ""
        path = _PATH_TOKENS.sub(MASK, parts.path) if len(parts.path) > 20 else parts.path
        return urlunsplit(SplitResult(parts.scheme, netloc, path, query, fragment))
    except ValueError:
        return MASK  # not a URL after all, and not worth the risk


def _mask_url_secrets(url: str) -> str:
    """A URL with its password and path tokens masked, the rest as it was (for replay)."""
    try:
        parts = urlsplit(url)
        path = _PATH_TOKENS.sub(MASK, parts.path) if len(parts.path) > 20 else parts.path
        netloc = _netloc_masked(parts.netloc)
        if (netloc, path) == (parts.netloc, parts.path):
            return url  # as written: urlunsplit would normalise it
        return urlunsplit(parts._replace(netloc=netloc, path=path))
    except ValueError:
        return MASK


def _netloc_masked(netloc: str) -> str:
    if "@" not in netloc:
        return netloc
    user, _, host = netloc.rpartition("@")
    name, has_password, _ = user.partition(":")
    return f"{name}:{MASK}@{host}" if has_password else f"{user}@{host}"
