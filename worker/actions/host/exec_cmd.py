"""workerHost.exec: run one allowlisted program, sandboxed, and return what it printed.

The argument list goes straight to the program: no shell ever sees it, so `;`,
`&&`, `$(...)`, backticks and newlines are just text. The allowlist decides
whether it may run and pins the executable's path; the sandbox (sandbox.process)
shows the program only the shared folders, rebuilds its environment from a
pass-list, limits its CPU, memory, files and processes, and kills every process
it started when the timeout, a Cancel or the plan's kill switch ends the call.

The result carries the exit code (or terminating signal); the blob carries stdout
then stderr, `stdout_bytes` and `stderr_bytes` long, at most 1 MiB together
(`truncated` says whether more was printed and discarded). Running out of the
call's own `timeout_s` is a result (`timed_out`, with the output so far); the
request's deadline passing first is the `timeout` error.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import os
import shlex
import signal
import stat
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Annotated, Any, Final, NamedTuple

import orjson
from pydantic import AfterValidator, Field

from allowlist import Decision, Refusal
from sandbox import HeldError, Root, confinement, environment
from sandbox.held import (
    Pin,
    PinDeniedError,
    Registered,
    at_or_beneath,
    held_files,
    pins_for,
)
from sandbox.process import (
    Completed,
    Limits,
    Mount,
    SandboxUnavailableError,
    View,
    run,
    visible_by_default,
)
from worker.actions.host.exec_arg_files import (
    LISTED_AT_MOST,
    ArgFile,
    Finder,
    arg_files,
    as_found,
    followed_as_run,
    held_places,
    not_held,
    reads_argument_files,
    written_beside,
)
from worker.actions.host.exec_git import git_view
from worker.actions.host.exec_policy import REFUSAL_CODES, check_walked, path_check, policy_for
from worker.actions.host.fs_paths import (
    CONFINED_CODES,
    all_local,
    busy_held,
    confined,
    hanging_root,
    in_thread,
)
from worker.config import ExecSection, Paths
from worker.core.blob_files import check_hasher
from worker.core.prompt_text import one_line
from worker.core.registry import MIB, ActionSpec, Args, Context, Json, Outcome, PathArg, Result
from worker.core.scopes import ask_name
from worker.errors import ErrorCode, WorkerError

OUTPUT_BYTES: Final = 1 * MIB  # stdout + stderr together, per call


ARG_BYTES: Final = 131_071  # the kernel's limit per argument (MAX_ARG_STRLEN), less the NUL


def _argument(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL bytes")
    try:
        size = len(os.fsencode(value))
    except UnicodeError:
        raise ValueError("is not text a program can be given (a lone surrogate)") from None
    if size > ARG_BYTES:
        raise ValueError(
            f"is {size:,} bytes; the kernel takes at most {ARG_BYTES:,} bytes per argument "
            "(pass longer data as the blob, on stdin)"
        )
    return value


Argument = Annotated[str, AfterValidator(_argument)]


class ExecArgs(Args):
    argv: list[Argument] = Field(min_length=1, max_length=4096)
    cwd: PathArg | None = None  # default: the first shared folder
    timeout_s: float | None = Field(default=None, gt=0)


class ExecResult(Result):
    program: str  # the pinned path that ran
    rule: str  # the allowlist rule that admitted it
    exit_code: int | None  # None when a signal ended it
    signal: str | None  # e.g. "SIGKILL"
    timed_out: bool
    stdout_bytes: int  # the blob is stdout, then stderr
    stderr_bytes: int
    truncated: bool
    duration_ms: int
    # Sandbox mode with a cgroup per plan: the plan's limits met while this program ran
    # ("memory": the kernel killed a process of the plan for want of memory;
    # "processes": a fork was refused at the plan's cap; "cpu": the plan was throttled).
    plan_limits: list[str] = []


async def exec_command(ctx: Context, args: ExecArgs) -> Outcome[ExecResult]:
    settings = ctx.config.exec
    timeout_s = _timeout(args, settings)
    # The working folder's and the arguments' lookups, and the roots' own, on the loop
    # only where none can hang (fs_paths.on_loop); elsewhere in a thread of the lane of
    # the working folder's root (or of the first root whose lookups may hang).
    local = all_local(ctx)
    lane = None if local else hanging_root(ctx, args.cwd, reaching_all=True)
    if local:
        cwd, decision, program = _judged(ctx, args)
    else:
        cwd, decision, program = await in_thread(ctx, lane, _judged, ctx, args, looks=True)
    with await held_while_asked(ctx, decision, cwd, args.argv, lane=lane) as holding:
        if decision.verdict == "ask":
            stdin = await stdin_sha256(ctx.blob)
            files = await in_thread(ctx, lane, arg_files, ctx.roots, cwd, args.argv, looks=True)
            files += holding.unbound()
            await ctx.approve(
                *ask_about(
                    "workerHost", args.argv, cwd, decision.reason, stdin, len(ctx.blob), files
                )
            )
        assert decision.program is not None
        why = (
            _moved(ctx.roots)
            if local
            else await in_thread(ctx, lane, _moved, ctx.roots, looks=True)
        )
        if why is not None:
            raise WorkerError("sandbox_unavailable", why)
        entry = await landlock_entry(settings, ctx.paths)
        if decision.program.network:
            why = confinement.abstract_sockets_open(
                entry,
                confinement.landlock_for(ctx.paths.exec_cache, settings.cc),
                decision.program.unix_sockets,
            )
            if why is not None:
                raise WorkerError("sandbox_unavailable", f"{why}: rule {decision.rule_id} not run")
        lane = None if local else hanging_root(ctx, cwd, reaching_all=True)
        thread = functools.partial(in_thread, ctx, lane)
        async with git_view(decision.program, program, ctx.roots, cwd, thread) as git:
            if decision.walks and not ctx.config.fs.allow_hard_links:
                await thread(check_walked, ctx.roots, cwd, decision.searched, git.env, looks=True)
            view = View(
                cwd=cwd,
                mounts=tuple(Mount(str(root.path), root.writable) for root in ctx.roots),
                env=environment.build(
                    os.environ, settings.pass_env, {**decision.program.env, **git.env}
                ),
                hidden=_withheld(ctx.roots),
                extra_files=() if visible_by_default(program) else (program,),
                private=tuple(git.private),
                network=decision.program.network,
                unix_sockets=decision.program.unix_sockets,
                bwrap=settings.bwrap,
                entry=entry,
            )
            warm = ctx.containment.warm
            warm.most, warm.idle_s = settings.ahead_plans, settings.ahead_idle_s  # as reloaded
            async with shown_held(ctx, ctx.roots, thread) as pins:
                try:
                    done = await run(
                        [program, *args.argv[1:]],
                        view,
                        limits_of(settings, timeout_s),
                        ctx.blob or None,
                        pid_cap=ctx.containment.pid_cap,
                        starts=ctx.containment.starts,
                        hash_output=check_hasher,
                        # Claimed while bubblewrap builds the sandbox, which waits for it;
                        # or, in one built ahead for the plan (sandbox.warm), before it is
                        # sent.
                        claim=ctx.claim,
                        warm=warm,
                        warm_for=ctx.plan_id,
                        pins=pins,
                    )
                except SandboxUnavailableError as exc:
                    raise WorkerError("sandbox_unavailable", str(exc)) from None
        return Outcome(
            result_of(program, decision.rule_id or "", done),
            blob=done.stdout + done.stderr,
            truncated=done.truncated,
            blob_check=done.output_digest,
        )


class Holding(NamedTuple):
    """What an asked command's hold could not make last (sandbox.held): `writers`,
    calls whose programs run and may write what it holds; `unfollowed`, links in its
    folder arguments it did not follow."""

    writers: tuple[str, ...] = ()
    unfollowed: tuple[str, ...] = ()

    def unbound(self) -> tuple[ArgFile, ...]:
        """The bindings that say so (a nonce each): its approval answers its call only."""
        return ((written_beside(self.writers),) if self.writers else ()) + (
            (not_held(self.unfollowed),) if self.unfollowed else ()
        )


async def held_while_asked(
    ctx: Context,
    decision: Decision,
    cwd: str,
    argv: Sequence[str],
    where: Finder = as_found,
    *,
    lane: Root | None = None,
) -> contextlib.AbstractContextManager[Holding]:
    """For an asked command, what its arguments name held still (sandbox.held) from now,
    before the look at them, until the returned block ends with its program (review18
    F5); `busy` when an fs_write is writing there now. Nothing for any other."""
    if decision.verdict != "ask":
        return contextlib.nullcontext(Holding())
    look = functools.partial(in_thread, ctx, lane, held_places, ctx.roots, cwd, argv, where)
    # Only what this call could have written meanwhile, by fs_write or a program of its
    # own: places beneath its read-write shared folders (in sandbox mode, its plan's
    # workspace). `/` as an argument held every write of every plan, for as long as
    # the prompt waited (review21 B2). But a place in a shared folder, which the binder
    # binds by what it holds, holds the read-write folders beneath it (a project shared
    # read-only, its build/ read-write): unheld, an fs_write into build/ swapped the
    # approved code (review23 C13).
    writable = [str(root.path) for root in ctx.roots if root.writable]
    shared = [str(root.path) for root in ctx.roots]

    def held(named: Sequence[str]) -> list[str]:
        bound = [place for place in named if any(at_or_beneath(place, r) for r in shared)]
        return sorted(
            {place for place in named if any(at_or_beneath(place, w) for w in writable)}
            | {w for w in writable if any(at_or_beneath(w, place) for place in bound)}
        )

    places = held(await look(looks=True))
    try:
        registered = ctx.containment.held.hold(places, ctx.correlation_id, writable)
    except HeldError as exc:
        raise busy_held(exc, exc.path) from None
    with contextlib.ExitStack() as let_go:
        let_go.push(registered)  # unless its files are known: then the caller's block
        try:  # once held: what its places are, by inode (review21 B1)
            # Links followed as the binder follows them: as the program will.
            follow = functools.partial(followed_as_run, where=where)
            found = await in_thread(
                ctx, lane, held_files, places, LISTED_AT_MOST, writable, follow, looks=True
            )
            registered.know(found)
        except HeldError as exc:
            raise busy_held(exc, exc.path) from None
        if reads_argument_files(argv) and places != held(await look(looks=True)):
            # An argument file changed before it was held: the places it names now are
            # not those held, and what the look binds would not be held still.
            raise WorkerError(
                "busy",
                "an argument file this command names (@...) changed as it was being "
                "held, so what it names is not held still: run the command again once "
                "nothing is writing it",
            )
        let_go.pop_all()
    return _holding(registered, found.unfollowed)


@contextlib.contextmanager
def _holding(registered: Registered, unfollowed: tuple[str, ...]) -> Iterator[Holding]:
    with registered as writers:
        yield Holding(writers, unfollowed)


@contextlib.asynccontextmanager
async def shown_held(
    ctx: Context,
    roots: Sequence[Root],
    thread: Callable[..., Awaitable[Any]],
    inside: Callable[[str], str] = str,
) -> AsyncIterator[list[Pin]]:
    """While a program runs, it is registered as running in its read-write `roots`
    (sandbox.held): the places other calls' asked programs hold there now are bound
    read-only in its sandbox (`inside` maps a path to where it shows it), and a hold
    begun meanwhile knows it may write there."""
    writable = [str(root.path) for root in roots if root.writable]
    try:
        registered, held = ctx.containment.held.run(writable, ctx.correlation_id)
    except HeldError as exc:  # a held file has other names, or a hold is still looking
        raise busy_held(exc, exc.path) from None
    with registered:
        try:
            pins: list[Pin] = (
                await thread(pins_for, roots, held, inside, looks=True) if held else []
            )
        except PinDeniedError as exc:
            raise WorkerError(
                "busy",
                f"{exc.path} is held by a running approved command, and this program's "
                "sandbox cannot show it read-only: a folder on its way lets no one look it "
                "up (its mode was changed). Run it once that command has ended, or give "
                "the folder its mode back",
                {"path": exc.path},
            ) from None
        try:
            yield pins
        finally:
            for pin in pins:
                os.close(pin.fd)


def _judged(ctx: Context, args: ExecArgs) -> tuple[str, Decision, str]:
    """The working folder, the allowlist's decision (its paths checked by the kernel)
    and the program to run, or the refusal as a WorkerError."""
    cwd = _working_dir(ctx, args.cwd)
    check = path_check(ctx.roots, cwd, allow_hard_links=ctx.config.fs.allow_hard_links)
    decision = policy_for(ctx.config, ctx.paths, ctx.policies).decide(args.argv, check)
    return cwd, decision, _admitted(decision, ctx.roots)


def _moved(roots: Sequence[Root]) -> str | None:
    """Why a root cannot be bound and blanked by path as it was shared, or None."""
    for root in roots:
        why = root.moved()
        if why is not None:
            return why
    return None


def result_of(
    program: str, rule: str, done: Completed, *, plan_limits: Sequence[str] = ()
) -> Json | ExecResult:
    """The result of a program that ran, as ExecResult's JSON written straight from its
    plain values (building and dumping the model took ~0.06 ms of each call, on its
    way back); the model itself should orjson refuse a string (a lone surrogate)."""
    answer: dict[str, Any] = {
        "program": program,
        "rule": rule,
        "exit_code": done.exit_code,
        "signal": _signal_name(done.signal),
        "timed_out": done.timed_out,
        "stdout_bytes": len(done.stdout),
        "stderr_bytes": len(done.stderr),
        "truncated": done.truncated,
        "duration_ms": int(done.duration_s * 1000),
        "plan_limits": list(plan_limits),
    }
    try:
        return Json(orjson.dumps(answer).decode())
    except orjson.JSONEncodeError:
        return ExecResult.model_construct(**answer)


async def landlock_entry(settings: ExecSection, paths: Paths) -> str | None:
    """The sandbox's entry helper, which applies Landlock; None where this machine cannot
    have it (the worker said so at start), unless the config requires it."""
    landlock = confinement.landlock_for(paths.exec_cache, settings.cc)
    entry = await landlock.entry()
    if entry is None and settings.landlock == "require":
        raise WorkerError(
            "sandbox_unavailable",
            f'exec needs Landlock here ([exec] landlock = "require") and cannot have it: '
            f'{landlock.problem}. Fix that, or set [exec] landlock = "auto" to run in '
            "bubblewrap with seccomp only",
        )
    return entry


def limits_of(settings: ExecSection, timeout_s: float) -> Limits:
    """The one place exec's caps come from: the [exec] section and the call's timeout."""
    return Limits(
        timeout_s=timeout_s,
        output_bytes=OUTPUT_BYTES,
        cpu_s=settings.cpu_s,
        memory_bytes=settings.memory_mb * 1024**2,
        file_size_bytes=settings.file_size_mb * 1024**2,
        open_files=settings.open_files,
        processes=settings.max_processes,
        tmp_bytes=settings.tmp_mb * 1024**2,
    )


def _timeout(args: ExecArgs, settings: ExecSection) -> float:
    if args.timeout_s is None:
        return settings.default_timeout_s
    if args.timeout_s > settings.max_timeout_s:
        raise WorkerError(
            "validation_error",
            f"timeout_s {args.timeout_s:g} is over this worker's ceiling of "
            f"{settings.max_timeout_s:g} s; ask for less, or split the work",
            {"errors": [{"loc": ["timeout_s"], "msg": "over the ceiling", "type": "too_large"}]},
        )
    return args.timeout_s


# A stdin this large is hashed in a thread, off the event loop.
_STDIN_HASHED_IN_THREAD: Final = 256 * 1024


async def stdin_sha256(stdin: bytes) -> str | None:
    """The SHA-256 (hex) of an exec's stdin (its blob) that its ask binds, or None
    when there is none."""
    if not stdin:
        return None
    if len(stdin) >= _STDIN_HASHED_IN_THREAD:
        return await asyncio.to_thread(lambda: hashlib.sha256(stdin).hexdigest())
    return hashlib.sha256(stdin).hexdigest()


def ask_about(
    surface: str,
    argv: Sequence[str],
    cwd: str,
    reason: str,
    stdin: str | None = None,
    stdin_bytes: int = 0,
    files: Sequence[ArgFile] = (),
) -> tuple[str, str]:
    """What an allowlist `ask` is asked (and its approval kept) as, and what its prompt
    says. The name is bound to the whole command, its working folder and its stdin by
    a digest, so an approval "for this plan" or "for this agent" answers that command
    in that folder with that input and nothing else (keyed on the first 300
    characters, with no folder, it let any longer command with that start run unasked;
    scopes.ask_binding matches on the digest). `stdin` is the SHA-256 (hex) of the
    call's blob, the program's stdin (stdin_sha256), None when it has none: for a
    program that reads its program from stdin (`python3 -`, `sh -s`, psql, `git
    apply`), the stdin *is* the command, and an approval of one script answered every
    other (review15 05). A call with no stdin is bound to [argv, cwd] as before, so a
    grant kept before stdin was bound answers that command with no stdin only, never
    one with a stdin it was not shown. `files`: the regular files its arguments name
    (exec_arg_files), bound by their contents, so a script rewritten asks again
    (review16 F7); a call naming none is bound as before.

    The name is kept at rest (a grant for the plan or agent, audit rows, a refusal's
    message, the hub's log): it names the program, how many arguments it has, the size
    of its stdin, the folder and the digest, and no argument at all. Masked argv there
    leaked every password the masking did not know (review14 01: curl --pass, openssl
    -pass, timeout 5 curl -u ...); the digest binds the command without showing it.
    Only the prompt, which is not kept, shows the command whole, and says what its
    stdin is (its start is shown below it, as the call's blob)."""
    command = shlex.join(argv)
    bound: list[Any] = [list(argv), cwd]
    if stdin is not None:
        bound.append({"stdin_sha256": stdin})
    if files:
        bound.append({"files": [file.bound() for file in files]})
    encoded = json.dumps(bound).encode()  # ASCII: every other char escaped
    digest = hashlib.sha256(encoded).hexdigest()
    name = ask_name(
        surface,
        argv[0] if argv else "",
        len(argv) - 1,
        cwd,
        digest,
        stdin=None if stdin is None else stdin_bytes,
    )
    if stdin is None:
        given = "stdin: none (the program's input is empty)"
    else:
        given = (
            f"stdin: {stdin_bytes:,} bytes, sha256 {stdin}: the program's input, shown "
            "below as the blob; an approval is for this stdin only"
        )
    named = "".join(f"{_WHAT[file.kind]} {one_line(file.line())}\n" for file in files)
    if files:
        named += "an approval is for these files as they are: a change asks again\n"
    return name, (
        f"command: {one_line(command)}\nworking folder: {one_line(cwd)}\n{given}\n{named}"
        f"the allowlist asks: {one_line(reason)}"
    )


# How a prompt names what an argument binds (exec_arg_files.ArgFile.kind).
_WHAT: Final = {"file": "file", "folder": "folder", "unbound": "argument"}


def _working_dir(ctx: Context, cwd: str | None) -> str:
    """An absolute folder inside a shared folder, checked by the kernel, not by text."""
    if cwd is None:
        if not ctx.roots:
            raise WorkerError("path_not_allowed", "no folder is shared, so no command can run")
        return str(ctx.roots[0].path)
    with confined(ctx, cwd) as (root, located):
        st = root.stat(located.relative, follow_symlinks=True)
    if not stat.S_ISDIR(st.st_mode):
        raise WorkerError("not_directory", f"cwd {cwd!r} is not a folder", {"path": cwd})
    # The real path, so that '..' in arguments means for the checks what it means
    # for the program (a symlinked cwd would otherwise make them disagree).
    real = os.path.realpath(os.path.join(located.root.path, located.relative))
    inside = str(located.root.path).rstrip("/") + "/"
    if real != str(located.root.path) and not real.startswith(inside):
        raise WorkerError(
            "path_not_allowed", f"cwd {cwd!r} leads outside its shared folder", {"path": cwd}
        )
    return real


def _admitted(decision: Decision, roots: Sequence[Root]) -> str:
    """The path to run, or the refusal as a WorkerError."""
    if not decision.runs or decision.path is None:
        raise WorkerError(
            REFUSAL_CODES[decision.refusal or Refusal.NOT_ALLOWED],
            decision.reason,
            {"argv": list(decision.argv), "rule": decision.rule_id, "tried": decision.near},
        )
    real = os.path.realpath(decision.path)
    for root in roots:
        if root.writable and (real + "/").startswith(str(root.path).rstrip("/") + "/"):
            raise WorkerError(
                "command_forbidden",
                f"{decision.path} lies in the read-write shared folder {root.path}, where it "
                "could be replaced; pin programs outside shared folders",
                {"argv": list(decision.argv), "rule": decision.rule_id},
            )
    return decision.path


def _withheld(roots: Sequence[Root]) -> tuple[str, ...]:
    """The worker's own folders and files that shared folders hold: blanked inside."""
    return tuple(sorted({str(place) for root in roots for place in root.withheld}))


def _signal_name(number: int | None) -> str | None:
    if number is None:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


SPEC: Final = ActionSpec(
    surface="workerHost",
    name="exec",
    args=ExecArgs,
    result=ExecResult,
    handler=exec_command,
    summary="run an allowlisted program (argv, no shell) in a sandbox; the blob is its stdin",
    takes_blob=True,
    sandboxed=True,
    codes=CONFINED_CODES
    | {
        ErrorCode.COMMAND_NOT_ALLOWED,
        ErrorCode.COMMAND_FORBIDDEN,
        ErrorCode.SANDBOX_UNAVAILABLE,
    },
    caps={"output_bytes": OUTPUT_BYTES},
    claims_late=True,  # Context.claim, from sandbox.process.run: see exec_command
)
