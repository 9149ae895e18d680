"""Allowlist asks this worker refused for want of someone to ask, kept for `grant`.

A headless worker refuses an allowlist `ask` with `scope_required` and names the
command to grant it ahead: `agentworker grant '<its name>'`. That refusal goes to
the server, which is the agent, and the agent relays it to the person. Only the
surface and the digest of an ask's name bind (scopes.ask_binding); the program,
argument count and folder between them are words, and an agent could hand the
person the digest of `python3 evil.py` named as `ls` (review21 B7). So the worker
keeps what it refused under each digest, as a prompt would have shown it (the
command, its folder, its stdin, the files it bound), and `grant` takes an ask's name
only when this worker refused that digest under that very name, and prints what it
is. A digest this worker never refused is not granted: nobody here knows what it is.

Kept in state.db, passwords in the argv masked as a refusal's message is
(redaction.masked_message with argv_secrets), for KEPT_S at most and
MAX_REFUSED_ASKS rows: an agent's flood of refusals pushes out older ones, which
makes the person's grant of one fail and ask for the call again, never grants more.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Final

from worker.clock import now_ms
from worker.core.prompt_text import SHOW_LIMIT
from worker.core.redaction import argv_secrets, masked_message, masked_text
from worker.core.scopes import ASK_PREFIX, ask_binding
from worker.db import transaction

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS refused_asks (
    digest     TEXT PRIMARY KEY, -- what binds the ask (scopes.ask_binding), with surface
    surface    TEXT NOT NULL,
    name       TEXT NOT NULL,    -- its name, as the refusal gave it (scopes.ask_name)
    shown      TEXT NOT NULL,    -- command, folder, stdin, files: as a prompt shows them, masked
    refused_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS refused_asks_when ON refused_asks (refused_ms);
"""

# How long a refused ask is kept for the person to grant, and how many at most.
KEPT_S: Final = 24 * 3600
MAX_REFUSED_ASKS: Final = 1000


@dataclass(frozen=True)
class RefusedAsk:
    surface: str
    digest: str
    name: str  # without ASK_PREFIX
    shown: str  # lines: command, working folder, stdin, the files bound, the rule's words
    refused_ms: int

    def named(self, label: str) -> bool:
        """Whether `label` (an ask's name, with or without ASK_PREFIX) is this ask's name
        as its refusal gave it: the agent got it masked as refusals are, and a pattern
        kept for it has fnmatch's specials escaped (`[*]`)."""
        label = label.removeprefix(ASK_PREFIX)
        unescaped = label.replace("[*]", "*").replace("[?]", "?").replace("[[]", "[")
        return self.name in (label, unescaped) or masked_text(self.name) in (label, unescaped)


class RefusedAsks:
    """The refused_asks table of a worker's state.db (its ledger's connection)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        conn.executescript(_SCHEMA)
        self._db = conn

    def record(self, name: str, preview: str, args_json: str, *, now: int | None = None) -> None:
        """Keep the ask named `name` (without ASK_PREFIX), refused now: `preview` is
        what its prompt would have said (exec_cmd.ask_about's note), masked here with
        the passwords of the call's argv (`args_json`). One too long to show in a
        prompt is not kept: nobody would read it whole here either."""
        bound = ask_binding(ASK_PREFIX + name)
        if bound is None:
            return
        shown = masked_message(preview, argv_secrets(args_json), room=SHOW_LIMIT + 1)
        if len(shown) > SHOW_LIMIT:
            return
        surface, digest = bound
        now = now_ms() if now is None else now
        with transaction(self._db):
            self._db.execute(
                "INSERT INTO refused_asks VALUES (?, ?, ?, ?, ?) ON CONFLICT (digest) DO UPDATE"
                " SET surface = excluded.surface, name = excluded.name,"
                " shown = excluded.shown, refused_ms = excluded.refused_ms",
                (digest, surface, name, shown, now),
            )
            self._db.execute(
                "DELETE FROM refused_asks WHERE refused_ms < ?", (now - KEPT_S * 1000,)
            )
            # Past the bound the oldest go (the index walks MAX_REFUSED_ASKS rows).
            self._db.execute(
                "DELETE FROM refused_asks WHERE rowid IN (SELECT rowid FROM refused_asks"
                " ORDER BY refused_ms DESC, rowid DESC LIMIT -1 OFFSET ?)",
                (MAX_REFUSED_ASKS,),
            )

    def find(self, surface: str, digest: str, *, now: int | None = None) -> RefusedAsk | None:
        """The ask of this surface and digest refused here within KEPT_S, if any."""
        since = (now_ms() if now is None else now) - KEPT_S * 1000
        row = self._db.execute(
            "SELECT surface, digest, name, shown, refused_ms FROM refused_asks"
            " WHERE digest = ? AND surface = ? AND refused_ms >= ?",
            (digest, surface, since),
        ).fetchone()
        return None if row is None else RefusedAsk(*row)
