"""The X11 backend: python-xlib for input, windows and the person's own input,
mss for pixels. Pure Python on top of the X protocol — no compiler, no evdev.

- input goes through XTEST on one connection per thread; a character missing from
  the keyboard layout (an accent, CJK) is typed by mapping its Unicode keysym onto
  a spare keycode for as long as it is needed, as xdotool does; a press, a release or
  a scroll waits until the pointer is where the motion before it sent it (a window
  manager's click-to-focus grab freezes the pointer for a moment: `_arrive`);
- monitors come from RandR 1.5 (or Xinerama, when it describes more of them);
- windows from the window manager's EWMH properties;
- the person's input is told apart from ours with the RECORD extension: every
  XTEST request (and pointer warp) is seen with the connection that sent it, and a
  device event that none of them produced came from a real keyboard or mouse, or
  from a program we cannot see (`watch`);
- the emergency-stop hotkey is a passive key grab on the root window (`hotkey`).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

import mss
from mss.exception import ScreenShotError
from Xlib import XK, X, Xatom, error
from Xlib import display as xdisplay
from Xlib.ext import record
from Xlib.protocol import event as xevent

from worker.actions.computer._backend import (
    Backend,
    Button,
    CursorImage,
    Grab,
    Guard,
    Window,
    WindowUnknownError,
)
from worker.actions.computer._geometry import Layout, Monitor, Rect
from worker.actions.computer._keys import Press
from worker.actions.computer._x11_line import PointerLine, compose_layout
from worker.errors import WorkerError

log = logging.getLogger(__name__)

BUTTONS: Final = {"left": 1, "middle": 2, "right": 3}
SCROLL_UP, SCROLL_DOWN, SCROLL_LEFT, SCROLL_RIGHT = 4, 5, 6, 7
FAKE_INPUT: Final = 2  # XTEST minor opcode
WARP_POINTER: Final = 41  # core request opcode
PID_MASK: Final = 1 << 1  # X-Resource: LocalClientPIDMask
CHUNK: Final = 64  # characters per round trip when typing
CLIENT_SEARCH_DEPTH: Final = 3  # frame → (decoration) → client, as window managers nest
# A remapped keycode is translated by each client with its own copy of the keymap,
# which it refreshes only when it reads the MappingNotify. Reusing a keycode the same
# text already pressed for another character therefore waits this long first; text
# with no more distinct off-layout characters than there are spare keycodes never waits.
REMAP_SETTLE_S: Final = 0.05
# An XTEST request and the device event it causes are seen one after the other; a
# credit not used within this time was a request that caused no event (a move to
# where the pointer already was).
CREDIT_TTL_S: Final = 1.0
# A press on a window the window manager watches (openbox's click to focus) freezes
# the pointer until the manager replays it. XTEST input sent meanwhile is queued, and
# the X server delivers a queued release where the pointer was frozen: a fast drag
# left the slider where it was in about half of the runs (Xvfb 21, openbox 3.6). So a
# step that depends on where the pointer is waits until the pointer is there.
ARRIVE_TIMEOUT_S: Final = 2.0
ARRIVE_POLL_S: Final = 0.002
# After an input action the window manager may move the focus (a titlebar's middle
# click in openbox, alt+tab). `settle` waits until the X server has processed every
# release the action sent (a window manager's synchronous grab queues them), then for
# the manager to answer a request sent after them (it handles its events in order),
# and again while the focus moved meanwhile (`_window_manager_rounds`), at most
# SETTLE_ROUNDS times. A manager that does not answer within this time is not waited for.
SETTLE_TIMEOUT_S: Final = 2.0
SETTLE_ROUNDS: Final = 6
FOCUS_LOOKS: Final = 3  # `focused_window`: looks at a focus that moves as it is asked
MODIFIER_MASKS: Final = {
    "ctrl": X.ControlMask,
    "shift": X.ShiftMask,
    "alt": X.Mod1Mask,
    "super": X.Mod4Mask,
    "altgr": X.Mod5Mask,
}


def _open(name: str | None = None) -> xdisplay.Display:
    try:
        return xdisplay.Display(name)
    except (error.DisplayError, error.ConnectionClosedError, OSError) as exc:
        raise WorkerError(
            "not_supported",
            f"could not open the X display {os.environ.get('DISPLAY', '')!r}: {exc}. Is the "
            "desktop session running, and may this user open it (XAUTHORITY)?",
            {"reason": "no X connection", "fix": "run agentworker inside the desktop session"},
        ) from exc


class _Keyboard:
    """One connection's view of the keymap: keysym → (keycode, needs shift), plus the
    spare keycodes it borrows for characters the layout lacks."""

    def __init__(self, display: xdisplay.Display) -> None:
        self.display = display
        self.borrowed: collections.OrderedDict[int, int] = collections.OrderedDict()  # ks → kc
        self.load()

    def load(self) -> None:
        d = self.display
        first = d.display.info.min_keycode
        count = d.display.info.max_keycode - first + 1
        self.map: dict[int, tuple[int, bool]] = {}
        self.spare: list[int] = []
        self.syms: dict[int, tuple[int, ...]] = {}
        borrowed_codes = set(self.borrowed.values())
        for offset, syms in enumerate(d.get_keyboard_mapping(first, count)):
            keycode = first + offset
            self.syms[keycode] = tuple(syms)
            if keycode in borrowed_codes:
                continue
            if not any(syms):
                self.spare.append(keycode)
                continue
            if _is_borrowed(syms) and syms[0] not in self.borrowed:
                # Left mapped by an earlier run (or another connection): ours to reuse.
                self.borrowed[syms[0]] = keycode
                self.borrowed.move_to_end(syms[0], last=False)
                continue
            for level, keysym in enumerate(syms[:2]):
                if keysym and keysym not in self.map:
                    self.map[keysym] = (keycode, level == 1)
            lower = syms[0]
            if len(syms) > 1 and not syms[1] and ord("a") <= lower <= ord("z"):
                self.map.setdefault(lower - 32, (keycode, True))
        for keysym, keycode in self.borrowed.items():
            self.map[keysym] = (keycode, False)

    def drain_notifies(self) -> None:
        """Reload when another program changed the keymap meanwhile."""
        d = self.display
        stale = False
        while d.pending_events():
            if d.next_event().type == X.MappingNotify:
                stale = True
        if stale:
            self.load()

    def ensure(self, keysyms: set[int], used: set[int], guard: Guard) -> None:
        """Map every keysym of `keysyms` the layout lacks onto a spare keycode."""
        missing = [ks for ks in keysyms if ks not in self.map]
        if not missing:
            return
        changes: dict[int, int] = {}
        reused = False
        for keysym in missing:
            if self.spare:
                keycode = self.spare.pop()
            else:
                victim = next((ks for ks in self.borrowed if ks not in keysyms), None)
                if victim is None:
                    raise WorkerError(
                        "not_supported",
                        "the keyboard layout has no spare keycode left to type these characters",
                    )
                keycode = self.borrowed.pop(victim)
                self.map.pop(victim, None)
                reused = reused or keycode in used
            changes[keycode] = keysym
            self.borrowed[keysym] = keycode
            self.map[keysym] = (keycode, False)
        if reused:
            self.display.sync()
            guard.wait(REMAP_SETTLE_S)
        self._remap(changes)

    def _remap(self, changes: dict[int, int]) -> None:
        """One ChangeKeyboardMapping for all of `changes` (keycode → keysym, 0 to
        unmap): every client, the window manager first, re-reads the keymap on each
        MappingNotify, so one for a whole chunk rather than one per character."""
        low, high = min(changes), max(changes)
        width = max(2, len(self.syms.get(low, ())))
        rows = []
        for keycode in range(low, high + 1):
            if keycode in changes:
                keysym = changes[keycode]
                row = (keysym, keysym) + (0,) * (width - 2) if keysym else (0,) * width
            else:
                current = self.syms.get(keycode, ())
                row = tuple(current[:width]) + (0,) * (width - len(current))
            self.syms[keycode] = row
            rows.append(row)
        self.display.change_keyboard_mapping(low, rows)
        self.display.sync()

    def give_back(self) -> None:
        """Unmap the borrowed keycodes (at the end: a client may still be translating)."""
        if self.borrowed:
            self._remap(dict.fromkeys(self.borrowed.values(), 0))
        self.borrowed.clear()

    def touch(self, keysym: int) -> None:
        if keysym in self.borrowed:
            self.borrowed.move_to_end(keysym)

    def chunk_limit(self) -> int:
        return max(1, len(self.spare) + len(self.borrowed))


def _is_borrowed(syms: Sequence[int]) -> bool:
    """A keycode mapped the way `_Keyboard.ensure` maps one: one Unicode keysym, twice."""
    first = syms[0]
    return first >= 0x01000000 and all(sym in (0, first) for sym in syms)


def keysym_of_char(ch: str) -> int:
    if ch in ("\n", "\r"):
        return int(XK.XK_Return)
    if ch == "\t":
        return int(XK.XK_Tab)
    code = ord(ch)
    if 0x20 <= code <= 0x7E or 0xA0 <= code <= 0xFF:
        return code
    return 0x01000000 | code


def _window_id(window: Any) -> int:
    """A reply's window field as an id: python-xlib gives X.NONE and X.PointerRoot as
    ints, a window as an object."""
    return int(getattr(window, "id", window) or 0)


class X11Backend(Backend):
    server = "x11"

    def __init__(self) -> None:
        self._local = threading.local()
        self._ours: set[int] = set()  # resource-id bases of the connections that inject
        self._atoms: dict[str, int] = {}
        self._atom_names: dict[int, str] = {}
        self._closers: list[Callable[[], None]] = []
        self._warp = False
        self._grabbers: list[Any] = []  # mss instances, one per grabbing thread
        self._keyboards: list[_Keyboard] = []
        d = self._display()  # fail now, with a message, if there is no X server
        for ext in ("XTEST", "RANDR"):
            if not d.has_extension(ext):
                raise WorkerError(
                    "not_supported",
                    f"the X server lacks the {ext} extension, which driving the desktop needs",
                )

    # -------------------------------------------------------------- connections

    def _display(self) -> xdisplay.Display:
        d: xdisplay.Display | None = getattr(self._local, "display", None)
        if d is None:
            d = _open()
            self._local.display = d
            self._ours.add(d.display.info.resource_id_base)
            self._closers.append(d.close)
        return d

    def _keyboard(self) -> _Keyboard:
        kb: _Keyboard | None = getattr(self._local, "keyboard", None)
        if kb is None:
            kb = _Keyboard(self._display())
            self._local.keyboard = kb
            self._keyboards.append(kb)
        else:
            kb.drain_notifies()
        return kb

    def _atom(self, name: str) -> int:
        atom = self._atoms.get(name)
        if atom is None:
            atom = self._atoms[name] = self._display().intern_atom(name)
        return atom

    def close(self) -> None:
        """At the worker's end, from its thread; the desktop threads are idle by then."""
        for sct in self._grabbers:
            with contextlib.suppress(Exception):
                sct.close()
        for keyboard in self._keyboards:
            with contextlib.suppress(Exception):
                keyboard.give_back()
        for closer in reversed(self._closers):
            with contextlib.suppress(Exception):
                closer()
        self._closers.clear()

    # -------------------------------------------------------------- seeing

    def layout(self) -> Layout:
        d = self._display()
        root = d.screen().root
        randr: list[Monitor] = []
        for m in root.xrandr_get_monitors(is_active=True).monitors:
            name = self._atom_names.get(m.name)
            if name is None:
                name = self._atom_names[m.name] = d.get_atom_name(m.name)
            rect = Rect(m.x, m.y, m.width_in_pixels, m.height_in_pixels)
            randr.append(Monitor(rect, primary=bool(m.primary), name=name))
        xinerama: list[Rect] = []
        if d.has_extension("XINERAMA") and d.xinerama_is_active():
            xinerama = [
                Rect(s.x, s.y, s.width, s.height) for s in d.xinerama_query_screens().screens
            ]
        screen = d.screen()
        layout, self._warp = compose_layout(
            randr, xinerama, Rect(0, 0, screen.width_in_pixels, screen.height_in_pixels)
        )
        return layout

    def pointer_line(self) -> PointerLine:
        return PointerLine(_open(), self._atom_names)

    def grab(self, rect: Rect) -> Grab:
        region = {"left": rect.x, "top": rect.y, "width": rect.width, "height": rect.height}
        for attempt in (1, 2):
            sct = getattr(self._local, "mss", None)
            if sct is None:
                sct = self._local.mss = mss.MSS()
                self._grabbers.append(sct)
            try:
                shot = sct.grab(region)
            except ScreenShotError as exc:
                # mss sizes its shared-memory buffer once: after the screen grew, a new one.
                self._grabbers.remove(sct)
                sct.close()
                self._local.mss = None
                if attempt == 2:
                    raise WorkerError(
                        "out_of_bounds", f"the X server could not capture {rect}: {exc}"
                    ) from exc
                continue
            return Grab(rect, shot.raw, rect.width * 4)
        raise AssertionError("unreachable")

    def cursor_position(self) -> tuple[int, int]:
        reply = self._display().screen().root.query_pointer()
        return int(reply.root_x), int(reply.root_y)

    def cursor_image(self) -> CursorImage | None:
        d = self._display()
        if not d.has_extension("XFIXES"):
            return None
        if not getattr(self._local, "xfixes", False):
            d.xfixes_query_version()
            self._local.xfixes = True
        image = d.xfixes_get_cursor_image(d.screen().root)
        width, height = image.width, image.height
        if not width or not height:
            return None
        argb = image.cursor_image
        rgba = bytearray(width * height * 4)
        for i, pixel in enumerate(argb):
            alpha = (pixel >> 24) & 0xFF
            # XFixes gives premultiplied ARGB; undo the premultiplication.
            r, g, b = (pixel >> 16) & 0xFF, (pixel >> 8) & 0xFF, pixel & 0xFF
            if alpha and alpha != 255:
                r, g, b = (min(255, c * 255 // alpha) for c in (r, g, b))
            rgba[i * 4 : i * 4 + 4] = bytes((r, g, b, alpha))
        return CursorImage(bytes(rgba), width, height, image.xhot, image.yhot)

    # -------------------------------------------------------------- input

    def _motion(self, x: int, y: int) -> None:
        self._local.sent = True
        d = self._display()
        if self._warp:
            d.screen().root.warp_pointer(x, y)
        else:
            d.xtest_fake_input(X.MotionNotify, x=x, y=y)

    def _arrive(self, guard: Guard, x: int, y: int, done: str = "") -> None:
        """Return once the pointer is at (x, y): the motion sent there has been
        processed, not queued behind a frozen pointer. Past ARRIVE_TIMEOUT_S: `busy`
        while nothing but the pointer's move was sent, `outcome_unknown` (not to be
        sent again blindly) once `done` says what already happened (review7 09)."""
        root = self._display().screen().root
        deadline = time.monotonic() + ARRIVE_TIMEOUT_S
        while True:
            at = root.query_pointer()  # a round trip: every request before it is done
            if (at.root_x, at.root_y) == (x, y):
                return
            if time.monotonic() > deadline:
                break
            guard.wait(ARRIVE_POLL_S)
        held = (
            f"the pointer did not reach ({x}, {y}) within {ARRIVE_TIMEOUT_S:g} s: another "
            "program holds it (a grab, a pointer barrier)"
        )
        if not done:
            raise WorkerError(
                "busy", f"{held}; nothing was pressed. Try again once that program lets go."
            )
        raise WorkerError(
            "outcome_unknown",
            f"{held}, and {done}: look at the screen before doing it again.",
            {"stuck_at": [at.root_x, at.root_y]},
        )

    def _button(self, kind: int, button: int) -> None:
        pressed = self._pressed()
        if kind == X.ButtonPress and button <= 5:  # the pointer's state has buttons 1-5
            pressed.add(("button", button))
        self._display().xtest_fake_input(kind, button)

    def _key(self, kind: int, keycode: int) -> None:
        pressed = self._pressed()
        if kind == X.KeyPress:
            pressed.add(("key", keycode))
        self._display().xtest_fake_input(kind, keycode)

    def _pressed(self) -> set[tuple[str, int]]:
        self._local.sent = True
        """The buttons and keys this thread pressed since its last `settle` (and a note
        that it sent input)."""
        pressed: set[tuple[str, int]] | None = getattr(self._local, "pressed", None)
        if pressed is None:
            pressed = self._local.pressed = set()
        return pressed

    @contextlib.contextmanager
    def _holding(self, hold: Sequence[Press]) -> Iterator[None]:
        """Hold keys down for the block; they are released whatever happens in it."""
        d = self._display()
        pressed: list[int] = []
        try:
            for keycode in self._keycodes(hold, Guard()):
                self._key(X.KeyPress, keycode)
                pressed.append(keycode)
            yield
        finally:
            for keycode in reversed(pressed):
                self._key(X.KeyRelease, keycode)
            d.sync()

    def _keycodes(self, presses: Sequence[Press], guard: Guard) -> list[int]:
        """The keycodes to press for `presses` (a shifted character adds shift first)."""
        kb = self._keyboard()
        keysyms = [self._keysym(p) for p in presses]
        kb.ensure(set(keysyms), set(), guard)
        codes: list[int] = []
        shift = kb.map.get(XK.XK_Shift_L, (0, False))[0]
        for keysym in keysyms:
            keycode, shifted = kb.map[keysym]
            if shifted and shift and shift not in codes:
                codes.append(shift)
            codes.append(keycode)
        return codes

    @staticmethod
    def _keysym(press: Press) -> int:
        if press.key is not None:
            keysym = int(XK.string_to_keysym(press.key.x11))
            if not keysym:
                raise WorkerError("unknown_key", f"X11 has no key {press.key.name!r}")
            return keysym
        return keysym_of_char(press.char)

    def move(self, guard: Guard, path: Sequence[tuple[int, int]], step_s: float) -> None:
        d = self._display()
        for index, (x, y) in enumerate(path):
            if index and step_s:
                d.sync()
                guard.wait(step_s)
            self._motion(x, y)
        self._arrive(guard, *path[-1], done="the pointer moved only part of the way")

    def click(
        self, guard: Guard, x: int, y: int, button: Button, clicks: int, hold: Sequence[Press]
    ) -> None:
        code = BUTTONS[button]
        self._motion(x, y)
        self._arrive(guard, x, y)
        with self._holding(hold):
            for _ in range(clicks):
                self._button(X.ButtonPress, code)
                self._button(X.ButtonRelease, code)

    def drag(
        self,
        guard: Guard,
        path: Sequence[tuple[int, int]],
        button: Button,
        step_s: float,
        hold: Sequence[Press],
    ) -> None:
        d = self._display()
        code = BUTTONS[button]
        x0, y0 = path[0]
        self._motion(x0, y0)
        self._arrive(guard, x0, y0)
        with self._holding(hold):
            self._button(X.ButtonPress, code)
            guard.did(f"the drag pressed at ({x0}, {y0}) and let go where the pointer was")
            try:
                for x, y in path[1:]:
                    if step_s:
                        d.sync()
                        guard.wait(step_s)
                    else:
                        guard.check()
                    self._motion(x, y)
                # The press may have frozen the pointer (a window manager's grab).
                self._arrive(
                    guard,
                    *path[-1],
                    done=f"the drag pressed at ({x0}, {y0}) and let go where the pointer was held",
                )
            finally:
                self._button(X.ButtonRelease, code)

    def scroll(self, guard: Guard, x: int, y: int, dx: int, dy: int) -> None:
        self._motion(x, y)
        self._arrive(guard, x, y)
        vertical = SCROLL_DOWN if dy > 0 else SCROLL_UP
        horizontal = SCROLL_RIGHT if dx > 0 else SCROLL_LEFT
        for button, count in ((vertical, abs(dy)), (horizontal, abs(dx))):
            for _ in range(count):
                self._button(X.ButtonPress, button)
                self._button(X.ButtonRelease, button)
        self._display().sync()

    def type_text(self, guard: Guard, text: str) -> int:
        d = self._display()
        kb = self._keyboard()
        text = text.replace("\r\n", "\n")
        keysyms = [keysym_of_char(ch) for ch in text]
        shift = kb.map.get(XK.XK_Shift_L, (0, False))[0]
        used: set[int] = set()
        start = 0
        shift_down = False
        try:
            while start < len(keysyms):
                chunk = self._next_chunk(kb, keysyms, start)
                kb.ensure(set(chunk), used, guard)
                # After the keymap's change, which may wait for clients to take it in
                # (REMAP_SETTLE_S): the focus may move during that wait (review16 F3).
                guard.check()
                for keysym in chunk:
                    keycode, shifted = kb.map[keysym]
                    kb.touch(keysym)
                    used.add(keycode)
                    if shifted != shift_down and shift:
                        self._key(X.KeyPress if shifted else X.KeyRelease, shift)
                        shift_down = shifted
                    self._key(X.KeyPress, keycode)
                    self._key(X.KeyRelease, keycode)
                if shift_down:
                    self._key(X.KeyRelease, shift)
                    shift_down = False
                d.sync()
                start += len(chunk)
                guard.did(f"{start:,} of the {len(text):,} characters were typed")
        finally:
            if shift_down:
                self._key(X.KeyRelease, shift)
                d.sync()
        return len(text)

    @staticmethod
    def _next_chunk(kb: _Keyboard, keysyms: list[int], start: int) -> list[int]:
        """Up to CHUNK keysyms from `start`, with no more off-layout ones than fit at once,
        ending after a Return: the focus is checked before each chunk, and a Return is
        the key most likely to close a window or open another."""
        limit = kb.chunk_limit()
        foreign: set[int] = set()
        end = start
        while end < len(keysyms) and end - start < CHUNK:
            keysym = keysyms[end]
            if keysym not in kb.map or keysym in kb.borrowed:
                if keysym not in foreign and len(foreign) >= limit:
                    break
                foreign.add(keysym)
            end += 1
            if keysym == XK.XK_Return:
                break
        return keysyms[start:end]

    def combo(self, guard: Guard, keys: Sequence[Press], hold_s: float) -> None:
        d = self._display()
        codes = self._keycodes(keys, guard)
        pressed: list[int] = []
        try:
            for keycode in codes:
                self._key(X.KeyPress, keycode)
                pressed.append(keycode)
            d.sync()
            guard.did("the keys were pressed, and let go early")
            if hold_s:
                guard.wait(hold_s)
        finally:
            for keycode in reversed(pressed):
                self._key(X.KeyRelease, keycode)
            d.sync()

    # -------------------------------------------------------------- windows

    def _property(self, window: Any, name: str, kind: int = X.AnyPropertyType) -> Any:
        try:
            prop = window.get_full_property(self._atom(name), kind)
        except error.XError:
            return None
        return None if prop is None else prop.value

    def windows(self) -> list[Window]:
        d = self._display()
        root = d.screen().root
        ids = self._property(root, "_NET_CLIENT_LIST")
        if ids is None:
            ids = [w.id for w in root.query_tree().children]
        active = self._property(root, "_NET_ACTIVE_WINDOW")
        active_id = int(active[0]) if active is not None and len(active) else 0
        found = []
        for wid in ids:
            window = d.create_resource_object("window", int(wid))
            try:
                attrs = window.get_attributes()
                if attrs.map_state != X.IsViewable:
                    continue
                geometry = window.get_geometry()
                origin = root.translate_coords(window, 0, 0)
                title = self._title(window)
                wm_class = window.get_wm_class()
            except error.XError:  # it closed meanwhile
                continue
            found.append(
                Window(
                    id=int(wid),
                    title=title,
                    app=wm_class[1] if wm_class else "",
                    pid=self._pid_of(window),
                    rect=Rect(int(origin.x), int(origin.y), geometry.width, geometry.height),
                    focused=int(wid) == active_id,
                )
            )
        return found

    def window_at(self, x: int, y: int) -> tuple[int, int | None] | None:
        d = self._display()
        root = d.screen().root
        try:
            top = root.translate_coords(root, x, y).child  # the frame on top at (x, y)
            if not top:
                return None
            # The application's window in the frame; with no window manager (no
            # WM_STATE anywhere), or on a menu (override-redirect), the window itself.
            client = self._client_in(top, CLIENT_SEARCH_DEPTH) or top
            found = self._settled(client)
            again = root.translate_coords(root, x, y).child
        except error.XError as exc:  # a window closed as it was asked: which one is there now?
            raise WindowUnknownError(f"the X server answered {type(exc).__name__}") from exc
        if _window_id(again) != _window_id(top):
            raise WindowUnknownError(f"the window on top at ({x}, {y}) changed as it was asked")
        return found

    def focused_window(self) -> tuple[int, int | None] | None:
        # A focus that moved as it was asked is most often the window manager's doing
        # (a window closed and openbox gives the focus to the next): once the manager
        # has handled what it was sent, look again. Still moving: fail closed.
        for _ in range(FOCUS_LOOKS - 1):
            with contextlib.suppress(WindowUnknownError):
                return self.focus_holder(self.input_focus())
            self._window_manager_rounds(time.monotonic() + SETTLE_TIMEOUT_S)
        return self.focus_holder(self.input_focus())

    def input_focus(self) -> int:
        return _window_id(self._display().get_input_focus().focus)

    def managed(self) -> bool:
        """An EWMH window manager runs; whether it answers _NET_REQUEST_FRAME_EXTENTS
        (`settle`'s round trip) is noted for this thread."""
        supported = self._property(self._display().screen().root, "_NET_SUPPORTED", Xatom.ATOM)
        self._local.answers_extents = (
            supported is not None and self._atom("_NET_REQUEST_FRAME_EXTENTS") in supported
        )
        return supported is not None

    def focus_holder(self, target: int) -> tuple[int, int | None] | None:
        d = self._display()
        root = d.screen().root
        try:
            if target == X.NONE:  # typed keys go to no window
                return None
            if target == X.PointerRoot or target == root.id:
                # Keys go to the window under the pointer (X delivers them to the
                # pointer's window when it is inside the focus window: the root holds all).
                pointer = root.query_pointer()
                found = self.window_at(pointer.root_x, pointer.root_y)
            else:
                focus = d.create_resource_object("window", target)
                found = self._settled(self._client_above(focus, root.id))
            again = d.get_input_focus().focus
        except error.XError as exc:  # a window closed as it was asked: where do keys go now?
            raise WindowUnknownError(f"the X server answered {type(exc).__name__}") from exc
        if _window_id(again) != target:
            raise WindowUnknownError("the keyboard focus moved as it was asked")
        return found

    def wait_for_window_manager(self) -> None:
        if getattr(self._local, "sent", False):
            self._window_manager_rounds(time.monotonic() + SETTLE_TIMEOUT_S)

    def settle(self) -> bool:
        if not getattr(self._local, "sent", False):
            return False
        self._local.sent = False
        d = self._display()
        pressed = self._pressed()
        self._local.sent = False
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while pressed:  # every release processed, not queued behind a frozen device
            mask = d.screen().root.query_pointer().mask
            keymap = d.query_keymap()
            for kind, code in list(pressed):
                if kind == "button":
                    down = mask & (X.Button1Mask << (code - 1))
                else:
                    down = keymap[code // 8] & (1 << (code % 8))
                if not down:
                    pressed.discard((kind, code))
            if not pressed or time.monotonic() > deadline:
                break
            time.sleep(ARRIVE_POLL_S)
        pressed.clear()
        self._window_manager_rounds(deadline)
        return True

    def _window_manager_rounds(self, deadline: float) -> None:
        """Round trips to the window manager (`_window_manager_round_trip`) until one in
        which the keyboard focus did not move, or the deadline.

        An answer says the manager handled every event the X server gave it before the
        request: the input, and the focus events of each focus change made before the
        request was sent (the focus is read just before it). A focus change made while
        the request waits (the manager's own, in answer to the input) queues its focus
        events behind the request, and what the manager does about them comes after
        its answer: openbox gives the focus to the window focused before when the focus
        falls to a frame or the root (an iconified window's). So one more round, while
        the focus moved. A focus moved by another program (the application that got it,
        on WM_TAKE_FOCUS) or on a timer is not ordered by the manager's answers."""
        if not getattr(self._local, "answers_extents", False):
            return  # a window manager that cannot be asked (`managed`): no waiting for it
        d: xdisplay.Display | None = getattr(self._local, "settle_display", None)
        if d is None:
            d = self._local.settle_display = _open()
            self._closers.append(d.close)
        focus = _window_id(d.get_input_focus().focus)
        for _ in range(SETTLE_ROUNDS):
            if not self._window_manager_round_trip(d, deadline):
                return
            now = _window_id(d.get_input_focus().focus)
            if now == focus:
                return
            focus = now
        log.debug("the keyboard focus still moved after %s rounds", SETTLE_ROUNDS)

    def _window_manager_round_trip(self, d: xdisplay.Display, deadline: float) -> bool:
        """Ask the window manager for a new probe window's frame extents (EWMH's
        _NET_REQUEST_FRAME_EXTENTS) and wait for its answer: by then it has handled
        every event the X server gave it before the request. On a connection of its
        own (the input thread's holds the keyboard's MappingNotify). False when it did
        not answer by the deadline.

        python-xlib hands a freed resource id out again at once, and a probe's id named
        the answer: the deleted properties of the probe destroyed after the last answer
        (PropertyNotify, as the X server destroys a window), or the manager's late answer
        to it, were taken for this one's, and no round trip waited (the focus was judged
        before openbox had handled the keys). So the last probe is destroyed only once
        this one holds an id of its own, and only a new value counts."""
        root = d.screen().root
        request = self._atom("_NET_REQUEST_FRAME_EXTENTS")  # atoms are the server's
        extents = self._atom("_NET_FRAME_EXTENTS")
        probe = root.create_window(
            -10, -10, 1, 1, 0, 0, X.InputOnly, X.CopyFromParent, event_mask=X.PropertyChangeMask
        )
        previous = getattr(self._local, "probe", None)
        self._local.probe = probe
        if previous is not None:
            previous.destroy()
        message = xevent.ClientMessage(window=probe, client_type=request, data=(32, [0] * 5))
        root.send_event(message, event_mask=X.SubstructureRedirectMask | X.SubstructureNotifyMask)
        d.flush()
        while True:
            while d.pending_events():
                event = d.next_event()
                if (
                    event.type == X.PropertyNotify
                    and event.window.id == probe.id
                    and event.atom == extents
                    and event.state == X.PropertyNewValue
                ):
                    return True
            left = deadline - time.monotonic()
            if left <= 0:
                log.debug("the window manager did not answer within %s s", SETTLE_TIMEOUT_S)
                return False
            select.select([d.fileno()], [], [], left)

    def refocus(self, target: int, timeout_s: float) -> None:
        try:
            self._refocus(target, timeout_s)
        finally:
            self._local.sent = False  # the worker's own doing, not the next action's

    def _refocus(self, target: int, timeout_s: float) -> None:
        d = self._display()
        root = d.screen().root
        try:
            if target in (X.NONE, X.PointerRoot):
                d.set_input_focus(target, X.RevertToPointerRoot, X.CurrentTime)
                d.sync()
                return
            window = d.create_resource_object("window", target)
            client = self._client_above(window, root.id)
            if client is not None and self._property(client, "WM_STATE") is not None:
                self.focus(client.id, timeout_s)  # the manager's way: it agrees with it
                return
            window.set_input_focus(X.RevertToParent, X.CurrentTime)
            d.sync()
        except error.XError as exc:  # it closed meanwhile: the caller looks where it is
            log.debug("could not put the focus back on window %s: %s", target, exc)

    def _settled(self, client: Any) -> tuple[int, int | None] | None:
        """(id, pid) of a window found for a check, or None; an X error if it closed
        while its pid was asked (the pid's lookups take a closed window for one
        without a pid)."""
        if client is None:
            return None
        pid = self._pid_of(client)
        client.get_attributes()  # still there once its pid is known
        return client.id, pid

    def _client_above(self, window: Any, root_id: int) -> Any:
        """The application's window that holds `window` (a toolkit focuses one of its
        inner windows): the nearest one up the tree carrying WM_STATE, else the one
        inside `window` when that is a window manager's frame, else (no window manager
        sets WM_STATE) the top-level window above it, unless that is override-redirect
        (a window manager's own, such as openbox's stand-in when nothing has focus)."""
        start = window
        top = None
        for _ in range(CLIENT_SEARCH_DEPTH * 4):
            if window.id == root_id:
                break
            if self._property(window, "WM_STATE") is not None:
                return window
            parent = window.query_tree().parent
            if not parent:
                break
            top, window = window, parent
        client = self._client_in(start, CLIENT_SEARCH_DEPTH)
        if client is None and top is not None and window.id == root_id:
            attributes = top.get_attributes()
            if attributes.map_state == X.IsViewable and not attributes.override_redirect:
                return top
        return client

    def _client_in(self, window: Any, depth: int) -> Any:
        """The application's window in a window manager's frame: the one that carries
        WM_STATE (the window itself when it is not reparented), as xprop looks."""
        if self._property(window, "WM_STATE") is not None:
            return window
        if depth == 0:
            return None
        for child in reversed(window.query_tree().children):  # the top one first
            found = self._client_in(child, depth - 1)
            if found is not None:
                return found
        return None

    def _pid_of(self, window: Any) -> int | None:
        pid = self._property(window, "_NET_WM_PID", Xatom.CARDINAL)
        if pid is None or not len(pid):
            pid = self._client_pid(int(window.id))
        return int(pid[0]) if pid is not None and len(pid) else None

    def _client_pid(self, window_id: int) -> list[int] | None:
        """The pid of the client that made the window, as the X server knows it
        (X-Resource), for programs that do not set _NET_WM_PID (Tk, for one)."""
        d = self._display()
        if not d.has_extension("X-Resource"):
            return None
        try:
            reply = d.res_query_client_ids([{"client": window_id, "mask": PID_MASK}])
        except error.XError:
            return None
        for found in reply.ids:
            if found.spec.mask == PID_MASK and found.value:
                return [int(found.value[0])]
        return None

    def _title(self, window: Any) -> str:
        name = self._property(window, "_NET_WM_NAME", self._atom("UTF8_STRING"))
        if name is None:
            name = self._property(window, "WM_NAME")
        if name is None:
            return ""
        if isinstance(name, bytes):
            return name.decode("utf-8", "replace")
        return str(name)

    def focus(self, window_id: int, timeout_s: float) -> bool:
        # A connection of its own: it listens to the root's property changes while it waits.
        self._local.sent = True
        d = _open()
        try:
            root = d.screen().root
            active_atom = d.intern_atom("_NET_ACTIVE_WINDOW")
            root.change_attributes(event_mask=X.PropertyChangeMask)
            window = d.create_resource_object("window", window_id)
            supported = root.get_full_property(d.intern_atom("_NET_SUPPORTED"), Xatom.ATOM)
            if supported is not None and active_atom in supported.value:
                message = xevent.ClientMessage(
                    window=window,
                    client_type=active_atom,
                    data=(32, [2, X.CurrentTime, 0, 0, 0]),  # 2: sent on the user's behalf
                )
                mask = X.SubstructureRedirectMask | X.SubstructureNotifyMask
                root.send_event(message, event_mask=mask)
            else:
                window.raise_window()
                window.set_input_focus(X.RevertToParent, X.CurrentTime)
            d.sync()
            deadline = time.monotonic() + timeout_s
            # Once the manager answered a request sent after the message (and the focus
            # stopped moving), it handled the message: a _NET_ACTIVE_WINDOW read now is
            # not one from before a focus change still in its queue.
            self._window_manager_rounds(deadline)
            while True:
                prop = root.get_full_property(active_atom, Xatom.WINDOW)
                if prop is not None and len(prop.value) and int(prop.value[0]) == window_id:
                    return True
                if supported is None:
                    focus = d.get_input_focus().focus
                    return getattr(focus, "id", 0) == window_id
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if not d.pending_events():
                    select.select([d.fileno()], [], [], left)
                while d.pending_events():
                    d.next_event()
        finally:
            d.close()

    # -------------------------------------------------------------- the person

    def watch(self, on_person_input: Callable[[str], None]) -> Callable[[], None] | None:
        control = _open()
        if not control.has_extension("RECORD"):
            control.close()
            log.warning("the X server has no RECORD extension: the person's input goes unnoticed")
            return None
        recorder = _open()
        xtest = control.query_extension("XTEST").major_opcode
        context = control.record_create_context(
            0,
            [record.AllClients],
            [
                {
                    "core_requests": (WARP_POINTER, WARP_POINTER),
                    "core_replies": (0, 0),
                    "ext_requests": (xtest, xtest, FAKE_INPUT, FAKE_INPUT),
                    "ext_replies": (0, 0, 0, 0),
                    "delivered_events": (0, 0),
                    "device_events": (X.KeyPress, X.MotionNotify),
                    "errors": (0, 0),
                    "client_started": False,
                    "client_died": False,
                }
            ],
        )
        control.sync()
        credits: collections.deque[float] = collections.deque()
        ours = self._ours

        def seen(reply: Any) -> None:
            now = time.monotonic()
            while credits and now - credits[0] > CREDIT_TTL_S:
                credits.popleft()
            data = bytes(reply.data)
            if reply.category == record.FromClient:
                if len(data) >= 2 and data[0] == xtest and data[1] == FAKE_INPUT:
                    credits.append(now)
                    if reply.id_base not in ours:
                        on_person_input("input injected by another X client (XTEST)")
                elif data[:1] == bytes((WARP_POINTER,)):
                    credits.append(now)
                    if reply.id_base not in ours:
                        on_person_input("another X client moved the pointer")
            elif reply.category == record.FromServer:
                for offset in range(0, len(data) - 31, 32):
                    kind = data[offset] & 0x7F
                    if not X.KeyPress <= kind <= X.MotionNotify:
                        continue
                    if credits:
                        credits.popleft()
                    else:
                        on_person_input("a key or pointer event the worker did not cause")

        def run() -> None:
            try:
                recorder.record_enable_context(context, seen)
            except Exception:
                log.exception("the desktop watcher stopped")
            finally:
                recorder.close()

        thread = threading.Thread(target=run, name="x11-watch", daemon=True)
        thread.start()

        def stop() -> None:
            with contextlib.suppress(Exception):
                control.record_disable_context(context)
                control.sync()
            thread.join(2.0)
            with contextlib.suppress(Exception):
                control.record_free_context(context)
                control.close()

        self._closers.append(stop)
        return stop

    def hotkey(self, keys: Sequence[Press], on_press: Callable[[], None]) -> Callable[[], None]:
        d = _open()
        root = d.screen().root
        mods = 0
        main: Press | None = None
        for press in keys:
            if press.key is not None and press.key.modifier:
                mods |= MODIFIER_MASKS[press.key.name]
            else:
                main = press
        if main is None:
            d.close()
            raise WorkerError("validation_error", "the stop hotkey needs a key besides modifiers")
        keycode = d.keysym_to_keycode(self._keysym(main))
        if not keycode:
            d.close()
            raise WorkerError("unknown_key", f"the keyboard has no key {main.label!r}")
        catch = error.CatchError(error.BadAccess)
        for extra in (0, X.LockMask, X.Mod2Mask, X.LockMask | X.Mod2Mask):  # Caps/Num Lock
            root.grab_key(
                keycode, mods | extra, True, X.GrabModeAsync, X.GrabModeAsync, onerror=catch
            )
        d.sync()
        if catch.get_error():
            d.close()
            raise WorkerError("busy", "another program holds this key combination")
        wake_r, wake_w = os.pipe()

        def run() -> None:
            try:
                while True:
                    while d.pending_events():
                        event = d.next_event()
                        if event.type == X.KeyPress and event.detail == keycode:
                            on_press()
                    ready, _, _ = select.select([d.fileno(), wake_r], [], [])
                    if wake_r in ready:
                        return
            except Exception:
                log.exception("the stop hotkey listener stopped")
            finally:
                d.close()
                os.close(wake_r)

        thread = threading.Thread(target=run, name="x11-hotkey", daemon=True)
        thread.start()

        def stop() -> None:
            with contextlib.suppress(OSError):
                os.write(wake_w, b"x")
                os.close(wake_w)
            thread.join(2.0)

        self._closers.append(stop)
        return stop
