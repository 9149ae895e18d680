"""The hub's log lines for the audit events workers send: counted, not one per event.

Every refused call is an audit event (scope_required needs no grant at all), and a
line of ~400 B per event let an agent grow the log by some 53 KiB/s (review10
finding 12). The audit table keeps each event; the log only says what is going on:
the first event of a (worker, agent, kind) in an interval is logged whole, the rest
of that interval as one line with their count when the interval ends. At most
MAX_KEYS keys are told apart in an interval; events of further agents are counted
together, so rotating agent ids buys no more lines.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final, TypeAlias

from worker.wire.proto import agentworker_pb2 as pb

log = logging.getLogger(__name__)

INTERVAL_S: Final = 60.0
MAX_KEYS: Final = 64
OTHER_AGENTS: Final = "(other agents)"

# Of what a worker sends only to be logged (audit events, its goodbye), the hub logs at
# most this many characters of a text; audit events are counted (hub.audit_log).
LOGGED_CHARS: Final = 1000


def shown(text: str) -> str:
    """`text` as the hub logs what a worker sent: at most LOGGED_CHARS of it."""
    if len(text) <= LOGGED_CHARS:
        return text
    return f"{text[:LOGGED_CHARS]}... ({len(text):,} characters)"


_Key: TypeAlias = tuple[str, str, str]  # worker, agent, kind


class AuditLines:
    """Counts audit events and logs them an interval at a time (on the event loop)."""

    def __init__(self, interval_s: float = INTERVAL_S, shown: Callable[[str], str] = str) -> None:
        self.interval_s = interval_s
        self._shown = shown  # a text the worker sent, as logged (cut short)
        self._counted: dict[_Key, int] = {}  # events of this interval not logged yet
        self._timer: asyncio.TimerHandle | None = None

    def event(self, worker_id: str, event: pb.AuditEvent) -> None:
        key = (worker_id, event.agent_id, event.kind)
        if key in self._counted:
            self._counted[key] += 1
            return
        if len(self._counted) >= MAX_KEYS:
            other = (worker_id, OTHER_AGENTS, event.kind)
            self._counted[other] = self._counted.get(other, 0) + 1
            return
        self._counted[key] = 0
        log.info(
            "audit from %s: %s (agent %s) %s",
            worker_id,
            self._shown(event.kind),
            self._shown(event.agent_id or "-"),
            self._shown(event.detail_json),
        )
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.interval_s, self.flush)

    def flush(self) -> None:
        """Log the counted events, and start the next interval."""
        self._timer = None
        counted, self._counted = self._counted, {}
        for (worker_id, agent_id, kind), count in counted.items():
            if count:
                log.info(
                    "audit from %s: %d more %s of agent %s in the last %.0f s "
                    "(each is in the worker's audit table: agentworker audit)",
                    worker_id,
                    count,
                    self._shown(kind),
                    self._shown(agent_id or "-"),
                    self.interval_s,
                )

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.flush()
