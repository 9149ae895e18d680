"""Issue 10's attacks, each replayed as a hostile agent would: fs_write, then exec.

Every test goes through a real hub and worker with the shipped default policy and
one read-write shared folder. A trap is armed first and shown to fire under plain
git (outside the worker), so a test that passes is not passing because the trap
was broken.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import Cluster
from tests.support.host_calls import call, call_many, dispatch, error_code, shared_cluster

RACE_ROUNDS = 200
GIT = ["git", "-c", "user.email=a@b", "-c", "user.name=n", "-c", "commit.gpgsign=false"]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with shared_cluster(tmp_path_factory.mktemp("attacks") / "home") as c:
        yield c


def write(live: Cluster, path: str, content: bytes, mode: str = "overwrite") -> dict[str, Any]:
    out, _ = call(live, "fs_write", {"path": path, "mode": mode, "make_parents": True}, content)
    assert out["status"] == "ok", out
    return out


def run_exec(live: Cluster, argv: list[str], cwd: str) -> tuple[dict[str, Any], bytes]:
    return call(live, "exec", {"argv": argv, "cwd": cwd})


def repository(folder: Path) -> None:
    folder.mkdir()
    subprocess.run([*GIT, "-C", str(folder), "init", "-q"], check=True)
    (folder / "a.txt").write_text("one\n")
    subprocess.run([*GIT, "-C", str(folder), "add", "a.txt"], check=True)
    subprocess.run([*GIT, "-C", str(folder), "commit", "-qm", "first"], check=True)
    (folder / "a.txt").write_text("one\ntwo\n")  # so that `git diff` has a change to show


def hostile_config(mark: Path) -> bytes:
    return (
        "[core]\n\trepositoryformatversion = 0\n"
        f"[diff]\n\texternal = \"sh -c 'touch {mark}'\"\n"
        f'[core]\n\tpager = "touch {mark}"\n'
    ).encode()


def test_a_commondir_with_a_trailing_space_never_leads_git_to_the_agents_config(
    live: Cluster, box: Path
) -> None:
    """A: `commondir` = "c2 \\n". git strips only the line end and reads `.git/c2 /config`;
    the worker used to strip all blanks and clean `.git/c2/config` instead."""
    repository(box / "repo")
    mark = box / "PWNED"
    base = f"{box.name}/repo/.git"
    write(live, f"{base}/c2/config", b"[core]\n\trepositoryformatversion = 0\n")
    write(live, f"{base}/c2 /config", hostile_config(mark))
    objects = f"{box / 'repo' / '.git' / 'objects'}\n".encode()
    write(live, f"{base}/c2 /objects/info/alternates", objects)
    write(live, f"{base}/c2 /refs/keep", b"")
    write(live, f"{base}/commondir", b"c2 \n")
    armed = subprocess.run(["git", "diff"], cwd=box / "repo", capture_output=True, check=False)
    assert mark.exists(), ("the trap is armed: plain git runs the external diff", armed)
    mark.unlink()
    out, blob = run_exec(live, ["git", "diff"], f"{box.name}/repo")
    assert out["status"] == "ok" and b"+two" in blob, (out, blob)
    assert not mark.exists(), "git read the agent's config through commondir"


def test_b_renaming_a_config_over_the_repositorys_never_reaches_git(
    live: Cluster, box: Path
) -> None:
    """B: an fs_write `overwrite` renames the agent's config over `.git/config` while
    `git diff` runs. git reads the worker's private copy, never that name."""
    repository(box / "repo")
    mark = box / "PWNED"
    config = f"{box.name}/repo/.git/config"
    plain = (box / "repo" / ".git" / "config").read_bytes()
    hostile = plain + hostile_config(mark)
    requests: list[tuple[str, dict[str, Any], bytes]] = []
    for round_ in range(RACE_ROUNDS):
        content = hostile if round_ % 2 else plain
        requests.append(("fs_write", {"path": config, "mode": "overwrite"}, content))
        requests.append(("exec", {"argv": ["git", "diff"], "cwd": f"{box.name}/repo"}, b""))
    answers = call_many(live, requests, in_flight=8)
    failed = [out["error"] for out, _ in answers if out["status"] != "ok"]
    assert not failed, failed[:3]
    diffs = [blob for (action, _, _), (_, blob) in zip(requests, answers, strict=True)]
    assert sum(b"+two" in blob for blob in diffs) == RACE_ROUNDS, "every git diff ran for real"
    assert not mark.exists(), "git read the agent's config in a race"
    # Calls in flight together finish in any order, so which write the race left is
    # not known: the hostile one is written last, alone, to show the trap was real.
    assert write(live, config, hostile)["status"] == "ok"
    subprocess.run(["git", "diff"], cwd=box / "repo", capture_output=True, check=False)
    assert mark.exists(), "the trap was armed: plain git runs the external diff"


def signed_commit(folder: Path) -> None:
    """Make HEAD a commit with a (bogus) signature: enough for git to call gpg."""
    tree = subprocess.run(
        ["git", "-C", str(folder), "rev-parse", "HEAD^{tree}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    body = (
        f"tree {tree}\nauthor n <a@b> 0 +0000\ncommitter n <a@b> 0 +0000\n"
        "gpgsig -----BEGIN PGP SIGNATURE-----\n \n AAAA\n -----END PGP SIGNATURE-----\n"
        "\nsigned\n"
    )
    sha = subprocess.run(
        ["git", "-C", str(folder), "hash-object", "-t", "commit", "-w", "--stdin"],
        input=body,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    subprocess.run(["git", "-C", str(folder), "update-ref", "HEAD", sha], check=True)


def test_g_signature_checks_never_run_gpg(live: Cluster, box: Path) -> None:
    """G: `git log --format=%G?` verifies signatures, which runs gpg.program. The
    placeholder is refused; the repository's own gpg.program and log.showSignature
    are never read; and git's gpg names a program that does not exist."""
    repository(box / "repo")
    signed_commit(box / "repo")
    mark = box / "PWNED"
    fake_gpg = box / "gpg.sh"
    write(live, f"{box.name}/gpg.sh", f"#!/bin/sh\ntouch {mark}\n".encode())
    fake_gpg.chmod(0o755)
    config = f"{box.name}/repo/.git/config"
    plain = (box / "repo" / ".git" / "config").read_bytes()
    write(
        live,
        config,
        plain + f'[gpg]\n\tprogram = "{fake_gpg}"\n[log]\n\tshowSignature = true\n'.encode(),
    )
    subprocess.run(["git", "log", "-n1"], cwd=box / "repo", capture_output=True, check=False)
    assert mark.exists(), "the trap is armed: plain git runs the repository's gpg.program"
    mark.unlink()
    for argv in (
        ["git", "log", "--format=%G?"],
        ["git", "log", "--format=%h %GS"],
        ["git", "show", "--format=%GK", "HEAD"],
        ["git", "branch", "--format=%(signature)"],
    ):
        out, _ = run_exec(live, argv, f"{box.name}/repo")
        assert error_code(out) == "command_not_allowed", (argv, out)
        assert "gpg" in out["error"]["message"], out
    out, blob = run_exec(live, ["git", "log", "-n", "1"], f"{box.name}/repo")
    assert out["status"] == "ok" and out["result"]["exit_code"] == 0, (out, blob)
    assert b"signed" in blob and b"gpg" not in blob.lower(), blob
    out, blob = run_exec(live, ["git", "log", "--format=%%G? %s", "-n", "1"], f"{box.name}/repo")
    assert out["status"] == "ok" and blob == b"%G? signed\n", (out, blob)
    assert not mark.exists(), "git ran a gpg"


def test_d_exec_refuses_a_hard_linked_file_as_fs_read_does(
    live: Cluster, box: Path, tmp_path: Path
) -> None:
    """D: with `[fs] allow_hard_links = false` (the default), a file with another name
    outside the shared folders is refused by exec's path checks, as by fs_read."""
    outside = tmp_path / "secret.txt"
    outside.write_text("not shared\n")
    (box / "link.txt").hardlink_to(outside)
    (box / "plain.txt").write_text("shared\n")
    out, _ = call(live, "fs_read", {"path": f"{box.name}/link.txt"})
    assert error_code(out) == "path_not_allowed", out
    for argv in (["cat", "link.txt"], ["head", "-n", "1", "link.txt"], ["xxd", "link.txt"]):
        out, blob = run_exec(live, argv, box.name)
        assert error_code(out) == "path_not_allowed", (argv, out, blob)
        assert "hard links" in out["error"]["message"], out
    out, blob = run_exec(live, ["cat", "plain.txt"], box.name)
    assert out["status"] == "ok" and blob == b"shared\n", out


def test_d_a_program_that_walks_folders_never_reaches_a_hard_linked_file(
    live: Cluster, box: Path, tmp_path: Path
) -> None:
    """D, inside folders: `grep -r x .` and the like open files no argument names. With
    `allow_hard_links = false` the worker walks the folders such a program searches
    first and refuses the call, naming the file, when one has several names."""
    outside = tmp_path / "secret.txt"
    outside.write_text("needle outside\n")
    linked = box / "deep" / "er"
    linked.mkdir(parents=True)
    (linked / "link.txt").hardlink_to(outside)
    clean = box / "clean"
    clean.mkdir()
    (clean / "plain.txt").write_text("needle shared\n")
    (box / "top.txt").write_text("needle top\n")
    where = f"{box.name}/deep/er/link.txt"

    def refused(argv: list[str], cwd: str = box.name) -> None:
        out, blob = run_exec(live, argv, cwd)
        assert error_code(out) == "path_not_allowed", (argv, out, blob)
        error = out["error"]
        assert "hard links" in error["message"] and error["details"]["links"] == 2, error
        assert error["details"]["path"].endswith(where), error
        assert "allow_hard_links" in error["message"]

    def allowed(argv: list[str], cwd: str = box.name) -> bytes:
        out, blob = run_exec(live, argv, cwd)
        assert out["status"] == "ok", (argv, out, blob)
        assert b"outside" not in blob, (argv, blob)
        return blob

    refused(["grep", "-r", "needle", "."])
    refused(["grep", "-rn", "needle"])  # no path: grep searches where it runs
    refused(["grep", "-r", "needle"], ".")  # the shared folder above holds it too
    refused(["grep", "--directories=recurse", "needle", "deep"])
    refused(["grep", "-f", "top.txt", "-r"])  # -f names a file; the search is still "."
    refused(["diff", "-r", "clean", "deep"])
    # A link to a folder is followed (as grep -R, rg -L do): the walk goes where it leads.
    (clean / "around").symlink_to(linked)
    refused(["grep", "-r", "needle", "clean"])
    (clean / "around").unlink()
    assert allowed(["grep", "-r", "needle", "clean"]) == b"clean/plain.txt:needle shared\n"
    assert allowed(["grep", "needle", "top.txt"]) == b"needle top\n"  # no walk: named only
    # Listing and stat-ing open no file's content, as fs_list and fs_stat may.
    assert b"link.txt" in allowed(["ls", "-R"])
    assert b"link.txt" in allowed(["find", ".", "-type", "f"])
    # git reads the files of its working tree: refused there, not in history alone.
    repo = box / "repo"
    repository(repo)
    assert allowed(["git", "status", "--short"], f"{box.name}/repo") == b" M a.txt\n"
    (repo / "b.txt").hardlink_to(outside)
    out, _ = run_exec(live, ["git", "status", "--short"], f"{box.name}/repo")
    assert error_code(out) == "path_not_allowed" and "b.txt" in out["error"]["message"], out
    out, _ = run_exec(live, ["git", "diff"], f"{box.name}/repo")
    assert error_code(out) == "path_not_allowed", out
    assert allowed(["git", "log", "--format=%s"], f"{box.name}/repo") == b"first\n"


@pytest.fixture(scope="module")
def home_shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A worker whose second shared folder holds its own home (config, token, data);
    a third holds none of it."""
    base = tmp_path_factory.mktemp("shares-home")
    other = tmp_path_factory.mktemp("beside-home", numbered=False)
    root = "".join(f'[[root]]\npath = "{folder}"\nmode = "rw"\n' for folder in (base, other))
    with shared_cluster(base / "home", extra_config=root) as c:
        yield c


def test_e_the_workers_own_folders_stay_out_of_reach_when_a_root_holds_them(
    home_shared: Cluster,
) -> None:
    """E: a person shares the folder that holds the worker's home. The token, config,
    allowlist and databases in it stay unreachable by fs_* and exec, by their own
    names and through symbolic links; the start log names the hidden folder."""
    live = home_shared
    home, base = live.home, live.home.parent
    token = live.token
    (base / "token-link").symlink_to(home / "hub.token")
    (base / "home-link").symlink_to(home)
    for path in (
        f"{home}/hub.token",
        f"{home}/config.toml",
        f"{home}/state.db",
        f"{base}/token-link",
        f"{base}/home-link/hub.token",
    ):
        out, blob = call(live, "fs_read", {"path": path})
        assert error_code(out) == "path_not_allowed", (path, out)
        assert token.encode() not in blob
        if not path.endswith("token-link"):  # fs_stat describes a link itself: allowed
            out, _ = call(live, "fs_stat", {"path": path})
            assert error_code(out) == "path_not_allowed", (path, out)
    for path, mode in (
        (f"{home}/allowlist.toml", "create"),
        (f"{home}/config.toml", "overwrite"),
        (f"{base}/home-link/allowlist.toml", "create"),
    ):
        out, _ = call(live, "fs_write", {"path": path, "mode": mode}, b"[program.sh]\n")
        assert error_code(out) == "path_not_allowed", (path, out)
    assert not (home / "allowlist.toml").exists()
    out, _ = call(live, "fs_list", {"path": str(base), "depth": 3, "hidden": True})
    assert out["status"] == "ok", out
    names = [entry["path"] for entry in out["result"]["entries"]]
    assert "token-link" in names and not any(n == "home" or n.startswith("home/") for n in names)
    out, _ = call(live, "fs_list", {"path": f"{base}/home-link"})
    assert error_code(out) == "path_not_allowed", out
    for argv in (
        ["cat", f"{home}/hub.token"],
        ["cat", "token-link"],
        ["wc", "home-link/hub.token"],
    ):
        out, _ = call(live, "exec", {"argv": argv, "cwd": str(base)})
        assert error_code(out) == "path_not_allowed", (argv, out)
    out, blob = call(live, "exec", {"argv": ["grep", "-r", token, "."], "cwd": str(base)})
    assert out["status"] == "ok" and out["result"]["exit_code"] == 1, (out.get("error"), blob)
    log = (home / "worker.log").read_text()
    assert f"holds the worker's own {home}" in log, log[-2000:]


def test_the_workers_own_folder_moved_away_from_its_path_closes_the_root_holding_it(
    home_shared: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The worker's home is withheld by its path. Moved away by a program outside any
    sandbox (the person's `mv`), its token and databases would be in plain view at the
    new path; fs_* and exec refuse the root holding it until it is back."""
    live = home_shared
    home, base = live.home, live.home.parent
    away, secret = base / "home-away", live.token
    token = secret.encode()
    os.rename(home, away)

    def refused(action: str, args: dict[str, Any]) -> None:
        out, blob = live.run(lambda c: dispatch(c, action, args, b""), token=secret)
        assert error_code(out) == "path_not_allowed", (action, out)
        assert f"the worker's own folder {home} is no longer at that" in out["error"]["message"]
        assert token not in blob

    try:
        refused("fs_read", {"path": f"{away}/hub.token"})
        refused("fs_stat", {"path": f"{away}/state.db"})
        refused("fs_list", {"path": str(base)})
        # exec's own path check opens the root first, and refuses the same way
        refused("exec", {"argv": ["cat", "home-away/hub.token"], "cwd": str(base)})
        # run in another shared folder, it is refused all the same: the sandbox shows
        # every shared folder, and blanks the worker's own by their paths
        beside = tmp_path_factory.getbasetemp() / "beside-home"
        refused("exec", {"argv": ["cat", f"{away}/hub.token"], "cwd": str(beside)})
        out, _ = live.run(
            lambda c: dispatch(c, "exec", {"argv": ["ls"], "cwd": str(beside)}, b""), token=secret
        )
        assert error_code(out) == "sandbox_unavailable", out
        assert f"the worker's own folder {home} is no longer at that" in out["error"]["message"]
    finally:
        os.rename(away, home)
    out, _ = call(live, "fs_list", {"path": str(base)})
    assert out["status"] == "ok", out
    out, _ = call(live, "exec", {"argv": ["ls"], "cwd": str(base)})
    assert out["status"] == "ok", out


def test_clear_errors_for_an_argument_over_the_kernels_limit_and_a_huge_offset(
    live: Cluster, box: Path
) -> None:
    """Issue 10, 8: limits the kernel would hit become validation errors naming them."""
    for argument in ("x" * 131_072, "é" * 70_000):
        out, _ = run_exec(live, ["echo", argument], box.name)
        assert error_code(out) == "validation_error", out.get("error")
        assert "131,071 bytes" in out["error"]["message"], out["error"]["message"][:300]
    out, blob = run_exec(live, ["echo", "-n", "x" * 131_071], box.name)
    assert out["status"] == "ok" and len(blob) == 131_071, out
    (box / "a.txt").write_text("a")
    out, _ = call(live, "fs_read", {"path": f"{box.name}/a.txt", "offset": 2**63 - 10})
    assert error_code(out) == "validation_error", out


def test_c_xxd_is_read_the_way_xxd_reads_its_options(
    live: Cluster, box: Path, tmp_path: Path
) -> None:
    """C: xxd reads `-ps` as one option, by its first two letters. Read as `-p -s VALUE`,
    `xxd -ps /etc/passwd` read an unchecked path, `xxd -ps in out` wrote `out`, and
    `xxd -ps -r -ps hex target` patched `target` in place through a hard link."""
    write(live, f"{box.name}/a.bin", b"hello", mode="create")
    write(live, f"{box.name}/hex", b"00000000: 5757\n", mode="create")
    outside = tmp_path / "target"
    outside.write_bytes(b"original")
    (box / "target").hardlink_to(outside)
    for argv, code in (
        (["xxd", "-ps", "/etc/passwd"], "path_not_allowed"),
        (["xxd", "-ps", "a.bin", "out"], "command_not_allowed"),
        (["xxd", "-ps", "-r", "-ps", "hex", "target"], "command_not_allowed"),
        (["xxd", "-revert", "hex"], "command_not_allowed"),
    ):
        out, _ = run_exec(live, argv, box.name)
        assert error_code(out) == code, (argv, out.get("error"))
    assert not (box / "out").exists() and outside.read_bytes() == b"original"
    for argv, expected in (
        (["xxd", "-ps", "a.bin"], b"68656c6c6f\n"),
        (["xxd", "-p", "-s1", "a.bin"], b"656c6c6f\n"),
        (["xxd", "-p", "-seek", "2", "a.bin"], b"6c6c6f\n"),
        (["xxd", "--ps", "-l", "1", "a.bin"], b"68\n"),
    ):
        out, blob = run_exec(live, argv, box.name)
        assert out["status"] == "ok" and blob == expected, (argv, out.get("error"), blob)
