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

An http_fetch's response is masked for its stay at rest with the same words
(`masked_headers`): the caller gets it whole, the stores keep it so once delivered.

The args are parsed before anything is decided: JSON may spell a URL `https:\\/\\/`
or a key `"tok\\u0065n"`, which no look at the text finds.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import shlex
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Final, ParamSpec, TypeVar
from urllib.parse import SplitResult, urlsplit, urlunsplit

from worker.core import expect_answers, shell_words

PREVIEW_CHARS: Final = 240
MASK: Final = "***"
# `pass` as a word of its own (--pass, -passin, --proxy-pass, REDIS_PASS, passphrase),
# not inside another (--passive, bypass, compass).
_PASS: Final = r"(?<![a-z])pass(?:phrase|in|out)?(?![a-z])"  # noqa: S105 (a pattern)
_SECRET_KEY: Final = re.compile(
    rf"token|secret|passw|{_PASS}|bearer|authori[sz]ation|api[-_]?key|cookie", re.I
)
_ALL_VALUES_KEY: Final = re.compile(r"headers?", re.I)
_CONTENT_KEY: Final = re.compile(r"content|data|body|text", re.I)
# A scheme is short: bounded, so a long run of letters costs linear time, not quadratic.
_URL: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,31}://[^\s\"'<>]*")
# Words that make a name (a key, a flag, a header, a variable) secret-looking.
_MASKED_WORD: Final = (
    rf"(?:token|secret|passw|{_PASS}|(?:store|key)pass|bearer|pwd|authori[sz]ation|api[-_]?key|cookie"
    r"|credential|private[-_]?key|access[-_]?key)"
)
_NAME: Final = r"[A-Za-z0-9_.-]{0,40}"
# A flag whose value follows as the next item: --password, --with-token, --api-key.
_SECRET_FLAG: Final = re.compile(rf"--?{_NAME}{_MASKED_WORD}{_NAME}", re.I)
# A secret-looking name given a value: --password=x, API_KEY=x, http.extraheader=x. Not
# one masked already, quoted as a script's masked word is written back ('--password=***',
# PASSWORD='***'): taking its closing quote left the script's quote open.
_ASSIGNED: Final = re.compile(
    rf"(?<![A-Za-z0-9_.-])(-{{0,2}}{_NAME}(?:{_MASKED_WORD}|extraheader){_NAME})"
    r"=(?!'?\*\*\*'?(?![^\s&]))[^\s&]+",
    re.I,
)
# A header written out, as curl -H and git's extraheader take it: the rest is its value.
_HEADER_LINE: Final = re.compile(
    rf"(?<![A-Za-z0-9_-])([A-Za-z0-9_-]{{0,40}}{_MASKED_WORD}[A-Za-z0-9_-]{{0,40}}:\s*)\S.*",
    re.I | re.S,
)
# A password SQL sets in a string literal (psql -c "ALTER USER u PASSWORD 'X'", mysql -e
# "CREATE USER … IDENTIFIED BY 'X'", "SET PASSWORD = PASSWORD('X')").
_SQL_PASSWORD: Final = re.compile(
    r"\b((?:password|identified\s+(?:with\s+\w+\s+)?by)(?:\s*=\s*|\s+)(?:password\s*\(\s*)?"
    r"|password\s*\(\s*)'([^']*)'",
    re.I,
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
# slower). `send` for what expect sends: its prompt may name nothing (`expect "*:"`).
_MARKERS: Final = (
    "token|secret|pass|pwd|authori|apikey|api_key|api-key|cookie|credential|private"
    "|accesskey|access_key|access-key|extraheader|bearer|basic|digest|ghp_|gho_|ghu_"
    "|ghs_|ghr_|github_pat_|glpat-|xox|sk-|akia|asia|aiza|npm_|hf_|pypi-|eyj|identified"
    "|assw|phrase|send"
)
_SUSPECT: Final = re.compile(_MARKERS)


def _expect_answers_masked(text: str) -> str:
    """What an expect script sends to a password prompt (`expect_answers`) masked."""
    kept, last = [], 0
    for start, end in expect_answers.answers(text):
        kept += [text[last:start], f'"{MASK}"']
        last = end
    return "".join(kept) + text[last:]


@dataclass(frozen=True)
class _Options:
    """How a program reads its options, as much as finding its password takes.

    `secret`: its options that take a password or user:password, and how each takes
    its value: "joined" (-pSECRET or --password=SECRET only: a lone -p asks on the
    terminal), "either" (-p SECRET or -pSECRET), "next" (--user u:p or --user=u:p),
    "cert" (curl's -E/--cert file:password: masked after the last `:`). Short
    options cluster (getopt, popt, curl, MySQL's my_getopt): -vpSECRET is -v then -p
    SECRET, and an option that takes a value takes the rest of its word, or the next
    word when none is left. So a cluster is read letter by letter up to the first that
    takes a value: `values` (required) and `optional` (the rest of the word only) name
    those letters, lest a value's letters be read as options (curl -XPUT is no -U);
    `long_values`, the long options whose value may be the next word (timeout
    --signal KILL). `words`: its options are whole words, never clusters (openssl
    -passin, redis-cli -a). `prefixes`: a long option may be cut to any prefix of
    this many characters or more (my_getopt: mysql --pass=X is --password=X).

    What it runs: `command_at`, the operand that is a command with options of its own
    (1: the first, sshpass ssh -p 22 where -p is a port; 2: the second, timeout 5
    curl ...), its `NAME=value` operands not counted when `assignments` (env, sudo);
    `script`, the option letter whose presence makes the first operand a shell script
    (sh -c '...', read by `_script_masked`), `script_values` the option letters whose
    value is a command line (env -S). `subcommands`: how a subcommand reads its own
    options (docker login -p). `secret_operand`: the operand that is a password
    (smbclient //h/s PASS); `secret_last_with`: an option letter that makes the last
    operand the password (htpasswd -b file user PASS); `colon_secrets`: the
    `/name:` options whose value is a password (xfreerdp /p:X). A word-options
    program's secret option marked "either" takes its value joined too (redis-cli
    -aX)."""

    secret: dict[str, str] = field(default_factory=dict)
    values: str = ""
    optional: str = ""
    long_values: tuple[str, ...] = ()
    words: bool = False
    prefixes: int = 0
    command_at: int = 0
    assignments: bool = False
    script: str = ""
    script_values: str = ""
    subcommands: dict[str, _Options] = field(default_factory=dict)
    secret_operand: int = 0  # 1 for the first operand; 0 for none
    secret_last_with: str = ""
    colon_secrets: tuple[str, ...] = ()


_MYSQL: Final = {"-p": "joined", "--password": "joined"}
_MYSQL_PREFIX: Final = len("--pa")  # --p is --port's, --pipe's, ... too: refused as ambiguous
_LDAP: Final = "bDdEefHhlOoPpRSsTUXYyz"  # OpenLDAP's tools: the letters that take a value
_SHELL: Final = _Options(values="oO", long_values=("--rcfile", "--init-file"), script="c")
_LOGIN: Final = {"login": _Options({"-p": "either"}, "u")}  # docker login -p X
_GLOBAL_UTILS: Final = {
    # Wrappers whose argv carries a command: the command's own options are read as its.
    "timeout": _Options(values="ks", long_values=("--kill-after", "--signal"), command_at=2),
    "env": _Options(
        values="uCS",
        long_values=("--unset", "--chdir", "--split-string"),
        command_at=1,
        assignments=True,
        script_values="S",
    ),
    "nice": _Options(values="n", long_values=("--adjustment",), command_at=1),
    "nohup": _Options(command_at=1),
    "setsid": _Options(command_at=1),
    "stdbuf": _Options(values="ioe", long_values=("--input", "--output", "--error"), command_at=1),
    "ionice": _Options(
        values="cnpPu",
        long_values=("--class", "--classdata", "--pid", "--pgid", "--uid"),
        command_at=1,
    ),
    "taskset": _Options(long_values=("--cpu-list",), command_at=2),
    "chrt": _Options(values="T", command_at=2),
    "time": _Options(values="fo", long_values=("--format", "--output"), command_at=1),
    "sudo": _Options(
        values="CDghpRrTUu",
        long_values=(
            "--close-from",
            "--chdir",
            "--group",
            "--host",
            "--prompt",
            "--role",
            "--type",
            "--command-timeout",
            "--other-user",
            "--user",
        ),
        command_at=1,
        assignments=True,
    ),
    "doas": _Options(values="Cu", command_at=1),
    "xargs": _Options(
        values="adEIsLnP",
        optional="eil",
        long_values=(
            "--arg-file",
            "--delimiter",
            "--max-args",
            "--max-procs",
            "--max-chars",
            "--process-slot-var",
        ),
        command_at=1,
    ),
}
_PROGRAMS: Final[dict[str, _Options]] = {
    **{
        name: _Options(_MYSQL, "DehPSu", "#", prefixes=_MYSQL_PREFIX)
        for name in ("mysql", "mariadb")
    },
    **{
        name: _Options(_MYSQL, "hPSurwT", "#", prefixes=_MYSQL_PREFIX)
        for name in ("mysqldump", "mariadb-dump")
    },
    "mysqladmin": _Options(_MYSQL, "hPSuci", "#", prefixes=_MYSQL_PREFIX),
    "mysqlimport": _Options(_MYSQL, "hPSuc", "#", prefixes=_MYSQL_PREFIX),
    "sshpass": _Options({"-p": "either"}, "fdP", command_at=1),
    "curl": _Options(
        {
            "-u": "either",
            "--user": "next",
            "-U": "either",
            "--proxy-user": "next",
            "-E": "cert",
            "--cert": "cert",
            "--proxy-cert": "cert",
        },
        "AbcCdDeFHKmoPQrtTwxXyYz",
    ),
    "smbclient": _Options(
        {"-U": "either", "--user": "next"}, "WIpnsdlORTDcbtmLMAi", secret_operand=2
    ),
    "zip": _Options({"-P": "either"}, "bnOstZ"),
    "unzip": _Options({"-P": "either"}, "dx"),
    # 7-Zip's switches are words: -pSECRET; every other switch takes the rest of its word.
    **{
        name: _Options({"-p": "joined"}, optional="abcdefghijklmnoqrstuvwxyz")
        for name in ("7z", "7za", "7zr")
    },
    "openssl": _Options({"-k": "next"}, words=True),
    "redis-cli": _Options({"-a": "either"}, words=True),
    **{
        name: _Options({"-p": "either", "--password": "next"}, "uhdcoqf")
        for name in (
            "mongo",
            "mongosh",
            "mongodump",
            "mongorestore",
            "mongoexport",
            "mongoimport",
            "mongostat",
            "mongotop",
            "mongofiles",
        )
    },
    **{
        name: _Options({"-P": "either"}, "SUdDiqQAvtlLcHhaekKsrWxyYfFbNo")
        for name in ("sqlcmd", "bcp")
    },
    **{
        name: _Options({"-P": "either"}, "hpiIkAutqmfLMTeDFcCKEUNWsSVxXr")
        for name in ("mosquitto_pub", "mosquitto_sub", "mosquitto_rr")
    },
    "rdesktop": _Options({"-p": "either"}, "udscgkaTxrBEzmnX"),
    **{name: _Options({"-p": "either"}, "uPjdtWo") for name in ("ncftp", "ncftpget", "ncftpput")},
    "lftp": _Options({"-u": "either", "--user": "next"}, "pcfe"),
    "wpa_passphrase": _Options(secret_operand=2),
    **{
        name: _Options(colon_secrets=("/p:", "/password:", "/gp:", "/gateway-password:", "/pth:"))
        for name in ("xfreerdp", "xfreerdp3", "wlfreerdp", "sdl-freerdp", "sdl-freerdp3")
    },
    "htpasswd": _Options(values="Cr", secret_last_with="b"),  # noqa: S106 (a letter)
    **{
        name: _Options({"-w": "either"}, _LDAP)
        for name in (
            "ldapsearch",
            "ldapadd",
            "ldapmodify",
            "ldapdelete",
            "ldapmodrdn",
            "ldapcompare",
            "ldapwhoami",
            "ldapexop",
        )
    },
    "ldappasswd": _Options({"-w": "either", "-a": "either", "-s": "either"}, _LDAP),
    **{
        name: _Options(values="cHl", subcommands=_LOGIN) for name in ("docker", "podman", "nerdctl")
    },
    **{name: _SHELL for name in ("sh", "bash", "dash", "zsh", "ksh", "mksh", "ash")},
    # review17 E6: the clouds' and registries' logins and settings people type.
    "az": _Options(subcommands={"login": _Options({"-p": "either", "--password": "next"}, "ut")}),
    "vault": _Options(subcommands={"login": _Options(secret_operand=1)}),  # vault login TOKEN
    # user/password@database, the first operand (sqlplus scott/X@orcl): masked whole.
    **{name: _Options(secret_operand=1) for name in ("sqlplus", "sqlldr", "rman")},
    # `aws configure set KEY VALUE`, `npm config set KEY VALUE`: every value masked.
    "aws": _Options(
        long_values=("--profile", "--region", "--output", "--endpoint-url"),
        subcommands={"configure": _Options(subcommands={"set": _Options(secret_operand=2)})},
    ),
    **{
        name: _Options(
            subcommands={
                "config": _Options(subcommands={"set": _Options(secret_operand=2)}),
                "set": _Options(secret_operand=2),
            }
        )
        for name in ("npm", "pnpm", "yarn")
    },
    **_GLOBAL_UTILS,
}


# And for the args' whole text (`_plain`): a URL, an escape, a key whose values are all
# masked (each a text found anywhere), a program named above or one that reads a
# password on stdin, as a word of its own anywhere (an argv's item, a word of a script
# in one: ssh h 'mysql -pX'). A word is a longest run of _WORD's characters: a name
# matched only where neither side continues it. One regex of all of these took some
# 6 us of each call's telemetry row for `{"path": "bench.txt"}` (every position tried
# against ~90 names); texts looked for with `in` and a set of words take a third.
_NOT_PLAIN_TEXTS: Final = (
    *_MARKERS.split("|"),
    "://",
    "\\",
    "header",
    "content",
    "data",
    "body",
    "text",
)
_NOT_PLAIN_WORDS: Final = frozenset([*_PROGRAMS, "sudo", "kinit", "cryptsetup", "chpasswd"])
_WORD: Final = re.compile(r"[a-z0-9_.+-]+")  # each name is one run of these (a test holds)
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
# A string, or one left open to the end: args that are no JSON (or cut at
# _PARSED_AT_MOST) end inside one, and looking for its close from each escaped quote in
# it again cost quadratic time (48 KB held a preview 10 s).
_STRING: Final = re.compile(r'"(?:[^"\\]++|\\.)*+"?')
_NOT_BRACKET: Final = re.compile(r"[^\[\]{}]++")
_LEVEL: Final = {"[": 1, "{": 1, "]": -1, "}": -1}


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _scripts_read(function: Callable[_P, _R]) -> Callable[_P, _R]:
    """`function` reads scripts within one share (_SCRIPTS_CHARS) for a preview, a
    detail, a recording or a refusal; calls nested in it keep the outer share."""

    @functools.wraps(function)
    def sharing(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        if _scripts_left.get() is not None:
            return function(*args, **kwargs)
        token = _scripts_left.set([_SCRIPTS_CHARS])
        try:
            return function(*args, **kwargs)
        finally:
            _scripts_left.reset(token)

    return sharing


def nests_deeper(text: str, levels: int = NESTED_AT_MOST) -> bool:
    """Whether JSON `text` nests arrays and objects more than `levels` deep, told
    without parsing it (no recursion): brackets inside strings do not count."""
    if text.count("[") + text.count("{") <= levels:
        return False
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(itertools.accumulate(map(_LEVEL.__getitem__, brackets)), default=0) > levels


def args_preview(args_json: str, *, parsed: bool = False) -> str:
    """A short, redacted look at the args for people reading telemetry. `parsed`: the
    caller knows they are JSON (pydantic parsed them; a text its parser takes,
    json.loads takes too: test_redaction holds it), so short plain args are shown as
    they are without parsing them again (2-3 us a call)."""
    if nests_deeper(args_json[:_PARSED_AT_MOST]):
        return "<json nested too deeply>"
    if parsed and len(args_json) <= PREVIEW_CHARS and _plain(args_json):
        return args_json  # valid, short, and nothing in it to hide
    return _preview_parsed(args_json)


@_scripts_read
def _preview_parsed(args_json: str) -> str:
    """`args_preview` of args parsed here: shown as they are when valid, short and
    plain, else redacted ("<invalid json>" when they do not parse)."""
    try:
        value = json.loads(args_json[:_PARSED_AT_MOST]) if args_json else {}
        if len(args_json) <= PREVIEW_CHARS and _plain(args_json):
            return args_json  # valid, short, and nothing in it to hide
        return json.dumps(_Redactor().value(value), ensure_ascii=False)[:PREVIEW_CHARS]
    except ValueError:
        return "<invalid json>"
    except RecursionError:  # 2 KB of `[` nest deeper than Python's stack goes
        return "<json nested too deeply>"


def args_masked(args_json: str) -> str:
    """The args as a screen shows them beside the call (the TUI's detail pane): whole,
    with what looks secret masked as a recording keeps it (`args_for_replay`); args
    that are not a JSON object, as text (`secrets_in_text`). A screen may be read by
    another agent's screenshot (review26 H6); a prompt, which the person signs, shows
    them unmasked (prompt_text)."""
    if _plain(args_json):
        return args_json
    masked, _changed = args_for_replay(args_json)
    return masked if masked is not None else secrets_in_text(args_json)


def head_masked(head: str) -> tuple[str, tuple[str, ...]] | None:
    """The head of args too long to parse for a screen (the rest cut away), masked by
    what its members are: a flag's value in an argv is found by its place, which text
    alone does not show (review27 I3). The members and argv items the head holds (the
    string it cuts through, as far as it goes), as JSON masked as `args_masked` masks,
    and the passwords that argv holds (`argv_secrets`); None when the head does not
    begin a JSON object."""
    whole = _members_of_head(head)
    if whole is None:
        return None
    argv = whole.get("argv")
    secrets = _argv_found(argv) if isinstance(argv, list) else ()
    return json.dumps(_secrets_masked(whole), ensure_ascii=False), secrets


def _value_of_head(head: str, at: int) -> tuple[Any, int]:
    """The JSON value at `at` and where it ends; of a string the head's end cuts
    through, what it holds and -1. ValueError for anything else cut."""
    try:
        return _DECODER.raw_decode(head, at)
    except ValueError:
        if not head.startswith('"', at):
            raise
        return _string_head(head, at), -1


def _string_head(head: str, at: int) -> str:
    """The text of a JSON string that begins at `at` and is cut by the head's end (as
    far as it decodes: an escape cut through is left out)."""
    for cut in range(len(head), max(at, len(head) - 6), -1):
        try:
            return str(json.loads(head[at:cut] + '"'))
        except ValueError:
            continue
    return ""


_DECODER: Final = json.JSONDecoder()
_SPACE: Final = re.compile(r"[ \t\n\r]*")


def _members_of_head(head: str) -> dict[str, Any] | None:
    """The members of a JSON object whose text is cut, that the head holds: whole, but
    for the string or list (an argv) it cuts through, of which what it holds."""
    at = _SPACE.match(head, 0).end()  # type: ignore[union-attr]
    if not head.startswith("{", at):
        return None
    members: dict[str, Any] = {}
    at += 1
    try:
        while True:
            at = _SPACE.match(head, at).end()  # type: ignore[union-attr]
            key, at = _DECODER.raw_decode(head, at)
            at = _SPACE.match(head, at).end()  # type: ignore[union-attr]
            if not isinstance(key, str) or not head.startswith(":", at):
                return members
            at = _SPACE.match(head, at + 1).end()  # type: ignore[union-attr]
            if head.startswith("[", at):
                items, at, whole = _items_of_head(head, at + 1)
                members[key] = items
                if not whole:
                    return members
            else:
                value, at = _value_of_head(head, at)
                if at < 0:  # a string cut through: the head ends in it
                    members[key] = value
                    return members
                members[key] = value
            at = _SPACE.match(head, at).end()  # type: ignore[union-attr]
            if not head.startswith(",", at):
                return members
            at += 1
    except (ValueError, RecursionError):
        return members


def _items_of_head(head: str, at: int) -> tuple[list[Any], int, bool]:
    """A list's items the head holds, from `at` (past its `[`): whole, and of a string
    it cuts through what it holds; where they end, and whether the list did."""
    items: list[Any] = []
    try:
        while True:
            at = _SPACE.match(head, at).end()  # type: ignore[union-attr]
            if head.startswith("]", at):
                return items, at + 1, True
            item, at = _value_of_head(head, at)
            items.append(item)
            if at < 0:
                return items, len(head), False
            at = _SPACE.match(head, at).end()  # type: ignore[union-attr]
            if head.startswith(",", at):
                at += 1
            elif not head.startswith("]", at):
                return items, at, False
    except (ValueError, RecursionError):
        return items, at, False


def _plain(args_json: str) -> bool:
    """Whether JSON text that parsed holds nothing a preview masks, by its text alone:
    true only without a backslash (no escape can then spell what the patterns look
    for differently), URL, secret-looking word or key whose values are masked."""
    lowered = args_json.lower()
    for text in _NOT_PLAIN_TEXTS:
        if text in lowered:
            return False
    return _NOT_PLAIN_WORDS.isdisjoint(_WORD.findall(lowered))


@_scripts_read
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
    lowered = text.lower()
    if not _SUSPECT.search(lowered):  # one scan for the common case: nothing to see
        return text
    if "send" in lowered:  # first: the patterns below rewrite quotes expect's words need
        text = _expect_answers_masked(text)
    text = _HEADER_LINE.sub(lambda m: f"{m.group(1)}{MASK}", text)
    text = _SCHEME.sub(lambda m: f"{m.group(1)} {MASK}", text)
    text = _ASSIGNED.sub(lambda m: f"{m.group(1)}={MASK}", text)
    text = _SQL_PASSWORD.sub(lambda m: f"{m.group(1)}'{MASK}'", text)
    return _TOKEN_SHAPED.sub(MASK, text)


# A response header whose value is kept masked once the response is delivered (review25
# G10), by its name: one with a word that makes any name secret-looking here
# (_MASKED_WORD: Set-Cookie, Set-Cookie2, X-Auth-Token, X-Api-Key, X-Subject-Token,
# X-Amz-Security-Token, Authorization), and those that issue or prove a session or an
# identity without such a word: `auth` (WWW-Authenticate's and Authentication-Info's
# nonces and digests, X-Registry-Auth), `session` (X-Session-Id, X-Transmission-Session-Id)
# and request-forgery tokens (X-CSRF-..., X-XSRF-...). Names are the server's to choose:
# what no pattern knows is caught, if at all, by the masking of every other value.
_SECRET_HEADER: Final = re.compile(rf"{_MASKED_WORD}|auth|session|csrf|xsrf", re.I)


def masked_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Response headers as they are kept once delivered: the value of a secret-looking
    one (`_SECRET_HEADER`) masked whole, as a preview masks each request header's; in
    any other, what `masked_text` masks (a Location's or Link's query values and
    fragment, an auth scheme's credentials, a token-shaped value). Names stay: they say
    what came, not what it held."""
    return [
        (name, MASK if _SECRET_HEADER.search(name) else _header_value_masked(name, value))
        for name, value in headers
    ]


# Headers whose value is (or holds) a URL reference, often a relative one (`/cb?code=`,
# `0;url=/x?ticket=`, `</p?cursor=>`): masked_text finds only URLs with a scheme. A
# Location's (Content-Location's) whole value is one reference, a Refresh's what follows
# its `url=`, a Link's each `<…>`: a query there ends only where the reference does, so
# one holding `,` or `;` is masked whole.
_WHOLE_REFERENCE: Final = frozenset({"location", "content-location"})
_REFRESH_URL: Final = re.compile(r"(\burl\s*=\s*)(.*)", re.I | re.S)
_LINK_REFERENCE: Final = re.compile(r"<([^>]*)>")
# Elsewhere in a Link (its parameters), a query ends at the separators around it.
_QUERY: Final = re.compile(r"\?([^\s<>\"'#;,]*)")
_FRAGMENT: Final = re.compile(r"#[^\s<>\"';,]+")


def _header_value_masked(name: str, value: str) -> str:
    """A header's value as kept at rest: `masked_text`, and in a URL-valued header the
    query values and fragment of every reference, relative ones too (review26 H2)."""
    value = masked_text(value)
    name = name.lower()
    if name in _WHOLE_REFERENCE:
        return _reference_masked(value)
    if name == "refresh":
        return _REFRESH_URL.sub(lambda m: m.group(1) + _reference_masked(m.group(2)), value)
    if name != "link":
        return value
    value = _LINK_REFERENCE.sub(lambda m: f"<{_reference_masked(m.group(1))}>", value)
    value = _QUERY.sub(lambda found: "?" + _query_masked(found.group(1)), value)
    return _FRAGMENT.sub(f"#{MASK}", value)


def _reference_masked(reference: str) -> str:
    """One URL reference with its query values and fragment masked to its end."""
    reference, hash_sign, _fragment = reference.partition("#")
    path, question, query = reference.partition("?")
    masked = path + (question and "?" + _query_masked(query))
    return masked + (hash_sign and f"#{MASK}")


def _query_masked(query: str) -> str:
    return "&".join(
        f"{field.partition('=')[0]}={MASK}" if "=" in field else MASK
        for field in query.split("&")
        if field
    )


# In a message: a secret-looking flag and the value after it (`--password hunter2`),
# as argv items quoted with spaces between them (shlex.join, a list's repr).
_FLAG_THEN_VALUE: Final = re.compile(
    rf"(?<![A-Za-z0-9_.-])(--?{_NAME}{_MASKED_WORD}{_NAME}(?:['\",]+\s*|\s+)['\"]?)"
    r"(?!-)[^\s'\",\]]+",
    re.I,
)


# At rest a refusal keeps at most this much of one string (its message, a string of its
# detail), and of its detail's strings together: the patterns then look at that much,
# and a megabyte of argv quoted back costs the worker's loop milliseconds, not a second
# (review19 A7). The agent knows what it sent.
KEPT_CHARS: Final = 8 * 1024
KEPT_DETAIL_CHARS: Final = 64 * 1024


def _kept(text: str, room: int) -> str:
    """`text` cut to about `room` characters, at a space where one is near, so that no
    word (a password half kept) is cut through; it says how much went."""
    if len(text) <= room:
        return text
    cut = text[:room]
    space = max(cut.rfind(" "), cut.rfind("\n"), cut.rfind("\t"))
    if space >= room // 2:
        cut = cut[:space]
    return f"{cut} … [{len(text) - len(cut):,} more characters not kept]"


def masked_message(text: str, known: tuple[str, ...] = (), room: int = KEPT_CHARS) -> str:
    """A text that quotes a call's args (a refusal's message, a log line), as kept at
    rest: each of `known` (the passwords the call's argv holds, `argv_secrets`)
    masked wherever it is, however the text quoted the argv (the allowlist's "`curl
    -E c.pem:X …` fits rule …"); then cut to `room` (`_kept`) and masked as previews
    are (masked_text), with a secret-looking flag's value that follows it as the next
    word too."""
    text = masked_text(_kept(known_masked(text, known), room))
    if not _SUSPECT.search(text.lower()):
        return text
    return _FLAG_THEN_VALUE.sub(lambda m: f"{m.group(1)}{MASK}", text)


def known_masked(text: str, known: tuple[str, ...]) -> str:
    """`text` with each of `known` (a call's argv passwords, `argv_secrets`) masked
    wherever it is, however the text quoted it; nothing else changed."""
    for secret in known:
        for form in _quoted_forms(secret):
            text = text.replace(form, MASK)
    return text


def _quoted_forms(secret: str) -> list[str]:
    """`secret` as a text quoting an argv may write it: inside a shell's single quotes
    (shlex.join writes ' as '"'"': a prompt's command line; review23 C9), inside a JSON
    string, and as it is; the longest first, as one may hold another."""
    forms = {secret, secret.replace("'", "'\"'\"'"), json.dumps(secret)[1:-1]}
    return sorted(forms, key=len, reverse=True)


@_scripts_read
def masked_detail(value: Any, known: tuple[str, ...] = ()) -> Any:
    """An audit event's detail with every string in it masked (masked_message, with
    `known`): its messages quote the refused call's URL or argv. Its strings are kept
    to KEPT_DETAIL_CHARS together, in the order they are met."""
    return _detail_masked(value, known, [KEPT_DETAIL_CHARS])


def _detail_masked(value: Any, known: tuple[str, ...], left: list[int]) -> Any:
    if isinstance(value, str):
        if left[0] <= 0:
            return "… [not kept]"
        kept = masked_message(value, known, min(KEPT_CHARS, left[0]))
        left[0] -= len(kept)
        return kept
    if isinstance(value, dict):
        return {k: _detail_masked(v, known, left) for k, v in value.items()}
    if isinstance(value, (list, tuple)):  # an argv: the value after a secret flag too
        return _argv_masked(value, lambda item: _detail_masked(item, known, left))
    return value


# A password this short is not looked for in a message's text: replacing two letters
# wherever they stand would leave the message unreadable (and say which they were).
_KNOWN_AT_LEAST: Final = 4
_KNOWN_AT_MOST: Final = 64  # passwords looked for in one message, at most


@_scripts_read
def argv_secrets(args_json: str) -> tuple[str, ...]:
    """The passwords a call's argv holds, as `_argv_plan` finds them (the item after
    `--pass`, the X of `-pX` and of curl's `c.pem:X`, those in a `sh -c` script), so
    a message that quotes the argv in its own way is masked too (masked_message's
    `known`). () for args with no argv (or that do not parse)."""
    if '"argv"' not in args_json or nests_deeper(args_json[:_PARSED_AT_MOST]):
        return ()
    try:
        args = json.loads(args_json[:_PARSED_AT_MOST])
    except (ValueError, RecursionError):
        return ()
    argv = args.get("argv") if isinstance(args, dict) else None
    if not isinstance(argv, list):
        return ()
    return _argv_found(argv)


def _argv_found(argv: list[Any]) -> tuple[str, ...]:
    found = sorted(set(_secret_parts(argv, 0)) | set(_text_secrets(argv)), key=len, reverse=True)
    return tuple(s for s in found if len(s) >= _KNOWN_AT_LEAST)[:_KNOWN_AT_MOST]


def _text_secrets(items: list[Any]) -> Iterator[str]:
    """The passwords found in an argv's items as text: what SQL sets (`psql -c "…
    PASSWORD 'X'"`) and what expect sends to a password prompt. A message quoting the
    argv re-quotes them (shlex.join), out of the text patterns' reach."""
    for item in items:
        if isinstance(item, str):
            text = item[:_SCRIPT_CHARS]
            lowered = text.lower()
            if "password" in lowered or "identified" in lowered:
                yield from (found.group(2) for found in _SQL_PASSWORD.finditer(text))
            if "send" in lowered:
                for start, end in expect_answers.answers(text):
                    sent = text[start:end].strip("\"'{}")
                    yield sent.removesuffix("\\r").removesuffix("\\n")


def _secret_parts(items: list[Any], depth: int) -> Iterator[str]:
    for item, masked in zip(items, _argv_plan(items, depth), strict=True):
        if masked is not None and isinstance(item, str):
            yield from _secrets_of(item, masked)


def _secrets_of(item: str, masked: str) -> Iterator[str]:
    """The passwords an item held, by what it is masked as."""
    if isinstance(masked, _Script):
        yield from masked.secrets
    elif masked == MASK:
        yield item
    elif masked.endswith(MASK):  # -pX, c.pem:X: the password is what the mask stands for
        yield item[len(masked) - len(MASK) :]


class _Script(str):
    """A shell script (or command line) of an argv with secrets masked in it: the
    text it is shown as still passes through the caller's own masking. `secrets`:
    the passwords masked in it (argv_secrets)."""

    secrets: tuple[str, ...] = ()


# A script longer than this is not read (though the reading is linear, it is Python: a
# script of 128 KiB would hold the loop), nor one nested deeper: its text is masked as
# any text is (`masked_message` and the like), and no more.
_SCRIPT_CHARS: Final = 4096
_SCRIPT_DEPTH: Final = 3
# And at most this many characters of scripts in all, per preview, audit detail,
# recording or refusal: args of a megabyte could hold 250 lists of `sh -c` and 4 KiB.
_SCRIPTS_CHARS: Final = 2 * _SCRIPT_CHARS
_scripts_left: ContextVar[list[int] | None] = ContextVar("_scripts_left", default=None)
_ASSIGNMENT: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\[[^]]*\])?\+?=")
# Words a shell reads before a command's own (`if mysql -pX …; then …`): the command
# starts after them. After `for`, `select` and `case` come names and words, no command.
_KEYWORDS: Final = frozenset(
    {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "!", "{", "}", "[[", "]]"}
)
_NO_COMMAND: Final = frozenset({"for", "select", "case", "function", "esac"})
# A bare word that names the password its next word is (nmcli … password X,
# mysqladmin password X). Not `passwd`: a program, whose next word is a user's name.
_PASSWORD_WORDS: Final = frozenset({"password", "passphrase"})
# Programs that read a password on stdin, as a script feeds them: `echo X | sudo -S …`,
# `chpasswd <<< u:X`, `docker login --password-stdin <<EOF`. Their flags that say so.
_STDIN_READERS: Final = frozenset(
    {"chpasswd", "chgpasswd", "kinit", "cryptsetup", "smbpasswd", "passwd", "htpasswd"}
)
_STDIN_FLAGS: Final = frozenset(
    {"--password-stdin", "--passphrase-stdin", "--stdin", "--passphrase-fd", "stdin", "fd:0"}
)
_SUDO_STDIN: Final = re.compile(r"-[A-Za-z]*S[A-Za-z]*")
# What writes a password into a pipe: its operands are the password (`echo X | sudo -S`).
_FEEDERS: Final = frozenset({"echo", "printf"})
# What passes its own stdin on into a pipe: what it is fed is the password (`cat <<EOF |
# sudo -S`, review17 E6).
_PASSERS: Final = frozenset({"cat", "tee"})


def _argv_plan(items: list[Any], depth: int = 0) -> list[str | None]:
    """For each item of a list like an argv: MASK, the item with its joined secret
    masked (`-p` + MASK, `c.pem:` + MASK), a `_Script` with its secrets masked, or
    None to show it as any value is shown. Masked: the value after a secret-looking
    flag (`--password hunter2`, `--with-token ghp_…`, `-passin pass:…`) or a bare
    `password` word, and the value of a known program's secret option (mysql -pX,
    sshpass -p X, curl -u u:p, zip -P X), in a cluster of short options too (curl -vu
    u:p, sshpass -vpX: `_Options`), behind the wrappers that run it (timeout 5 curl
    -u u:p, env, nice, sudo ...) and in a shell's script (sh -c 'curl -u u:p', best
    effort). Behind a program not named (docker exec c, kubectl exec p --, ssh h,
    find -exec) the first item naming a known program is read as it, and an item
    holding blanks is read as a script (ssh h 'mysql -pX db'; an argv given as one
    string, too)."""
    options = _program_options(items[0] if items else None)
    plan: list[str | None] = []
    then = ""  # what the next item is: "secret", "cert", "script", "value" (shown) or ""
    operands = 0
    only_operands = False  # after `--`
    script_next = False  # sh -c: the first operand is a script
    positional_from = 0  # and its operand from which on each is a password (`$N`), or 0
    flagged = ""  # the letters of the short options given (htpasswd -b)
    last_operand = -1
    for index, item in enumerate(items):
        text = item if isinstance(item, str) else ""
        now, then = then, ""
        if isinstance(item, str) and now in ("secret", "cert", "script"):
            if now == "script":
                plan.append(_script_masked(text, depth))
                continue
            if not text.startswith("-"):
                plan.append(MASK if now == "secret" else _cert_masked(text))
                continue
        masked: str | None = None
        if options is None and isinstance(item, str) and now != "value":
            # A program not named here: a known one it runs, or a command line it takes
            # (the program's own item too: an argv given as one string, `["mysql -pX"]`,
            # runs nothing, and its refusal quoted it whole: review17 E6).
            options = _program_options(text)
            if options is None and _SCRIPT_LIKE.search(text[:_SCRIPT_CHARS]):
                masked = _script_masked(text, depth)
            operands, only_operands, script_next, flagged, last_operand = 0, False, False, "", -1
        elif index > 0 and options is not None and now != "value" and isinstance(item, str):
            if text == "--" and not only_operands:
                only_operands = True
            elif options.colon_secrets and text.startswith(options.colon_secrets):
                masked = text[: text.index(":") + 1] + MASK
            elif not only_operands and text.startswith("-") and text != "-":
                masked, then = _option_masked(text, options)
                if not text.startswith("--"):
                    flagged += text[1:_FLAG_CHARS]
                    script_next = script_next or bool(options.script and options.script in text)
            elif options.script and text.startswith("+") and not only_operands:
                pass  # a shell's +o, +e: options too
            elif options.assignments and operands == 0 and _ASSIGNMENT.match(text):
                pass  # env NAME=value command: shown as any NAME=value is
            elif operands == 0 and text in options.subcommands:
                options = options.subcommands[text]
            else:
                operands += 1
                last_operand = index
                if script_next and operands == 1:
                    masked = _script_masked(text, depth)
                    positional_from = _positional_operand(masked)
                elif script_next and positional_from and operands >= positional_from:
                    masked = MASK  # sh -c 'mysql -p"$1"' sh X: X is $1
                elif operands == options.command_at or (
                    not options.command_at
                    and not options.script
                    and operands != options.secret_operand
                    and _program_options(text) is not None
                ):  # the command it runs (docker exec c mysql …), with its own options
                    options = _program_options(text)
                    operands, only_operands, script_next, flagged = 0, False, False, ""
                    last_operand = -1
                elif operands == options.secret_operand:
                    masked = MASK
        plan.append(masked)
        if masked is None and not then and len(text) <= _FLAG_CHARS:  # -psecret is no flag
            secret_next = _SECRET_FLAG.fullmatch(text) or text.lower() in _PASSWORD_WORDS
            then = "secret" if secret_next else ""
    secret_last = "" if options is None else options.secret_last_with
    if secret_last and secret_last in flagged and last_operand > 0:
        plan[last_operand] = MASK
    return plan


# An item that may be a command line: blanks between words.
_SCRIPT_LIKE: Final = re.compile(r"\S\s+\S")


def _program_options(program: Any) -> _Options | None:
    if not isinstance(program, str) or len(program) > _FLAG_CHARS:
        return None
    return _PROGRAMS.get(program.rsplit("/", 1)[-1])


def _cert_masked(value: str) -> str | None:
    """curl's `file:password` with the password masked (after the last `:`)."""
    head, colon, _ = value.rpartition(":")
    return head + colon + MASK if colon else None


def _joined(how: str, option: str, value: str) -> str | None:
    """An option word with the password joined to it masked, by how it takes it."""
    if how == "cert":
        masked = _cert_masked(value)
        return None if masked is None else option + masked
    return option + MASK


def _option_masked(text: str, options: _Options) -> tuple[str | None, str]:
    """An option word of a known program: the word with a password joined to it masked
    (or None), and what the next item is ("secret", "cert", "script", "value", or "")."""
    if text.startswith("--") or options.words:
        name, equals, value = text.partition("=")
        how = options.secret.get(name) or _prefix_of_secret(name, options)
        if how is None and options.words and not text.startswith("--"):
            joined = _joined_either(text[:2], options)
            if joined is not None:
                return joined, ""
        if how is None:
            if not equals and name in options.long_values:
                return None, "value"
            return None, ""
        if equals:
            return _joined(how, name + "=", value), ""
        if how == "joined":
            return None, ""  # asks on the terminal
        return None, "cert" if how == "cert" else "secret"
    # A cluster of short options: -vu, -vpX, -Bpsecret; read as far as a flag goes
    # (a word of a megabyte costs no more than one of a hundred characters).
    for at in range(1, min(len(text), _FLAG_CHARS)):
        letter, rest = text[at], text[at + 1 :]
        how = options.secret.get("-" + letter)
        if how is not None:
            if rest:
                return _joined(how, text[: at + 1], rest), ""
            if how == "joined":
                return None, ""
            return None, "cert" if how == "cert" else "secret"
        if letter in options.script_values:
            return None, "" if rest else "script"
        if letter in options.values:
            return None, "" if rest else "value"
        if letter in options.optional:
            return None, ""
    return None, ""


def _joined_either(option: str, options: _Options) -> str | None:
    """A word-options program's `-aX`, masked, when its `-a` takes a password either
    way (redis-cli -aX, which it reads as -a X)."""
    return option + MASK if options.secret.get(option) == "either" else None


def _prefix_of_secret(name: str, options: _Options) -> str | None:
    """How a cut long option takes its value, when the program reads any long enough
    prefix of a long option as that option (my_getopt: --pas is --password)."""
    if not options.prefixes or len(name) < options.prefixes or not name.startswith("--"):
        return None
    return next((how for full, how in options.secret.items() if full.startswith(name)), None)


def _script_masked(script: str, depth: int) -> _Script | None:
    """A shell script (sh -c '…', env -S '…', ssh h '…') with the secrets of each
    command in it masked as an argv's are, each masked word written back quoted in
    its place (the rest as it was written); None when nothing was masked, or it was
    not read (longer than _SCRIPT_CHARS, past the call's share, nested deeper than
    _SCRIPT_DEPTH). Best effort (`shell_words`): commands split at newlines, `;`,
    `&&`, `||`, `|`, `&`, parentheses, `$(` and backticks, past their leading
    keywords (`if`, `then`, `do`, `!` …) and NAME=value assignments; a password fed
    on stdin to a program that reads one there (`echo X | sudo -S`, `<<< X`, a
    here-document) too. Not aliases, functions or expansions' values."""
    if depth >= _SCRIPT_DEPTH or not _script_share(script):
        return None
    shown: dict[int, tuple[int, str]] = {}  # where a masked word starts: its end, its text
    secrets: list[str] = []
    reader_seen = False  # a command that reads a password on stdin came
    script_commands = shell_words.commands(script)
    for command in script_commands:
        words = command.words
        first = _command_start(words)
        items = [] if first is None else [word.text for word in words[first:]]
        if first is not None:
            for word, masked in zip(words[first:], _argv_plan(items, depth + 1), strict=True):
                if masked is not None:
                    shown[word.start] = (word.end, shlex.quote(str(masked)))
                    secrets.extend(_secrets_of(word.text, masked))
        reads = _reads_password(items)
        reader_seen = reader_seen or reads
        # `fi <<EOF`, `done <<< X`, `) <<< X`: fed to a compound command, read by any in it.
        if reads or (first is None and reader_seen):
            _fed_masked(command, shown, secrets)
            _feeder_masked(command.piped_from, shown, secrets)
    if reader_seen:
        # A process substitution is a file any command may read, and pass on to the
        # reader (`cat <(echo X) | sudo -S`, `exec 3< <(echo X); sudo -S … <&3`: review19
        # A3): which one reads it is not followed, so with a reader in the script, what
        # each writes is masked.
        for command in filter(lambda command: command.substituted, script_commands):
            _feeder_masked(command, shown, secrets)
    _assigned_secrets_masked(script_commands, secrets, shown)
    if not shown:
        return None
    pieces: list[str] = []
    at = 0
    for start in sorted(shown):
        if start >= at:
            end, text = shown[start]
            pieces += [script[at:start], text]
            at = max(at, end)
    masked_script = _Script("".join(pieces) + script[at:])
    masked_script.secrets = tuple(secret for secret in secrets if secret)
    return masked_script


def _feeder_masked(
    feeder: shell_words.Command | None, shown: dict[int, tuple[int, str]], secrets: list[str]
) -> None:
    """Mask what `feeder` writes for a program that reads a password on stdin: the
    operands of `echo`/`printf`, what `cat`/`tee` is fed (`cat <<EOF | sudo -S`)."""
    words = [] if feeder is None else feeder.words
    start = _command_start(words)
    feeding = "" if start is None else words[start].text.rsplit("/", 1)[-1]
    if start is not None and feeding in _FEEDERS:
        for word in words[start + 1 :]:
            if not word.text.startswith("-"):
                shown[word.start] = (word.end, MASK)
                secrets.append(word.text)
    elif feeder is not None and feeding in _PASSERS:
        _fed_masked(feeder, shown, secrets)


def _fed_masked(
    command: shell_words.Command, shown: dict[int, tuple[int, str]], secrets: list[str]
) -> None:
    """Mask what the script feeds `command` on stdin (here-strings, here-documents)."""
    for fed in filter(lambda fed: fed.text, command.fed):
        body = fed.kind == "body"
        shown[fed.start] = (fed.end, MASK + "\n" if body else MASK)
        secrets.extend(line for line in fed.text.splitlines() if line.strip())


# A parameter a masked word expands (`mysql -p$P`, `echo "${P}" | sudo -S`, `-p$1`,
# `-p${10}`; `$10` is `$1` and a 0).
_PARAMETER: Final = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*|(?<=\{)[0-9]+|[1-9])")


def _assigned_secrets_masked(
    commands: list[shell_words.Command], secrets: list[str], shown: dict[int, tuple[int, str]]
) -> None:
    """Mask the values a script assigns to the parameters its masked words expand:
    `P=X; mysql -p$P` held X in `P=X` (mask17's note). Any word `NAME=value` of such a
    NAME, before a command (an assignment) or an operand (`export P=X`, `make P=X`):
    more masked rather than less; the words `for P in …` and `printf -v P …` give P
    (review19 A3); and the positional parameters `set` gives (`set -- X; mysql -p$1`:
    review17 E6). Not followed: a value read (`read P`), computed (`P=$(cat f)` is
    masked as written) or set in another script."""
    names = {name for secret in secrets for name in _PARAMETER.findall(secret)}
    if not names:
        return
    numbers = [int(name) for name in names if name.isdigit()]
    for command in commands:
        if numbers:
            # `shift` (in a loop, a function, `shift 2`: not followed) makes `$N` name
            # an operand further on, never one before: from the N-th on, all are masked.
            for number, word in _positionals_set(command):
                if number >= min(numbers):
                    shown[word.start] = (word.end, shlex.quote(MASK))
                    secrets.append(word.text)
        for name, word in _names_given(command):
            if name in names:
                shown[word.start] = (word.end, shlex.quote(MASK))
                secrets.append(word.text)
        for word in command.words:
            assignment = _ASSIGNMENT.match(word.text)
            if assignment is None:
                continue
            name = assignment.group(0).rstrip("+=").split("[", 1)[0]
            value = word.text[assignment.end() :]
            if name in names and value:
                shown[word.start] = (word.end, assignment.group(0) + shlex.quote(MASK))
                secrets.append(value)


def _names_given(command: shell_words.Command) -> Iterator[tuple[str, shell_words.Token]]:
    """The words a command gives a parameter otherwise than as `NAME=value`, each with
    the name: `for P in a b` (and `select`) gives P each of a and b; `printf -v P FORMAT
    ARGS` gives P what the format makes of the arguments, so each is taken."""
    words = command.words
    at = 0
    while at < len(words) and words[at].text in _KEYWORDS:
        at += 1  # `do for P in …`
    head = [word.text for word in words[at : at + 3]]
    if len(head) == 3 and head[0] in ("for", "select") and head[2] == "in":
        yield from ((head[1], word) for word in words[at + 3 :])
        return
    start = _command_start(words)
    if start is None or words[start].text != "printf":
        return
    options = words[start + 1 :]
    for index, word in enumerate(options):
        if word.text == "-v" and index + 1 < len(options):
            name, values = options[index + 1].text, options[index + 2 :]
        elif word.text.startswith("-v") and len(word.text) > 2:  # printf -vP
            name, values = word.text[2:], options[index + 1 :]
        else:
            continue
        yield from ((name, value) for value in values)
        return


def _positional_operand(script: _Script | None) -> int:
    """The operand of `sh -c SCRIPT $0 $1 …` from which on each may be a password: the
    one the lowest `$N` a masked word of the script expands names (operand 2 is `$0`),
    and each after it, since a `shift` moves `$N` to a later one; 0 for none."""
    secrets = () if script is None else script.secrets
    names = [name for secret in secrets for name in _PARAMETER.findall(secret)]
    return min((int(name) + 2 for name in names if name.isdigit()), default=0)


def _positionals_set(command: shell_words.Command) -> list[tuple[int, shell_words.Token]]:
    """The positional parameters a `set` command gives, numbered from 1: its operands
    after its options (`set -e -- a b`, `set -o pipefail a`, `set a b`). Each `o` in an
    option takes the next word, in a cluster too (`set -eo pipefail a`: review19 A3)."""
    words = command.words
    start = _command_start(words)
    if start is None or words[start].text != "set":
        return []
    at = start + 1
    while at < len(words) and words[at].text[:1] in ("-", "+") and words[at].text != "--":
        at += 1 + words[at].text.count("o")
    if at < len(words) and words[at].text == "--":
        at += 1
    return list(enumerate(words[at:], start=1))


def _script_share(script: str) -> bool:
    """Whether `script` may be read: short enough, and within what is left of the
    call's share (which it then takes)."""
    left = _scripts_left.get()
    if len(script) > _SCRIPT_CHARS or (left is not None and left[0] < len(script)):
        return False
    if left is not None:
        left[0] -= len(script)
    return True


def _command_start(words: list[shell_words.Token]) -> int | None:
    """Where a simple command's own words start, past keywords and assignments; None
    when it runs no command (`for x in …`, `case … in`)."""
    first = 0
    while first < len(words):
        text = words[first].text
        if text in _NO_COMMAND:
            return None
        if text not in _KEYWORDS and not _ASSIGNMENT.match(text):
            return first
        first += 1
    return None


def _reads_password(items: list[str]) -> bool:
    """Whether a command reads a password on its stdin (sudo -S, chpasswd,
    --password-stdin, openssl's -passin stdin, gpg's --passphrase-fd 0)."""
    names = {item.rsplit("/", 1)[-1] for item in items if len(item) <= _FLAG_CHARS}
    if names & _STDIN_READERS or names & _STDIN_FLAGS:
        return True
    return "sudo" in names and any(_SUDO_STDIN.fullmatch(name) for name in names)


def _argv_masked(items: Iterable[Any], each: Callable[[Any], Any]) -> list[Any]:
    """A list like an argv: its secrets masked (_argv_plan), every other item (and a
    script with its secrets masked) passed through `each`."""
    items = list(items)
    return [
        each(item if masked is None else str(masked))
        if masked is None or isinstance(masked, _Script)
        else masked
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
            elif isinstance(masked, _Script):
                out.append(self.value(str(masked)))
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
