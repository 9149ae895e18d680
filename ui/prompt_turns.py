"""Which waiting prompt the person sees next: agents take turns.

Oldest-first let one agent's many prompts push another agent's prompt back (review27
I4: 16 of one agent's, each up to a minute, stood before another's). Each agent's
prompts still come oldest first, and agents are ranked on one count of events: an agent
by when its last turn ended, or when its oldest waiting prompt came if that is later
(an agent never shown: when it came). So a prompt that came during another agent's
turn goes before that agent's next one, and another agent's prompt is at most one
prompt per agent waiting before it away.

An agent id is only what the caller says. "An agent never shown goes first" (4bbcc78)
let a caller naming a fresh agent for each prompt stand before a prompt that came
earlier, for as long as it kept one fresh id waiting (review29 t1); ranked by when its
prompt came, a fresh id now queues behind every agent already waiting then.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Any


def agent_of(prompt: Mapping[str, Any]) -> str:
    """Whose prompt it is: the worker's key for the agent (its id whole; the id shown
    is cut and escaped, and two agents' ids may show alike), else the id shown."""
    return str(prompt.get("agent_key") or prompt.get("agent_id") or "")


def next_in_turn(
    prompts: Iterable[Mapping[str, Any]],
    turn_ended: Mapping[str, int],
    came: Mapping[str, int],
) -> Mapping[str, Any] | None:
    """The oldest prompt of the agent whose turn it is: of the agents with a prompt
    waiting (`prompts` in arrival order), the one whose rank is lowest, the later of
    when its last turn ended (`turn_ended`: agent -> count) and when its oldest waiting
    prompt came (`came`: prompt id -> count, on the same count); ties by arrival."""
    oldest: dict[str, Mapping[str, Any]] = {}
    for prompt in prompts:
        oldest.setdefault(agent_of(prompt), prompt)
    if not oldest:
        return None

    def rank(agent: str) -> int:
        return max(turn_ended.get(agent, -1), came.get(str(oldest[agent]["id"]), -1))

    return oldest[min(oldest, key=rank)]


class Turns:
    """The counts `next_in_turn` ranks by, for the prompts waiting in one TUI."""

    def __init__(self) -> None:
        self._count = itertools.count()
        self._came: dict[str, int] = {}  # prompt id -> when it came
        self._turn_ended: dict[str, int] = {}  # agent -> when its last turn ended

    def came(self, prompt_id: str) -> None:
        """A prompt came (an update of one waiting keeps its place)."""
        self._came.setdefault(prompt_id, next(self._count))

    def ended(self, agent: str) -> None:
        """`agent`'s prompt left the screen (answered, or it went away)."""
        self._turn_ended[agent] = next(self._count)

    def next(self, waiting: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any] | None:
        """The prompt to show of `waiting` (prompt id -> prompt, in arrival order). What
        is kept of prompts and agents no longer waiting is dropped: an agent's prompt
        that comes later ranks by when it came, after its turn ended anyway."""
        self._came = {i: at for i, at in self._came.items() if i in waiting}
        agents = {agent_of(p) for p in waiting.values()}
        self._turn_ended = {a: at for a, at in self._turn_ended.items() if a in agents}
        return next_in_turn(waiting.values(), self._turn_ended, self._came)


def of_agent(prompts: Iterable[Mapping[str, Any]], agent: str) -> list[str]:
    """The ids of `agent`'s waiting prompts, oldest first."""
    return [str(prompt["id"]) for prompt in prompts if agent_of(prompt) == agent]
