"""macOS and Windows: pynput for input and the person's own input, mss for pixels.

Untested on this project's CI (it runs Linux); kept to what both libraries document.
Where the platform cannot do a thing here (listing and focusing windows), the
action answers `not_supported`, naming what is missing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import mss
from pynput import keyboard, mouse

from worker.actions.computer._backend import Backend, Button, Grab, Guard
from worker.actions.computer._geometry import Layout, Monitor, Rect
from worker.actions.computer._keys import Press, chunks
from worker.errors import WorkerError

CHUNK = 64


class PynputBackend(Backend):
    server = "pynput"

    def __init__(self) -> None:
        self._local = threading.local()
        self._mouse = mouse.Controller()
        self._keyboard = keyboard.Controller()

    def _mss(self) -> Any:
        sct = getattr(self._local, "mss", None)
        if sct is None:
            sct = self._local.mss = mss.MSS()
        return sct

    def layout(self) -> Layout:
        monitors = self._mss().monitors[1:]
        found = [
            Monitor(Rect(m["left"], m["top"], m["width"], m["height"]), primary=i == 0)
            for i, m in enumerate(monitors)
        ]
        return Layout(tuple(found), self.server)

    def grab(self, rect: Rect) -> Grab:
        shot = self._mss().grab(
            {"left": rect.x, "top": rect.y, "width": rect.width, "height": rect.height}
        )
        return Grab(rect, bytes(shot.raw), rect.width * 4)

    def cursor_position(self) -> tuple[int, int]:
        x, y = self._mouse.position
        return int(x), int(y)

    @staticmethod
    def _key(press: Press) -> Any:
        if press.key is not None:
            return getattr(keyboard.Key, press.key.pynput)
        return press.char

    @contextmanager
    def _holding(self, hold: Sequence[Press]) -> Iterator[None]:
        pressed: list[Any] = []
        try:
            for press in hold:
                key = self._key(press)
                self._keyboard.press(key)
                pressed.append(key)
            yield
        finally:
            for key in reversed(pressed):
                self._keyboard.release(key)

    def move(self, guard: Guard, path: Sequence[tuple[int, int]], step_s: float) -> None:
        for index, point in enumerate(path):
            if index and step_s:
                guard.wait(step_s)
            self._mouse.position = point

    def click(
        self, guard: Guard, x: int, y: int, button: Button, clicks: int, hold: Sequence[Press]
    ) -> None:
        self._mouse.position = (x, y)
        with self._holding(hold):
            self._mouse.click(getattr(mouse.Button, button), clicks)

    def drag(
        self,
        guard: Guard,
        path: Sequence[tuple[int, int]],
        button: Button,
        step_s: float,
        hold: Sequence[Press],
    ) -> None:
        which = getattr(mouse.Button, button)
        self._mouse.position = path[0]
        with self._holding(hold):
            self._mouse.press(which)
            guard.did(f"the drag pressed at {tuple(path[0])} and let go where the pointer was")
            try:
                for point in path[1:]:
                    if step_s:
                        guard.wait(step_s)
                    else:
                        guard.check()
                    self._mouse.position = point
            finally:
                self._mouse.release(which)

    def scroll(self, guard: Guard, x: int, y: int, dx: int, dy: int) -> None:
        self._mouse.position = (x, y)
        self._mouse.scroll(dx, -dy)  # pynput: positive dy scrolls up

    def type_text(self, guard: Guard, text: str) -> int:
        text = text.replace("\r\n", "\n")
        typed = 0
        for chunk in chunks(text, CHUNK):
            guard.check()
            for ch in chunk:
                if ch == "\n":
                    self._keyboard.tap(keyboard.Key.enter)
                elif ch == "\t":
                    self._keyboard.tap(keyboard.Key.tab)
                else:
                    self._keyboard.type(ch)
            typed += len(chunk)
            guard.did(f"{typed:,} of the {len(text):,} characters were typed")
        return len(text)

    def combo(self, guard: Guard, keys: Sequence[Press], hold_s: float) -> None:
        with self._holding(keys):
            guard.did("the keys were pressed, and let go early")
            if hold_s:
                guard.wait(hold_s)

    def watch(self, on_person_input: Callable[[str], None]) -> Callable[[], None] | None:
        def moved(x: int, y: int, injected: bool = False) -> None:
            if not injected:
                on_person_input("a pointer motion from a real device")

        def pressed(key: Any, injected: bool = False) -> None:
            if not injected:
                on_person_input("a key from a real keyboard")

        pointer = mouse.Listener(on_move=moved)
        keys = keyboard.Listener(on_press=pressed)
        pointer.start()
        keys.start()

        def stop() -> None:
            pointer.stop()
            keys.stop()

        return stop

    def hotkey(self, keys: Sequence[Press], on_press: Callable[[], None]) -> Callable[[], None]:
        spec = "+".join(
            f"<{press.key.pynput}>" if press.key is not None else press.char for press in keys
        )
        try:
            listener = keyboard.GlobalHotKeys({spec: on_press})
        except ValueError as exc:
            raise WorkerError("unknown_key", f"pynput cannot listen for {spec}: {exc}") from exc
        listener.start()

        def stop() -> None:
            listener.stop()

        return stop
