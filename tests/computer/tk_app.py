"""A small Tk application that records what it receives, one JSON line per event
on stdout. The computer tests drive it through the worker and read the lines.

    python tk_app.py [--x X --y Y] [--attach SOCKET]    (DISPLAY must be set)

--attach: a child process of the app attaches to a worker's UI socket as
`agentworker ui` does (the app stands for the terminal that runs the UI) and
reports {"event": "attached"} once the worker has answered.

First line: {"event": "ready", "widgets": {name: [root_x, root_y, width, height]},
"windows": {name: title}}. Afterwards: click, text, selection, scale, yview, wheel,
combo, focus, leave events.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tkinter as tk

RED, GREEN, BLUE = "#ff0000", "#00ff00", "#0000ff"
TITLE = "agentworker test app"
SECOND_TITLE = "agentworker second window"


ATTACH = """
import os, select, socket, sys
ui = socket.socket(socket.AF_UNIX)
ui.connect(sys.argv[1])
ui.sendall(b'{"op": "attach", "asks": true}\\n')
told = False
while True:  # until the worker or the app (its stdin) goes
    ready, _, _ = select.select([ui, 0], [], [])
    if 0 in ready or not ui.recv(65536):
        break
    if not told:
        os.write(1, b"attached\\n")
        told = True
"""


def emit(**event: object) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--x", type=int, default=0)
    parser.add_argument("--y", type=int, default=0)
    parser.add_argument("--second-x", type=int, default=900)
    parser.add_argument("--second-y", type=int, default=0)
    parser.add_argument("--attach", default="")
    opts = parser.parse_args()
    attach = None
    if opts.attach:  # it ends when the app does (its stdin closes)
        attach = subprocess.Popen(
            [sys.executable, "-c", ATTACH, opts.attach],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )

    root = tk.Tk(className="AgentworkerTest")
    root.title(TITLE)
    root.geometry(f"820x640+{opts.x}+{opts.y}")

    colours = tk.Frame(root)
    colours.grid(row=0, column=0, columnspan=3, sticky="w", padx=10, pady=10)
    swatches = {}
    for name, colour in (("red", RED), ("green", GREEN), ("blue", BLUE)):
        swatch = tk.Frame(colours, width=120, height=60, bg=colour, highlightthickness=0, bd=0)
        swatch.pack(side="left", padx=8)
        swatches[name] = swatch

    def clicker(name: str, widget: tk.Widget) -> None:
        for button in (1, 2, 3):
            for kind, prefix in (("single", ""), ("double", "Double-"), ("triple", "Triple-")):
                widget.bind(
                    f"<{prefix}Button-{button}>",
                    lambda e, b=button, k=kind: emit(
                        event="click", widget=name, button=b, kind=k, state=e.state
                    ),
                )

    left = tk.Label(root, text="left target", bg="#dddddd", width=16, height=3)
    right = tk.Label(root, text="right target", bg="#bbbbbb", width=16, height=3)
    left.grid(row=1, column=0, padx=10, pady=10)
    right.grid(row=1, column=1, padx=10, pady=10)
    clicker("left", left)
    clicker("right", right)

    text = tk.Text(root, width=40, height=6, undo=False)
    text.grid(row=2, column=0, columnspan=2, padx=10, pady=10)

    def report_text(_event: object = None) -> None:
        emit(event="text", value=text.get("1.0", "end-1c"))
        text.edit_modified(False)

    text.bind("<<Modified>>", report_text)
    text.bind("<FocusIn>", lambda _e: emit(event="focus", window="text"))

    def report_selection(_event: object = None) -> None:
        ranges = text.tag_ranges("sel")
        value = text.get(ranges[0], ranges[1]) if ranges else ""
        emit(event="selection", value=value)

    text.bind("<<Selection>>", report_selection)

    def select_all(_event: object) -> str:
        text.tag_add("sel", "1.0", "end-1c")
        emit(event="combo", name="ctrl+a")
        return "break"

    text.bind("<Control-a>", select_all)

    scale = tk.Scale(
        root,
        from_=0,
        to=100,
        orient="horizontal",
        length=300,
        command=lambda v: emit(event="scale", value=int(float(v))),
    )
    scale.grid(row=3, column=0, columnspan=2, padx=10, pady=10)

    listbox = tk.Listbox(root, height=8, width=30)
    for i in range(200):
        listbox.insert("end", f"item {i:03d} " + "wide " * 12)
    listbox.grid(row=1, column=2, rowspan=3, padx=10, pady=10)
    listbox.configure(
        yscrollcommand=lambda first, last: emit(event="yview", first=float(first)),
        xscrollcommand=lambda first, last: emit(event="xview", first=float(first)),
    )

    def wheel(event: tk.Event) -> None:  # type: ignore[type-arg]
        emit(event="wheel", button=event.num)
        if event.num in (6, 7):  # Tk 8.6 has no class binding for horizontal wheels
            listbox.xview_scroll(-2 if event.num == 6 else 2, "units")

    listbox.bind("<Button>", wheel, add="+")

    second = tk.Toplevel(root)
    second.title(SECOND_TITLE)
    second.geometry(f"300x200+{opts.second_x}+{opts.second_y}")
    second_label = tk.Label(second, text="second window", bg="#ffff00", width=20, height=4)
    second_label.pack(padx=20, pady=20)
    clicker("second", second_label)

    for name, window in (("main", root), ("second", second)):
        window.bind(
            "<FocusIn>",
            lambda e, n=name, w=window: emit(event="focus", window=n) if e.widget is w else None,
        )

    def report_leave(path: str, detail: str) -> None:
        # With no window manager, Tk takes the focus implicitly while the pointer is in
        # its window and, on leaving it, sets the X focus back to PointerRoot: in its
        # handling of an event that may come after this Leave (the FocusOut the server
        # sends with it). The round trip (winfo_pointerxy) brings every such event in;
        # the report waits for Tk to have handled them all (idle), and a second round
        # trip lets what they sent reach the X server before it.
        if path == str(root) and detail != "NotifyInferior":
            root.winfo_pointerxy()
            root.after_idle(reported_leave)

    def reported_leave() -> None:
        root.winfo_pointerxy()
        emit(event="leave", window="main")

    # tkinter's Event has no crossing detail (%d): a Tcl command takes it as it is.
    root.bind("<Leave>", f"+{root.register(report_leave)} %W %d")

    for kind in ("KeyPress", "KeyRelease"):
        root.bind_all(
            f"<{kind}>",
            lambda e, k=kind: emit(event="key", kind=k, keysym=e.keysym),
            add="+",
        )

    widgets = {
        **swatches,
        "left": left,
        "right": right,
        "text": text,
        "scale": scale,
        "listbox": listbox,
        "second": second_label,
    }

    def ready() -> None:
        root.update_idletasks()
        geometry = {
            name: [w.winfo_rootx(), w.winfo_rooty(), w.winfo_width(), w.winfo_height()]
            for name, w in widgets.items()
        }
        slider = scale.coords(0)  # where the slider sits at value 0, in the scale
        emit(
            event="ready",
            widgets=geometry,
            slider=[scale.winfo_rootx() + slider[0], scale.winfo_rooty() + slider[1]],
            slider_end=[
                scale.winfo_rootx() + scale.coords(100)[0],
                scale.winfo_rooty() + scale.coords(100)[1],
            ],
            windows={"main": TITLE, "second": SECOND_TITLE},
            pid=__import__("os").getpid(),
        )

    def when_mapped() -> None:
        if root.winfo_viewable() and second.winfo_viewable():
            ready()
        else:
            root.after(10, when_mapped)

    root.after(0, when_mapped)
    if attach is not None:
        assert attach.stdout is not None
        told = attach.stdout

        def attached(_file: object, _mask: int) -> None:
            root.tk.deletefilehandler(told)
            if told.readline():
                emit(event="attached")

        root.tk.createfilehandler(told, tk.READABLE, attached)
    root.mainloop()


if __name__ == "__main__":
    main()
