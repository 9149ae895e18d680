"""Scripted replays: run a JSON Lines script of actions against a worker and check
each answer; `record` turns a plan's calls into such a script.

    script    the format (models, parser, the shipped JSON Schema, step ids)
    expect    an answer against its expectation, and the diff when it falls short
    targets   where steps run: a worker built in this process, or through a hub
    runner    the run (tolerant or fail-fast) and the dry run
    render    the progress bar and the summary a person reads
"""

from worker.replay.expect import Answer, Mismatch, check
from worker.replay.runner import Report, StepReport, interrupted, replay, validate
from worker.replay.script import (
    FORMAT_VERSION,
    Entry,
    Expect,
    Header,
    Malformed,
    Script,
    Step,
    line_schema,
    load,
    parse,
    shipped_schema,
)
from worker.replay.targets import config_for_replay, in_process, through_hub

__all__ = [
    "FORMAT_VERSION",
    "Answer",
    "Entry",
    "Expect",
    "Header",
    "Malformed",
    "Mismatch",
    "Report",
    "Script",
    "Step",
    "StepReport",
    "check",
    "config_for_replay",
    "in_process",
    "interrupted",
    "line_schema",
    "load",
    "parse",
    "replay",
    "shipped_schema",
    "through_hub",
    "validate",
]
