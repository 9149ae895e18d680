"""`agentworker call`, `workers` and `status`: questions for a hub's ControlService."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from worker.cli._common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    add_server_flags,
    config_of,
    iso,
    json_shown,
    shown,
    with_client,
)

if TYPE_CHECKING:
    from worker.config import Paths
    from worker.hub.client import ControlClient


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    call = sub.add_parser(
        "call",
        help="run one action through the hub and print the result as JSON",
        description='Example: agentworker call fs_stat \'{"path": "."}\' --agent me. '
        "ACTION is surface.action; a bare name means workerHost.NAME, or "
        "workerComputer.NAME for a computer action (screenshot, mouse_click, ...).",
    )
    call.add_argument("action", metavar="ACTION")
    call.add_argument("args", metavar="JSON", nargs="?", default="{}", help="the action's args")
    call.add_argument("--plan", default="", help="plan id (kill switch and grants are per plan)")
    call.add_argument("--agent", default="cli", help="agent id the call is made as (default cli)")
    call.add_argument("--worker", default="", help="worker id, when several are connected")
    call.add_argument("--task", default="", help="task id, for telemetry")
    call.add_argument("--id", default="", help="correlation id; reuse one to retry safely")
    call.add_argument("--timeout", type=float, default=0, help="deadline in seconds")
    call.add_argument("--blob-in", type=Path, help="send this file's bytes as the request blob")
    call.add_argument("--blob-out", type=Path, help="write the result blob to this file")
    # The result is always JSON; the flag is accepted as on the other verbs.
    call.add_argument("--json", action="store_true", help="machine-readable output (always)")
    add_server_flags(call)
    call.set_defaults(handler=_call)

    workers = sub.add_parser(
        "workers",
        help="list the workers the hub knows; accept, refuse or forget one",
        description="A hub serves a worker only with the key its operator accepted for "
        "the worker's id. A worker not accepted yet is listed as pending with its key's "
        "fingerprint: compare it with the one the worker printed at its start "
        "('key fingerprint ...'), then `agentworker workers accept ID`. With the whole "
        "fingerprint (--fingerprint) a worker is accepted even while not listed: its "
        "next Hello is served.",
    )
    workers.add_argument("--json", action="store_true", help="machine-readable output")
    add_server_flags(workers)
    workers.set_defaults(handler=_workers)
    decisions = workers.add_subparsers(dest="decision", metavar="{accept,refuse,forget}")
    for verb, what in (
        ("accept", "serve this worker id with the key it came with (and no other)"),
        ("refuse", "refuse this worker id's Hellos with that key; it gets nothing here"),
        ("forget", "forget every decision about the id: its next Hello waits again"),
    ):
        decide = decisions.add_parser(verb, help=what, description=what)
        decide.add_argument("worker_id", metavar="ID", help="the worker's id, as listed")
        if verb != "forget":
            decide.add_argument(
                "--fingerprint",
                default="",
                help="which key (the start of its fingerprint, as the worker printed it); "
                "needed when the id came with more than one"
                + (
                    "; the whole fingerprint accepts the key ahead of its next Hello"
                    if verb == "accept"
                    else ""
                ),
            )
        add_server_flags(decide)
        decide.set_defaults(handler=_decide)

    status = sub.add_parser("status", help="connected / disconnected / unconfigured")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    add_server_flags(status)
    status.set_defaults(handler=_status)


def _call(paths: Paths, args: argparse.Namespace) -> int:
    from worker.cli import _blobs

    surface, _, action = args.action.rpartition(".")
    if not surface:  # a bare name: the computer surface's list says whose it is
        from worker.surfaces import COMPUTER_ACTIONS

        surface = "workerComputer" if action in COMPUTER_ACTIONS else "workerHost"
    # Checked before anything is sent: a missing file must not cost an action's run.
    blob = _blobs.read_blob_in(args.action, args.blob_in)
    _blobs.check_blob_out(args.blob_out)
    on_its_way = False  # once it is, Ctrl-C leaves the call running: say so

    async def body(client: ControlClient) -> int:
        nonlocal on_its_way
        import asyncio

        # Loaded by with_client once the channel is connecting (see there).
        from worker.hub.client import result_to_dict
        from worker.wire.proto import agentworker_pb2 as pb

        sent = client.begin_dispatch(
            headers_early=True,
            worker_id=args.worker,
            correlation_id=args.id,
            plan_id=args.plan,
            agent_id=args.agent,
            task_id=args.task,
            surface=surface,
            action=action,
            args_json=args.args,
            blob=blob,
            timeout_ms=int(args.timeout * 1000),
        )
        on_its_way = True
        told = asyncio.ensure_future(_say_when_asked(sent))
        # One turn of the loop sends it; json (for the answer, a few ms to load) then
        # loads while the hub and the worker run the call (issue 12: `call` at once).
        await asyncio.sleep(0)
        import json  # noqa: F401 - used by result_to_dict and json_shown

        try:
            response = await sent
        finally:
            told.cancel()
        ok = response.result.status == pb.ActionResult.OK
        # The blob file first: a reader that has the answer may open it at once.
        note = _blobs.write_blob_out(args.blob_out, ok, response.result.blob)
        # Flushed at once: a reader on a pipe has the answer now, not after the
        # channel, the event loop and the interpreter have closed (stdout on a pipe
        # is block-buffered and would wait for the exit).
        shown_result = result_to_dict(response)
        print(json_shown(shown_result, indent=2), flush=True)
        if note:
            print(f"agentworker: {note}", file=sys.stderr)
        if _masked_replay(shown_result):
            print(
                f"agentworker: call {shown(response.result.correlation_id)} already ran: this "
                "is its record, not a new run, and its secrets (Set-Cookie, tokens) were "
                "masked once delivered; the *** in it are not what the server sent. Run it "
                "under a new --id to get them.",
                file=sys.stderr,
            )
        return EXIT_OK if ok else EXIT_FAILED

    try:
        return with_client(paths, args, body)
    except KeyboardInterrupt:
        left = _left_running(args, f"{surface}.{action}", on_its_way)
        print(f"agentworker: {left}", file=sys.stderr)
        return EXIT_INTERRUPTED


async def _say_when_asked(sent: object) -> None:
    """Says once, on stderr, that the call waits for the person's approval, as soon as
    the hub's headers say so (ActionAck.AWAITING_APPROVAL): the person asked may be the
    one waiting here, and a silent wait looked like a hung call."""
    import asyncio

    import grpc  # loaded already: the channel is open

    from worker.hub.client import AWAITING_APPROVAL

    if not isinstance(sent, grpc.aio.Call):  # sent up in parts: its headers say that
        return
    try:
        got = tuple(await sent.initial_metadata() or ())
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError):  # its answer says how
        return
    if AWAITING_APPROVAL in got and not sent.done():
        print(
            "agentworker: waiting for approval: the worker asks its person about this call. "
            "Answer the prompt in the agentworker TUI (the terminal of `agentworker up`, "
            "or `agentworker ui`); no answer in time is a denial.",
            file=sys.stderr,
            flush=True,
        )


def _left_running(args: argparse.Namespace, name: str, sent: bool) -> str:
    """What Ctrl-C did to a call, and what the person can do about it: the hub and
    the worker run a sent call on (a caller's leaving cancels nothing), and its
    answer is lost to this command."""
    if not sent:
        return f"interrupted: {shown(name)} was not sent"
    plan = shown(args.plan)
    stop = (
        f"To stop it: agentworker kill {plan} (then agentworker lift {plan})."
        if args.plan
        else "A call without --plan is stopped only by agentworker pause (every call)."
    )
    again = (
        f" The same call with --id {shown(args.id)} answers from the hub's record, "
        "never running it twice."
        if args.id
        else ""
    )
    return (
        f"interrupted: {shown(name)} was sent and may still run on the worker; this "
        f"command no longer waits for its answer. Its outcome: agentworker telemetry "
        f"tail. {stop}{again}"
    )


def _masked_replay(shown_result: dict[str, Any]) -> bool:
    """Whether a call's answer is its record with secrets masked (review26 H7): a person
    reading the JSON could take the *** for the values, so stderr says so too."""
    error = shown_result.get("error") or {}
    details = error.get("details")
    return (
        error.get("code") == "blob_gone"
        and isinstance(details, dict)
        and bool(details.get("masked"))
    )


def _workers(paths: Paths, args: argparse.Namespace) -> int:
    import json

    from worker.wire.proto import agentworker_pb2 as pb

    async def body(client: ControlClient) -> int:
        reply = await client.stub.ListWorkers(pb.ListWorkersRequest(), metadata=client.metadata)
        rows = [
            {
                "worker_id": w.worker_id,
                "connected": w.connected,
                "state": pb.Heartbeat.State.Name(w.state).lower(),
                "in_flight": w.in_flight,
                "max_concurrency": w.max_concurrency,
                "version": w.version,
                "last_seen": iso(w.last_seen_unix_ms),
                "actions": list(w.actions),
                "enrolment": w.enrolment or "not accepted",
                "fingerprint": w.fingerprint,
            }
            for w in reply.workers
        ]
        if args.json:
            print(json.dumps(rows, indent=2))
        elif not rows:
            print("no workers yet: start one with `agentworker run` (or use `agentworker up`)")
        else:
            for r in rows:
                link = "connected" if r["connected"] else f"last seen {r['last_seen']}"
                key = f", key {r['fingerprint']}" if r["fingerprint"] else ""
                print(
                    f"{shown(str(r['worker_id']))}  {r['enrolment']}{key}  {link}  "
                    f"in flight {r['in_flight']}/{r['max_concurrency']}"
                )
            waiting = [r for r in rows if r["enrolment"] == "pending"]
            if waiting:
                print(
                    f"{len(waiting)} waiting: compare each fingerprint with what its worker "
                    "printed at its start, then `agentworker workers accept ID`"
                )
            accepted = {r["worker_id"] for r in rows if r["enrolment"] == "accepted"}
            for r in waiting:
                if r["worker_id"] in accepted:
                    print(_second_key_warning(str(r["worker_id"]), str(r["fingerprint"])))
        return EXIT_OK

    return with_client(paths, args, body)


def _second_key_warning(worker_id: str, fingerprint: str) -> str:
    """What a pending key under an accepted worker's id may be, and how to tell: a
    worker given a new key (a new worker.key, or an upgrade from before per-server
    keys), or another program saying Hello under that id."""
    return (
        f"{shown(worker_id)}: a second key (fingerprint {fingerprint}) says Hello under this "
        "accepted worker's id: its worker has a new key (a new worker.key, or an upgrade), "
        "or another program claims the id. Accept it only if the worker printed this "
        "fingerprint in its 'dialling' line: "
        f"`agentworker workers accept {shown(worker_id)} --fingerprint {fingerprint}`"
    )


def _decide(paths: Paths, args: argparse.Namespace) -> int:
    import grpc

    from worker.wire.proto import agentworker_pb2 as pb

    decision = {
        "accept": pb.DecideWorkerRequest.ACCEPT,
        "refuse": pb.DecideWorkerRequest.REFUSE,
        "forget": pb.DecideWorkerRequest.FORGET,
    }[args.decision]
    request = pb.DecideWorkerRequest(
        worker_id=args.worker_id,
        decision=decision,
        fingerprint=getattr(args, "fingerprint", ""),
    )

    async def body(client: ControlClient) -> int:
        try:
            reply = await client.stub.DecideWorker(request, metadata=client.metadata)
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
                raise
            print(f"agentworker: {shown(exc.details() or '')}", file=sys.stderr)
            return EXIT_FAILED
        print(shown(reply.message))
        return EXIT_OK

    return with_client(paths, args, body)


def _status(paths: Paths, args: argparse.Namespace) -> int:
    import json

    from worker.errors import (
        CredentialsError,
        HubUnreachableError,
        NotYourHubError,
        TokenNotSentError,
        TokenRefusedError,
    )
    from worker.wire.proto import agentworker_pb2 as pb

    try:
        return _ask_status(paths, args, pb)
    except TokenNotSentError as needed:  # another hub named, and no token for it
        if args.json:
            print(json_shown({"state": "token_needed", "message": needed.message}))
        else:
            print(f"agentworker: {shown(needed.message)}", file=sys.stderr)
        return needed.exit_code
    except NotYourHubError as refused:  # another user's listener: no token was sent
        if args.json:
            print(json_shown({"state": "not_your_hub", "message": refused.message}))
        else:
            print(f"agentworker: {shown(refused.message)}", file=sys.stderr)
        return refused.exit_code
    except TokenRefusedError as refused:  # a hub answered: not "no hub"
        if args.json:
            print(json_shown({"state": "token_refused", "message": refused.message}))
        else:
            print(f"agentworker: {shown(refused.message)}", file=sys.stderr)
        return refused.exit_code
    except (HubUnreachableError, CredentialsError):  # no token file: no hub ran here
        address = args.server or config_of(paths, args).hub.listen
        hint = "start one with `agentworker up` (or `agentworker service install`)"
        if args.json:
            print(json.dumps({"state": "no_hub", "address": address, "hint": hint}))
        else:
            print(f"no hub answered at {address}: {hint}", file=sys.stderr)
        return HubUnreachableError.exit_code


def _ask_status(paths: Paths, args: argparse.Namespace, pb: Any) -> int:
    import json

    async def body(client: ControlClient) -> int:
        reply = await client.stub.Status(pb.StatusRequest(), metadata=client.metadata)
        state = pb.StatusResponse.State.Name(reply.state).lower()
        if args.json:
            print(
                json.dumps(
                    {
                        "state": state,
                        "connected_workers": reply.connected_workers,
                        "known_workers": reply.known_workers,
                        "version": reply.version,
                    }
                )
            )
        else:
            print(
                f"{state}: {reply.connected_workers} of {reply.known_workers} worker(s) connected"
            )
        return EXIT_OK if reply.state == pb.StatusResponse.CONNECTED else EXIT_FAILED

    return with_client(paths, args, body)
