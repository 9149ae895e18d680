"""git in the exec sandbox reads only repository configuration the worker wrote.

A repository's own `.git/config` can name programs that read-only commands run:
a `filter.*.clean` driver runs on `git status`, `diff.*.textconv` on `git log -p`
and `git blame`, `diff.external` on `git diff`, an `[include]` pulls in more of
the same. The files in a shared folder are not trusted (an archive of someone's
working copy carries its `.git/config`, and the agent may write one), so git
never reads that file here.

git reads a repository's config from its *common* folder, `$GIT_COMMON_DIR/config`.
The worker finds the repository, has git parse its config (no includes, nothing
run), keeps only keys that name no program (the format version, object format,
remotes' URLs and branches' upstreams) and builds a private common folder inside
the sandbox, on the sandbox's own read-only tmpfs: that clean `config` plus links
to the repository's objects, refs and the rest. `GIT_DIR`, `GIT_COMMON_DIR` and
`GIT_WORK_TREE` are set explicitly, so git follows no pointer file (`.git` files,
`commondir`) and discovers nothing; whatever an agent renames or rewrites in the
shared folder, even while git runs, the config git reads is the worker's. (How
the worker itself read the pointer files only decides which repository's data
git sees: it can never make git read a config other than the private one.)
Hooks are not linked; signature checks name a gpg that does not exist (and the
policy refuses the format placeholders that would ask for them). Submodules are
not entered (the policy's env sets diff.ignoreSubmodules), since each has a
config of its own.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from allowlist import Program
from sandbox import (
    ChangedWhileOpenedError,
    ConfinementError,
    Root,
    locate,
    open_regular,
    read_at,
)
from sandbox.environment import SAFE_PATH
from sandbox.process import PrivateDir
from worker.errors import CONFINEMENT_CODES, WorkerError

CONFIG_MAX: Final = 1024 * 1024
READ_TRIES: Final = 5
NO_REPOSITORY: Final = "/nonexistent/agentworker-no-repository"
# Where the private common folder appears inside the sandbox (never a shared folder).
PRIVATE_COMMON: Final = "/run/agentworker/git-common"
NO_GPG: Final = "/nonexistent/agentworker-signatures-are-not-checked"
# What git keeps in the common folder (git's path.c, common_list), less `config`,
# which is ours, and `hooks`, which runs programs. Linked whether or not they exist.
COMMON_ENTRIES: Final = (
    "objects",
    "refs",
    "packed-refs",
    "info",
    "logs",
    "shallow",
    "remotes",
    "branches",
    "worktrees",
    "rr-cache",
    "svn",
    "lost-found",
    "common",
    "reftable",
)
_KEPT: Final = re.compile(
    r"core\.(repositoryformatversion|bare|filemode|symlinks|ignorecase|precomposeunicode)"
    r"|extensions\.(objectformat|preciousobjects)"
    r"|remote\..+\.(url|pushurl|fetch)"
    r"|branch\..+\.(remote|merge)",
    re.IGNORECASE | re.DOTALL,
)


@dataclass
class GitView:
    env: dict[str, str] = field(default_factory=dict)
    private: list[PrivateDir] = field(default_factory=list)


@asynccontextmanager
async def git_view(
    program: Program,
    path: str,
    roots: Sequence[Root],
    cwd: str,
    thread: Callable[..., Awaitable[GitView]] = asyncio.to_thread,
) -> AsyncIterator[GitView]:
    """For git: the env and private common folder to run it in `cwd`, looked up in a
    `thread` (exec's: a lane of its own where the roots' lookups may hang). For any
    other program: nothing to add."""
    if program.name != "git":
        yield GitView()
        return
    for root in roots:
        if _overlaps(str(root.path), PRIVATE_COMMON):
            raise WorkerError(
                "path_not_allowed",
                f"the shared folder {root.path} overlaps {PRIVATE_COMMON}, where git's "
                "private settings go inside the sandbox; git cannot run with it shared",
            )
    with tempfile.TemporaryDirectory(prefix="agentworker-git-") as scratch:
        yield await thread(_prepare, path, roots, cwd, Path(scratch))


def _prepare(git: str, roots: Sequence[Root], cwd: str, scratch: Path) -> GitView:
    found = _discover(roots, cwd)
    if found is None:
        return GitView(env={"GIT_DIR": NO_REPOSITORY})
    work_tree, git_dir, common = found
    text = _read_inside(roots, str(common / "config"))
    raw = scratch / "raw"
    raw.write_bytes(text)
    clean = _sanitized(_parse(git, raw)).encode("utf-8", "surrogateescape")
    folder = PrivateDir(
        path=PRIVATE_COMMON,
        files={"config": clean},
        links={name: str(common / name) for name in COMMON_ENTRIES},
    )
    return GitView(
        env={
            "GIT_DIR": str(git_dir),
            "GIT_COMMON_DIR": PRIVATE_COMMON,
            "GIT_WORK_TREE": str(work_tree),
        },
        private=[folder],
    )


def _overlaps(a: str, b: str) -> bool:
    a, b = a.rstrip("/") + "/", b.rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)


def _discover(roots: Sequence[Root], cwd: str) -> tuple[Path, Path, Path] | None:
    """(work tree, git dir, common dir) of the repository holding `cwd`, as git finds it."""
    here = Path(cwd)
    root = locate(roots, cwd).root.path
    while True:
        dot_git = here / ".git"
        if dot_git.is_dir():
            git_dir = _inside(roots, dot_git)
            break
        if dot_git.is_file():
            pointer = _line(_read_inside(roots, str(dot_git)))
            if not pointer.startswith("gitdir: "):
                return None
            git_dir = _inside(roots, here / pointer[len("gitdir: ") :])
            break
        if here == root or here.parent == here:
            return None
        here = here.parent
    common = git_dir
    if (git_dir / "commondir").is_file():
        pointer = _line(_read_inside(roots, str(git_dir / "commondir")))
        common = _inside(roots, git_dir / pointer)
    return here, git_dir, common


def _line(data: bytes) -> str:
    """A pointer file's text as git reads it: only the line ends come off."""
    return data.decode("utf-8", "surrogateescape").rstrip("\r\n")


def _inside(roots: Sequence[Root], path: Path) -> Path:
    """`path` resolved; refused unless it lies in a shared folder (the sandbox sees no other)."""
    real = Path(os.path.realpath(path))
    try:
        locate(roots, str(real))
    except ConfinementError as exc:
        raise WorkerError(
            "path_not_allowed", f"the repository's git folder is not usable: {exc.message}"
        ) from None
    return real


def _read_inside(roots: Sequence[Root], path: str) -> bytes:
    """A small regular file's bytes, opened beneath its root (no FIFO, device or link out).

    A file replaced between its check and its open (an atomic overwrite) is read again,
    a few times: any of its versions will do, since only its safe keys are kept.
    """
    for tries_left in reversed(range(READ_TRIES)):
        try:
            return _read_once(roots, path)
        except ChangedWhileOpenedError as exc:
            if not tries_left:
                code = CONFINEMENT_CODES[exc.problem]
                raise WorkerError(code, f"the repository cannot be read: {exc.message}") from None
    raise AssertionError("unreachable")


def _read_once(roots: Sequence[Root], path: str) -> bytes:
    try:
        located = locate(roots, path)
        with located.root.confined() as root:
            fd = open_regular(root, located.relative, allow_hard_links=True)
            try:
                if os.fstat(fd).st_size > CONFIG_MAX:
                    raise WorkerError(
                        "too_large", f"{path} is over {CONFIG_MAX:,} bytes; git is not run"
                    )
                return read_at(fd, 0, CONFIG_MAX)
            finally:
                os.close(fd)
    except ChangedWhileOpenedError:
        raise
    except ConfinementError as exc:
        code = CONFINEMENT_CODES[exc.problem]
        raise WorkerError(code, f"the repository cannot be read: {exc.message}") from None


def _parse(git: str, config: Path) -> list[tuple[str, str]]:
    """(key, value) pairs as git itself reads `config`: includes off, nothing run."""
    done = subprocess.run(  # a pinned git, fixed arguments, no shell
        [git, "config", "--no-includes", "--file", str(config), "--null", "--list"],
        capture_output=True,
        env={"PATH": SAFE_PATH, "LANG": "C", "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent"},
        timeout=10,
        check=False,
    )
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip()[:300]
        raise WorkerError("command_not_allowed", f"the repository's config does not parse: {said}")
    pairs = []
    for entry in done.stdout.decode("utf-8", "surrogateescape").split("\0"):
        key, _, value = entry.partition("\n")
        if key:
            pairs.append((key, value))
    return pairs


def _sanitized(pairs: list[tuple[str, str]]) -> str:
    lines = [f'[gpg]\n\tprogram = "{NO_GPG}"']
    lines += [f'[gpg "{kind}"]\n\tprogram = "{NO_GPG}"' for kind in ("openpgp", "x509", "ssh")]
    for key, value in pairs:
        if not _KEPT.fullmatch(key):
            continue
        section, _, rest = key.partition(".")
        subsection, _, name = rest.rpartition(".")
        header = f'[{section} "{_escaped(subsection)}"]' if subsection else f"[{section}]"
        lines += [header, f'\t{name} = "{_escaped(value)}"']
    return "\n".join(lines) + "\n"


def _escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
