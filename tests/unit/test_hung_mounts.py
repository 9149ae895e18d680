"""A lookup on a file system that never answers (a FUSE mount whose server is gone, NFS,
CIFS) is made in a thread, never on the worker's one event loop: there it would stop
every other call, the heartbeats, the console and the kill switch (review7 finding 07).
Under a root where every mount on the way and beneath is local, fs_stat and fs_read of a
cached page still answer in the turn that received the call.

The hung file system is real (tests/support/hung_fuse.py): it needs root and /dev/fuse,
and it is mounted in a private mount namespace of a child process, so nothing else on
the machine sees it; the child runs the worker's dispatcher and checks what it answers.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sandbox import mounts
from sandbox.mounts import MountTable
from tests.support.hung_fuse import MNT_DETACH, HungMount, can_mount, hung_mount
from worker import app
from worker.config import Config, GrantSection, Paths, RootSection
from worker.core.pipeline import Dispatcher, Outgoing
from worker.core.threads import LANE_THREADS
from worker.wire.framing import worker_message_of
from worker.wire.local import HandedResult
from worker.wire.proto import agentworker_pb2 as pb

REPO = Path(__file__).resolve().parents[2]

MOUNTINFO = (
    "22 27 0:21 / /proc rw,relatime - proc proc rw\n"
    "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
    "30 27 0:40 / /home rw - nfs4 server:/home rw\n"
    "31 27 0:41 / /srv/data rw - xfs /dev/sdb rw\n"
    "32 31 0:42 / /srv/data/cloud\\040drive rw - fuse.rclone cloud: rw\n"
    "33 27 0:43 / /srv/other rw - tmpfs tmpfs rw\n"
    "34 27 0:44 / /srv/odd rw - somethingnew x rw\n"
)


def test_a_root_is_local_when_every_mount_on_the_way_and_beneath_is() -> None:
    table = mounts.parse(MOUNTINFO)
    assert ("/srv/data/cloud drive", "fuse.rclone") in {(m.point, m.kind) for m in table}
    assert mounts.local_under(table, "/srv/other")
    assert mounts.local_under(table, "/srv/other/deep/er")
    assert mounts.local_under(table, "/srv/data/code")  # beside the FUSE mount, not over it
    assert not mounts.local_under(table, "/srv/data")  # the FUSE mount is beneath
    assert not mounts.local_under(table, "/srv/data/cloud drive/x")  # on the way
    assert not mounts.local_under(table, "/home/me/project")  # NFS on the way
    assert not mounts.local_under(table, "/srv/odd")  # a type not known local: may hang
    assert not mounts.local_under(table, "/")  # every mount is beneath the root
    assert mounts.local_under(table, "/srv/dat")  # a prefix of a name is not a parent


OVERLAYS = (
    "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
    "40 27 0:50 / /srv/fuse rw - fuse.sshfs me@far: rw\n"
    "41 27 0:51 / /srv/scratch rw - tmpfs tmpfs rw\n"
    # an overlay over the FUSE mount, and one over local folders only
    "42 27 0:52 / /srv/over rw - overlay overlay rw,lowerdir=/srv/fuse/base,"
    "upperdir=/srv/scratch/u,workdir=/srv/scratch/w\n"
    "43 27 0:53 / /srv/fine rw - overlay overlay rw,lowerdir=/srv/scratch/l\\134\\0541\\134:x:"
    "/srv/scratch/l2,upperdir=/srv/scratch/u2,workdir=/srv/scratch/w2\n"
    # the FUSE mount named as the second lower folder, after one with an escaped ':'
    "44 27 0:54 / /srv/second rw - overlay overlay rw,lowerdir=/srv/scratch/a\\134:b:/srv/fuse\n"
    # layers given one by one (lowerdir+), the data layer on FUSE
    "45 27 0:55 / /srv/plus rw - overlay overlay rw,lowerdir+=/srv/scratch/l,datadir+=/srv/fuse/d\n"
    "46 27 0:56 / /srv/bare rw - overlay overlay rw\n"  # no folders named: may hang
    # an overlay whose lower folder is an overlay over FUSE
    "47 27 0:57 / /srv/stack rw - overlay overlay rw,lowerdir=/srv/over/x\n"
    # ext4 on loop devices: one backed by a file on FUSE, one on the local disk; an nbd
    "48 27 7:0 / /srv/loopfuse rw - ext4 /dev/loop0 rw\n"
    "49 27 7:1 / /srv/loopdisk rw - squashfs /dev/loop1 ro\n"
    "50 27 43:0 / /srv/nbd rw - ext4 /dev/nbd0 rw\n"
)
BACKING = {"7:0": ("/srv/fuse/disk.img",), "7:1": ("/var/images/tools.sqfs",), "43:0": None}


def test_an_overlay_or_a_loop_device_is_local_only_when_what_it_reads_is() -> None:
    table = mounts.parse(OVERLAYS)
    fine = next(m for m in table if m.point == "/srv/fine")
    assert fine.layers == ("/srv/scratch/l,1:x", "/srv/scratch/l2", "/srv/scratch/u2")

    def backing(device: str) -> tuple[str, ...] | None:
        return BACKING.get(device, ())

    def local(path: str) -> bool:
        return mounts.local_under(table, path, backing)

    assert not local("/srv/over/project")  # its lower folder is on FUSE
    assert local("/srv/fine/project")
    assert not local("/srv/second")  # the FUSE mount is its second lower folder
    assert not local("/srv/plus")  # its data layer is on FUSE
    assert not local("/srv/bare")  # an overlay that names no folders
    assert not local("/srv/stack/deep")  # over an overlay over FUSE
    assert not local("/srv/loopfuse")  # a loop device backed by a file on FUSE
    assert local("/srv/loopdisk")
    assert not local("/srv/nbd")  # a block device a program serves
    assert local("/srv/scratch")


def test_a_block_device_is_told_by_its_sysfs_entry(tmp_path: Path) -> None:
    block, devices = tmp_path / "dev-block", tmp_path / "devices"
    block.mkdir()
    for name, number in (("loop3", "7:3"), ("loop4", "7:4"), ("nbd0", "43:0"), ("vda", "254:0")):
        (devices / name).mkdir(parents=True)
        (block / number).symlink_to(devices / name)
    (devices / "loop3" / "loop").mkdir()
    (devices / "loop3" / "loop" / "backing_file").write_text("/srv/fuse/disk.img\n")
    (devices / "vda" / "vda1").mkdir()
    (devices / "vda" / "vda1" / "partition").write_text("1\n")
    (block / "254:1").symlink_to(devices / "vda" / "vda1")
    backing = functools.partial(mounts.block_backing, sys_block=str(block))
    assert backing("7:3") == ("/srv/fuse/disk.img",)
    assert backing("7:4") is None  # a loop device whose backing file cannot be read
    assert backing("43:0") is None
    assert backing("254:0") == ()
    assert backing("254:1") == ()  # a partition of a disk
    assert backing("0:52") == ()  # no device
    assert mounts.block_backing("7:3", sys_block=str(tmp_path / "none")) == ()


def test_without_a_mount_table_no_root_is_local(tmp_path: Path) -> None:
    table = mounts.MountTable(str(tmp_path / "no-such-file"))
    assert not table.local(str(tmp_path))


def test_the_table_sees_a_mount_made_after_it_was_read() -> None:
    why = can_mount()
    if why is not None:
        pytest.skip(why)
    _in_a_mount_namespace_of_its_own("_mount_seen")


def test_calls_beside_a_hung_lookup_answer_and_local_roots_stay_in_the_turn() -> None:
    why = can_mount()
    if why is not None:
        pytest.skip(why)
    _in_a_mount_namespace_of_its_own("_beside_a_hung_lookup")


def test_an_overlay_over_a_hung_mount_is_looked_up_in_a_thread() -> None:
    why = can_mount()
    if why is not None:
        pytest.skip(why)
    _in_a_mount_namespace_of_its_own("_over_a_hung_lookup")


def test_stuck_lookups_hold_their_roots_lane_never_the_shared_pool() -> None:
    why = can_mount()
    if why is not None:
        pytest.skip(why)
    _in_a_mount_namespace_of_its_own("_stuck_in_a_lane")


def _in_a_mount_namespace_of_its_own(scenario: str) -> None:
    # Only a bound on a failure, below pytest's own: each step waits on an event. A
    # loop blocked by a lookup never gets past it: the child's threads are shown.
    code = (
        "import faulthandler; faulthandler.dump_traceback_later(80, exit=True)\n"
        f"from tests.unit.test_hung_mounts import {scenario} as run; run()"
    )
    try:
        done = subprocess.run(
            ["unshare", "-m", "--propagation", "private", sys.executable, "-c", code],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=100,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the scenario did not end (a loop blocked by a lookup?): {exc.stderr!r}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("ok"), done.stdout + done.stderr


# ------------------------------------------------------ the scenarios, in the child


def _mount_seen() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        table = mounts.MountTable()
        target = Path(tmp) / "mnt"
        target.mkdir()
        assert table.local(tmp)
        with hung_mount(target):
            assert not table.local(tmp), "the new FUSE mount beneath was not seen"
            assert not table.local(str(target))
            assert table.local(str(Path(tmp).parent / "elsewhere"))
        assert table.local(tmp), "its unmount was not seen"
    print("ok")


class _Worker:
    """A dispatcher whose agent "t" may stat, read and exec in two roots, `hung` (which
    will hold the hung mount) and `plain`, and the answers it sent, by correlation id."""

    def __init__(self, base: Path) -> None:
        self.hung, self.plain = base / "hung", base / "plain"
        for root in (self.hung, self.plain):
            (root / "mnt").mkdir(parents=True)
            (root / "ok.txt").write_text("fine\n")
        config = Config(
            root=[RootSection(path=self.hung, mode="ro"), RootSection(path=self.plain, mode="ro")],
            grant=[
                GrantSection(
                    agent="t",
                    scopes=["workerHost.fs_stat", "workerHost.fs_read", "workerHost.exec"],
                )
            ],
        )
        paths = Paths(config_dir=base / "config", data_dir=base / "data")
        self.dispatcher: Dispatcher = app.build_dispatcher(paths, config)
        self.answers: dict[str, pb.ActionResult] = {}
        self.changed = asyncio.Event()
        self.dispatcher.outbox.attach(self._send, self._hand)

    def _send(self, out: Outgoing) -> None:
        message = worker_message_of(out) if isinstance(out, bytes) else out
        if message.WhichOneof("kind") == "result":
            self._answered(message.result)

    def _hand(self, result: HandedResult) -> None:
        self._answered(pb.ActionResult.FromString(result.result))

    def _answered(self, result: pb.ActionResult) -> None:
        self.answers[result.correlation_id] = result
        self.changed.set()

    def ask(self, cid: str, action: str, timeout_ms: int = 0, **args: object) -> None:
        self.dispatcher.submit(
            pb.ActionRequest(
                correlation_id=cid,
                agent_id="t",
                surface="workerHost",
                action=action,
                args_json=json.dumps(args),
                timeout_ms=timeout_ms,
            )
        )

    def running(self) -> set[str]:
        """The calls not answered yet. A call answered in the turn that received it has
        left this set when `submit` returns, though its result may wait for the calls
        still in flight to go out with them."""
        return {call.cid for call in self.dispatcher.unanswered()}

    async def answered(self, *cids: str) -> None:
        while not all(cid in self.answers for cid in cids):
            self.changed.clear()
            await self.changed.wait()


async def _looked_up(mount: HungMount, names: set[str], every: bool = False) -> None:
    """Until the FUSE server has received a LOOKUP of one of `names` (it is sent the
    lookups of one folder one at a time: the others wait in the kernel for that one),
    or of `every` one of them (a server that asked for parallel lookups)."""
    loop = asyncio.get_running_loop()
    seen: set[str] = set()
    while not (names <= seen if every else names & seen):
        readable = loop.create_future()
        loop.add_reader(mount.reports, readable.set_result, None)
        try:
            await readable
        finally:
            loop.remove_reader(mount.reports)
        seen = mount.looked_up()


def _beside_a_hung_lookup() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        worker = _Worker(Path(tmp))
        hung, plain = worker.hung, worker.plain

        async def run() -> None:
            # Before the mount every root is local: answered within submit, in this turn.
            worker.ask("before", "fs_stat", path=f"{hung}/ok.txt")
            assert "before" in worker.answers, "a local root's fs_stat left the turn"
            with hung_mount(hung / "mnt") as mount:
                worker.ask("hung-read", "fs_read", path=f"{hung}/mnt/a")
                worker.ask("hung-stat", "fs_stat", path=f"{hung}/mnt/b")
                worker.ask("hung-exec", "exec", argv=["ls"], cwd=f"{hung}/mnt/c")
                assert {"hung-read", "hung-stat", "hung-exec"} <= worker.running()
                # Their lookups are under way, in threads, and will not end by themselves
                # (had one been made on the loop, the `ask` making it would not return).
                await _looked_up(mount, {"a", "b", "c"})
                # The other root has nothing that may hang: still answered in the turn.
                worker.ask("plain-stat", "fs_stat", path=f"{plain}/ok.txt")
                worker.ask("plain-read", "fs_read", path=f"{plain}/ok.txt")
                assert not worker.running() & {"plain-stat", "plain-read"}, (
                    "a local root's calls left the turn while another root holds a hung mount"
                )
                # Beside the hung mount, in its root: in a thread, and answered.
                worker.ask("beside-stat", "fs_stat", path=f"{hung}/ok.txt")
                worker.ask("beside-read", "fs_read", path=f"{hung}/ok.txt")
                assert {"beside-stat", "beside-read"} <= worker.running()
                await worker.answered("plain-stat", "plain-read", "beside-stat", "beside-read")
                assert {"hung-read", "hung-stat", "hung-exec"} <= worker.running()
                mount.stop()  # the server is gone: its lookups fail
                await worker.answered("hung-read", "hung-stat", "hung-exec")
            await worker.dispatcher.drain(60)

        asyncio.run(run())
        worker.dispatcher.close()
        answers = worker.answers
        for cid in ("before", "plain-stat", "plain-read", "beside-stat", "beside-read"):
            assert answers[cid].status == pb.ActionResult.OK, answers[cid]
        assert json.loads(answers["beside-stat"].result_json)["size"] == 5
        for cid in ("hung-read", "hung-stat", "hung-exec"):
            assert answers[cid].status != pb.ActionResult.OK, answers[cid]
    print("ok")


def _mount(source: str, target: Path, kind: str, options: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(source.encode(), str(target).encode(), kind.encode(), 0, options.encode()):
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {kind} at {target}: {os.strerror(errno)}")


def _unmount(target: Path) -> None:
    ctypes.CDLL(None, use_errno=True).umount2(str(target).encode(), MNT_DETACH)


def _over_a_hung_lookup() -> None:
    """An overlay in a root, its lower folder a hung FUSE mount outside every root (so
    no mount of that type is on the way to the root or beneath it): a name not in its
    upper folder is looked up in FUSE, so the root is not local (review8 finding 05)."""
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        worker = _Worker(base / "w")
        fuse, scratch = base / "fuse", base / "scratch"
        fuse.mkdir()
        scratch.mkdir()
        table: MountTable = worker.dispatcher.containment.mounts

        async def run() -> None:
            assert table.local(str(worker.hung))
            with hung_mount(fuse) as mount:
                _mount("tmpfs", scratch, "tmpfs", "size=8m")
                try:
                    (scratch / "upper").mkdir()
                    (scratch / "work").mkdir()
                    _mount(
                        "overlay",
                        worker.hung / "mnt",
                        "overlay",
                        f"lowerdir={fuse},upperdir={scratch}/upper,workdir={scratch}/work",
                    )
                    try:
                        assert not table.local(str(worker.hung)), "the overlay counts local"
                        assert table.local(str(worker.plain))
                        # Made on the loop, the lookup would not let `ask` return.
                        worker.ask("over", "fs_stat", path=f"{worker.hung}/mnt/anything")
                        assert "over" in worker.running()
                        await _looked_up(mount, {"anything"})
                        worker.ask("plain", "fs_stat", path=f"{worker.plain}/ok.txt")
                        assert "plain" not in worker.running(), "a local root's stat left the turn"
                        mount.stop()  # the server is gone: the lookup fails
                        await worker.answered("over", "plain")
                    finally:
                        _unmount(worker.hung / "mnt")
                finally:
                    _unmount(scratch)
            await worker.dispatcher.drain(60)

        asyncio.run(run())
        worker.dispatcher.close()
        assert worker.answers["plain"].status == pb.ActionResult.OK, worker.answers["plain"]
        assert worker.answers["over"].status != pb.ActionResult.OK
    print("ok")


def _stuck_in_a_lane() -> None:
    """Lookups stuck in a hung FUSE mount hold threads of their root's lane, at most
    LANE_THREADS, never the worker's shared pool: once every thread of the lane belongs
    to a call that stopped waiting, calls under that root answer `busy` at once, naming
    the mount, and the other root's thread work goes on (review8 finding 04)."""
    with tempfile.TemporaryDirectory() as tmp:
        worker = _Worker(Path(tmp))
        hung, plain = worker.hung, worker.plain
        lanes = worker.dispatcher.threads.lanes
        stuck = [f"x{n}" for n in range(LANE_THREADS)]
        long = 3_600_000  # no deadline comes first: the calls are cancelled

        async def run() -> None:
            with hung_mount(hung / "mnt", parallel=True) as mount:
                for name in stuck:
                    worker.ask(name, "fs_stat", long, path=f"{hung}/mnt/{name}")
                await _looked_up(mount, set(stuck), every=True)
                # Its lane is full of lookups whose calls still wait: one more waits too.
                worker.ask("in-line", "fs_read", long, path=f"{hung}/mnt/y", encoding="utf-8")
                # The other root's work runs in the shared pool (the calls, though, take
                # concurrency slots: eight at once, these three fill them).
                for n in range(3):
                    worker.ask(
                        f"plain-{n}", "fs_read", long, path=f"{plain}/ok.txt", encoding="utf-8"
                    )
                await worker.answered(*(f"plain-{n}" for n in range(3)))
                assert "in-line" in worker.running()
                assert lanes.held() == LANE_THREADS
                # The calls stop; their threads stay in the kernel, stuck.
                for name in stuck:
                    assert worker.dispatcher.cancel(name, "the test stops it")
                await worker.answered(*stuck, "in-line")
                assert lanes.stuck() == {str(hung): LANE_THREADS}
                # Beside the stuck lookups, in their root: refused at once, naming the mount.
                worker.ask("again", "fs_stat", long, path=f"{hung}/ok.txt")
                worker.ask("again-exec", "exec", long, argv=["ls"], cwd=str(hung))
                worker.ask("plain-after", "fs_read", long, path=f"{plain}/ok.txt", encoding="utf-8")
                await worker.answered("again", "again-exec", "plain-after")
                mount.stop()  # the server is gone: the stuck lookups fail, their threads end
                await lanes.idle()
                worker.ask("after", "fs_stat", long, path=f"{hung}/ok.txt")
                await worker.answered("after")
            await worker.dispatcher.drain(60)

        asyncio.run(run())
        worker.dispatcher.close()
        answers = worker.answers
        for name in stuck:
            assert answers[name].error.code == "cancelled", answers[name]
        for cid in ("in-line", "again", "again-exec"):
            error = answers[cid].error
            assert error.code == "busy" and error.retryable, answers[cid]
            assert f"fuse.hung at {hung}/mnt" in error.message, error.message
        for cid in (*(f"plain-{n}" for n in range(3)), "plain-after", "after"):
            assert answers[cid].status == pb.ActionResult.OK, answers[cid]
    print("ok")
