"""Per-plan limits on processes, memory and CPU, through one cgroup per plan.

Bounding a plan's programs as a whole (every sandbox of the plan together) takes
a cgroup per plan holding all of them, with a cap on processes, memory and CPU
time. Two kinds of machine can give the worker that, and `choose` finds which
this one is, changing nothing:

- **cgroup v2, delegated** (`CgroupV2`): the worker runs in a cgroup v2 subtree
  it may write to (`systemd-run --user --scope -p Delegate=yes`, or a service
  with `Delegate=yes`) whose `cgroup.controllers` offers cpu, memory and pids.
  v2 lets no cgroup hold processes and hand controllers to its children at once,
  so `prepare` moves the worker into a leaf of its own (`worker/`), then enables
  the controllers; each plan's cgroup is a sibling of that leaf, with `pids.max`,
  `memory.max` (`memory.swap.max` 0) and `cpu.max`.
- **cgroup v1, as root** (`CgroupV1`): hierarchies for cpu, memory and pids
  mounted read-write (many hybrid machines, where cgroup v2 is mounted too but
  holds none of those controllers). Beneath the worker's own cgroup in each
  hierarchy it makes `agentworker-<tag>/` (the tag names its data folder, so
  workers beside each other never touch each other's), and a plan's cgroup is a
  child of that in each of the three, with `pids.max`, `memory.limit_in_bytes`
  (and `memory.memsw.limit_in_bytes`, so swap is no way round it) and
  `cpu.cfs_quota_us`/`cpu.cfs_period_us`.

Where neither applies, sandbox mode bounds each sandbox with rlimits instead (see
worker.actions.workbench), and `choose` says why neither does.

A program joins its plan's cgroup before it runs: bubblewrap holds the sandbox at
its start line (--block-fd) while the worker writes the sandbox's first pid into
each `cgroup.procs` (`PlanGroup.join`, called by sandbox.process.run); only then
is the sandbox let go, so nothing of the program ever runs, or forks, outside
the plan's cgroup. The sandbox sees no cgroup file system (nothing of /sys is
mounted in it, and it can mount nothing), so it can neither read nor raise its
limits, nor move itself out.

`PlanGroup.destroy` kills every process in the cgroup (`cgroup.kill` where the
kernel has it, else each listed pid through a pidfd, checked to be in the cgroup
before the signal) until it is empty, then removes it. A cgroup is made for one
plan once and never given to another: its name carries a counter unique to this
worker's run, and leftovers of an earlier run are destroyed by `prepare`.

Every step that touches the cgroup file system goes through `Files`, the kernel
boundary (real files; the v2 protocol's tests pass a fake cgroupfs). Failures
are `CgroupError`, saying which file and why: the caller refuses the call rather
than run it unlimited. Standard library only; the blocking steps (mkdir, writes
that migrate processes, waiting for a kill) are for a thread, not an event loop.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import select
import signal
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Final

NEEDED: Final = ("cpu", "memory", "pids")
HOW: Final = (
    "start the worker in a delegated cgroup v2 subtree (systemd-run --user --scope "
    "-p Delegate=yes agentworker run --sandbox, or a service with Delegate=yes) on a "
    "machine whose cgroup v2 offers the cpu, memory and pids controllers; or, as root, "
    "with cgroup v1 hierarchies for cpu, memory and pids mounted read-write"
)
CPU_PERIOD_US: Final = 100_000
LEAF: Final = "worker"  # cgroup v2: the worker's own leaf beneath its delegated cgroup
PLAN_PREFIX: Final = "plan-"
EMPTY_WITHIN_S: Final = 20.0  # a cgroup still populated after this, killed all along, is an error


class CgroupError(Exception):
    """A plan's cgroup could not be made, limited, joined or removed; the message says
    which file and why."""


@dataclass(frozen=True)
class PlanLimits:
    """What all of one plan's programs together may use."""

    processes: int  # pids.max
    memory_bytes: int  # memory.max / memory.limit_in_bytes (swap: none)
    cpus: float  # CPU time per second of wall time, in CPUs

    @property
    def cpu_quota_us(self) -> int:
        return round(self.cpus * CPU_PERIOD_US)


@dataclass(frozen=True)
class Counters:
    """A plan cgroup's event counts: out-of-memory kills, forks refused at the process
    cap, periods in which the CPU quota throttled it."""

    oom_kills: int = 0
    forks_refused: int = 0
    throttled: int = 0

    def met_since(self, before: Counters) -> list[str]:
        """The limits met between `before` and these counts: "memory", "processes", "cpu"."""
        met = []
        if self.oom_kills > before.oom_kills:
            met.append("memory")
        if self.forks_refused > before.forks_refused:
            met.append("processes")
        if self.throttled > before.throttled:
            met.append("cpu")
        return met


class Files:
    """The kernel boundary: every read, write, mkdir and rmdir the backends make on a
    cgroup file system. A write never creates a file (a cgroup's files are the
    kernel's: a missing one is an error, not a new file)."""

    def read(self, path: Path) -> str:
        with open(path, encoding="ascii") as handle:
            return handle.read()

    def write(self, path: Path, text: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, text.encode("ascii"))
        except OSError as exc:  # the kernel refused the value: say which file
            raise type(exc)(exc.errno, exc.strerror, str(path)) from None
        finally:
            os.close(fd)

    def exists(self, path: Path) -> bool:
        return os.path.exists(path)

    def mkdir(self, path: Path) -> None:
        os.mkdir(path, 0o755)

    def rmdir(self, path: Path) -> None:
        os.rmdir(path)

    def listdir(self, path: Path) -> list[str]:
        return os.listdir(path)


REAL: Final = Files()


def _say(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _field(text: str, key: str) -> int:
    """The number after `key` in a `key value` per line file (0 when absent)."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            with contextlib.suppress(ValueError):
                return int(value.strip())
    return 0


@dataclass(frozen=True)
class _Place:
    """One cgroup of a plan, in one hierarchy: its folder, and its path as
    /proc/<pid>/cgroup spells it."""

    folder: Path
    inside: str


class PlanGroup:
    """One plan's cgroup (in each hierarchy, for v1): join a sandbox to it, read its
    counters, destroy it."""

    def __init__(
        self,
        name: str,
        places: tuple[_Place, ...],
        counter_files: tuple[Path, Path, Path],
        files: Files,
    ) -> None:
        self.name = name
        self.places = places
        self._counter_files = counter_files  # (oom kills, forks refused, throttled)
        self._files = files
        self.destroyed = False

    @property
    def folders(self) -> tuple[Path, ...]:
        return tuple(place.folder for place in self.places)

    def join(self, pid: int) -> None:
        """Move process `pid` (held before it runs anything) into the plan's cgroup,
        in every hierarchy; CgroupError if any move fails, or if the plan's processes
        are then more than its cap (the caller kills `pid`, which never ran).

        A move is not a fork: the kernel lets it take a cgroup past pids.max. A
        sandbox joining a plan already at its cap ran its program as one process more
        than the cap (one more for each sandbox joining so), the forks of the plan's
        other programs having filled it meanwhile."""
        for place in self.places:
            procs = place.folder / "cgroup.procs"
            try:
                self._files.write(procs, f"{pid}\n")
            except OSError as exc:
                raise CgroupError(
                    f"could not move the sandbox into its plan's cgroup ({procs}): {_say(exc)}"
                ) from None
        folder = self._counter_files[1].parent  # the pids controller's cgroup
        try:
            current = int(self._files.read(folder / "pids.current"))
            cap = self._files.read(folder / "pids.max").strip()
        except (OSError, ValueError) as exc:
            reason = _say(exc) if isinstance(exc, OSError) else "not a number"
            raise CgroupError(
                f"could not read the plan's process count ({folder}/pids.current): {reason}"
            ) from None
        if cap != "max" and current > int(cap):
            raise CgroupError(f"the plan already runs its cap of {cap} processes")

    def counters(self) -> Counters:
        oom, pids, cpu = self._counter_files
        try:
            return Counters(
                oom_kills=_field(self._files.read(oom), "oom_kill"),
                forks_refused=_field(self._files.read(pids), "max"),
                throttled=_field(self._files.read(cpu), "nr_throttled"),
            )
        except OSError:
            return Counters()

    def destroy(self) -> None:
        """Kill every process in the plan's cgroup, wait until they are gone, and remove
        it. Idempotent; CgroupError if it cannot be emptied or removed."""
        for place in self.places:
            _destroy(self._files, place)
        self.destroyed = True


def _destroy(files: Files, place: _Place) -> None:
    if not files.exists(place.folder):
        return
    kill = place.folder / "cgroup.kill"
    if files.exists(kill):
        with contextlib.suppress(OSError):
            files.write(kill, "1\n")
    deadline = time.monotonic() + EMPTY_WITHIN_S
    while time.monotonic() < deadline:
        try:
            pids = [int(word) for word in files.read(place.folder / "cgroup.procs").split()]
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise CgroupError(f"could not read {place.folder}/cgroup.procs: {exc}") from None
        if not pids:
            try:
                files.rmdir(place.folder)
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise CgroupError(f"could not remove {place.folder}: {_say(exc)}") from None
                time.sleep(0.01)  # still settling in the kernel: nothing to wait on
                continue
        if not _kill_and_wait(pids, place.inside, deadline):
            time.sleep(0.01)  # listed, but gone by the time we looked: read it again
    raise CgroupError(f"the processes in {place.folder} could not all be killed")


def _holds(pid: int, inside: str) -> bool:
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return False
    return any(line.split(":", 2)[-1] == inside for line in lines)


def _exited(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def _kill_and_wait(pids: list[int], inside: str, deadline: float) -> int:
    """SIGKILL each pid still in the cgroup (through a pidfd, checked to be in the
    cgroup while the pidfd was open: a reused pid is never signalled), then wait
    until they have exited. Returns how many it killed."""
    fds = []
    try:
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue  # gone already
            if not _holds(pid, inside) or _exited(fd):
                os.close(fd)  # gone, its pid maybe reused: the next listing tells
                continue
            fds.append(fd)
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        waiting = set(fds)
        while waiting and time.monotonic() < deadline:
            for fd, _ in poller.poll(max(1, int((deadline - time.monotonic()) * 1000))):
                poller.unregister(fd)
                waiting.discard(fd)
    finally:
        for fd in fds:
            os.close(fd)
    return len(fds)


class Backend(ABC):
    """One kind of cgroup the worker makes plans' cgroups in."""

    kind: str  # "cgroup v2" or "cgroup v1 (root)", for what the worker says

    def __init__(self, files: Files) -> None:
        self.files = files
        self._serial = itertools.count(1)

    @property
    @abstractmethod
    def where(self) -> str:
        """The folder(s) the plans' cgroups are made in."""

    @abstractmethod
    def prepare(self) -> list[str]:
        """Ready the worker's cgroups, and destroy plan cgroups an earlier run left;
        returns their names. CgroupError when it cannot."""

    @abstractmethod
    def create(self, plan_key: str, limits: PlanLimits) -> PlanGroup:
        """A new cgroup for one plan, its limits written; CgroupError (and nothing
        left behind) when any step fails."""

    @abstractmethod
    def close(self) -> None:
        """Remove what `prepare` made, once every plan's cgroup is destroyed."""

    def _name(self, plan_key: str) -> str:
        return f"{PLAN_PREFIX}{plan_key[:16]}-{next(self._serial)}"

    def _make(
        self,
        group: PlanGroup,
        writes: list[tuple[Path, str]],
        if_present: tuple[Path, str] | None = None,
    ) -> PlanGroup:
        """Make the group's folders and write its limits; `if_present` is a limit
        written only where the kernel offers its file (swap accounting may be off)."""
        made: list[_Place] = []
        try:
            for place in group.places:
                try:
                    self.files.mkdir(place.folder)
                except FileExistsError:
                    raise CgroupError(
                        f"{place.folder} exists already; a plan's cgroup is never shared"
                    ) from None
                made.append(place)
            for path, value in writes:
                self.files.write(path, value)
            if if_present is not None and self.files.exists(if_present[0]):
                self.files.write(*if_present)  # after the others: swap's bound is theirs
        except OSError as exc:
            for place in made:
                with contextlib.suppress(CgroupError):
                    _destroy(self.files, place)
            what = getattr(exc, "filename", None) or "its folder"
            raise CgroupError(
                f"could not make plan cgroup {group.name} ({what}): {_say(exc)}"
            ) from None
        except CgroupError:
            for place in made:
                with contextlib.suppress(CgroupError):
                    _destroy(self.files, place)
            raise
        return group

    def _leftovers(self, folder: Path, inside: str) -> list[str]:
        removed = []
        for name in sorted(self.files.listdir(folder)):
            if name.startswith(PLAN_PREFIX) and self.files.exists(folder / name / "cgroup.procs"):
                _destroy(self.files, _Place(folder / name, f"{inside.rstrip('/')}/{name}"))
                removed.append(name)
        return removed


class CgroupV2(Backend):
    """A delegated cgroup v2 subtree at `root` (the worker's own cgroup), whose path
    in /proc/self/cgroup is `inside`."""

    kind = "cgroup v2"

    def __init__(self, root: Path, inside: str, files: Files = REAL) -> None:
        super().__init__(files)
        self.root = root
        self.inside = inside

    @property
    def where(self) -> str:
        return str(self.root)

    def prepare(self) -> list[str]:
        files, root = self.files, self.root
        try:
            removed = self._leftovers(root, self.inside)
            leaf = root / LEAF
            if not files.exists(leaf):
                files.mkdir(leaf)
            # No internal processes: every process of the worker's cgroup moves to the
            # leaf before the cgroup can hand its controllers to the plans' cgroups.
            for word in files.read(root / "cgroup.procs").split():
                try:
                    files.write(leaf / "cgroup.procs", f"{word}\n")
                except ProcessLookupError:
                    continue  # it exited meanwhile
            enabled = files.read(root / "cgroup.subtree_control").split()
            wanted = [f"+{name}" for name in NEEDED if name not in enabled]
            if wanted:
                files.write(root / "cgroup.subtree_control", " ".join(wanted) + "\n")
        except OSError as exc:
            raise CgroupError(
                f"could not ready the delegated cgroup {root} for plans' cgroups "
                f"({getattr(exc, 'filename', None) or root}): {_say(exc)}"
            ) from None
        return removed

    def create(self, plan_key: str, limits: PlanLimits) -> PlanGroup:
        name = self._name(plan_key)
        folder = self.root / name
        place = _Place(folder, f"{self.inside.rstrip('/')}/{name}")
        counters = (folder / "memory.events", folder / "pids.events", folder / "cpu.stat")
        group = PlanGroup(name, (place,), counters, self.files)
        writes = [
            (folder / "pids.max", f"{limits.processes}\n"),
            (folder / "memory.max", f"{limits.memory_bytes}\n"),
            (folder / "cpu.max", f"{limits.cpu_quota_us} {CPU_PERIOD_US}\n"),
        ]
        return self._make(group, writes, if_present=(folder / "memory.swap.max", "0\n"))

    def close(self) -> None:
        """The leaf stays: the worker is in it until it exits."""


class CgroupV1(Backend):
    """cgroup v1 hierarchies for cpu, memory and pids, used as root: `own` maps each
    controller to the worker's cgroup in its hierarchy (folder, path as
    /proc/self/cgroup spells it); plans' cgroups go in `agentworker-<tag>` there."""

    kind = "cgroup v1 (root)"

    def __init__(self, own: dict[str, tuple[Path, str]], tag: str, files: Files = REAL) -> None:
        super().__init__(files)
        self.base = {
            name: _Place(folder / f"agentworker-{tag}", f"{inside.rstrip('/')}/agentworker-{tag}")
            for name, (folder, inside) in own.items()
        }

    def _bases(self) -> list[_Place]:
        """Each distinct base folder once (controllers mounted together share one)."""
        return list({place.folder: place for place in self.base.values()}.values())

    @property
    def where(self) -> str:
        return ", ".join(str(place.folder) for place in self._bases())

    def prepare(self) -> list[str]:
        removed: list[str] = []
        try:
            for base in self._bases():
                if not self.files.exists(base.folder):
                    self.files.mkdir(base.folder)
                removed += self._leftovers(base.folder, base.inside)
        except OSError as exc:
            raise CgroupError(
                f"could not ready {getattr(exc, 'filename', None) or self.where} for plans' "
                f"cgroups: {_say(exc)}"
            ) from None
        return sorted(set(removed))

    def create(self, plan_key: str, limits: PlanLimits) -> PlanGroup:
        name = self._name(plan_key)
        at = {
            controller: _Place(base.folder / name, f"{base.inside}/{name}")
            for controller, base in self.base.items()
        }
        places = tuple({place.folder: place for place in at.values()}.values())
        pids, memory, cpu = at["pids"].folder, at["memory"].folder, at["cpu"].folder
        counters = (memory / "memory.oom_control", pids / "pids.events", cpu / "cpu.stat")
        group = PlanGroup(name, places, counters, self.files)
        writes = [
            (pids / "pids.max", f"{limits.processes}\n"),
            (memory / "memory.limit_in_bytes", f"{limits.memory_bytes}\n"),
            (cpu / "cpu.cfs_period_us", f"{CPU_PERIOD_US}\n"),
            (cpu / "cpu.cfs_quota_us", f"{limits.cpu_quota_us}\n"),
        ]
        swap = memory / "memory.memsw.limit_in_bytes"  # memory and swap together
        return self._make(group, writes, if_present=(swap, f"{limits.memory_bytes}\n"))

    def close(self) -> None:
        for base in self._bases():
            with contextlib.suppress(OSError):
                self.files.rmdir(base.folder)


# ----------------------------------------------------------------- which applies here


@dataclass(frozen=True)
class CgroupSupport:
    """`usable`: a delegated cgroup v2 subtree with the controllers a plan needs is at
    `folder`. Otherwise `reason` says what is missing."""

    usable: bool
    folder: Path | None
    reason: str
    controllers: tuple[str, ...] = ()
    inside: str = ""  # the worker's cgroup as /proc/self/cgroup spells it


@dataclass(frozen=True)
class Choice:
    """Which cgroups bound a plan here: `backend` (None: neither kind, so rlimits), and
    `note`, what to say: where the plans' cgroups go, or why neither kind applies."""

    backend: Backend | None
    note: str
    v2: CgroupSupport


def choose(
    tag: str,
    mountinfo_path: str = "/proc/self/mountinfo",
    cgroup_path: str = "/proc/self/cgroup",
) -> Choice:
    """cgroup v2 where a delegated subtree offers cpu, memory and pids; else cgroup v1
    as root; else neither, and why. Changes nothing."""
    v2 = probe(mountinfo_path, cgroup_path)
    if v2.usable and v2.folder is not None:
        backend: Backend = CgroupV2(v2.folder, v2.inside)
        return Choice(backend, f"cgroup v2 at {backend.where}", v2)
    own, why_not_v1 = probe_v1(mountinfo_path, cgroup_path)
    if own is not None:
        backend = CgroupV1(own, tag)
        return Choice(backend, f"cgroup v1 (root) at {backend.where}", v2)
    return Choice(None, f"not cgroup v2: {v2.reason}; not cgroup v1: {why_not_v1}", v2)


def _v1_mounts(mountinfo: str) -> dict[str, tuple[str, str, bool]]:
    """Each cgroup v1 controller's hierarchy: (root inside it, mount point, read-write)."""
    found: dict[str, tuple[str, str, bool]] = {}
    for line in mountinfo.splitlines():
        if " - " not in line:
            continue
        fields, after = line.split(" - ", 1)[0].split(), line.split(" - ", 1)[1].split()
        if len(fields) < 6 or len(after) < 3 or after[0] != "cgroup":
            continue
        writable = "rw" in fields[5].split(",") and "rw" in after[2].split(",")
        for option in after[2].split(","):
            if option in NEEDED:
                found[option] = (fields[3], fields[4].replace("\\040", " "), writable)
    return found


def probe_v1(
    mountinfo_path: str = "/proc/self/mountinfo", cgroup_path: str = "/proc/self/cgroup"
) -> tuple[dict[str, tuple[Path, str]] | None, str]:
    """The worker's cgroup in the v1 hierarchy of each of cpu, memory and pids (its
    folder, and its path as /proc/self/cgroup spells it), where a root worker can
    make plans' cgroups beneath them; else None and why not."""
    try:
        mountinfo = Path(mountinfo_path).read_text()
        membership = Path(cgroup_path).read_text()
    except OSError as exc:
        return None, f"cannot read the process's cgroups: {exc.strerror}"
    mounts = _v1_mounts(mountinfo)
    missing = [name for name in NEEDED if name not in mounts]
    if missing:
        return None, f"no cgroup v1 hierarchy for {', '.join(missing)}"
    if os.geteuid() != 0:
        return None, "cgroup v1 hierarchies are here, but only a root worker may use them"
    own: dict[str, tuple[Path, str]] = {}
    for line in membership.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for name in parts[1].split(","):
            if name in mounts:
                root, point, writable = mounts[name]
                path = parts[2]
                if not (path == root or path.startswith(root.rstrip("/") + "/")):
                    return None, f"the worker's {name} cgroup {path} is not under a mount here"
                if not writable:
                    return None, f"the cgroup v1 {name} hierarchy at {point} is mounted read-only"
                folder = Path(point) / path[len(root) :].lstrip("/")
                if not os.access(folder, os.W_OK):
                    return None, f"the worker's {name} cgroup {folder} is not writable"
                own[name] = (folder, path)
    absent = [name for name in NEEDED if name not in own]
    if absent:
        return None, f"the worker is in no cgroup v1 {', '.join(absent)} cgroup"
    return own, ""


def _cgroup2_mounts(mountinfo: str) -> list[tuple[str, str]]:
    """(root inside the hierarchy, mount point) of each cgroup2 mount."""
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        after = line.split(" - ", 1)[1].split()
        if after and after[0] == "cgroup2":
            found.append((fields[3], fields[4].replace("\\040", " ")))
    return found


def _v1_controllers(mountinfo: str) -> set[str]:
    """Controllers bound to a cgroup v1 hierarchy (so absent from v2)."""
    held: set[str] = set()
    for line in mountinfo.splitlines():
        if " - " not in line:
            continue
        after = line.split(" - ", 1)[1].split()
        if len(after) >= 3 and after[0] == "cgroup":
            held.update(option for option in after[2].split(",") if option in NEEDED)
    return held


def probe(
    mountinfo_path: str = "/proc/self/mountinfo", cgroup_path: str = "/proc/self/cgroup"
) -> CgroupSupport:
    """Whether a delegated cgroup v2 subtree offers this process cpu, memory and pids,
    and why not."""
    try:
        mountinfo = Path(mountinfo_path).read_text()
        membership = Path(cgroup_path).read_text()
    except OSError as exc:
        return CgroupSupport(False, None, f"cannot read the process's cgroups: {exc.strerror}")
    mounts = _cgroup2_mounts(mountinfo)
    if not mounts:
        return CgroupSupport(False, None, "no cgroup v2 hierarchy is mounted")
    own = next((line[3:] for line in membership.splitlines() if line.startswith("0::")), None)
    if own is None:
        return CgroupSupport(False, None, "the worker is in no cgroup v2 (cgroup v1 only)")
    for root, point in mounts:
        if own == root or own.startswith(root.rstrip("/") + "/"):
            folder = Path(point) / own[len(root) :].lstrip("/")
            break
    else:
        return CgroupSupport(False, None, f"the worker's cgroup {own} is not under a mount here")
    try:
        offered = tuple((folder / "cgroup.controllers").read_text().split())
    except OSError as exc:
        return CgroupSupport(False, folder, f"cannot read {folder}/cgroup.controllers: {exc}")
    missing = [name for name in NEEDED if name not in offered]
    if missing:
        on_v1 = sorted(set(missing) & _v1_controllers(mountinfo))
        where = f" (on cgroup v1 here: {', '.join(on_v1)})" if on_v1 else ""
        noun = "controllers" if len(missing) > 1 else "controller"
        return CgroupSupport(
            False,
            folder,
            f"cgroup v2 at {folder} offers no {', '.join(missing)} {noun}{where}",
            offered,
        )
    if own in ("/", ""):
        return CgroupSupport(
            False,
            folder,
            f"the worker runs in the root cgroup ({folder}), not in a subtree delegated to it",
            offered,
        )
    writable = all(
        os.access(path, os.W_OK)
        for path in (folder, folder / "cgroup.procs", folder / "cgroup.subtree_control")
    )
    if not writable:
        return CgroupSupport(
            False, folder, f"the worker's cgroup {folder} is not delegated to it (not writable)"
        )
    return CgroupSupport(True, folder, f"delegated cgroup v2 at {folder}", offered, own)
