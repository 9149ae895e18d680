"""`agentworker record PLAN`: a plan's calls, as a replay script.

Each call of the plan becomes a step, in the order the calls started, with its
expectation filled from what happened: the status, the error code, the result
(less the fields that differ from run to run or machine to machine: times,
durations, owners, HTTP headers), exec's exit code and the result blob's digest.
A call's args are known only if recording was switched on for the plan when it
ran (`agentworker record start PLAN`); calls without them are written as comments.
A plan is one server's (plan ids are unique per server only): its script holds that
server's calls, never another server's in a plan of the same id (review12 04).
A refused call's request blob was not kept (worker.core.recording): its step goes
without it, after a comment saying so; a call that ran but whose blob the
recordings' bound left out is written as a comment too (it cannot be replayed as it
was).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from worker.core.approvals import inert
from worker.core.ledger import UNRECORDED_SERVER
from worker.core.recording import RecordedCall, Recordings
from worker.core.telemetry import has_server_column
from worker.replay.script import DEFAULT_SURFACE, FORMAT_VERSION, HEADER_KEY

# Result fields left out of a recorded expectation: they differ between two runs of
# the same call (times, durations, headers with dates) or between machines (owners).
VOLATILE: Final = frozenset(
    {"mtime", "atime", "ctime", "duration_ms", "uid", "gid", "owner", "group", "headers"}
)


MAX_WAIT_MS: Final = 3_600_000  # the longest pause a step may ask (see Step.wait_ms)
_NO_BLOB: Final = hashlib.sha256(b"").hexdigest()


@dataclass
class Recorded:
    """A script as lines, and the request blobs its steps name (file name → bytes)."""

    lines: list[str] = field(default_factory=list)
    blobs: dict[str, bytes] = field(default_factory=dict)
    steps: int = 0
    without_args: int = 0
    redacted: int = 0

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def stable(value: Any) -> Any:
    """`value` without its volatile fields, at any depth."""
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


def expectation(row: dict[str, Any], call: RecordedCall) -> dict[str, Any]:
    if row["status"] != "ok":
        return {"status": "error", "error_code": row["error_code"]}
    expect: dict[str, Any] = {"status": "ok"}
    result = json.loads(call.result_json) if call.result_json else None
    if isinstance(result, dict):
        if result.get("exit_code") is not None:
            expect["exit_code"] = result["exit_code"]
        kept = stable({k: v for k, v in result.items() if k != "exit_code"})
        if kept:
            expect["result"] = kept
    if call.result_blob_sha256 != _NO_BLOB:
        expect["blob_sha256"] = call.result_blob_sha256
    return expect


def _when(unix_ms: int) -> str:
    return datetime.fromtimestamp(unix_ms / 1000, UTC).isoformat(timespec="seconds")


def _comment(text: str) -> str:
    """`text` (a server's id or name) as it may stand in a comment line: every line
    break and control character escaped, so it cannot end the comment and start a
    step of its own."""
    return inert(text, 1000)


def servers_of_plan(conn: sqlite3.Connection, plan_id: str) -> list[str]:
    """The servers with calls in a plan of this id, in the telemetry (rows from before
    rows kept their server, not converted yet, are UNRECORDED_SERVER's)."""
    if not has_server_column(conn):
        found = conn.execute(
            "SELECT 1 FROM invocations WHERE plan_id = ? LIMIT 1", (plan_id,)
        ).fetchone()
        return [UNRECORDED_SERVER] if found else []
    rows = conn.execute(
        "SELECT DISTINCT server FROM invocations WHERE plan_id = ? ORDER BY server", (plan_id,)
    )
    return [str(server) for (server,) in rows]


def record(
    conn: sqlite3.Connection, server: str, plan_id: str, blob_dir: str, *, timing: bool = False
) -> Recorded:
    """The server's plan's calls as a script; request blobs are named
    `<blob_dir>/step-N.bin`. With `timing`, each step waits as long as the session
    paused before the call."""
    recorded_calls = Recordings(conn).calls(server, plan_id)
    select = (
        "SELECT correlation_id, worker_id, agent_id, task_id, surface, action, status,"
        " error_code, started_unix_ms, finished_unix_ms FROM invocations WHERE plan_id = ?"
    )
    order = " ORDER BY started_unix_ms, rowid"
    if has_server_column(conn):
        rows = conn.execute(select + " AND server = ?" + order, (plan_id, server)).fetchall()
    elif server == UNRECORDED_SERVER:  # not converted yet: every row is from before
        rows = conn.execute(select + order, (plan_id,)).fetchall()
    else:
        rows = []
    names = (
        "correlation_id",
        "worker_id",
        "agent_id",
        "task_id",
        "surface",
        "action",
        "status",
        "error_code",
        "started_unix_ms",
        "finished_unix_ms",
    )
    out = Recorded()
    workers = sorted({row[1] for row in rows if row[1]})
    header = {
        HEADER_KEY: FORMAT_VERSION,
        "plan": plan_id,
        "note": f"recorded from plan {plan_id}"
        + (f" on {', '.join(workers)}" if workers else "")
        + (f", {_when(rows[0][8])} to {_when(rows[-1][8])}" if rows else ""),
    }
    out.lines.append(json.dumps(header, ensure_ascii=False))
    previous_end: int | None = None
    for values in rows:
        row = dict(zip(names, values, strict=True))
        pause = 0 if previous_end is None else row["started_unix_ms"] - previous_end
        previous_end = max(previous_end or 0, row["finished_unix_ms"])
        name = f"{row['surface']}.{row['action']}"
        call = recorded_calls.get(row["correlation_id"])
        if not row["action"]:
            out.lines.append(
                f"# {_when(row['started_unix_ms'])} call {_comment(row['correlation_id'])}: "
                f"{_comment(row['error_code'] or row['status'])}, its action unknown; "
                "not replayable"
            )
            continue
        if call is None or call.args_json is None:
            out.without_args += 1
            why = (
                "recording was off for the plan"
                if call is None
                else "the recordings reached their bound"
                if call.past_bound
                else "they were not JSON"
            )
            outcome = row["status"] + (f" {row['error_code']}" if row["error_code"] else "")
            out.lines.append(
                f"# {_when(row['started_unix_ms'])} {_comment(name)} ({_comment(outcome)}): "
                f"its args were not kept ({why})"
            )
            continue
        if call.blob_left_out and row["status"] == "ok":
            out.without_args += 1
            out.lines.append(
                f"# {_when(row['started_unix_ms'])} {_comment(name)} (ok): its request blob "
                f"({call.blob_left_out} bytes) was not kept (the recordings reached their "
                "bound); not replayable"
            )
            continue
        if call.blob_left_out:
            out.lines.append(
                f"# its request blob ({call.blob_left_out} bytes) was not kept (refused before "
                "it ran, or past the recordings' bound): the step below goes without it"
            )
        out.steps += 1
        step: dict[str, Any] = {
            "action": row["action"] if row["surface"] == DEFAULT_SURFACE else name,
            "args": json.loads(call.args_json),
        }
        if call.request_blob:
            blob_name = f"{blob_dir}/step-{out.steps}.bin"
            out.blobs[blob_name] = call.request_blob
            step["blob"] = blob_name
        step["agent"] = row["agent_id"]
        if row["task_id"]:
            step["task"] = row["task_id"]
        if timing and pause > 0:
            step["wait_ms"] = min(pause, MAX_WAIT_MS)
        step["expect"] = expectation(row, call)
        if call.redacted:
            out.redacted += 1
            out.lines.append(
                "# secret-looking values below were masked (***): put real ones in to replay"
            )
        out.lines.append(json.dumps(step, ensure_ascii=False))
    return out
