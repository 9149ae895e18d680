"""The desktop backend: a few methods per operating system, chosen lazily.

As python-mss does, one module per platform implements a small abstract class,
and `load_backend` imports the right one only when the computer surface is first
used (`_x11` on Linux, `_darwin` on macOS, `_win32` on Windows). `detect` decides
from the environment alone — no import, no connection — whether a desktop is
there at all, so the worker can say so in its Hello without loading anything.

Every method blocks; the caller (`desktop.Desktop`) runs them in threads of its
own. Input methods take a `Guard`: they call `guard.check()` between steps and
`guard.wait(s)` to pace a movement, so a cancelled call or a pause stops them at
the next step, and they release every key and button they pressed on the way out.
"""

from __future__ import annotations

import abc
import importlib.util
import os
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

from worker.actions.computer._geometry import Layout, Rect
from worker.actions.computer._keys import Press
from worker.errors import WorkerError

if TYPE_CHECKING:
    from worker.actions.computer._x11_line import PointerLine

Button = Literal["left", "right", "middle"]


@dataclass(frozen=True)
class Availability:
    """Whether this machine has a desktop the worker can drive, and if not, why."""

    available: bool
    server: str = ""  # "x11", "quartz", "win32"
    reason: str = ""
    fix: str = ""

    def error(self) -> WorkerError:
        return WorkerError(
            "not_supported",
            f"the computer surface is not available here: {self.reason}. {self.fix}",
            {"reason": self.reason, "fix": self.fix},
        )


class StepsInterruptedError(Exception):
    """An input sequence stopped between steps (a cancel or a pause)."""


class WindowUnknownError(Exception):
    """The display server could not say which window is at a point or holds the
    keyboard focus: one closed or moved while it was asked (an X error, or an answer
    that changed between two looks). Not "no window": the input it guards may not go."""


class Guard:
    """Lets a running input sequence be stopped from outside its thread, and notes what
    of it had an effect by then (`did`)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self.why: WorkerError | None = None
        self.done = ""  # what the sequence did that sending it again would repeat
        # Run by `check` before each step once set: what must still hold for the next
        # step to go (key_type: the focus is not on the person's terminal).
        self.before_step: Callable[[], None] | None = None

    def did(self, what: str) -> None:
        """Note that the sequence had an effect a retry would repeat (a press, typed
        characters): stopped from now on, it answers `outcome_unknown`, not a
        retryable code (review8 finding 10)."""
        self.done = what

    def interrupt(self, why: WorkerError | None = None) -> None:
        if self.why is None:
            self.why = why
        self._stop.set()

    def check(self) -> None:
        if self._stop.is_set():
            raise StepsInterruptedError
        if self.before_step is not None:
            self.before_step()

    def wait(self, seconds: float) -> None:
        """Pace a movement: returns after `seconds`, or raises at once when stopped."""
        if self._stop.wait(seconds):
            raise StepsInterruptedError


@dataclass(frozen=True)
class Window:
    id: int
    title: str
    app: str
    pid: int | None
    rect: Rect
    focused: bool


@dataclass(frozen=True)
class Grab:
    """Raw pixels of a region: BGRA rows (`stride` bytes each), as mss returns them."""

    rect: Rect
    bgra: bytes | bytearray
    stride: int


@dataclass(frozen=True)
class CursorImage:
    rgba: bytes  # width x height, straight alpha
    width: int
    height: int
    hot_x: int
    hot_y: int


class Backend(abc.ABC):
    """One platform's desktop. Called from the desktop's threads only; each thread
    may hold connections of its own (python-xlib and mss are per-thread)."""

    server: str

    # -------------------------------------------------------------- seeing
    @abc.abstractmethod
    def layout(self) -> Layout: ...

    @abc.abstractmethod
    def grab(self, rect: Rect) -> Grab: ...

    @abc.abstractmethod
    def cursor_position(self) -> tuple[int, int]: ...

    def pointer_line(self) -> PointerLine | None:
        """A connection the event loop asks where the pointer is and what the monitors
        are, without a thread (blocking to open); None where the platform has none, and
        `cursor_position` and `layout` run in the desktop's query thread instead."""
        return None

    def cursor_image(self) -> CursorImage | None:
        """The pointer's current shape, where the platform tells (else one is drawn)."""
        return None

    # -------------------------------------------------------------- input
    @abc.abstractmethod
    def move(self, guard: Guard, path: Sequence[tuple[int, int]], step_s: float) -> None:
        """Move the pointer through `path`, waiting `step_s` between points."""

    @abc.abstractmethod
    def click(
        self, guard: Guard, x: int, y: int, button: Button, clicks: int, hold: Sequence[Press]
    ) -> None: ...

    @abc.abstractmethod
    def drag(
        self,
        guard: Guard,
        path: Sequence[tuple[int, int]],
        button: Button,
        step_s: float,
        hold: Sequence[Press],
    ) -> None: ...

    @abc.abstractmethod
    def scroll(self, guard: Guard, x: int, y: int, dx: int, dy: int) -> None: ...

    @abc.abstractmethod
    def type_text(self, guard: Guard, text: str) -> int:
        """Type `text` exactly, in chunks (`_keys.chunks`), calling `guard.check()` just
        before the keys of every chunk, the first included, after anything else the
        chunk waits for (key_type's focus check rides on it); returns the number of
        characters sent."""

    @abc.abstractmethod
    def combo(self, guard: Guard, keys: Sequence[Press], hold_s: float) -> None:
        """Press `keys` in order, hold, release in reverse — always released."""

    # -------------------------------------------------------------- windows
    def windows(self) -> list[Window]:
        raise WorkerError(
            "not_supported", f"listing windows is not implemented for {self.server} yet"
        )

    def focus(self, window_id: int, timeout_s: float) -> bool:
        raise WorkerError(
            "not_supported", f"focusing windows is not implemented for {self.server} yet"
        )

    def window_at(self, x: int, y: int) -> tuple[int, int | None] | None:
        """The top-level window the person sees at (x, y), as (id, pid), or None
        (the bare desktop, or a platform that cannot tell); WindowUnknownError when
        the display server could not say (a window closed as it was asked)."""
        return None

    def focused_window(self) -> tuple[int, int | None] | None:
        """The top-level window that has the keyboard focus (where typed keys go), as
        (id, pid), or None (keys go to no window, or a platform that cannot tell);
        WindowUnknownError when the display server could not say (a window closed as
        it was asked)."""
        return None

    def managed(self) -> bool:
        """A window manager runs (it may move the focus in answer to input); False
        where none runs or the platform cannot tell."""
        return False

    def input_focus(self) -> int:
        """Where the keyboard focus is now, as the display server has it, unresolved: a
        window's id (any window, an application's inner one or a window manager's), or
        0 (no window) or 1 (the window under the pointer, X's PointerRoot); 0 where the
        platform cannot tell. Cheap: it only tells whether the focus moved."""
        return 0

    def focus_holder(self, target: int) -> tuple[int, int | None] | None:
        """The top-level window (id, pid) that an `input_focus` answer sends keys to, as
        `focused_window` resolves it; None where none (or it closed meanwhile)."""
        return None

    def wait_for_window_manager(self) -> None:
        """Return once the window manager has handled the input this thread sent so far,
        as `settle` does, but noting nothing (the action's own `settle` still comes):
        for a check made between steps of one action (key_type's chunks). Bounded; at
        once where no manager can be asked."""
        return None

    def settle(self) -> bool:
        """Return once the window manager has handled the input this thread sent since
        its last settle (what a titlebar's click or alt+tab makes it do: move the
        focus): True, or False at once when it sent none. Bounded: a manager that does
        not answer is not waited for past a moment. False where the platform cannot tell."""
        return False

    def refocus(self, target: int, timeout_s: float) -> None:
        """Put the keyboard focus back on `target` (an `input_focus` answer): through the
        window manager when it manages that window, so that it agrees, else directly."""
        return None

    # -------------------------------------------------------------- the person
    def watch(self, on_person_input: Callable[[str], None]) -> Callable[[], None] | None:
        """Call `on_person_input(what)` for input the worker did not inject; returns a
        function that stops watching, or None where the platform cannot tell."""
        return None

    def hotkey(self, keys: Sequence[Press], on_press: Callable[[], None]) -> Callable[[], None]:
        """Call `on_press()` whenever the person presses `keys`, in any window; returns
        a function that stops listening."""
        raise WorkerError("not_supported", f"no global hotkey on {self.server} yet")

    def close(self) -> None:  # noqa: B027 - optional: most backends hold nothing to close
        """Release connections (called once, at the worker's end)."""


_INSTALL_HINT: Final = "Install agentworker's dependencies again (`make .venv/.installed`)."


def detect(env: dict[str, str] | None = None, platform: str | None = None) -> Availability:
    """Is there a desktop to drive? From the environment only: nothing is loaded."""
    env = dict(os.environ) if env is None else env
    platform = platform or sys.platform
    if platform.startswith("linux") or "bsd" in platform:
        if env.get("WAYLAND_DISPLAY") or env.get("XDG_SESSION_TYPE", "").lower() == "wayland":
            return Availability(
                False,
                "wayland",
                "this is a Wayland session; an X11 grab would see only the XWayland windows "
                "(most windows would be missing from screenshots) and input could not reach "
                "native Wayland windows",
                "Log in to an X11 (Xorg) session to let the agent drive this desktop.",
            )
        if not env.get("DISPLAY"):
            return Availability(
                False,
                "",
                "no display: DISPLAY is not set (a headless machine, or a service started "
                "outside the desktop session)",
                "Run agentworker inside the desktop session, or set DISPLAY (and XAUTHORITY) "
                "to that session's display.",
            )
        if importlib.util.find_spec("Xlib") is None or importlib.util.find_spec("mss") is None:
            return Availability(False, "x11", "python-xlib or mss is not installed", _INSTALL_HINT)
        return Availability(True, "x11")
    if platform in ("darwin", "win32"):
        server = "quartz" if platform == "darwin" else "win32"
        missing = [m for m in ("pynput", "mss") if importlib.util.find_spec(m) is None]
        if missing:
            return Availability(
                False, server, f"{', '.join(missing)} is not installed", _INSTALL_HINT
            )
        return Availability(True, server)
    return Availability(
        False,
        "",
        f"no desktop backend for {platform}",
        "Run the worker on Linux (X11), macOS or Windows.",
    )


def load_backend(availability: Availability) -> Backend:
    """Import and open the backend for this platform (the first computer call pays)."""
    if not availability.available:
        raise availability.error()
    # Imported here, not above: a platform's libraries load when the surface is first used.
    if availability.server == "x11":
        from worker.actions.computer import _x11

        return _x11.X11Backend()
    if availability.server == "quartz":
        from worker.actions.computer import _darwin

        return _darwin.DarwinBackend()
    from worker.actions.computer import _win32

    return _win32.Win32Backend()
