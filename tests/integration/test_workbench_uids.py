"""A uid of each plan's own ([sandbox] uids, a root worker): a real hub, a real
`agentworker run --sandbox` as root, real bubblewrap with the entry helper, Landlock
and the filter.

The kernel keeps some counts per user that no namespace or rlimit bounds. Run as
the worker's user, a sandbox took all of root's 5,491,507 epoll watches in 7.2 s,
and every event loop of root's then got ENOSPC. Run as its plan's own uid, it
exhausts only that uid's.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox import plan_uids
from tests.support.cluster import Cluster, cluster, wait_for
from tests.support.policies import PYTHON3, exec_config
from tests.support.workbench import call, files_of, run, sandbox_cluster, teardown
from worker.config import SandboxSection

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="[sandbox] uids needs a root worker")

# A range of this test process's own: two runs at once must not share a uid (a
# teardown kills every process of its plan's). Above login.defs' default SUB_UID_MAX
# (600100000): the start refuses ids useradd gives out later.
FIRST = 1_900_000_000 + (os.getpid() % 10_000) * 100
UIDS = f"{FIRST}-{FIRST + 99}"

# In the sandbox: adds epoll watches until the kernel refuses (its user's
# fs.epoll.max_user_watches): one process (so the quota watch holds it still at once)
# with 4,000 eventfds, each in up to 4,000 epoll instances (16M watches at most, more
# than the kernel lets a user have). Refuses to as the worker's user (root): that
# would take root's. Says in `ready` how many it added, why it stopped and as whom
# (written whole, then renamed: the test reads it once it is there, and read an empty
# one between its creation and the write), then holds them until the FIFO `go` is
# opened.
FILL_WATCHES = textwrap.dedent(
    """
    import errno, os, select
    def say(text):
        with open("ready.part", "w") as out:
            out.write(text)
        os.rename("ready.part", "ready")
    if os.getuid() == 0:
        say("0 runs-as-root 0")
        raise SystemExit(1)
    os.mkfifo("go")
    fds = [os.eventfd(0) for _ in range(4000)]
    eps, added, why = [], 0, ""
    try:
        while len(eps) < 4000:
            ep = select.epoll()
            eps.append(ep)
            for fd in fds:
                ep.register(fd, select.EPOLLIN)
                added += 1
    except OSError as exc:
        why = errno.errorcode[exc.errno]
    say(f"{added} {why or 'none'} {os.getuid()}")
    open("go").close()
    """
)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("uids")
    settings = exec_config(base, PYTHON3, extra="open_files = 8192\nmax_timeout_s = 900\n") + (
        f'\n[sandbox]\nuids = "{UIDS}"\nplan_memory_mb = 8192\n'
    )
    with sandbox_cluster(base, extra_config=settings) as c:
        yield c


def new_plan() -> str:
    return f"plan-{uuid.uuid4().hex[:12]}"


def meta_of(live: Cluster, plan: str) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads(
        (files_of(live, "bench", plan).parent / "plan.json").read_text()
    )
    return meta


def let_go(fifo: Path) -> bool:
    """Open the program's FIFO `go` for writing (it ends once it is), if it waits on it."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # not made yet, or no reader yet (ENXIO)
        return False
    return True


def add_a_watch() -> str:
    """What the worker's user (root: this test) gets adding one epoll watch."""
    with select.epoll() as ep:
        fd = os.eventfd(0)
        try:
            ep.register(fd, select.EPOLLIN)
            return "added"
        except OSError as exc:
            return exc.strerror or str(exc)
        finally:
            os.close(fd)


def test_epoll_watches_a_plan_takes_are_its_uids_not_the_workers(
    live: Cluster,
) -> None:
    plan = new_plan()
    files = files_of(live, "bench", plan)
    done: list[tuple[dict[str, Any], bytes]] = []
    running = threading.Thread(
        target=lambda: done.append(
            run(live, plan, ["python3", "-c", FILL_WATCHES], timeout_s=600, timeout_ms=600_000)
        )
    )
    running.start()
    try:
        wait_for(lambda: (files / "ready").exists() or bool(done), 600)
        assert (files / "ready").exists(), done[0][0].get("error", done)
        added, why, uid = (files / "ready").read_text().split()
        # The plan's program ran as its own uid (as the worker's, its watches would be
        # root's), and the kernel refused it its next watch: it holds every watch that
        # uid may have.
        assert int(uid) != 0, "the plan's program runs as the worker's user"
        assert int(uid) == meta_of(live, plan)["uid"] and int(uid) in plan_uids.parse(UIDS)
        assert why == "ENOSPC" and int(added) > 1_000_000, (added, why)
        # While it holds them all, the worker's user adds one as ever.
        assert add_a_watch() == "added"
    finally:
        wait_for(lambda: not running.is_alive() or let_go(files / "go"), 600)
        running.join(600)
    ((out, _blob),) = done
    assert out["status"] == "ok" and out["result"]["exit_code"] == 0, out.get("error", out)
    assert teardown(live, plan)["result"]["removed"] is True  # its uid free again


def test_each_plan_has_a_uid_and_everything_in_its_workspace_is_that_uids(
    live: Cluster,
) -> None:
    first, second = new_plan(), new_plan()
    for plan in (first, second):
        out, _ = call(live, plan, "fs_write", {"path": "a/b/c.txt", "make_parents": True}, b"x")
        assert out["status"] == "ok", out
        out, blob = run(
            live, plan, ["python3", "-c", "import os; open('d.txt','w'); print(os.getuid())"]
        )
        assert out["status"] == "ok" and out["result"]["exit_code"] == 0, (out, blob)
        uid = meta_of(live, plan)["uid"]
        assert int(blob) == uid
        files = files_of(live, "bench", plan)
        for made in ("", "a", "a/b", "a/b/c.txt", "d.txt"):
            st = os.lstat(files / made)
            assert (st.st_uid, st.st_gid) == (uid, uid), made
        # the worker's write replaced by the program, and the program's by the worker
        out, blob = run(live, plan, ["python3", "-c", "open('a/b/c.txt','a').write('y')"])
        assert out["result"]["exit_code"] == 0, (out, blob)
        out, _ = call(live, plan, "fs_write", {"path": "d.txt", "mode": "overwrite"}, b"z")
        assert out["status"] == "ok" and os.lstat(files / "d.txt").st_uid == uid, out
    assert meta_of(live, first)["uid"] != meta_of(live, second)["uid"]
    for plan in (first, second):  # their uids free again (the range is 100 long)
        assert teardown(live, plan)["result"]["removed"] is True


def test_a_teardown_kills_what_runs_as_the_plans_uid_before_its_files_go(
    live: Cluster,
) -> None:
    plan = new_plan()
    out, _ = call(live, plan, "fs_write", {"path": "a.txt"}, b"x")
    assert out["status"] == "ok", out
    uid = meta_of(live, plan)["uid"]
    # A leftover of the plan's uid (none outlives its sandbox: this one is made so)
    leftover = subprocess.Popen(["sleep", "600"], user=uid, group=uid, extra_groups=[], cwd="/")
    try:
        out = teardown(live, plan)
        assert out["status"] == "ok" and out["result"]["removed"] is True, out
        assert leftover.wait(timeout=60) == -9
        assert not files_of(live, "bench", plan).parent.exists()
    finally:
        leftover.kill()
        leftover.wait()


def start_refused(home: Path, become: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """`agentworker run --sandbox` with the home `home` (as `become` says, else as
    root): a start the uids' checks stop before it dials (nothing listens there)."""
    return subprocess.run(
        [*become, sys.executable, "-m", "worker", "run", "--sandbox", "--server", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env={
            **os.environ,
            "AGENTWORKER_HOME": str(home),
            "AGENTWORKER_TOKEN": "not-used",
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        },
    )


def test_a_worker_that_is_not_root_refuses_to_start_with_uids() -> None:
    user = 4252
    place = Path(tempfile.mkdtemp(prefix="aw-uids-", dir="/tmp"))
    try:
        place.chmod(0o755)
        home = place / "home"
        home.mkdir()
        (home / "config.toml").write_text(f'[sandbox]\nuids = "{UIDS}"\n')
        for made in (home, home / "config.toml"):
            os.chown(made, user, user)
        started = start_refused(
            home, ("setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups")
        )
    finally:
        shutil.rmtree(place)
    assert started.returncode == 8, started.stderr
    assert "only a worker running as root" in started.stderr, started.stderr
    assert f"runs as uid {user}" in started.stderr


def test_a_range_of_subordinate_ids_useradd_gives_out_later_stops_the_start() -> None:
    """review29b r2, the rest: login.defs' SUB_UID_MIN-SUB_UID_MAX (100000-600100000
    where it names none) is where each new user's rootless containers' ids come from."""
    place = Path(tempfile.mkdtemp(prefix="aw-uids-", dir="/tmp"))
    try:
        place.chmod(0o711)
        (place / "config.toml").write_text('[sandbox]\nuids = "200000-200999"\n')
        started = start_refused(place)
    finally:
        shutil.rmtree(place)
    assert started.returncode == 8, started.stderr
    assert "subordinate uids (SUB_UID_MIN-SUB_UID_MAX in /etc/login.defs" in started.stderr
    assert 'Choose a range outside them, e.g. "1900000000-1900000999"' in started.stderr


@pytest.mark.parametrize(
    ("uids", "said"),
    [
        ("10", 'write it as "A-B"'),
        ("200-x", 'write it as "A-B"'),
        ("5000-4000", "ends before it starts"),
        ("10-2000", "below 1000 are the system's accounts"),
        ("2147483000-2147484000", "bubblewrap cannot map a uid above 2147483647"),
    ],
)
def test_a_range_that_is_no_range_of_uids_is_refused_saying_why(uids: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        SandboxSection(uids=uids)


def test_a_range_holding_an_account_is_refused_naming_it(tmp_path: Path) -> None:
    nobody = 65534
    problem = plan_uids.problem(range(nobody - 5, nobody + 1), tmp_path / "workbench", tmp_path)
    assert problem is not None and f"({nobody})" in problem and "no account uses" in problem


def test_a_data_folder_linked_past_a_folder_others_cannot_pass_is_refused() -> None:
    """review29b #4 (r6): the check walked the data folder's path as written, so a link
    into a folder others cannot pass (/root) passed, and then every exec failed: the
    plan's uid could not reach its workspace by the real path bubblewrap resolves."""
    place = Path(tempfile.mkdtemp(prefix="aw-uids-", dir="/tmp"))
    try:
        place.chmod(0o711)
        closed = place / "closed"
        closed.mkdir(mode=0o700)
        real = closed / "home"
        real.mkdir(mode=0o700)
        link = place / "home"
        link.symlink_to(real)
        problem = plan_uids.problem(plan_uids.parse(UIDS), link / "workbench", link)
    finally:
        shutil.rmtree(place)
    assert problem is not None
    assert f"the folder {closed} (mode 700) above the worker's data folder" in problem, problem
    assert f"data folder {link} (a link to {real}) may not be searched" in problem, problem


def test_a_start_without_uids_shuts_the_data_folder_again(tmp_path: Path) -> None:
    """review29b #5: a start with [sandbox] uids lets others pass through the data
    folder (0701); once the setting is gone nothing needs that, and it stayed. And
    worker_id was written 0644, readable by any user passing through."""
    with cluster(tmp_path / "home", worker=False) as c:
        home = c.home
        home.chmod(0o701)  # as a start with the setting left it
        (home / "worker_id").write_text("was-a-uids-worker\n")
        (home / "worker_id").chmod(0o644)  # as a worker from before wrote it
        c.start_worker()
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        assert stat.S_IMODE((home / "worker_id").stat().st_mode) == 0o600
        assert any(w.worker_id == "was-a-uids-worker" and w.connected for w in c.workers())


def test_sandbox_list_shows_each_plans_uid(live: Cluster) -> None:
    plan = new_plan()
    assert call(live, plan, "fs_write", {"path": "a.txt"}, b"x")[0]["status"] == "ok"
    uid = meta_of(live, plan)["uid"]
    bench = live.home.parent / "bench"
    env = {**live.env, "AGENTWORKER_HOME": str(bench)}
    listed = subprocess.run(
        [sys.executable, "-m", "worker", "sandbox", "list", "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert {row["plan_id"]: row["uid"] for row in json.loads(listed.stdout)}[plan] == uid
    text = subprocess.run(
        [sys.executable, "-m", "worker", "sandbox", "list"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    [line] = [line for line in text.splitlines() if line.startswith(plan + "  ")]
    assert f"  uid {uid}  " in line, text
    assert teardown(live, plan)["result"]["removed"] is True
    # The worker wrote its id at its start (review29b #5): its user's alone, though
    # other users pass through its data folder.
    assert stat.S_IMODE((bench / "worker_id").stat().st_mode) == 0o600
