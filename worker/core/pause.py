"""The pause switch: the person's way to stop the agent, at once and everywhere.

Two reasons to pause, each lifted only by the person (`agentworker resume`, or a
TUI key bound to `PauseSwitch.resume`):

    stop      the global emergency stop (hotkey, `agentworker pause`, the TUI):
              every surface; running calls are stopped and answer `paused`
    takeover  the person used the desktop while the agent drove it: the computer
              surface only (`workerComputer`); host calls go on

The state lives in one small JSON file in the data dir, so the CLI (another
process) and the worker see the same switch, and a pause survives a restart just
as a plan kill does. The worker reads it back whenever the file changes (one
`stat` per check) and is told of its own changes at once through `subscribe`.

The API is deliberately small — `stop`, `take_over`, `resume`, `current`, `check`,
`subscribe` — because the TUI binds keys to it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

from worker.clock import now_ms
from worker.errors import WorkerError

log = logging.getLogger(__name__)

COMPUTER_SURFACE: Final = "workerComputer"
FILE_NAME: Final = "pause.json"


@dataclass(frozen=True)
class Pause:
    """Why calls are paused: what happened, who or what did it, and when."""

    reason: str  # a sentence for the person and the caller
    by: str  # "hotkey", "cli", "tui", "desktop"...
    at_ms: int


@dataclass(frozen=True)
class PauseState:
    stop: Pause | None = None
    takeover: Pause | None = None

    def blocks(self, surface: str) -> Pause | None:
        """The pause that refuses a call on `surface`, if any (the global stop first)."""
        if self.stop is not None:
            return self.stop
        if self.takeover is not None and surface == COMPUTER_SURFACE:
            return self.takeover
        return None

    @property
    def active(self) -> bool:
        return self.stop is not None or self.takeover is not None


Listener = Callable[[PauseState], None]


class PauseSwitch:
    """One process's view of the pause file; safe to call from any thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._state = PauseState()
        self._seen: tuple[int, int, int] | None = None  # (ino, size, mtime_ns) last read
        self._listeners: list[Listener] = []

    @classmethod
    def in_dir(cls, data_dir: Path) -> PauseSwitch:
        return cls(data_dir / FILE_NAME)

    # ------------------------------------------------------------- the person's verbs

    def stop(self, reason: str, by: str) -> None:
        """The global emergency stop: every surface pauses until `resume`."""
        self._change(lambda s: PauseState(stop=Pause(reason, by, now_ms()), takeover=s.takeover))

    def take_over(self, reason: str, by: str = "desktop") -> None:
        """The person took the desktop back: the computer surface pauses until `resume`."""
        self._change(lambda s: PauseState(stop=s.stop, takeover=Pause(reason, by, now_ms())))

    def resume(self) -> PauseState:
        """Lift both pauses; returns what was lifted."""
        lifted = PauseState()

        def clear(state: PauseState) -> PauseState:
            nonlocal lifted
            lifted = state
            return PauseState()

        self._change(clear)
        return lifted

    # ------------------------------------------------------------- the worker's checks

    def current(self) -> PauseState:
        """The switch as the file holds it now (re-read only when the file changed)."""
        with self._lock:
            changed = self._reload()
            state = self._state
        if changed:
            self._notify(state)
        return state

    def check(self, surface: str) -> None:
        """Raise `paused` if a call on `surface` must not run now."""
        state = self.current()
        pause = state.blocks(surface)
        if pause is not None:
            what = "every action" if pause is state.stop else "the computer surface"
            raise WorkerError(
                "paused",
                f"{what} is paused: {pause.reason}. The person at this worker hands control "
                "back with `agentworker resume`; try again after that.",
                {"paused_by": pause.by, "since_unix_ms": pause.at_ms},
            )

    def subscribe(self, listener: Listener) -> None:
        """Call `listener(state)` after every change this process makes or notices."""
        self._listeners.append(listener)

    # ------------------------------------------------------------- storage

    def _change(self, update: Callable[[PauseState], PauseState]) -> None:
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            lock_fd = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX)  # against `agentworker resume` meanwhile
                self._seen = None
                self._reload()
                self._state = update(self._state)
                self._write(self._state)
            finally:
                os.close(lock_fd)
            state = self._state
        self._notify(state)

    def _write(self, state: PauseState) -> None:
        data = {k: (asdict(v) if v else None) for k, v in vars(state).items()}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, self.path)
        self._seen = _stamp(self.path)

    def _reload(self) -> bool:
        stamp = _stamp(self.path)
        if stamp == self._seen:
            return False
        self._seen = stamp
        before = self._state
        self._state = _read(self.path) if stamp is not None else PauseState()
        return self._state != before

    def _notify(self, state: PauseState) -> None:
        for listener in self._listeners:
            try:
                listener(state)
            except Exception:
                log.exception("a pause listener failed")


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        # os.stat, not Path.stat: this runs for every call, and the file is mostly
        # missing; pathlib's way to that miss took 8 us here, os.stat's 5.
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _read(path: Path) -> PauseState:
    with contextlib.suppress(FileNotFoundError):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return PauseState(
                stop=Pause(**data["stop"]) if data.get("stop") else None,
                takeover=Pause(**data["takeover"]) if data.get("takeover") else None,
            )
        except (ValueError, TypeError, KeyError):
            # Unreadable: the safe reading of a damaged pause file is "stopped".
            log.warning("%s is damaged; treating it as a global stop until resume", path)
            return PauseState(stop=Pause(f"{path.name} is damaged", "file", 0))
    return PauseState()
