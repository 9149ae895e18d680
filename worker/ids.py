"""Random ids as the wire and the databases carry them: 32 hex digits.

`new_id()` is `uuid.uuid4().hex` without the UUID object: the same 122 random bits
from the kernel (os.urandom) with the version and variant bits set, so the text is
the same kind of id as before. A call takes two of them (its correlation id at the
hub, its invocation id at the worker), and on the 2-core machine the project is
measured on, building the UUID object took 12 of uuid4's 15 us.

`ordered_id()` is a version-7 UUID's (RFC 9562): the time in milliseconds first, then
74 random bits. The hub names the calls it makes ids for so: each database keys a call
by its id (hub.db's calls, the ledger's calls, telemetry's index of invocations), and
a random key puts each new row on a random leaf of a grown index, each its own 4 KiB
page written to the log and copied back in. With 300,000 calls in each table, the
hub's and the worker's writes of a call (add, complete, hold and telemetry, ack; in
batches of 64) took 79.5 us with random ids against 39.8 us with ordered ones (47.1
and 35.3 in fresh databases; alternated, at load 21). An id a caller chooses is kept
as it is; a caller that names its calls does best with ordered ids too.

`id_problem` is the one rule for ids a request carries (correlation, plan, agent,
owner, task): what the hub takes from callers and the worker from a server;
`name_problem` the one for the surface and action it names.
"""

from __future__ import annotations

import os
import re
import time
from typing import Final

# The longest id a request may carry. A hub's own are 32 hex digits; a server's plan
# and agent ids are its choice, and are kept (ledger, telemetry, audit) and shown.
MAX_ID_CHARS: Final = 256
# A surface's or action's name: every real one is a short word of letters, digits and
# underscores (workerHost, fs_read); a server's unknown one is kept and shown all the same.
MAX_NAME_CHARS: Final = 64
_NAME: Final = re.compile(r"[A-Za-z0-9_.-]*")


def new_id() -> str:
    """A version-4 UUID's 32 hex digits, as `uuid.uuid4().hex` gives them."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # the RFC 4122 variant
    return raw.hex()


def ordered_id() -> str:
    """A version-7 UUID's 32 hex digits: 48 bits of Unix time in milliseconds, then the
    version, 74 random bits and the variant."""
    raw = bytearray((time.time_ns() // 1_000_000).to_bytes(6, "big") + os.urandom(10))
    raw[6] = (raw[6] & 0x0F) | 0x70  # version 7
    raw[8] = (raw[8] & 0x3F) | 0x80  # the RFC 4122 variant
    return raw.hex()


def id_problem(name: str, value: str, *, required: bool = False) -> tuple[str, str] | None:
    """Why `value` cannot be the id `name` ((kind, a sentence a person can act on)), or
    None. An id is at most MAX_ID_CHARS printable characters (str.isprintable: letters,
    digits, punctuation, symbols and the space; no control, format, separator or
    unassigned character). Ids are written where people read them (telemetry, the
    audit log, the TUI, replay comments): an escape, a bidi override or a line break in
    one could forge or hide what is shown there."""
    if not value:
        return ("missing", f"{name} is required") if required else None
    if len(value) > MAX_ID_CHARS:
        return "too_long", f"{name} has {len(value):,} characters; at most {MAX_ID_CHARS}"
    if value.isprintable():  # the whole text at C speed; the loop below says where not
        return None
    for index, char in enumerate(value):
        if not char.isprintable():
            return "not_printable", (
                f"{name} has a character that is not printable, U+{ord(char):04X} at "
                f"position {index}: an id is letters, digits, punctuation and spaces, with "
                "no control, format (bidi) or line-separator character"
            )
    return None


def name_problem(name: str, value: str) -> tuple[str, str] | None:
    """Why `value` cannot be the `name` (surface or action) of a request ((kind, a
    sentence a person can act on)), or None. At most MAX_NAME_CHARS ASCII letters,
    digits, `_`, `.` and `-`: an unknown action is answered `unknown_action` and kept
    (telemetry, the console's call rows) under its name, which an escape sequence in it
    would carry to a terminal (review8 finding 03)."""
    if len(value) > MAX_NAME_CHARS:
        return "too_long", f"{name} has {len(value):,} characters; at most {MAX_NAME_CHARS}"
    if not _NAME.fullmatch(value):
        bad = next(char for char in value if not _NAME.fullmatch(char))
        return "not_a_name", (
            f"{name} has U+{ord(bad):04X}, which no surface or action name has: a name is "
            "ASCII letters, digits, '_', '.' and '-'"
        )
    return None
