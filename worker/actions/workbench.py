"""Sandbox mode (the workbench): the six host actions, each confined to its plan's workspace.

`agentworker run --sandbox` serves `workbenchHost.<action>` instead of
`workerHost.*`. Each call belongs to a plan, and the plan has a folder of its own
(sandbox.workspaces), made on its first call. The host handlers run unchanged
with that folder as their one root, so the same kernel confinement
(`ConfinedDir`) keeps file actions inside it. Paths may be relative to it or
spelled `/workspace/...`, the place programs see it at.

Programs run in bubblewrap as `workerHost.exec` runs them, with these changes: the
plan's workspace is the only folder, read-write at /workspace; the environment is
cleared (the pass-list is ignored); there is never a network (http_fetch is the
way out, behind its guard); each file a program writes is bounded by what is
left of the plan's quota, and a program whose writes fill the plan is answered
`too_large`; and at most `plan_execs` programs of one plan run at once.

All of a plan's programs together are held to `plan_processes`, `plan_memory_mb`
and `plan_cpus` by a cgroup of the plan's own where this machine offers cgroups
(sandbox.cgroups: a delegated cgroup v2 subtree, or cgroup v1 as root), made on
the plan's first exec and destroyed (its processes killed) by teardown and the
sweep; each sandbox joins it before its program runs. A cgroup that cannot be
made or joined refuses the call (`sandbox_unavailable`): it never runs without
the limits the worker said apply. Elsewhere the per-sandbox rlimits, with
`plan_execs`, bound the plan (see `limits_note`).

The sandbox is probed once at start (`probe`): sandbox mode refuses to start when
bubblewrap cannot build it, and a call never runs outside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import logging
import os
import posixpath
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final, TypeVar

from allowlist import Decision
from sandbox import cgroups, environment, plan_uids, still
from sandbox import sockets as socket_memory
from sandbox.cgroups import CgroupError, PlanGroup, PlanLimits
from sandbox.held_open import UnseenError, held_open_bytes, superblock_device
from sandbox.process import (
    Completed,
    Limits,
    Mount,
    PidCap,
    SandboxUnavailableError,
    View,
    run,
    visible_by_default,
)
from sandbox.sockets import SocketMemory, SocketsUnseenError
from sandbox.workspaces import (
    MOUNT_POINT,
    UNCLAIMED,
    Use,
    Workspace,
    WorkspaceError,
    WorkspaceProblem,
    Workspaces,
    check_plan_id,
    plan_key,
)
from worker.actions.host import exec_cmd, fs_list, fs_read, fs_stat, fs_write, http_fetch
from worker.actions.host.exec_arg_files import arg_files, plain
from worker.actions.host.exec_git import git_view
from worker.actions.host.exec_policy import path_check, policy_for
from worker.actions.host.fs_paths import in_thread
from worker.actions.workbench_terms import answering_in_plan_terms, host_paths
from worker.config import Config, ExecSection, Paths, SandboxSection
from worker.core.blob_files import check_hasher
from worker.core.registry import ActionSpec, Args, Context, Outcome, Registry, Result, table
from worker.errors import ErrorCode, WorkerError, from_workspace
from worker.wire.protocol import WORKBENCH_SURFACE

log = logging.getLogger(__name__)

SURFACE: Final = WORKBENCH_SURFACE
# Threads counting plans' quotas (each plan walks on one at a time).
COUNT_THREADS: Final = 2
# While a plan's program runs, its workspace is counted again this often (or, for a
# workspace whose count takes long, ten counts' time apart, up to WATCH_AT_MOST_S;
# sooner when the disk fills, see WATCH_POLL_S), and the program is stopped once the
# plan holds twice its quota, or more than its cap of entries (a count stops one past
# it). RLIMIT_FSIZE bounds each file by the room left, not the files together, so a
# program writing file after file would otherwise fill the disk until its timeout.
# Twice, not once: a program that ends past its quota is answered `too_large` by the
# count after it all the same, with its exit code; the watch is for one that would not
# stop.
WATCH_EVERY_S: Final = 1.0
WATCH_AT_MOST_S: Final = 5.0
WATCH_SLACK: Final = 2
# Between counts, the watch looks at the file system's free space this often, and
# counts at once when it fell by the room left before the stop (`_until_due`).
WATCH_POLL_S: Final = 0.02
# Counts in a row, at once, after one whose folders moved under it; if each of them
# had folders move, the program is stopped as uncountable (see `_overfilled`).
WATCH_REWALKS: Final = 3
# Descriptors and mapped ranges one look for removed files may examine (about 5 us
# each): what the sandbox's limits let its processes hold, with MAPS_PER_PROCESS
# mappings each (python3 with ssl has 137; open_files does not bound them: review6
# finding 09), up to HELD_OPEN_MOST.
MAPS_PER_PROCESS: Final = 4096
HELD_OPEN_MOST: Final = 1 << 20
# Where a plan has no cgroup (rlimits mode), what its running programs' sockets hold in
# kernel buffers (sandbox.sockets) is summed this often, and the program is stopped once
# the plan's together pass plan_memory_mb: memory no rlimit counts (review7 finding 02).
# A process queues about 6 GB/s into socketpairs on this machine's cores, so a plan may
# pass its memory by what its programs queue in one such wait. A plan whose sums take
# long is summed ten sums' time apart, up to WATCH_AT_MOST_S.
SOCKETS_EVERY_S: Final = 0.05
# Looks for a stopped program's processes all stopped before a count walks on anyway
# (about 0.4 s in all): a process inside a long system call stops when it ends.
STILL_CHECKS: Final = 16

A = TypeVar("A", bound=Args)
R = TypeVar("R", bound=Result)


def _translated(exc: WorkspaceError) -> WorkerError:
    return from_workspace(exc)


def _stop_still(sandboxes: list[int]) -> tuple[list[still.Stopped], bool]:
    """Stops every process of `sandboxes` (bubblewrap's pids) and waits, a bounded
    while, until each thread is stopped: what stopped, and whether all of them did."""
    stopped: list[still.Stopped] = []
    try:
        for pid in sandboxes:  # one by one: each is resumed, whatever fails after
            stopped.append(still.stop(pid))
        held = list(zip(sandboxes, stopped, strict=True))
        pause, steady = 0.0005, False
        for _ in range(STILL_CHECKS):
            steady = all(still.settled(pid, each) for pid, each in held)
            if steady:
                break
            time.sleep(pause)
            pause = min(2 * pause, 0.05)
            for pid, each in held:
                still.stop(pid, each)  # new ones meanwhile
    except BaseException as exc:
        for each in stopped:
            each.resume()
        if isinstance(exc, OSError):  # no descriptor left for a pidfd (review7 finding 06)
            raise WorkspaceError(
                WorkspaceProblem.NO_ROOM,
                f"the plan's running programs could not be held still for a count of its "
                f"workspace ({exc.strerror or exc}), so it cannot be counted; try again once "
                "fewer programs run.",
            ) from None
        raise
    return stopped, steady


def _still_since(
    sandboxes: list[int], stopped: list[still.Stopped], before: dict[int, int]
) -> bool:
    """Whether every thread `stopped` holds stayed stopped since `before` (its figures of
    `still.runs`): none was put on a CPU, none is waiting for one (woken by a SIGCONT it
    has not run on yet), and no process was added."""
    if still.runs(stopped) != before:
        return False
    return all(still.settled(pid, each) for pid, each in zip(sandboxes, stopped, strict=True))


def _resume_when_stopped(done: asyncio.Future[tuple[list[still.Stopped], bool]]) -> None:
    if not done.cancelled() and done.exception() is None:
        for each in done.result()[0]:
            each.resume()


def _held_open_of(workspace: Workspace, running: dict[int, Limits]) -> tuple[int, str]:
    """Bytes the sandboxes of `running`, each with its limits, hold in files of the
    workspace's file system they removed but keep open or mapped (sandbox.held_open),
    and why part of it could not be looked at ("" if it could)."""
    try:
        device = os.stat(workspace.files).st_dev
        superblock = superblock_device(str(workspace.files))
    except FileNotFoundError:  # torn down meanwhile: the walk says so
        return 0, ""
    except OSError as exc:
        return 0, f"the workspace's file system could not be told ({exc})"
    total = 0
    for pid, limits in running.items():
        try:
            total += held_open_bytes(
                pid,
                device,
                unknown_bytes=limits.file_size_bytes,
                superblock=superblock,
                most=min(HELD_OPEN_MOST, limits.processes * (limits.open_files + MAPS_PER_PROCESS)),
            )
        except UnseenError as exc:
            return total, str(exc)
        except OSError as exc:  # no descriptor left to look with (review7 finding 06)
            return total, f"what its processes hold open could not be looked at ({exc})"
    return total, ""


def plan_cgroups(base: Path, settings: SandboxSection) -> cgroups.Choice:
    """Which cgroups would bound the plans of the workbench at `base` (nothing made)."""
    if settings.cgroups == "off":
        return cgroups.Choice(None, '[sandbox] cgroups = "off"', cgroups.probe())
    tag = hashlib.sha256(str(base.absolute()).encode()).hexdigest()[:12]
    return cgroups.choose(tag)


class Workbench:
    """Sandbox mode's state: every plan's workspace, its cgroup where cgroups apply,
    and how many programs each runs."""

    def __init__(
        self,
        workspaces: Workspaces,
        settings: SandboxSection,
        choice: cgroups.Choice | None = None,
    ) -> None:
        self.workspaces = workspaces
        self.settings = settings
        self.choice = choice
        self.backend = choice.backend if choice is not None else None
        # The server whose plans the calls are: each call reaches that server's
        # workspace of its plan only (sandbox.workspaces). The worker's ledger names it
        # (worker.core.ledger.State.server: one per worker's lifetime).
        self.server: Callable[[], str] = lambda: ""
        # By the plan's workspace key (its server's and its own).
        self._exec_slots: dict[str, asyncio.Semaphore] = {}
        self._groups: dict[str, asyncio.Future[PlanGroup]] = {}
        # Quota counts walk a plan's workspace: on threads of their own, never the
        # shared pool every plan's file work waits on, and one walk per plan at once.
        self._counting = ThreadPoolExecutor(COUNT_THREADS, thread_name_prefix="agentworker-quota")
        self._walks: dict[str, asyncio.Future[Use]] = {}
        # Looks at what running programs hold open: a thread of their own, since a
        # program chooses their cost (its processes and descriptors), and the counts
        # every plan's writes wait on must not queue behind them.
        self._holding = ThreadPoolExecutor(1, thread_name_prefix="agentworker-held-open")
        # plan key -> bubblewrap's pid of each of its programs running now, and the
        # limits it runs with: stopped while the plan's workspace is counted (sandbox.still)
        self._running: dict[str, dict[int, Limits]] = {}
        # plan key -> (bytes, how many) of its fs_writes under way
        self._writes: dict[str, tuple[int, int]] = {}
        # plan key -> futures of writes waiting for one under way to end (`a_write_ends`)
        self._write_ends: dict[str, list[asyncio.Future[None]]] = {}
        # rlimits mode: plan key -> bubblewrap's pid -> what its sandbox's sockets hold,
        # summed on a thread of its own (a program chooses how many sockets it has).
        self._sockets: dict[str, dict[int, SocketMemory]] = {}
        # Why they cannot be summed on this machine ('' when they can): said at start.
        self.sockets_unseen = socket_memory.probe() if self.backend is None else ""
        self._summing = ThreadPoolExecutor(1, thread_name_prefix="agentworker-sockets")

    def with_writes(self, used: Use, workspace: Workspace) -> Use:
        """`used` with the plan's fs_writes under way added: their bytes and an entry
        each (twice where the count holds part of them already, so a write that then
        does not fit waits for them: `a_write_ends`)."""
        size, count = self._writes.get(workspace.key, (0, 0))
        return dataclasses.replace(used, bytes=used.bytes + size, entries=used.entries + count)

    def a_write_ends(self, workspace: Workspace) -> asyncio.Future[None] | None:
        """Done when one of the plan's fs_writes under way ends; None if none is."""
        if workspace.key not in self._writes:
            return None
        ends = asyncio.get_running_loop().create_future()
        self._write_ends.setdefault(workspace.key, []).append(ends)
        return ends

    @contextlib.contextmanager
    def writing(self, workspace: Workspace, incoming: int) -> Iterator[None]:
        """An fs_write of `incoming` bytes to the plan is under way (see `with_writes`)."""
        size, count = self._writes.get(workspace.key, (0, 0))
        self._writes[workspace.key] = (size + incoming, count + 1)
        try:
            yield
        finally:
            size, count = self._writes[workspace.key]
            if count == 1:
                del self._writes[workspace.key]
            else:
                self._writes[workspace.key] = (size - incoming, count - 1)
            for waiting in self._write_ends.pop(workspace.key, []):
                if not waiting.done():  # a waiting call cancelled meanwhile: done
                    waiting.set_result(None)

    def started(self, workspace: Workspace, sandbox_pid: int, limits: Limits) -> None:
        """A program of the plan runs in the sandbox of `sandbox_pid` until `ended`."""
        self._running.setdefault(workspace.key, {})[sandbox_pid] = limits

    def ended(self, workspace: Workspace, sandbox_pid: int) -> None:
        running = self._running.get(workspace.key, {})
        running.pop(sandbox_pid, None)
        if not running:
            self._running.pop(workspace.key, None)
        watched = self._sockets.get(workspace.key, {})
        watched.pop(sandbox_pid, None)
        if not watched:
            self._sockets.pop(workspace.key, None)

    @property
    def watches_sockets(self) -> bool:
        """Whether the plans' socket buffers are summed by the watch: where no cgroup
        charges them to the plan (rlimits mode)."""
        return self.backend is None and not self.sockets_unseen

    def sockets_of(self, workspace: Workspace, sandbox_pid: int, memory: SocketMemory) -> None:
        """The sockets of the sandbox of `sandbox_pid` (a program of the plan) are
        summed through `memory` until `ended`."""
        self._sockets.setdefault(workspace.key, {})[sandbox_pid] = memory

    async def socket_bytes(self, workspace: Workspace) -> int:
        """What the plan's running programs' sockets hold in kernel buffers now
        (SocketsUnseenError when they cannot be summed)."""
        watched = list(self._sockets.get(workspace.key, {}).values())
        if not watched:
            return 0
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._summing, lambda: sum(each.queued() for each in watched)
        )

    async def use(self, workspace: Workspace) -> Use:
        """What the plan's workspace holds: the cached count, or a walk. Callers that
        arrive while the plan's walk runs share it (or, if the workspace changed since
        it began, wait for it and walk once more); WorkspaceError as `Workspaces.use`."""
        while True:
            known = self.workspaces.known_use(workspace)
            if known is not None:
                return known
            walk = self._walks.get(workspace.key)
            if walk is None or walk.done():
                # None runs. (A walk that ended, its count not kept since the workspace
                # changed while it ran, stays here until its `finished` runs, a turn
                # of the loop later: awaiting it would return at once, never yielding,
                # and this loop would spin, the worker's event loop with it.)
                break
            # Its count is kept (then the next turn returns it), unless the workspace
            # changed while it ran: then the next turn walks again.
            with contextlib.suppress(Exception):
                await asyncio.shield(walk)
        walk = asyncio.ensure_future(self._walk_still(workspace))
        self._walks[workspace.key] = walk

        def finished(_: asyncio.Future[Use]) -> None:
            if self._walks.get(workspace.key) is walk:
                del self._walks[workspace.key]
            if not walk.cancelled():
                walk.exception()  # retrieved: a caller that left may not

        walk.add_done_callback(finished)
        return await asyncio.shield(walk)

    async def _walk_still(self, workspace: Workspace) -> Use:
        """A walk of the workspace with the plan's running programs stopped: a program
        moving its files out of the walk's way would be left out of the count (review5
        finding 01). While they are stopped, what they hold in files they removed is
        looked at too (`Use.held_open`): a look after they went on could be dodged by
        naming such a file for it (review7 finding 01). If they could not all be held
        still (a chain of forks outran the stop, review6 finding 01; one had itself sent
        SIGCONT, review7 finding 03), the count says so as a moved one does
        (`Use.moved`), and the watch counts again. All of it on the count threads
        (the /proc walks are the program's to make long: review7 finding 05), the look
        on its own thread."""
        loop = asyncio.get_running_loop()
        running = dict(self._running.get(workspace.key, {}))
        if not running:
            return await loop.run_in_executor(self._counting, self.workspaces.use, workspace)
        stopping = loop.run_in_executor(self._counting, _stop_still, list(running))
        try:
            stopped, steady = await asyncio.shield(stopping)
        except asyncio.CancelledError:  # the thread goes on: let them go once it is done
            stopping.add_done_callback(_resume_when_stopped)
            raise
        try:
            before = await loop.run_in_executor(self._counting, still.runs, stopped)
            used = await loop.run_in_executor(self._counting, self.workspaces.use, workspace)
            look = functools.partial(_held_open_of, workspace, running)
            held, unseen = await loop.run_in_executor(self._holding, look)
            held_still = functools.partial(_still_since, list(running), stopped, before)
            ran = not await loop.run_in_executor(self._counting, held_still)
        finally:
            for each in stopped:
                each.resume()
        used = dataclasses.replace(used, held_open=held, unseen=unseen)
        return used if steady and not ran else dataclasses.replace(used, moved=max(used.moved, 1))

    @classmethod
    def at(cls, base: Path, settings: SandboxSection) -> Workbench:
        """The workbench at `base`; WorkerError (sandbox_unavailable) when cgroups
        should apply here and cannot be readied."""
        workspaces = Workspaces(
            base,
            quota_bytes=settings.quota_mb * 1024**2,
            max_entries=settings.max_entries,
            max_plans=settings.max_plans,
            max_plans_per_agent=settings.plans_per_agent,
            uids=settings.uid_range,
        )
        workspaces.prepare()
        choice = plan_cgroups(base, settings)
        if choice.backend is not None:
            try:
                left = choice.backend.prepare()
            except CgroupError as exc:
                raise WorkerError(
                    "sandbox_unavailable",
                    f"sandbox mode cannot start: per-plan limits should come from "
                    f"{choice.note}, and {exc}. Fix that, or set [sandbox] cgroups = "
                    '"off" to bound each sandbox by rlimits instead.',
                ) from None
            if left:
                log.info("removed %d plan cgroup(s) an earlier run left", len(left))
        return cls(workspaces, settings, choice)

    def plan_limits(self) -> PlanLimits:
        return PlanLimits(
            processes=self.settings.plan_processes,
            memory_bytes=self.settings.plan_memory_mb * 1024**2,
            cpus=self.settings.plan_cpus,
        )

    async def plan_group(self, workspace: Workspace) -> PlanGroup | None:
        """The plan's cgroup, made on its first exec (None where cgroups do not apply);
        WorkerError (sandbox_unavailable) when it cannot be made: the call is refused,
        never run without its limits."""
        if self.backend is None:
            return None
        key = workspace.key
        made = self._groups.get(key)
        if made is None:
            backend, limits = self.backend, self.plan_limits()
            made = asyncio.ensure_future(asyncio.to_thread(backend.create, key, limits))
            self._groups[key] = made
        try:
            return await asyncio.shield(made)
        except CgroupError as exc:
            if self._groups.get(key) is made:
                del self._groups[key]  # the next call tries again
            raise _refused(exc) from None

    def open(self, plan_id: str, agent_id: str, placement_token: str = "") -> Workspace:
        """The plan's workspace, of the server the worker serves (made now if new), with
        the placement token its call brought kept (see Workspaces.open)."""
        try:
            return self.workspaces.open(
                plan_id, agent_id, server=self.server(), placement_token=placement_token
            )
        except WorkspaceError as exc:
            raise _translated(exc) from None

    def find(self, plan_id: str, placement_token: str = "") -> Workspace | None:
        try:
            return self.workspaces.find(
                plan_id, server=self.server(), placement_token=placement_token
            )
        except WorkspaceError as exc:
            raise _translated(exc) from None

    def held(self) -> list[tuple[str, int, str]]:
        """Every plan of the server the worker serves holding a workspace here, with its
        last use (unix ms) and the placement token its calls last brought: what the
        worker tells that server's hub when it connects, so the hub routes the plan
        back here (the token proves the hub placed it here). Never another server's
        plans."""
        return [
            (plan.plan_id, int(plan.last_used_unix * 1000), plan.placement_token)
            for plan in self.workspaces.plans(sizes=False, server=self.server())
        ]

    def sort_old(self, servers_of: Callable[[list[str]], dict[str, str]]) -> None:
        """Workspaces from before they were kept per server get theirs, or none
        (Workspaces.sort_old); said in the log, with how to claim the others."""
        for plan in self.workspaces.sort_old(servers_of):
            if plan.server == UNCLAIMED:
                log.warning(
                    "the workspace of plan %r was made before workspaces were kept per "
                    "server, and which server it was made for is not known: no server's "
                    "calls reach it until you claim it (`agentworker sandbox claim PLAN`) "
                    "or tear it down",
                    plan.plan_id,
                )
            else:
                log.info(
                    "the workspace of plan %r, made before workspaces were kept per "
                    "server, is server %s's (its calls of the plan, in the ledger)",
                    plan.plan_id,
                    plan.server,
                )

    def exec_slot(self, workspace: Workspace) -> asyncio.Semaphore:
        slot = self._exec_slots.get(workspace.key)
        if slot is None:
            slot = self._exec_slots[workspace.key] = asyncio.Semaphore(self.settings.plan_execs)
        return slot

    def teardown(self, plan_id: str, server: str | None = None) -> Awaitable[dict[str, Any]]:
        """Take the plan's workspace (the served server's, or `server`'s) and cgroup out
        of use now (a later call starts afresh) and return their removal, to await once
        the plan's calls have stopped: the cgroup's processes killed and the cgroup
        removed, then the workspace. Idempotent."""
        if server is None:
            server = self.server()
        key = plan_key(plan_id, server)
        self._exec_slots.pop(key, None)
        group = self._groups.pop(key, None)
        try:
            trash = self.workspaces.detach(plan_id, server=server)
        except WorkspaceError as exc:
            raise _translated(exc) from None
        return self._remove(plan_id, trash, group)

    async def _remove(
        self, plan_id: str, trash: Path | None, group: asyncio.Future[PlanGroup] | None
    ) -> dict[str, Any]:
        if group is not None:
            with contextlib.suppress(CgroupError):  # never made: nothing to destroy
                made = await group
                try:
                    await asyncio.to_thread(made.destroy)
                except CgroupError as exc:
                    raise WorkerError(
                        "internal_error", f"plan {plan_id!r}'s cgroup could not be removed: {exc}"
                    ) from None
        if trash is not None:
            await asyncio.to_thread(self.workspaces.remove, trash)
        return {"plan_id": plan_id, "removed": trash is not None}

    async def close(self) -> None:
        """At the worker's end: destroy every plan's cgroup (killing what runs in it),
        then what the backend made."""
        self._counting.shutdown(wait=False, cancel_futures=True)
        self._holding.shutdown(wait=False, cancel_futures=True)
        self._summing.shutdown(wait=False, cancel_futures=True)
        for key in list(self._groups):
            with contextlib.suppress(WorkerError):
                await self._remove(key, None, self._groups.pop(key))
        if self.backend is not None:
            await asyncio.to_thread(self.backend.close)

    async def sweep(self, busy: Callable[[], set[str]]) -> list[str]:
        """Remove the workspaces idle past `idle_hours` whose plans run nothing now
        (asked again before each one: a call may have come meanwhile): every server's,
        by its last use, but never an UNCLAIMED one. `busy` names the served server's
        plans with calls running."""
        idle_s = self.settings.idle_hours * 3600

        def running() -> set[tuple[str, str]]:
            served = self.server()
            return {(served, plan) for plan in busy()}

        removed = []
        for server, plan_id in self.workspaces.idle(idle_s, running()):
            used = self.workspaces.last_used(plan_id, server=server)
            if (server, plan_id) in running() or used is None or time.time() - used < idle_s:
                continue
            try:
                if (await self.teardown(plan_id, server))["removed"]:
                    removed.append(plan_id)
            except (OSError, WorkerError) as exc:  # the next plan, and the next round, go on
                log.warning("the idle plan %r could not be removed: %s", plan_id, exc)
        return removed

    def limits_note(self, exec_settings: ExecSection) -> str:
        """Which limits bound a plan's programs, for the start-up log."""
        assert self.choice is not None
        return limits_note(self.settings, exec_settings, self.choice, self.sockets_unseen)


def _refused(exc: CgroupError) -> WorkerError:
    return WorkerError(
        "sandbox_unavailable",
        f"the program was not run: its plan's cgroup, which holds it to the plan's limits "
        f"on processes, memory and CPU, could not be had ({exc}). It is never run without "
        "them; try again, and if this persists see `agentworker doctor`.",
    )


def limits_note(
    settings: SandboxSection,
    exec_settings: ExecSection,
    choice: cgroups.Choice,
    sockets_unseen: str = "",
) -> str:
    """Which limits bound a plan's programs: a cgroup per plan (of which kind, where),
    or rlimits and why not cgroups (and, if so, why socket buffers cannot be summed
    here: `sockets_unseen`)."""
    per_sandbox = (
        f"each sandbox at most {exec_settings.max_processes} processes, "
        f"{exec_settings.memory_mb} MiB of address space per process and "
        f"{exec_settings.cpu_s} s of CPU per process"
    )
    if choice.backend is not None:
        return (
            f"per-plan limits by {choice.note}: all of a plan's programs together at most "
            f"{settings.plan_processes} processes, {settings.plan_memory_mb} MiB of memory "
            f"(no swap) and {settings.plan_cpus:g} CPU(s); {per_sandbox}"
        )
    if sockets_unseen:
        summed = (
            f"what they hold in socket buffers (kernel memory no rlimit counts) is bounded "
            f"only per socket, by the system's defaults, since it cannot be summed here "
            f"({sockets_unseen})"
        )
    else:
        summed = (
            "what a plan's programs hold in socket buffers (kernel memory no rlimit counts) "
            f"is summed while they run and they are stopped past {settings.plan_memory_mb} "
            "MiB (plan_memory_mb), where exec runs its Landlock entry helper (without it "
            "nothing sums them)"
        )
    return (
        f"per-plan limits by rlimits ({choice.note}): at most {settings.plan_execs} "
        f"program(s) of a plan at once, {per_sandbox}, so memory and CPU are bounded per "
        f"process, not per plan; {summed}; pipe buffers are bounded only per pipe, by the "
        "system's defaults: only a memory cgroup bounds all kernel memory"
    )


# ----------------------------------------------------------------- paths


def _inside(path: str) -> str:
    """A path as the plan may spell it, made relative to its workspace."""
    if path == MOUNT_POINT or path.startswith(MOUNT_POINT + "/"):
        return path[len(MOUNT_POINT) :].lstrip("/") or "."
    if path.startswith("/"):
        raise WorkerError(
            "path_not_allowed",
            f"{path!r} is outside the plan's workspace. Use a path relative to it, or "
            f"one under {MOUNT_POINT}, where programs see it.",
            {"path": path},
        )
    return path


def _as_seen_inside(workspace: Workspace, host_path: str) -> str:
    """A host path in the workspace, as programs in the sandbox see it."""
    base = str(workspace.files)
    if host_path == base:
        return MOUNT_POINT
    if host_path.startswith(base + "/"):
        return MOUNT_POINT + host_path[len(base) :]
    return host_path


def _as_seen_outside(workspace: Workspace, path: str) -> str:
    """An argument spelled /workspace/..., as the host sees it (for the allowlist's checks)."""
    if path == MOUNT_POINT or path.startswith(MOUNT_POINT + "/"):
        return str(workspace.files) + path[len(MOUNT_POINT) :]
    return path


def _found_in_workspace(workspace: Workspace, cwd: str, named: str) -> str | None:
    """Where a program in the workspace's sandbox, started in `cwd` (as the host sees
    it), finds the path `named`, as the host sees it (exec_arg_files.Finder): /workspace
    however `//` and `.` spell it; None when a `..` climbs out of /workspace and back
    (`/tmp/../workspace/s.py`, `../workspace/s.py` from /workspace: review19 A1b, each
    was taken for a host path naming nothing). A path that leads out of /workspace is
    the host's own: nothing of the agent's."""
    inside = plain(named if named.startswith("/") else f"{_as_seen_inside(workspace, cwd)}/{named}")
    lexical = posixpath.normpath(inside)
    if lexical != MOUNT_POINT and not lexical.startswith(MOUNT_POINT + "/"):
        return inside
    if inside != MOUNT_POINT and not inside.startswith(MOUNT_POINT + "/"):
        return None
    depth = 0
    for part in inside[len(MOUNT_POINT) :].split("/"):
        depth += -1 if part == ".." else 1 if part else 0
        if depth < 0:
            return None
    return _as_seen_outside(workspace, inside)


def _plan_context(bench: Workbench, ctx: Context) -> tuple[Context, Workspace]:
    workspace = bench.open(ctx.plan_id, ctx.agent_id, ctx.placement_token)
    return dataclasses.replace(ctx, roots=(workspace.root,)), workspace


def _looking_context(bench: Workbench, ctx: Context) -> Context:
    """For a call that only looks: the plan's workspace if it has one, else an empty
    read-only folder, so that a look never makes a workspace (each one counts against
    max_plans, and a look needs no grant)."""
    workspace = bench.find(ctx.plan_id, ctx.placement_token)
    root = bench.workspaces.empty if workspace is None else workspace.root
    return dataclasses.replace(ctx, roots=(root,))


# ----------------------------------------------------------------- the actions


def _look(
    bench: Workbench, handler: Callable[[Context, A], Awaitable[Outcome[R]]]
) -> Callable[[Context, A], Awaitable[Outcome[R]]]:
    async def confined(ctx: Context, args: A) -> Outcome[R]:
        path = args.path  # type: ignore[attr-defined]
        return await handler(
            _looking_context(bench, ctx), args.model_copy(update={"path": _inside(path)})
        )

    return confined


def _stat(
    bench: Workbench,
) -> Callable[[Context, fs_stat.FsStatArgs], Outcome[Any] | Awaitable[Outcome[Any]]]:
    def confined(ctx: Context, args: fs_stat.FsStatArgs) -> Outcome[Any] | Awaitable[Outcome[Any]]:
        plan_ctx = _looking_context(bench, ctx)
        return fs_stat.fs_stat(plan_ctx, args.model_copy(update={"path": _inside(args.path)}))

    return confined


def _write(bench: Workbench) -> Callable[[Context, fs_write.FsWriteArgs], Awaitable[Outcome[Any]]]:
    async def confined(ctx: Context, args: fs_write.FsWriteArgs) -> Outcome[Any]:
        plan_ctx, workspace = _plan_context(bench, ctx)
        path = _inside(args.path)
        try:
            await _room_for(bench, workspace, ctx.blob_bytes)
        except WorkspaceError as exc:
            raise _translated(exc) from None
        with bench.writing(workspace, ctx.blob_bytes):
            try:
                return await fs_write.fs_write(plan_ctx, args.model_copy(update={"path": path}))
            finally:
                bench.workspaces.changed(workspace)

    return confined


async def _room_for(bench: Workbench, workspace: Workspace, incoming: int) -> None:
    """Returns once `incoming` bytes fit beside the plan's use and its writes under way
    (reserve them before the next await); raises WorkspaceError if they do not.

    The writes under way count whole, since the count may not hold them yet (each
    passed the check on the same count: review5 finding 06, 64 MiB went into a 16 MiB
    quota), and so twice where it holds part of them: a write that does not fit beside
    them waits for one to end and counts again, and is refused only when it does not
    fit with none under way (review6 finding 06: two 6 MiB writes to a 16 MiB plan, the
    second was refused)."""
    while True:
        # Counting walks the workspace: on the workbench's own threads.
        used = await bench.use(workspace)
        try:
            bench.workspaces.check_room(workspace, incoming, bench.with_writes(used, workspace))
            return
        except WorkspaceError:
            ends = bench.a_write_ends(workspace)
            if ends is None:
                raise
            await ends


def _fetch(bench: Workbench) -> Callable[[Context, Any], Awaitable[Outcome[Any]]]:
    async def guarded(ctx: Context, args: http_fetch.HttpFetchArgs) -> Outcome[Any]:
        try:
            check_plan_id(ctx.plan_id)
        except WorkspaceError as exc:
            raise _translated(exc) from None
        return await http_fetch.http_fetch(dataclasses.replace(ctx, roots=()), args)

    return guarded


def _exec(bench: Workbench) -> Callable[[Context, exec_cmd.ExecArgs], Awaitable[Outcome[Any]]]:
    async def sandboxed(ctx: Context, args: exec_cmd.ExecArgs) -> Outcome[Any]:
        plan_ctx, workspace = _plan_context(bench, ctx)
        return await _run_in_workspace(bench, plan_ctx, workspace, args)

    return sandboxed


async def _run_in_workspace(
    bench: Workbench, ctx: Context, workspace: Workspace, args: exec_cmd.ExecArgs
) -> Outcome[exec_cmd.ExecResult]:
    settings = ctx.config.exec
    timeout_s = exec_cmd._timeout(args, settings)
    cwd = exec_cmd._working_dir(ctx, None if args.cwd is None else _inside(args.cwd))
    judge = path_check(ctx.roots, cwd)
    decision = policy_for(ctx.config, ctx.paths, ctx.policies).decide(
        args.argv, lambda path, write: judge(_as_seen_outside(workspace, path), write)
    )
    program = exec_cmd._admitted(decision, ctx.roots)
    where = functools.partial(_found_in_workspace, workspace)
    with await exec_cmd.held_while_asked(ctx, decision, cwd, args.argv, where) as holding:
        return await _asked_and_run(
            bench, ctx, workspace, args, (cwd, decision, program), timeout_s, holding
        )


async def _asked_and_run(
    bench: Workbench,
    ctx: Context,
    workspace: Workspace,
    args: exec_cmd.ExecArgs,
    judged: tuple[str, Decision, str],
    timeout_s: float,
    holding: exec_cmd.Holding,
) -> Outcome[exec_cmd.ExecResult]:
    """An exec judged in its plan's workspace (`judged`: its working folder, the
    allowlist's decision, the program), asked when the rule says so (`holding`: what
    its hold could not make last, sandbox.held), and run."""
    cwd, decision, program = judged
    settings = ctx.config.exec
    if decision.verdict == "ask":
        inside = _as_seen_inside(workspace, cwd)
        stdin = await exec_cmd.stdin_sha256(ctx.blob)
        where = functools.partial(_found_in_workspace, workspace)
        files = await asyncio.to_thread(arg_files, ctx.roots, cwd, args.argv, where)
        files += holding.unbound()
        await ctx.approve(
            *exec_cmd.ask_about(
                SURFACE, args.argv, inside, decision.reason, stdin, len(ctx.blob), files
            )
        )
    assert decision.program is not None
    entry = await exec_cmd.landlock_entry(settings, ctx.paths)
    if entry is not None and workspace.uid is not None:
        # bubblewrap, as the plan's uid, reaches it by its path (sandbox.plan_uids)
        await asyncio.to_thread(plan_uids.reachable, entry, ctx.paths.data_dir)
    async with git_view(decision.program, program, ctx.roots, cwd) as git:
        fixed = {
            **decision.program.env,
            **{name: _as_seen_inside(workspace, value) for name, value in git.env.items()},
        }
        view = View(
            cwd=_as_seen_inside(workspace, cwd),
            mounts=(Mount(str(workspace.files), writable=True, target=MOUNT_POINT),),
            env=environment.build({}, (), fixed),  # cleared: nothing of the worker's passes
            extra_files=() if visible_by_default(program) else (program,),
            private=tuple(
                dataclasses.replace(
                    folder,
                    links={n: _as_seen_inside(workspace, t) for n, t in folder.links.items()},
                )
                for folder in git.private
            ),
            network=False,
            bwrap=settings.bwrap,
            read_only_root=True,
            entry=entry,
            uid=workspace.uid,
        )
        async with bench.exec_slot(workspace):
            group = await bench.plan_group(workspace)
            counted = group.counters() if group is not None else None
            limits = exec_cmd.limits_of(settings, timeout_s)
            try:
                before = await bench.use(workspace)
            except WorkspaceError as exc:
                raise _translated(exc) from None
            # A plan past its cap of entries has a count that stopped there: what it holds
            # is not known, so its programs get no room at all.
            full = bench.workspaces.over_entries(before)
            room = 0 if full else max(0, bench.workspaces.quota_bytes - before.bytes)
            limits = dataclasses.replace(limits, file_size_bytes=min(limits.file_size_bytes, room))
            sandbox_pid: list[int] = []  # bubblewrap's, once it started

            def started(pid: int) -> None:
                sandbox_pid.append(pid)
                bench.started(workspace, pid, limits)

            def sockets_of(memory: SocketMemory) -> None:
                bench.sockets_of(workspace, sandbox_pid[-1], memory)

            shown = functools.partial(_as_seen_inside, workspace)
            try:
                async with exec_cmd.shown_held(
                    ctx, ctx.roots, functools.partial(in_thread, ctx, None), shown
                ) as pins:
                    done = await _watched(
                        bench,
                        workspace,
                        before,
                        run(
                            [program, *args.argv[1:]],
                            view,
                            limits,
                            ctx.blob or None,
                            pid_cap=ctx.containment.pid_cap,
                            cgroup=group,
                            starts=ctx.containment.starts,
                            on_start=started,
                            on_sockets=sockets_of if bench.watches_sockets else None,
                            hash_output=check_hasher,
                            pins=pins,
                        ),
                    )
            except SandboxUnavailableError as exc:
                raise WorkerError("sandbox_unavailable", str(exc)) from None
            except CgroupError as exc:
                raise _refused(exc) from None
            finally:
                for pid in sandbox_pid:
                    bench.ended(workspace, pid)
                bench.workspaces.changed(workspace)  # whatever ran may have written
            # Counted again (and kept for the next call): RLIMIT_FSIZE bounds each file
            # by the room left, not the files together, nor folders.
            try:
                used = await bench.use(workspace)
            except WorkspaceError as exc:
                raise _translated(exc) from None
            met = [] if group is None or counted is None else group.counters().met_since(counted)
    _check_quota(bench, workspace, before, used, done.exit_code, done.signal)
    result = exec_cmd.result_of(program, decision.rule_id or "", done, plan_limits=met)
    return Outcome(
        result,
        blob=done.stdout + done.stderr,
        truncated=done.truncated,
        blob_check=done.output_digest,
    )


async def _watched(
    bench: Workbench,
    workspace: Workspace,
    before: Use,
    running: Awaitable[Completed],
) -> Completed:
    """The program's run, stopped (as a Cancel stops it: the call's task is cancelled,
    and the run kills the sandbox) and answered `too_large` if its workspace (with what
    the plan's running programs hold in removed files) passes twice its quota or its
    cap of entries while it runs, or, in rlimits mode, once the plan's running
    programs' sockets hold more than its memory. The run stays in the call's own task,
    where the pipeline sees its thread work."""
    task = asyncio.current_task()
    assert task is not None
    watch = asyncio.ensure_future(_overfilled(bench, workspace, before))
    sockets = (
        asyncio.ensure_future(_sockets_over(bench, workspace)) if bench.watches_sockets else None
    )
    watches: list[asyncio.Future[Any]] = [watch] if sockets is None else [watch, sockets]
    # Whether the run may still be stopped by a watch, and which one stopped it: a stop
    # scheduled as the run ended (same loop turn) must not cancel what comes after,
    # and a Cancel that came before the stop is the Cancel's answer, not the watch's.
    running_now = True
    stopped_by: list[asyncio.Future[Any]] = []

    def stop(ended: asyncio.Future[Any]) -> None:
        # Ended with an error too: fail closed.
        if running_now and not ended.cancelled() and not stopped_by:
            stopped_by.append(ended)
            task.cancel()

    for each in watches:
        each.add_done_callback(stop)
    try:
        return await running
    except asyncio.CancelledError:
        # Ours alone (no Cancel, kill or deadline came too): the answer is the watch's.
        if stopped_by and task.cancelling() == 1:
            task.uncancel()
            if stopped_by[0] is sockets:
                raise _sockets_stopped(bench, workspace, _held(sockets)) from None
            raise _stopped(bench, workspace, _found(watch)) from None
        raise
    finally:
        running_now = False
        for each in watches:
            each.remove_done_callback(stop)
            each.cancel()


def _found(watch: asyncio.Future[Use | WorkspaceError]) -> Use | WorkspaceError:
    """What the watch found; an error it ended with (`_overfilled` turns each into its
    answer, so only a defect of ours) as the program being uncountable."""
    if watch.exception() is None:
        return watch.result()
    return WorkspaceError(
        WorkspaceProblem.NO_ROOM,
        "its workspace could not be counted (the worker's watch failed, see its log), so "
        "what it writes cannot be counted against the quota.",
    )


def _held(watch: asyncio.Future[int | SocketsUnseenError]) -> int | SocketsUnseenError:
    """What the socket watch found; an error it ended with (a defect of ours) as the
    sockets being unseen."""
    if watch.exception() is None:
        return watch.result()
    return SocketsUnseenError("the worker's watch failed (see its log)")


async def _sockets_over(bench: Workbench, workspace: Workspace) -> int | SocketsUnseenError:
    """Returns once the plan's running programs' sockets hold more than the plan's
    memory in kernel buffers (what they hold), or cannot be summed (why): rlimits mode,
    where no cgroup charges it and no rlimit counts it (review7 finding 02)."""
    most, pause = bench.settings.plan_memory_mb * 1024**2, SOCKETS_EVERY_S
    while True:
        await asyncio.sleep(pause)
        began = time.monotonic()
        try:
            held = await bench.socket_bytes(workspace)
        except SocketsUnseenError as exc:
            return exc
        except Exception as exc:  # fail closed: a watch that ended would stop nothing
            log.exception("a sum of plan %r's socket buffers failed", workspace.plan_id)
            return SocketsUnseenError(f"{type(exc).__name__}: {exc}")
        if held > most:
            return held
        # Ten sums' time apart for a plan whose sums take long (thousands of sockets):
        # the thread, and the interpreter, are not the program's to hold.
        pause = min(WATCH_AT_MOST_S, max(SOCKETS_EVERY_S, 10 * (time.monotonic() - began)))


def _sockets_stopped(
    bench: Workbench, workspace: Workspace, found: int | SocketsUnseenError
) -> WorkerError:
    most = bench.settings.plan_memory_mb * 1024**2
    details: dict[str, Any] = {
        "stopped": True,
        "plan_limits": ["memory"],
        "plan_memory_bytes": most,
    }
    if isinstance(found, SocketsUnseenError):
        return WorkerError(
            "too_large",
            f"the program was stopped while it ran: what plan {workspace.plan_id!r}'s "
            f"programs hold in socket buffers could not be summed ({found}), so it cannot "
            "be held to the plan's memory.",
            details,
        )
    return WorkerError(
        "too_large",
        f"the program was stopped while it ran: plan {workspace.plan_id!r}'s programs held "
        f"{found:,} bytes in socket buffers (data written to sockets and not read), past "
        f"the plan's memory of {most:,} bytes ([sandbox] plan_memory_mb). Read what is "
        "written to a socket, or write less at once.",
        {**details, "socket_bytes": found},
    )


async def _overfilled(bench: Workbench, workspace: Workspace, before: Use) -> Use | WorkspaceError:
    """Returns once the workspace holds WATCH_SLACK times its quota or more than its
    cap of entries (either more than `before`), or cannot be counted: what was found.
    Bytes the plan's programs hold in files they removed but keep open or mapped count
    too."""
    workspaces = bench.workspaces
    pause, used = WATCH_EVERY_S, before
    while True:
        # Sooner if the disk filled by more than the room left before the stop: a
        # program writes hundreds of MB a second, many times a quota (review5 07).
        room = WATCH_SLACK * workspaces.quota_bytes - used.bytes
        await _until_due(workspace.files, pause, room)
        workspaces.changed(workspace)  # the program may have written since the last count
        began = time.monotonic()
        try:
            used = await _steady_count(bench, workspace)
        except WorkspaceError as exc:
            return exc
        except Exception as exc:  # fail closed: a watch that ended would stop nothing
            log.exception("a count of plan %r's workspace failed", workspace.plan_id)
            return WorkspaceError(
                WorkspaceProblem.NO_ROOM,
                f"its workspace could not be counted ({type(exc).__name__}: {exc}), so what "
                "it writes cannot be counted against the quota.",
            )
        if used.unseen:
            return WorkspaceError(
                WorkspaceProblem.NO_ROOM,
                f"{used.unseen}, so what it keeps in files it removed cannot be counted "
                "against the quota.",
            )
        used = dataclasses.replace(used, bytes=used.bytes + used.held_open)
        pause = min(WATCH_AT_MOST_S, max(WATCH_EVERY_S, 10 * (time.monotonic() - began)))
        if workspaces.over_entries(used) and used.entries > before.entries:
            return used
        if used.bytes >= WATCH_SLACK * workspaces.quota_bytes and used.bytes > before.bytes:
            return used


async def _until_due(files: Path, pause: float, room: int) -> None:
    """Waits `pause` seconds, or less once the file system of `files` lost `room` bytes
    or more of its free space, to whoever wrote them: a look at it (statvfs) every
    WATCH_POLL_S costs microseconds. No least wait: a program may make its own counts
    slow (review6 finding 02)."""
    loop = asyncio.get_running_loop()
    start, free = loop.time(), _free_bytes(files)
    while (left := start + pause - loop.time()) > 0:
        await asyncio.sleep(min(left, WATCH_POLL_S))
        if free - _free_bytes(files) >= room:
            return


def _free_bytes(files: Path) -> int:
    try:
        found = os.statvfs(files)
    except OSError:  # torn down meanwhile: the count says so
        return 0
    return found.f_bfree * found.f_frsize


async def _steady_count(bench: Workbench, workspace: Workspace) -> Use:
    """A count of the running program's workspace in which no folder moved under the
    walk. A folder listed and gone when entered is left out of a count, and a program
    told when the walk passes (inotify) can move its files out of the walk's way every
    time (review4 finding 02); a program that builds and cleans moves folders too,
    though rarely under every count. So a count with moved folders is taken again at
    once, and WATCH_REWALKS such counts in a row fail closed: the program cannot be
    counted, and is stopped."""
    for _ in range(WATCH_REWALKS):
        used = await bench.use(workspace)
        if not used.moved:
            return used
        bench.workspaces.changed(workspace)
    raise WorkspaceError(
        WorkspaceProblem.NO_ROOM,
        f"folders of the workspace moved, or its programs could not be held still, under "
        f"each of {WATCH_REWALKS} counts in a row while the program ran, so what it wrote "
        "cannot be counted against the quota.",
        {"moved_folders": used.moved},
    )


def _stopped(bench: Workbench, workspace: Workspace, found: Use | WorkspaceError) -> WorkerError:
    if isinstance(found, WorkspaceError):
        return WorkerError(
            _translated(found).code,  # too_large: the watch's counts fail as no_room
            f"the program was stopped while it ran: {found.message}",
            {**found.details, "stopped": True},
        )
    workspaces = bench.workspaces
    if workspaces.over_entries(found):
        what = f"more than {workspaces.max_entries:,} files and folders ([sandbox] max_entries)"
    else:
        what = f"{found.bytes:,} bytes of its {workspaces.quota_bytes:,}-byte quota"
        if found.held_open:
            what += f" ({found.held_open:,} of them in files it removed but kept open or mapped)"
    return WorkerError(
        "too_large",
        f"the program was stopped while it ran: plan {workspace.plan_id!r}'s workspace "
        f"reached {what}. What it wrote is kept, but the plan can write nothing more; "
        "remove files it no longer needs, or tear it down to start over.",
        {
            "stopped": True,
            "quota_bytes": workspaces.quota_bytes,
            "used_bytes": found.bytes,
            "max_entries": workspaces.max_entries,
            "entries": found.entries,
            "held_open_bytes": found.held_open,
        },
    )


def _check_quota(
    bench: Workbench,
    workspace: Workspace,
    before: Use,
    after: Use,
    exit_code: int | None,
    signal: int | None,
) -> None:
    """`too_large` when a program's writes took the plan to its quota or past it (each
    file was bounded by the room left, not the files together), or past its cap of
    entries: what it wrote is kept, and the plan, full, can write no more (fs_write
    refuses, programs get no room) until it is torn down (or, for entries, until a
    program removes files)."""
    workspaces = bench.workspaces
    if workspaces.over_entries(after) and after.entries > before.entries:
        cap = workspaces.max_entries
        raise WorkerError(
            "too_large",
            f"the program left more than {cap:,} files and folders in plan "
            f"{workspace.plan_id!r}'s workspace, its cap ([sandbox] max_entries); the plan "
            "can write nothing more. Remove files it no longer needs (one archive instead "
            "of many small files), or tear the plan down to start over.",
            {
                "max_entries": cap,
                "entries": after.entries,
                "exit_code": exit_code,
                "signal": exec_cmd._signal_name(signal),
            },
        )
    quota = workspaces.quota_bytes
    used = after.bytes
    if used <= before.bytes or used < quota:
        return
    raise WorkerError(
        "too_large",
        f"the program filled plan {workspace.plan_id!r}'s workspace: it now uses {used:,} "
        f"bytes of its {quota:,}-byte quota ({before.bytes:,} before the program ran). What it "
        "wrote is kept, but the plan can write nothing more; tear it down to start over.",
        {
            "quota_bytes": quota,
            "used_bytes": used,
            "used_before_bytes": before.bytes,
            "exit_code": exit_code,
            "signal": exec_cmd._signal_name(signal),
        },
    )


# What confining a call to its plan's workspace may add to a host action's answers.
_PLAN_CODES: Final = frozenset(
    {ErrorCode.PATH_NOT_ALLOWED, ErrorCode.PERMISSION_DENIED, ErrorCode.TOO_LARGE}
)


def build(bench: Workbench) -> Registry:
    """The workbenchHost table: each host action's SPEC (models, caps, codes), its
    handler confined to the call's plan, every call marked sandboxed."""
    confined: list[tuple[ActionSpec[Any, Any], Any, str]] = [
        (
            fs_stat.SPEC,
            _stat(bench),
            "type, size, mode, owner and times of a path in the plan's workspace",
        ),
        (
            fs_read.SPEC,
            _look(bench, fs_read.read_in_thread),
            "up to 1 MiB of a regular file in the plan's workspace (offset/length), in the blob",
        ),
        (
            fs_write.SPEC,
            _write(bench),
            "create, overwrite or append to a file in the plan's workspace, within its quota",
        ),
        (
            fs_list.SPEC,
            _look(bench, fs_list.fs_list),
            "a folder's entries in the plan's workspace, symlinks never entered",
        ),
        (
            http_fetch.SPEC,
            _fetch(bench),
            "one HTTP(S) request to a public address: the plan's only way to the network",
        ),
        (
            exec_cmd.SPEC,
            _exec(bench),
            "run an allowlisted program in a sandbox that sees only the plan's workspace "
            f"(at {MOUNT_POINT}), with no network; the blob is its stdin",
        ),
    ]
    paths = host_paths(bench.workspaces.base)
    return table(
        *(
            dataclasses.replace(
                host,
                surface=SURFACE,
                handler=answering_in_plan_terms(paths, handler),
                summary=summary,
                sandboxed=True,
                codes=host.codes | _PLAN_CODES,
                # Claimed before the handler runs: it makes the plan's workspace first.
                claims_late=False,
            )
            for host, handler, summary in confined
        )
    )


# ----------------------------------------------------------------- the start-up probe


def _program(name: str) -> str | None:
    found = shutil.which(name)
    return None if found is None else os.path.realpath(found)


def check_uids(paths: Paths, settings: SandboxSection) -> None:
    """With [sandbox] uids, that this worker can give plans a uid of their own
    (sandbox.plan_uids.problem); WorkerError (sandbox_unavailable) saying why not."""
    uids = settings.uid_range
    if uids is None:
        return
    problem = plan_uids.problem(uids, paths.workbench, paths.data_dir)
    if problem is not None:
        raise WorkerError("sandbox_unavailable", f"sandbox mode cannot start: {problem}.")


async def probe(config: Config) -> None:
    """Build one sandbox as every exec will (as a plan's uid, with [sandbox] uids), and
    run `true` in it; WorkerError (sandbox_unavailable) saying why and what to change
    when that fails."""
    true = _program("true")
    settings = config.exec
    uids = config.sandbox.uid_range
    uid = None if uids is None else uids.start
    try:
        if true is None:
            raise SandboxUnavailableError("`true` is not on this machine's PATH")
        with tempfile.TemporaryDirectory(prefix="agentworker-probe-") as scratch:
            os.chmod(scratch, 0o700)
            if uid is not None:
                os.chown(scratch, uid, uid)
            view = View(
                cwd=MOUNT_POINT,
                mounts=(Mount(scratch, writable=True, target=MOUNT_POINT),),
                env=environment.build({}, ()),
                network=False,
                bwrap=settings.bwrap,
                read_only_root=True,
                uid=uid,
            )
            limits = Limits(timeout_s=20.0, processes=settings.max_processes)
            # A one-off check before any call: a latch of its own (a refusal raises here).
            done = await run([true], view, limits, pid_cap=PidCap())
        if done.exit_code != 0:
            said = (done.stderr or done.stdout).decode(errors="replace").strip()[:300]
            raise SandboxUnavailableError(
                f"a program in it did not run (exit {done.exit_code}, signal {done.signal}): "
                f"{said or 'no message'}"
            )
    except SandboxUnavailableError as exc:
        raise WorkerError(
            "sandbox_unavailable",
            f"sandbox mode cannot start: bubblewrap ({settings.bwrap}) cannot build the sandbox "
            f"every call runs in, and no call is ever run without it. {exc} To fix it: install "
            "bubblewrap and util-linux; allow unprivileged user namespaces (sysctl "
            "kernel.unprivileged_userns_clone=1 and user.max_user_namespaces > 0; on Ubuntu "
            "24.04+ also kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile "
            "for bwrap); in a container, allow the unshare/clone syscalls (a seccomp profile "
            "that permits user namespaces).",
        ) from None
