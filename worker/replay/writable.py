"""Which files a replay reads could an agent have written: a script, a config, a
grants profile or an allowlist in a folder shared read-write (or a sandbox
workspace) may not be the one the person wrote or recorded. An agent could add a
step naming another agent whose grants the replay then uses, or point the config's
exec at a program of its own (review25, review26 H1).

Folders are compared by identity (device and inode), not by path: a bind mount of a
shared folder, a case-insensitive file system's other spelling or a link all name
the same folder (review26 H4). A bind mount of a folder *inside* a shared one has
an identity of its own, so the file's name is also looked up in the mount table: a
mount shows which file system it shows and from which of its folders, and the same
file's name under the shared folder is walked as well.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from worker.config import USER_POLICY, Config, Paths, roots_of

Identity = tuple[int, int]


@dataclass(frozen=True)
class Place:
    """A folder agents can write, less the places withheld inside it."""

    path: Path
    identity: Identity
    withheld: frozenset[Identity]


def _identity(path: Path) -> Identity | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def agent_writable_places(config: Config, paths: Paths) -> list[Place]:
    """The shared read-write folders of the person's config, and sandbox mode's
    workspaces, as they are now (a folder not there yet holds nothing to read)."""
    places: list[Place] = []
    folders = [(root.path, root.withheld) for root in roots_of(config, paths) if root.writable]
    folders.append((paths.workbench, ()))
    for folder, withheld in folders:
        identity = _identity(folder)
        if identity is not None:
            hidden = {_identity(place) for place in withheld}
            places.append(Place(folder, identity, frozenset(h for h in hidden if h)))
    return places


def writable_place_of(path: Path, places: list[Place]) -> Place | None:
    """The place among `places` that holds `path` (links followed), walking up from
    it; None when none does or a withheld place comes first (the worker's own
    folders inside a shared one are not the agent's)."""
    real = Path(os.path.realpath(path))
    for name in (real, *_same_file_under(real, places)):
        place = _walked_up(name, places)
        if place is not None:
            return place
    return None


def _walked_up(real: Path, places: list[Place]) -> Place | None:
    withheld = frozenset().union(*(place.withheld for place in places))
    by_identity = {place.identity: place for place in places}
    for folder in (real, *real.parents):
        identity = _identity(folder)
        if identity is None:
            continue
        if identity in withheld:
            return None
        place = by_identity.get(identity)
        if place is not None:
            return place
    return None


def _same_file_under(real: Path, places: list[Place]) -> list[Path]:
    """The names `real` has under each place through the mount table: a folder inside a
    place's file system that is mounted elsewhere (a bind mount) shows its files there
    too. Nothing where there is no mount table (not Linux)."""
    table = _mount_table()
    seen = _in_file_system(real, table)
    names = []
    for place in places:
        holder = _in_file_system(Path(os.path.realpath(place.path)), table)
        if seen and holder and seen[0] == holder[0] and seen[1].is_relative_to(holder[1]):
            names.append(place.path / seen[1].relative_to(holder[1]))
    return names


def _mount_table() -> list[tuple[str, PurePosixPath, PurePosixPath]]:
    """(file system, its folder shown, where) for each mount, from /proc/self/mountinfo
    (its fields 3, 4 and 5; spaces and the like written as octal escapes)."""
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return []
    table = []
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) > 4:
            shown, where = (_unescaped(field) for field in fields[3:5])
            table.append((fields[2], PurePosixPath(shown), PurePosixPath(where)))
    return table


def _unescaped(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _in_file_system(
    real: Path, table: list[tuple[str, PurePosixPath, PurePosixPath]]
) -> tuple[str, PurePosixPath] | None:
    """The file system holding `real` and its path in it: by the mount whose mount
    point is the longest that holds it (of those on one point, the last: the top)."""
    path = PurePosixPath(real)
    best: tuple[str, PurePosixPath, PurePosixPath] | None = None
    for mount in table:
        if path.is_relative_to(mount[2]) and (
            best is None or len(mount[2].parts) >= len(best[2].parts)
        ):
            best = mount
    if best is None:
        return None
    return best[0], best[1] / path.relative_to(best[2])


def files_read(
    script: Path, config_file: Path | None, grants_file: Path | None, config: Config | None
) -> list[Path]:
    """What a replay in this process reads besides the person's own config: the
    script and its blobs' folder, and a --config (with its allowlist: the policy it
    names, or the one beside it) and --grants given."""
    files = [script, script.parent / f"{script.stem}.blobs"]  # its request blobs
    if grants_file is not None:
        files.append(grants_file)
    if config_file is not None:
        files.append(config_file)
        policy = config.exec.policy if config is not None else None
        # As the worker finds it (exec_policy.user_policy_file), its config folder
        # being the --config's.
        beside = config_file.parent / USER_POLICY
        files.append(beside if policy is None else Path(os.path.expanduser(policy)))
    return files
