"""git in the exec sandbox sees its repository's config with every program taken out.

A repository's own `.git/config` can name programs that read-only commands run:
a `filter.*.clean` driver runs on `git status`, `diff.*.textconv` on `git log -p`
and `git blame`, `diff.external` on `git diff`, an `[include]` pulls in more of
the same. Environment settings can switch off only keys whose names are known in
advance, and driver names are chosen by the repository. The files in a shared
folder are not trusted (an archive of someone's working copy carries its
`.git/config`, and the agent may write one), so git never reads that file here.

Instead the worker finds the repository itself, has git parse its config (no
includes, nothing run), keeps only keys that name no program (the format
version, object format, remotes' URLs and branches' upstreams) and binds that
copy read-only over the config inside the sandbox. `GIT_DIR` and
`GIT_WORK_TREE` point git at exactly that repository, so it cannot discover a
different one planted meanwhile; with none found, git is told there is none.
Submodules are not entered (the policy's env sets diff.ignoreSubmodules), since
each has a config of its own.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from allowlist import Program
from sandbox import ConfinedDir, ConfinementError, Root, locate, open_regular, read_at
from sandbox.environment import SAFE_PATH
from worker.errors import CONFINEMENT_CODES, WorkerError

CONFIG_MAX: Final = 1024 * 1024
NO_REPOSITORY: Final = "/nonexistent/agentworker-no-repository"
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
    overlays: list[tuple[str, str]] = field(default_factory=list)  # (our copy, where git looks)


@asynccontextmanager
async def git_view(
    program: Program, path: str, roots: Sequence[Root], cwd: str
) -> AsyncIterator[GitView]:
    """For git: the env and read-only overlays to run it in `cwd` (our copies live until
    exit). For any other program: nothing to add."""
    if program.name != "git":
        yield GitView()
        return
    with tempfile.TemporaryDirectory(prefix="agentworker-git-") as scratch:
        yield await asyncio.to_thread(_prepare, path, roots, cwd, Path(scratch))


def _prepare(git: str, roots: Sequence[Root], cwd: str, scratch: Path) -> GitView:
    found = _discover(roots, cwd)
    if found is None:
        return GitView(env={"GIT_DIR": NO_REPOSITORY})
    work_tree, git_dir, common = found
    text = _read_inside(roots, str(common / "config"))
    raw = scratch / "raw"
    raw.write_bytes(text)
    clean = scratch / "config"
    clean.write_text(_sanitized(_parse(git, raw)))
    return GitView(
        env={"GIT_DIR": str(git_dir), "GIT_WORK_TREE": str(work_tree)},
        overlays=[(str(clean), str(common / "config"))],
    )


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
            pointer = _read_inside(roots, str(dot_git)).decode(errors="replace").strip()
            if not pointer.startswith("gitdir: "):
                return None
            git_dir = _inside(roots, here / pointer[len("gitdir: ") :])
            break
        if here == root or here.parent == here:
            return None
        here = here.parent
    common = git_dir
    if (git_dir / "commondir").is_file():
        pointer = _read_inside(roots, str(git_dir / "commondir")).decode(errors="replace")
        common = _inside(roots, git_dir / pointer.strip())
    return here, git_dir, common


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
    """A small regular file's bytes, opened beneath its root (no FIFO, device or link out)."""
    try:
        located = locate(roots, path)
        with ConfinedDir(located.root.path) as root:
            fd = open_regular(root, located.relative, allow_hard_links=True)
            try:
                if os.fstat(fd).st_size > CONFIG_MAX:
                    raise WorkerError(
                        "too_large", f"{path} is over {CONFIG_MAX:,} bytes; git is not run"
                    )
                return read_at(fd, 0, CONFIG_MAX)
            finally:
                os.close(fd)
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
    lines = []
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
