"""The desktop as the worker holds it: one per worker, shared by every computer call.

It owns what must be one of: the backend (loaded at the first call, in a thread),
the threads its blocking calls run in, the lock that keeps input actions from
interleaving, the screenshots whose coordinate spaces callers may name, and the
link to the pause switch.

Threads: input actions run one at a time in the `input` thread, under the desktop
lock; screenshots in the `grab` thread; everything that only asks (monitors,
windows) in the `query` thread, so a long `key_type` never delays a screenshot. Each
thread holds its own display connection (python-xlib and mss are per-thread). The
pointer's position and the layout (a cursor_position's, a screenshot's) are asked by
the event loop itself, on a connection of its own that it never blocks on (`pointer`,
worker.actions.computer._x11_line), where the backend offers one.

While the person is asked to approve something (`hold`), input actions and
screenshots wait for their answer: the prompt may be on this desktop, where a key or
a click could answer it and an image would show another agent's whole ask.

The person stays in charge: while the agent drives (an input action ran within
`takeover_window_s`), input the worker did not inject trips the switch's takeover;
the stop hotkey trips its global stop; either interrupts a running input action at
its next step, which releases every key and button it holds.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal, TypeVar

from worker.actions.computer._backend import (
    Availability,
    Backend,
    Guard,
    StepsInterruptedError,
    Window,
    WindowUnknownError,
    detect,
    load_backend,
)
from worker.actions.computer._geometry import Layout, ShotSpace
from worker.actions.computer._keys import parse_combo
from worker.actions.computer._own_ui import own_ui
from worker.actions.computer._shared import WindowResult
from worker.config import Config
from worker.core.pause import COMPUTER_SURFACE, PauseState, PauseSwitch
from worker.core.registry import Context
from worker.errors import ErrorCode, WorkerError

if TYPE_CHECKING:  # the X11 line is imported with the X11 backend, when it loads
    from worker.actions.computer._x11_line import PointerLine

log = logging.getLogger(__name__)

T = TypeVar("T")
SHOTS_KEPT: Final = 64
FOCUS_BACK_TIMEOUT_S: Final = 2.0  # for the window manager to give the focus back


@dataclass(frozen=True)
class DesktopSettings:
    stop_hotkey: str = "ctrl+alt+shift+escape"  # "" for none
    takeover: bool = True
    takeover_window_s: float = 30.0


class Desktop:
    def __init__(
        self,
        availability: Availability,
        pause: PauseSwitch | None = None,
        settings: DesktopSettings = DesktopSettings(),
    ) -> None:
        self.availability = availability
        self.pause = pause
        self.settings = settings
        self._backend: Backend | None = None
        self._load_lock = threading.Lock()
        self._input = concurrent.futures.ThreadPoolExecutor(1, "desktop-input")
        self._query = concurrent.futures.ThreadPoolExecutor(1, "desktop-query")
        self._grab = concurrent.futures.ThreadPoolExecutor(1, "desktop-grab")
        # The loop's own line to the display server (see `pointer`): None until the
        # first call opens it, False where the backend has none.
        self._line: PointerLine | Literal[False] | None = None
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None
        self._shots: collections.OrderedDict[str, ShotSpace] = collections.OrderedDict()
        self._guards: set[Guard] = set()
        self._driving_until = 0.0  # monotonic time the takeover watch stays armed until
        # Why input waits now (the person is being asked to approve something), or None;
        # `_answered` is set while it is None (made on the loop, as `_lock` is).
        self._asking: str | None = None
        self._answered: asyncio.Event | None = None
        self._asked = 0  # holds begun: a screenshot taken across one is taken again
        self.input_waiting = 0  # input actions waiting for the person's answer
        self.shots_waiting = 0  # screenshots waiting for it
        self._stop_hotkey: Callable[[], None] | None = None
        # The pids of the UIs attached now (set by the assembly: the console socket's
        # peers), whose windows, like the worker's own terminal, the agent may not reach.
        self.ui_pids: Callable[[], Iterable[int]] = tuple
        if pause is not None:
            pause.subscribe(self._on_pause)

    @property
    def available(self) -> bool:
        return self.availability.available

    # -------------------------------------------------------------- lifecycle

    def backend(self) -> Backend:
        """The backend, loaded on first use (blocking: call it from a desktop thread)."""
        if self._backend is not None:
            return self._backend
        with self._load_lock:
            if self._backend is None:
                backend = load_backend(self.availability)
                if self.settings.takeover:
                    try:
                        backend.watch(self._on_person_input)
                    except WorkerError as exc:
                        log.warning("the person's input will go unnoticed: %s", exc.message)
                self._backend = backend
                log.info("desktop: %s backend loaded", backend.server)
        return self._backend

    async def start_hotkey(self) -> None:
        """Listen for the emergency-stop hotkey (from the worker's start: the person may
        need it for any plan). Loads the backend in the background; never fails the worker."""
        if not self.available or not self.settings.stop_hotkey or self.pause is None:
            return
        try:
            keys = parse_combo(self.settings.stop_hotkey)
            loop = asyncio.get_running_loop()
            self._stop_hotkey = await loop.run_in_executor(
                self._query, lambda: self.backend().hotkey(keys, self._on_hotkey)
            )
            log.info("emergency stop: press %s to pause every plan", self.settings.stop_hotkey)
        except WorkerError as exc:
            log.warning(
                "no emergency-stop hotkey (%s): %s; `agentworker pause` still works",
                self.settings.stop_hotkey,
                exc.message,
            )

    def close(self) -> None:
        if self._line:
            self._line.close()
        if self._backend is not None:
            self._backend.close()
        for pool in (self._input, self._query, self._grab):
            pool.shutdown(wait=False, cancel_futures=True)

    # -------------------------------------------------------------- running work

    def _check(self) -> None:
        if not self.available:
            raise self.availability.error()

    async def query(self, fn: Callable[[Backend], T]) -> T:
        """Run a question (cursor, monitors, windows) in the query thread."""
        self._check()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._query, lambda: fn(self.backend()))

    async def pointer(self) -> tuple[int, int, Layout]:
        """Where the pointer is and the layout, asked now. On the loop's own line to the
        display server where the backend has one (no thread hop, one round trip, at most
        _x11_line.BOUND_S of waiting); else in the query thread."""
        where = await self.pointer_on_line()
        if where is None:
            return await self.query(lambda b: (*b.cursor_position(), b.layout()))
        return where

    async def pointer_on_line(self) -> tuple[int, int, Layout] | None:
        """`pointer`, asked on the loop's own line; None where the backend has none (the
        caller then asks the backend in a desktop thread, as it would anyway)."""
        self._check()
        line = self._line
        if line is None or (line and line.closed):
            line = await self.query(self._open_line)
        if not line:
            return None
        return await line.where()

    def _open_line(self, backend: Backend) -> PointerLine | Literal[False]:
        """In the query thread, which runs one job at a time: calls that found no line
        at once open one between them."""
        line = self._line
        if line is None or (line and line.closed):
            line = self._line = backend.pointer_line() or False
        return line

    async def grab(self, fn: Callable[[Backend], T]) -> T:
        """Run a screenshot in the grab thread, once no one is being asked (`hold`).

        A prompt shows another agent's whole ask (its argv, passwords and all: the
        person must see what they approve), maybe on this very desktop, in the TUI's
        terminal: a screenshot then would hand it to this agent. So screenshots wait
        for the answer as input does. Held rather than the TUI's window masked: where
        the prompt is drawn cannot always be known (a terminal multiplexer's window is
        not found, see _own_ui; a UI attached from another terminal, a notification).
        A screenshot under way when a prompt opens may already show it: it is thrown
        away, and taken again once the person has answered."""
        self._check()
        self._mark_driving()
        loop = asyncio.get_running_loop()
        answered = self._answered_on(loop)
        while True:
            while self._asking is not None:
                self.shots_waiting += 1
                try:
                    await answered.wait()
                finally:
                    self.shots_waiting -= 1
            asked = self._asked
            shot = await loop.run_in_executor(self._grab, lambda: fn(self.backend()))
            if self._asked == asked:
                return shot

    def _answered_on(self, loop: asyncio.AbstractEventLoop) -> asyncio.Event:
        """The event set while no one is asked (and the input lock), made on `loop`."""
        if self._lock is None or self._lock_loop is not loop or self._answered is None:
            self._lock, self._lock_loop = asyncio.Lock(), loop
            self._answered = asyncio.Event()
            if self._asking is None:
                self._answered.set()
        return self._answered

    async def act(self, fn: Callable[[Backend, Guard], T], what: str = "the input action") -> T:
        """Run an input action alone (the desktop lock), stoppable between its steps,
        and keep what it makes the window manager do from putting the keyboard focus
        on the person's own terminal (`_keep_focus`).

        A cancelled call interrupts the thread and waits for it to let go of every key
        and button before the cancellation goes on."""
        self._check()
        loop = asyncio.get_running_loop()
        answered = self._answered_on(loop)
        assert self._lock is not None
        async with self._lock:
            while self._asking is not None:
                self.input_waiting += 1
                try:
                    await answered.wait()
                finally:
                    self.input_waiting -= 1
            if self.pause is not None:
                self.pause.check(COMPUTER_SURFACE)  # paused while it queued
            guard = Guard()
            self._guards.add(guard)
            self._mark_driving()
            future = loop.run_in_executor(self._input, lambda: self._run(fn, guard, what))
            try:
                return await asyncio.shield(future)
            except asyncio.CancelledError:
                # The pipeline stops a call by cancelling it (`agentworker pause` from
                # another process, a kill, the deadline): once the action had an effect a
                # retry would repeat, that answers outcome_unknown too (review10 15).
                guard.interrupt(self._why_cancelled())
                try:
                    await future
                    finished = True
                except BaseException:  # noqa: BLE001 - stopped between steps, or failed
                    finished = False
                if finished or guard.done:
                    raise _stopped(guard, finished) from None
                raise
            except StepsInterruptedError:
                raise _stopped(guard) from None
            finally:
                self._guards.discard(guard)
                self._mark_driving()

    def _run(self, fn: Callable[[Backend, Guard], T], guard: Guard, what: str) -> T:
        """In the input thread: the action, then `_keep_focus` (also when the action
        failed or was stopped: what it sent before may move the focus all the same)."""
        backend = self.backend()
        # With no window manager nothing moves the focus in answer to input.
        before = backend.input_focus() if backend.managed() else None
        try:
            result = fn(backend, guard)
        except BaseException:
            kept = None if before is None else self._keep_focus(backend, before, what)
            if kept is not None:
                log.warning("%s", kept.message)
            raise
        kept = None if before is None else self._keep_focus(backend, before, what)
        if kept is not None:
            raise kept
        return result

    def _keep_focus(self, backend: Backend, before: int, what: str) -> WorkerError | None:
        """After an input action: when the keyboard focus is now on the terminal of the
        worker or of an attached UI, and was not before, put it back where it was
        (review11 finding 07) and return what the action answers instead of its result.

        The agent may not focus that terminal (window_focus, a click on it are
        refused), but the window manager does it for a click or keys elsewhere: a
        middle click on a titlebar in openbox lowers that window and gives the focus to
        the one below, alt+tab to the next, a menu's entry to its window. Then the
        person's next keys, meant for their window, would go to the TUI. What those
        inputs are depends on the window manager and its settings, so the result is
        judged, not the input: once the manager has handled what the action sent
        (`Backend.settle`: it answered a request sent after it, and again while the
        focus moved, for what it does on the focus events of its own move comes after),
        where is the focus?
        A focus the manager moves later, on a timer (focus follows the mouse with a
        delay), is not seen: a limit said in docs/architecture.md."""
        if not backend.settle():
            return None  # it sent nothing (refused, or stopped before its first step)
        now = backend.input_focus()
        if now == before:
            return None
        own = own_ui(self.ui_pids())
        try:
            found = backend.focus_holder(now)
        except WindowUnknownError:
            found = (now, None)  # it moved again as it was asked: put it back all the same
        else:
            if found is None or not own.owns(*found):
                return None
        try:
            was = backend.focus_holder(before)
        except WindowUnknownError:
            was = None  # the window it was on closed: not the person's terminal
        if was is not None and own.owns(*was):
            return None  # it was there already: the person left it so
        backend.refocus(before, FOCUS_BACK_TIMEOUT_S)
        try:
            holder = backend.focused_window()
            back = holder is None or not own.owns(*holder)
        except WindowUnknownError:
            back = False
        where = (
            f"the focus was put back where it was (window {before})"
            if back
            else "the focus could not be put back: the person's next keys would go there"
        )
        return WorkerError(
            "permission_denied",
            f"{what} was done, but then the window manager gave the keyboard focus to "
            f"window {found[0]}, which belongs to this worker's own terminal or approval "
            f"UI (a titlebar's click, alt+tab, a window menu do that); {where}. Act on "
            "another window, in a way that leaves the focus on it",
            {"window": found[0], "pid": found[1], "focus_back": back},
        )

    def _why_cancelled(self) -> WorkerError:
        """Why a running input action's call was cancelled, as far as the desktop knows."""
        if self.pause is not None:
            try:
                self.pause.check(COMPUTER_SURFACE)
            except WorkerError as paused:
                return paused
        return WorkerError(
            "cancelled", "its call was stopped (a kill, its deadline, or the server's Cancel)"
        )

    def _mark_driving(self) -> None:
        self._driving_until = time.monotonic() + self.settings.takeover_window_s

    # -------------------------------------------------------------- screenshots

    def remember(self, space: ShotSpace) -> str:
        shot_id = secrets.token_hex(6)
        self._shots[shot_id] = space
        while len(self._shots) > SHOTS_KEPT:
            self._shots.popitem(last=False)
        return shot_id

    def space(self, shot_id: str, layout: Layout) -> ShotSpace:
        """The named screenshot's space, if it still describes the screen."""
        space = self._shots.get(shot_id)
        if space is None:
            raise WorkerError(
                "out_of_bounds",
                f"no screenshot {shot_id!r} here (this worker keeps the last {SHOTS_KEPT}, "
                "and forgets them when it restarts); take a new screenshot",
                {"screenshot_id": shot_id},
            )
        if space.layout != layout:
            raise WorkerError(
                "out_of_bounds",
                f"the monitors changed since screenshot {shot_id!r} was taken, so its "
                "coordinates no longer point where they did; take a new screenshot",
                {"screenshot_id": shot_id, "stale": True},
            )
        return space

    def physical(self, layout: Layout, x: int, y: int, shot_id: str | None) -> tuple[int, int]:
        """A caller's point on the desktop: physical, or mapped from a screenshot's
        space; `out_of_bounds` when it lands on no monitor."""
        if shot_id is not None:
            x, y = self.space(shot_id, layout).to_physical(x, y)
        layout.check_point(x, y)
        return x, y

    # -------------------------------------------------------------- the person

    def refuse_own_window(self, backend: Backend, x: int, y: int, what: str) -> None:
        """`permission_denied` when (x, y) is on the terminal of the worker or of an
        attached UI (worker.actions.computer._own_ui); `busy` when the display server
        could not say which window is there. In the input thread, just before the
        input it guards."""
        try:
            found = backend.window_at(x, y)
        except WindowUnknownError as exc:
            raise _unknown(what, f"which window is at ({x}, {y})", exc) from None
        if found is not None:
            own_ui(self.ui_pids()).refuse(*found, what)

    def refuse_own_focus(self, backend: Backend, what: str) -> None:
        """`permission_denied` when the keyboard focus is on the terminal of the worker
        or of an attached UI: the person left it there (say, after answering a
        prompt), and keys typed now would drive it (its kill and lift keys); `busy`
        when the display server could not say where the focus is (it fails closed).
        In the input thread, just before the keys."""
        self.focus_check(backend, what)()

    def focus_check(
        self, backend: Backend, what: str, guard: Guard | None = None
    ) -> Callable[[], None]:
        """`refuse_own_focus` as a check to run before each step of a long sequence of
        keys (key_type's chunks): the keys typed so far may have moved the focus (a
        window they closed let it fall on the person's terminal), and the rest must not
        follow it there. A refusal after `guard` noted keys typed says how many went.
        The worker's and the UIs' processes are read once, and again when the set of
        attached UIs changed: a UI attached meanwhile (the person ran `agentworker ui`
        in the window the keys go to) is protected from the next check on."""
        attached = frozenset(self.ui_pids())
        own = own_ui(attached)

        def check() -> None:
            nonlocal attached, own
            now = frozenset(self.ui_pids())
            if now != attached:
                attached, own = now, own_ui(now)
            # The keys typed so far take effect once the window manager handled them (a
            # Return closed a window, and the manager gives the focus to the one below):
            # looked at before that, the focus is where it was (review16 F3).
            backend.wait_for_window_manager()
            try:
                found = backend.focused_window()
            except WindowUnknownError as exc:
                raise _unknown(what, "which window holds the keyboard focus", exc) from None
            if found is None:
                return
            try:
                own.refuse(*found, what)
            except WorkerError as exc:
                if guard is None or not guard.done:
                    raise
                raise WorkerError(
                    exc.code,
                    f"{exc.message}. The keyboard focus moved there while the keys were "
                    f"typed: {guard.done}, and the rest were not",
                    {**exc.details, "done": guard.done},
                ) from None

        return check

    def refuse_own(self, window: Window, what: str) -> None:
        own_ui(self.ui_pids()).refuse(window.id, window.pid, what)

    def held(self) -> bool:
        """Input and screenshots wait (`hold`)."""
        return self._asking is not None

    def hold(self, why: str | None) -> None:
        """While the person is asked to approve something (`why`), input actions and
        screenshots wait for their answer, and an input action running stops at its
        next step: the prompt may be on this very desktop (the TUI's terminal), where a
        key typed or a click made now could answer it for them, and a screenshot would
        show what it asks (see `grab`). None lets them go on. On the loop's thread."""
        if why is not None:
            self._asked += 1
        self._asking = why
        if self._answered is not None:
            if why is None:
                self._answered.set()
            else:
                self._answered.clear()
        if why is not None:
            stopped = WorkerError(
                "paused", f"input stopped: {why}; try again once they have answered"
            )
            for guard in list(self._guards):
                guard.interrupt(stopped)

    def _on_person_input(self, what: str) -> None:
        """From the watcher's thread: the person used the desktop."""
        if self.pause is None or time.monotonic() > self._driving_until:
            return
        if self.pause.current().takeover is not None:
            return
        log.warning("the person took the desktop back (%s): pausing the computer surface", what)
        self.pause.take_over(f"the person used the desktop while the agent drove it ({what})")

    def _on_hotkey(self) -> None:
        assert self.pause is not None
        if self.pause.current().stop is None:
            log.warning("emergency-stop hotkey pressed: pausing every plan")
            self.pause.stop("the person pressed the emergency-stop hotkey", "hotkey")

    def _on_pause(self, state: PauseState) -> None:
        """Any thread: stop running input actions the switch now refuses."""
        if state.blocks(COMPUTER_SURFACE) is None or self.pause is None:
            return
        try:
            self.pause.check(COMPUTER_SURFACE)
        except WorkerError as why:
            for guard in list(self._guards):
                guard.interrupt(why)


def window_result(window: Window, layout: Layout) -> WindowResult:
    r = window.rect
    return WindowResult(
        id=window.id,
        title=window.title,
        app=window.app,
        pid=window.pid,
        x=r.x,
        y=r.y,
        width=r.width,
        height=r.height,
        focused=window.focused,
        monitor=layout.monitor_at(r.x + r.width // 2, r.y + r.height // 2),
    )


# ------------------------------------------------------------------ one per worker


def build(config: Config, data_dir: Path) -> Desktop:
    """The desktop a worker with this config and data dir drives (nothing loads yet)."""
    availability = detect()
    if not config.computer.enabled:
        availability = Availability(
            False,
            "",
            "it is turned off in config.toml ([computer] enabled = false)",
            "Set [computer] enabled = true to let the agent drive this desktop.",
        )
    settings = DesktopSettings(
        stop_hotkey=config.computer.stop_hotkey,
        takeover=config.computer.takeover,
        takeover_window_s=config.computer.takeover_window_s,
    )
    return Desktop(availability, PauseSwitch.in_dir(data_dir), settings)


def of(ctx: Context) -> Desktop:
    """The desktop of the worker running this call: the one its dispatcher owns (the
    worker builds it once, see app.build_dispatcher, and hands it to every call)."""
    desktop = ctx.services.get(Desktop)
    if desktop is None:  # a worker assembled without one: a bug of the assembly
        raise WorkerError(ErrorCode.INTERNAL_ERROR, "this worker was assembled without a desktop")
    return desktop


def _unknown(what: str, which: str, why: WindowUnknownError) -> WorkerError:
    """What an input action answers when the check for the person's own windows could
    not tell where its input would go: nothing was sent (it might have reached the
    person's terminal), and asking again may well tell."""
    return WorkerError(
        "busy",
        f"{what}: the display server could not say {which} ({why}; a window closed or "
        "moved as it was asked), so nothing was sent, for it might have reached the "
        "person's own terminal; try again",
        {"reason": "window unknown"},
    )


def _stopped(guard: Guard, finished: bool = False) -> WorkerError:
    """What a sequence stopped between its steps answers: why it was stopped (`paused`,
    retryable: nothing was done), or once it had an effect a retry would repeat (a
    drag's press, typed characters), `outcome_unknown` with what was done and why it
    stopped (review8 finding 10: a drag stopped by a prompt after its press answered
    `paused`, and a server retrying it dragged again)."""
    why = guard.why or WorkerError("cancelled", "the action was stopped before it finished")
    if finished:  # the stop came while its last step ran: all of it was done
        return WorkerError(
            "outcome_unknown",
            f"it was stopped ({why.message.rstrip('.')}) as it ran to its end; look at the "
            "screen before sending it again",
            {"stopped": str(why.code)},
        )
    if not guard.done:
        return why
    return WorkerError(
        "outcome_unknown",
        f"stopped part way, after {guard.done} ({why.message.rstrip('.')}); look at the "
        "screen before sending it again",
        {"stopped": str(why.code)},
    )
