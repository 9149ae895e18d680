"""Where agentworker keeps its files: the config folder and the data folder.

Apart from worker.config (which re-exports it) so that a command that needs only
the folders (`agentworker call` reads the token and a setting or two) loads no
pydantic: the standard library and platformdirs only. Paths is a NamedTuple, not a
dataclass: on `call`'s path nothing else needs the dataclasses module, and making a
frozen dataclass compiles its methods at import (about 1 ms between the two).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

APP = "agentworker"
DEFAULT_LISTEN = "127.0.0.1:7421"
CONFIG_FILE = "config.toml"
TOKEN_FILE = "hub.token"  # noqa: S105 - a file name, not a secret
# The token a worker needs to serve a hub: it opens WorkerService only, never Dispatch.
WORKERS_TOKEN_FILE = "hub-workers.token"  # noqa: S105 - a file name, not a secret
# The hub's key of sandbox plans' placement tokens (worker.hub.placement), apart from
# hub.db: a hub that lost hub.db still checks the tokens its workers hold.
PLACEMENT_KEY_FILE = "hub-placements.key"
WORKER_KEY_FILE = "worker.key"  # the worker's own secret, beside its worker_id
UI_SOCKET = "ui.sock"
# Where this data folder's hub also serves (`agentworker hub`, `up`): the way `run` with no
# --server and the CLI's verbs reach it, a hub they can tell is this user's
# (worker.wire.own_hub; review11 finding 06).
HUB_SOCKET = "hub.sock"
# A Unix socket's address holds 108 bytes on Linux, 104 on macOS: past this the UI
# socket goes to a short path.
_MAX_SOCKET_PATH = 100


class Paths(NamedTuple):
    """The two directories everything else hangs off."""

    config_dir: Path
    data_dir: Path
    home: Path | None = None  # set when a home folder was chosen (--home, AGENTWORKER_HOME)

    @classmethod
    def at(cls, home: Path | str) -> Paths:
        """Config and data both in one folder (`--home`, AGENTWORKER_HOME)."""
        root = Path(home).expanduser().resolve()
        return cls(config_dir=root, data_dir=root, home=root)

    @classmethod
    def from_env(cls) -> Paths:
        """AGENTWORKER_HOME when set, else the platform's user config and data folders.

        Read once, by whoever starts the program (the CLI); everything after is
        handed these Paths."""
        home = os.environ.get("AGENTWORKER_HOME")
        if home:
            return cls.at(home)
        import platformdirs  # only here: a home folder needs none of it

        return cls(
            config_dir=Path(platformdirs.user_config_dir(APP)),
            data_dir=Path(platformdirs.user_data_dir(APP)),
        )

    @property
    def config_file(self) -> Path:
        return self.config_dir / CONFIG_FILE

    @property
    def token_file(self) -> Path:
        return self.config_dir / TOKEN_FILE

    @property
    def workers_token_file(self) -> Path:
        return self.config_dir / WORKERS_TOKEN_FILE

    @property
    def placement_key_file(self) -> Path:
        return self.config_dir / PLACEMENT_KEY_FILE

    @property
    def worker_key_file(self) -> Path:
        return self.data_dir / WORKER_KEY_FILE

    @property
    def workspace(self) -> Path:
        return self.data_dir / "workspace"

    @property
    def exec_cache(self) -> Path:
        """Where the sandbox's entry helper is built (sandbox._entry)."""
        return self.data_dir / "exec-cache"

    @property
    def workbench(self) -> Path:
        """Sandbox mode's per-plan workspaces."""
        return self.data_dir / "workbench"

    @property
    def ui_socket(self) -> Path:
        """Where this data folder's worker listens for its UI (worker.core.console_socket):
        in the data folder when the path fits a socket address, else in a per-user
        folder under the temp folder, named by a digest of the data folder."""
        return self._socket(UI_SOCKET, "sock")

    @property
    def hub_socket(self) -> Path:
        """Where this data folder's hub serves besides its TCP address, for this user
        alone (worker.wire.own_hub): placed as the UI's socket is."""
        return self._socket(HUB_SOCKET, "hub.sock")

    def _socket(self, name: str, suffix: str) -> Path:
        path = self.data_dir / name
        if len(os.fsencode(path)) <= _MAX_SOCKET_PATH:
            return path
        import hashlib
        import tempfile

        digest = hashlib.sha256(os.fsencode(self.data_dir.resolve())).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"agentworker-{os.getuid()}" / f"{digest}.{suffix}"

    def ensure(self) -> None:
        for folder in (self.config_dir, self.data_dir):
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
