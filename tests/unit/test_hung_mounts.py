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
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sandbox import mounts
from tests.support.hung_fuse import HungMount, can_mount, hung_mount
from worker import app
from worker.config import Config, GrantSection, Paths, RootSection
from worker.core.pipeline import Dispatcher, Outgoing
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
    assert ("/srv/data/cloud drive", "fuse.rclone") in table  # \040 is a space
    assert mounts.local_under(table, "/srv/other")
    assert mounts.local_under(table, "/srv/other/deep/er")
    assert mounts.local_under(table, "/srv/data/code")  # beside the FUSE mount, not over it
    assert not mounts.local_under(table, "/srv/data")  # the FUSE mount is beneath
    assert not mounts.local_under(table, "/srv/data/cloud drive/x")  # on the way
    assert not mounts.local_under(table, "/home/me/project")  # NFS on the way
    assert not mounts.local_under(table, "/srv/odd")  # a type not known local: may hang
    assert not mounts.local_under(table, "/")  # every mount is beneath the root
    assert mounts.local_under(table, "/srv/dat")  # a prefix of a name is not a parent


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

    def ask(self, cid: str, action: str, **args: object) -> None:
        self.dispatcher.submit(
            pb.ActionRequest(
                correlation_id=cid,
                agent_id="t",
                surface="workerHost",
                action=action,
                args_json=json.dumps(args),
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


async def _looked_up(mount: HungMount, names: set[str]) -> None:
    """Until the FUSE server has received a LOOKUP of one of `names` (it is sent the
    lookups of one folder one at a time: the others wait in the kernel for that one)."""
    loop = asyncio.get_running_loop()
    seen: set[str] = set()
    while not names & seen:
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
