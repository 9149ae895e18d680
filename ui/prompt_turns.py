"""Which waiting prompt the person sees next: agents take turns.

Oldest-first let one agent's many prompts push another agent's prompt back (review27
I4: 16 of one agent's, each up to a minute, stood before another's). Each agent's
prompts still come oldest first, but the agent shown least recently goes next, so
another agent's prompt is at most one prompt per waiting agent away.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def agent_of(prompt: Mapping[str, Any]) -> str:
    """Whose prompt it is: the worker's key for the agent (its id whole; the id shown
    is cut and escaped, and two agents' ids may show alike), else the id shown."""
    return str(prompt.get("agent_key") or prompt.get("agent_id") or "")


def next_in_turn(
    prompts: Iterable[Mapping[str, Any]], last_shown: Mapping[str, int]
) -> Mapping[str, Any] | None:
    """The oldest prompt of the agent whose turn it is: of the agents with a prompt
    waiting (`prompts` in arrival order), the one shown least recently (`last_shown`:
    agent -> when, in any increasing count; an agent never shown goes first), agents
    alike taken in the order of their oldest prompt."""
    oldest: dict[str, Mapping[str, Any]] = {}
    for prompt in prompts:
        oldest.setdefault(agent_of(prompt), prompt)
    if not oldest:
        return None
    turn = min(oldest, key=lambda agent: last_shown.get(agent, -1))
    return oldest[turn]


def of_agent(prompts: Iterable[Mapping[str, Any]], agent: str) -> list[str]:
    """The ids of `agent`'s waiting prompts, oldest first."""
    return [str(prompt["id"]) for prompt in prompts if agent_of(prompt) == agent]
