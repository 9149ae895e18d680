"""Real X servers for the computer tests: Xvfb (+ openbox), Xephyr for layouts Xvfb
cannot make, and the Tk test application that records what it receives.

Everything here waits on events: a server is ready when it writes its display
number (`-displayfd`), a window manager when it claims the root window, the Tk
app when it prints its `ready` line, and an expected app event when it arrives.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import queue
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker.actions import computer
from worker.config import Paths
from worker.core.registry import Context, Services

TK_APP = Path(__file__).resolve().parents[1] / "computer" / "tk_app.py"
Event = dict[str, Any]


@dataclass
class XServer:
    display: str  # ":N"
    proc: subprocess.Popen[bytes]
    helpers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("WAYLAND_DISPLAY",)}
        env["DISPLAY"] = self.display
        env.pop("XDG_SESSION_TYPE", None)
        return env

    def run(self, *argv: str) -> str:
        """A client program (xdotool, xrandr) on this display; its output."""
        done = subprocess.run(
            list(argv), env=self.env(), capture_output=True, text=True, timeout=30, check=True
        )
        return done.stdout

    def __enter__(self) -> XServer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        for proc in [*self.helpers, self.proc]:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)


def _start_server(argv: list[str], env: dict[str, str] | None = None) -> XServer:
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        [*argv, "-displayfd", str(write_fd)],
        pass_fds=[write_fd],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    os.close(write_fd)
    try:
        number = b""
        deadline = time.monotonic() + 30
        while not number.endswith(b"\n"):
            left = deadline - time.monotonic()
            ready, _, _ = select.select([read_fd], [], [], max(0.0, left))
            chunk = os.read(read_fd, 16) if ready else b""
            if not chunk:
                proc.kill()
                raise AssertionError(f"{argv[0]} did not start (exit {proc.poll()})")
            number += chunk
    finally:
        os.close(read_fd)
    return XServer(f":{int(number)}", proc)


def start_xvfb(width: int = 1600, height: int = 900, *, window_manager: bool = True) -> XServer:
    server = _start_server(
        ["Xvfb", "-screen", "0", f"{width}x{height}x24", "-nolisten", "tcp", "-noreset"]
    )
    if window_manager:
        start_openbox(server)
    return server


def start_xephyr(host: XServer, *screens: str, xinerama: bool = False) -> XServer:
    """A nested X server on `host`; several `screens` ("WxH") with Xinerama make one
    desktop of side-by-side monitors."""
    argv = ["Xephyr", "-nolisten", "tcp", "-ac", "-noreset"]
    if xinerama:
        argv.append("+xinerama")
    for screen in screens:
        argv += ["-screen", screen]
    return _start_server(argv, env=host.env())


def start_openbox(server: XServer) -> None:
    proc = subprocess.Popen(
        ["openbox", "--sm-disable"],
        env=server.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    server.helpers.append(proc)
    wait_until(lambda: _wm_running(server), 20, what="openbox to manage the screen")


def _wm_running(server: XServer) -> bool:
    done = subprocess.run(
        ["xprop", "-root", "_NET_SUPPORTING_WM_CHECK"],
        env=server.env(),
        capture_output=True,
        text=True,
        timeout=10,
    )
    return "window id" in done.stdout


def wait_until(condition: Callable[[], bool], timeout: float, *, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class TkApp:
    """The test application on a display; its events arrive on a queue."""

    def __init__(self, server: XServer, *args: str) -> None:
        self.server = server
        self.proc = subprocess.Popen(
            [sys.executable, str(TK_APP), *args],
            env={**server.env(), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.events: queue.Queue[Event] = queue.Queue()
        self.seen: list[Event] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.ready = self.wait(lambda e: e["event"] == "ready", 20)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.events.put(json.loads(line))
        self.events.put({"event": "exit"})

    def widget(self, name: str) -> tuple[int, int, int, int]:
        x, y, w, h = self.ready["widgets"][name]
        return x, y, w, h

    def centre(self, name: str) -> tuple[int, int]:
        x, y, w, h = self.widget(name)
        return x + w // 2, y + h // 2

    def wait(self, match: Callable[[Event], bool], timeout: float = 10) -> Event:
        """The next event that matches (earlier ones are kept in `seen`)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                event = self.events.get(timeout=max(0.0, left))
            except queue.Empty:
                raise AssertionError(
                    f"no matching event within {timeout} s; last events: {self.seen[-10:]}"
                ) from None
            self.seen.append(event)
            if event["event"] == "exit":
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise AssertionError(f"the Tk app exited: {err[-2000:]}")
            if match(event):
                return event

    def wait_text(self, value: str, timeout: float = 10) -> None:
        self.wait(lambda e: e["event"] == "text" and e["value"] == value, timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self._reader.join(10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


@contextlib.contextmanager
def tk_app(server: XServer, *args: str) -> Iterator[TkApp]:
    app = TkApp(server, *args)
    try:
        yield app
    finally:
        app.stop()


@contextlib.contextmanager
def computer_on(
    server: XServer, monkeypatch: Any, data_dir: Path, settings: Any = None
) -> Iterator[Computer]:
    """The computer actions' handlers on `server`'s display, through a desktop of
    their own (no stop hotkey, no takeover watch unless `settings` say so)."""
    monkeypatch.setenv("DISPLAY", server.display)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.delenv("XDG_SESSION_TYPE", raising=False)
    settings = settings or computer.DesktopSettings(stop_hotkey="", takeover=False)
    desktop = computer.Desktop(computer.detect(), None, settings)
    try:
        with Computer.on(desktop, data_dir) as handlers:
            yield handlers
    finally:
        desktop.close()


class Computer:
    """The computer actions' handlers, called with a Context as the pipeline calls
    them: `await Computer.on(desktop, dir).mouse_click(None, args)`."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    @classmethod
    @contextlib.contextmanager
    def on(cls, desktop: computer.Desktop, data_dir: Path) -> Iterator[Computer]:
        yield cls(
            Context("test", "", "tester", b"", [], Paths.at(data_dir), services=Services(desktop))
        )

    def __getattr__(self, action: str) -> Callable[[object, Any], Any]:
        handler = importlib.import_module(f"worker.actions.computer.{action}").SPEC.handler
        return lambda _ctx, args: handler(self.ctx, args)


class OtherClient:
    """Another program on the display, driven by the test over an X connection of its
    own: it maps a plain window (not managed by the window manager: override-redirect,
    so nothing but this client moves or focuses it) and can focus or destroy it at the
    moment a test names."""

    def __init__(self, server: XServer, x: int, y: int, width: int = 80, height: int = 60) -> None:
        from Xlib import X
        from Xlib import display as xdisplay

        self.display = xdisplay.Display(server.display)
        root = self.display.screen().root
        self.window = root.create_window(
            x,
            y,
            width,
            height,
            0,
            X.CopyFromParent,
            override_redirect=True,
            background_pixel=self.display.screen().white_pixel,
            event_mask=X.StructureNotifyMask | X.FocusChangeMask,
        )
        self.id: int = self.window.id
        self.window.map()
        self.wait(X.MapNotify)

    def wait(self, kind: int) -> None:
        """Until the X server reports an event of `kind` on the window."""
        while True:
            event = self.display.next_event()
            if event.type == kind and event.window.id == self.id:
                return

    def focus(self) -> None:
        """The keyboard focus to the window, as the X server has it once this returns."""
        from Xlib import X

        self.window.set_input_focus(X.RevertToParent, X.CurrentTime)
        self.wait(X.FocusIn)

    def focus_off_the_root(self) -> bool:
        """The keyboard focus is on a window other than the root (or on none), as the X
        server has it now."""
        focus = self.display.get_input_focus().focus
        return int(getattr(focus, "id", focus)) != self.display.screen().root.id

    def destroy(self) -> None:
        """Gone, as the X server has it once this returns (later requests naming it fail)."""
        self.window.destroy()
        self.display.sync()

    def close(self) -> None:
        self.display.close()

    def __enter__(self) -> OtherClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
